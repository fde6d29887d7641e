//! How an AMQP message is kept in a leasemq message body.
//!
//! A leasemq [`leasemq::Message`] holds a body of bytes; an AMQP message also has
//! properties (content type, headers, correlation id, …) that must come back unchanged on
//! delivery. leasemqd stores both in the body:
//!
//! ```text
//! [format: u8 = 1][properties length: u32 big-endian][properties][payload]
//! [format: u8 = 2][properties length: u32 big-endian][properties]
//!     [exchange length: u8][exchange][routing key length: u8][routing key][payload]
//! ```
//!
//! Format 1 is a publish through the default exchange (its routing key is the queue's
//! name); format 2 keeps the exchange and routing key of a publish through another, or
//! through the default exchange to more queues than its key names (`CC`, `BCC`), which
//! its deliveries report as RabbitMQ's do.
//!
//! A message that may expire (message TTL: its own `expiration`, or a queue's
//! `x-message-ttl`) is stamped with when it arrived, as is every dead letter: the format
//! byte has [`TIMED`] set, and [`OWN_TTL`] where the message has an `expiration` of its
//! own, and the arrival, in milliseconds since the Unix epoch (u64 big-endian), follows
//! it, before the properties' length ([`stamp`]). Bodies not stamped never expire; a
//! build from before stamps would deliver a stamped body as it is, so it cannot read a
//! data dir holding one.
//!
//! where the properties are in the content header's own encoding, as the publish's header
//! carried them (checked by `amq-protocol`'s `parse_properties`, with the two low flag bits,
//! which announce nothing, cleared), so that a delivery copies them out as they are; a
//! dead letter's are parsed and written anew with its `x-death` headers. Keeping them in
//! the body means they travel wherever the body does: through a redelivery, a dead letter
//! and, later, the log of a durable queue. A body that does not start with this layout (a
//! message put through the Rust API) is delivered as it is, with no properties.

use amq_protocol::frame::WriteContext;
use amq_protocol::protocol::basic::{gen_properties, parse_properties};
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::Bytes;
use leasemq::{Envelope, Message};

use crate::names;

mod death;
mod ttl;

pub use death::{dead_letter, DeadLetter, EXPIRED};
use death::{reason_text, with_death, Died};
pub use ttl::{arrival, expires_at, has_own_ttl, parse_expiration, stamp, MAX_TTL_MS};

/// The longest message id the broker takes (contract §3 Limits): a `message-id` longer
/// is kept in the properties only.
pub const MAX_ID_BYTES: usize = 1024;

const FORMAT: u8 = 1;
const FORMAT_ROUTED: u8 = 2;
/// Set in the format byte of a body stamped with its arrival.
pub const TIMED: u8 = 0x80;
/// Set in the format byte of a stamped body whose message has an `expiration`.
pub const OWN_TTL: u8 = 0x40;
/// The bytes of an arrival stamp.
const STAMP: usize = 8;
const PREFIX: usize = 5;
/// Room reserved for properties before they are written: enough for a few short ones;
/// more grows the buffer.
const PROPERTIES_GUESS: usize = 64;

/// Writes `properties` and `payload` into one stored body, or `None` if the properties
/// cannot be written (a value over its wire limit).
pub fn encode(properties: &BasicProperties, payload: &[u8]) -> Option<Bytes> {
    encode_routed(properties, "", "", payload)
}

/// As [`encode`], for a publish through `exchange` with `routing_key`; the default
/// exchange (`""`) keeps neither, since its routing key is the queue's name.
pub fn encode_routed(
    properties: &BasicProperties,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
) -> Option<Bytes> {
    let encoded = encode_properties(properties)?;
    let mut body = stored_start(&encoded, exchange, routing_key, payload.len())?;
    body.extend_from_slice(payload);
    Some(Bytes::from(body))
}

/// A stored body up to its payload, with room reserved for `payload` bytes more: a
/// publish's content header starts it, its body frames are appended as they come.
/// `properties` are encoded as a content header carries them; `None` for a name over 255
/// bytes.
pub fn stored_start(
    properties: &[u8],
    exchange: &str,
    routing_key: &str,
    payload: usize,
) -> Option<Vec<u8>> {
    let route = (!exchange.is_empty()).then_some((exchange, routing_key));
    start(properties, route, payload)
}

/// As [`stored_start`], keeping the routing key even for the default exchange: for a
/// message that reaches queues other than the one its key names (`CC`, `BCC`), whose
/// deliveries report the key it was published with.
pub fn stored_start_keeping_key(
    properties: &[u8],
    exchange: &str,
    routing_key: &str,
    payload: usize,
) -> Option<Vec<u8>> {
    start(properties, Some((exchange, routing_key)), payload)
}

fn start(properties: &[u8], route: Option<(&str, &str)>, payload: usize) -> Option<Vec<u8>> {
    let route_len = route.map_or(0, |(exchange, key)| 2 + exchange.len() + key.len());
    // Room for the arrival stamp too, which every publish gets (`stamp`): it then moves
    // the bytes after the format byte, and does not grow the buffer.
    let room = STAMP + PREFIX + properties.len() + route_len + payload;
    let mut body = Vec::with_capacity(room);
    body.push(if route.is_none() {
        FORMAT
    } else {
        FORMAT_ROUTED
    });
    let len = u32::try_from(properties.len()).ok()?;
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(properties);
    if properties.len() >= 2 {
        let flags = &mut body[PREFIX + 1];
        // The two low bits of the flags announce nothing `amq-protocol` reads (bit 0 is
        // the 0-9-1 "more flags follow", which no property set here needs): cleared, so
        // that no consumer's client reads them otherwise.
        *flags &= !0b11;
    }
    if let Some((exchange, routing_key)) = route {
        for name in [exchange, routing_key] {
            body.push(u8::try_from(name.len()).ok()?);
            body.extend_from_slice(name.as_bytes());
        }
    }
    Some(body)
}

/// `properties` as a content header carries them, or `None` for a value over its wire
/// limit.
pub(crate) fn encode_properties(properties: &BasicProperties) -> Option<Vec<u8>> {
    let buffer = Vec::with_capacity(PROPERTIES_GUESS);
    let written = gen_properties(properties)(WriteContext::from(buffer)).ok()?;
    Some(written.into_inner().0)
}

/// The routing keys a publish's `CC` and `BCC` headers add to its own (RabbitMQ's
/// sender-selected distribution), and whether it has a `BCC` header, which is taken out
/// before the message is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderRoutes {
    /// Each string of `CC`, then of `BCC` (other values in them are passed over, as
    /// RabbitMQ passes them over).
    pub keys: Vec<String>,
    /// A `BCC` header is there.
    pub bcc: bool,
}

/// The publish's [`SenderRoutes`]; `None` when it has neither header.
///
/// # Errors
///
/// RabbitMQ's 406 text when either header is not an array.
pub fn sender_routes(properties: &BasicProperties) -> Result<Option<SenderRoutes>, String> {
    let Some(headers) = properties.headers() else {
        return Ok(None);
    };
    let headers = headers.inner();
    let (cc, bcc) = (headers.get("CC"), headers.get("BCC"));
    if cc.is_none() && bcc.is_none() {
        return Ok(None);
    }
    let mut keys = Vec::new();
    for (name, value) in [("CC", cc), ("BCC", bcc)] {
        match value {
            None => {}
            Some(AMQPValue::FieldArray(array)) => {
                keys.extend(array.as_slice().iter().filter_map(|v| match v {
                    AMQPValue::LongString(key) => {
                        Some(String::from_utf8_lossy(key.as_bytes()).into_owned())
                    }
                    _ => None,
                }));
            }
            Some(other) => {
                let kind = crate::field::type_name(other);
                return Err(format!(
                    "PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,\"{name}\",{kind}}}"
                ));
            }
        }
    }
    Ok(Some(SenderRoutes {
        keys,
        bcc: bcc.is_some(),
    }))
}

/// `properties` without their `BCC` header.
pub fn without_bcc(properties: BasicProperties) -> BasicProperties {
    without_header(properties, "BCC")
}

/// `properties` without their header `name`.
fn without_header(properties: BasicProperties, name: &str) -> BasicProperties {
    let Some(headers) = properties.headers() else {
        return properties;
    };
    let mut kept = FieldTable::default();
    for (key, value) in headers.inner() {
        if key.as_str() != name {
            kept.insert(key.clone(), value.clone());
        }
    }
    properties.with_headers(kept)
}

/// The `headers` property of a body made by [`stored_start`], if it has one.
pub fn stored_headers(stored: &[u8]) -> Option<FieldTable> {
    parse_whole(stored_properties(stored))?.headers().clone()
}

/// The properties `encoded` holds, parsed by `amq-protocol` with nothing left over; `None`
/// where they do not parse, or nest deeper than [`crate::wire::MAX_NESTING`]. A stored
/// body's were checked as they came, but a data dir is read too, and the parser's
/// recursion must not meet a table deeper than a publish could bring.
fn parse_whole(encoded: &[u8]) -> Option<BasicProperties> {
    if crate::wire::properties_too_deep(encoded) {
        return None;
    }
    match parse_properties(encoded).ok()? {
        ([], properties) => Some(properties),
        _ => None,
    }
}

/// The encoded properties of a body made by [`stored_start`].
pub fn stored_properties(stored: &[u8]) -> &[u8] {
    split(stored).map_or(&[], |parts| parts.properties)
}

/// The parts of a body in the stored layout, its properties still encoded.
struct Parts<'a> {
    /// When it arrived, if it was stamped.
    arrival: Option<u64>,
    properties: &'a [u8],
    /// The exchange and routing key of a publish not through the default exchange.
    route: Option<(&'a str, &'a str)>,
    /// Where the payload starts.
    payload_start: usize,
}

/// `body` taken apart, or `None` for a body not in the stored layout (one put through the
/// Rust API): too short, another first byte, a length past the end, or names that are not
/// UTF-8. The properties are not checked here.
fn split(body: &[u8]) -> Option<Parts<'_>> {
    let format = *body.first()?;
    let (format, timed) = (format & !(TIMED | OWN_TTL), format & TIMED != 0);
    let at = if timed { 1 + STAMP } else { 1 };
    if body.len() < at + 4 || !matches!(format, FORMAT | FORMAT_ROUTED) {
        return None;
    }
    let arrival = timed.then(|| u64::from_be_bytes(body[1..at].try_into().expect("8 bytes")));
    let len = u32::from_be_bytes(body[at..at + 4].try_into().expect("4 bytes")) as usize;
    let start = at + 4;
    let mut end = start.checked_add(len).filter(|&end| end <= body.len())?;
    let properties = &body[start..end];
    let mut route = None;
    if format == FORMAT_ROUTED {
        let mut name = || {
            let len = usize::from(*body.get(end)?);
            let text = body.get(end + 1..end + 1 + len)?;
            end += 1 + len;
            std::str::from_utf8(text).ok()
        };
        route = Some((name()?, name()?));
    }
    Some(Parts {
        arrival,
        properties,
        route,
        payload_start: end,
    })
}

/// The leasemq message that carries `body`, a body in the stored layout: with its
/// properties' `priority` (parsed by `seen`), by which a queue declared with
/// `x-max-priority` delivers it; none counts as 0, as in RabbitMQ, and so does a body
/// not in the layout. A dead letter and a message that expired are made here; a publish,
/// whose content header has just been parsed, takes its priority from there.
pub fn message(body: Bytes, seen: &mut PropertiesSeen) -> Message {
    let priority = (split(&body))
        .and_then(|parts| seen.check(parts.properties))
        .and_then(|properties| *properties.priority());
    let message = Message::new(body);
    match priority {
        Some(priority) => message.with_priority(priority),
        None => message,
    }
}

/// Splits a stored body into its properties and payload (sharing the body's memory).
pub fn decode(body: &Bytes) -> (BasicProperties, Bytes) {
    match decode_stored(body) {
        Some(stored) => (stored.properties, stored.payload),
        None => (BasicProperties::default(), body.clone()),
    }
}

/// What a delivery of a message carries, still encoded: borrowed from its stored body, to
/// be written out as it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Encoded<'a> {
    /// The publish's properties as a content header carries them.
    pub properties: &'a [u8],
    /// As in [`Delivered`].
    pub exchange: &'a str,
    /// As in [`Delivered`].
    pub routing_key: &'a str,
    /// The message body.
    pub payload: &'a [u8],
}

/// The last encoded properties found well formed, and what they hold, so that a run of
/// messages with the same properties (the usual case: one publisher, one kind of message)
/// has them parsed once.
#[derive(Debug, Default)]
pub struct PropertiesSeen {
    last: Vec<u8>,
    parsed: BasicProperties,
}

impl PropertiesSeen {
    /// The properties `encoded` holds, or `None` if `amq-protocol` cannot parse them with
    /// nothing left over, or if their `headers` nest deeper than
    /// [`crate::wire::MAX_NESTING`] (which its parser would find at the bottom of the
    /// stack).
    pub fn check(&mut self, encoded: &[u8]) -> Option<&BasicProperties> {
        // Two bytes of flags at the least: nothing shorter parses, and an empty `last`
        // (nothing seen yet) must not pass for it.
        if encoded.len() < 2 {
            return None;
        }
        if encoded != self.last.as_slice() {
            self.parsed = parse_whole(encoded)?;
            self.last.clear();
            self.last.extend_from_slice(encoded);
        }
        Some(&self.parsed)
    }
}

/// What [`delivered`] would give, still encoded, where nothing needs writing anew: `None`
/// for a dead letter (it gains `x-death` headers), a redelivery (it gains
/// `x-delivery-count`) and a body [`delivered`] would not take apart (one put through the
/// Rust API), which then go through [`delivered`].
pub fn delivered_encoded<'a>(
    envelope: &'a Envelope,
    queue: &'a str,
    seen: &mut PropertiesSeen,
) -> Option<Encoded<'a>> {
    if envelope.death.is_some() || envelope.redelivered() {
        return None;
    }
    let parts = split(&envelope.body)?;
    seen.check(parts.properties)?;
    let (exchange, routing_key) = parts.route.unwrap_or(("", queue));
    Some(Encoded {
        properties: parts.properties,
        exchange,
        routing_key,
        payload: &envelope.body[parts.payload_start..],
    })
}

/// A stored body taken apart.
struct Stored {
    properties: BasicProperties,
    /// The exchange and routing key of a publish not through the default exchange.
    route: Option<(String, String)>,
    payload: Bytes,
}

/// What a delivery of a message carries besides the method's tags.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// The publish's properties (with `x-death` headers on a dead letter).
    pub properties: BasicProperties,
    /// The exchange it was published to (`""` for the default one or a dead letter).
    pub exchange: String,
    /// Its routing key: the publish's, or the queue's name through the default exchange
    /// and for a dead letter (RabbitMQ's `x-dead-letter-routing-key`).
    pub routing_key: String,
    /// The message body.
    pub payload: Bytes,
}

impl Delivered {
    /// Its properties as a content header carries them, or `None` for a value over its
    /// wire limit.
    pub fn encoded_properties(&self) -> Option<Vec<u8>> {
        encode_properties(&self.properties)
    }
}

/// What a delivery of `envelope` from `queue` carries: its stored properties, exchange,
/// routing key and payload, and for a dead letter RabbitMQ's `x-death` headers (`x-death`
/// with `count`, `reason` — `rejected` or `delivery_limit` —, `queue`, `exchange` and
/// `routing-keys`; `x-first-death-queue`, `-reason` and `-exchange`), so that a consumer
/// of a dead-letter queue reads why as it would from RabbitMQ. A redelivery also carries
/// `x-delivery-count`, as from a RabbitMQ quorum queue: how many times it was delivered
/// before.
pub fn delivered(envelope: &Envelope, queue: &str) -> Delivered {
    let mut delivered = delivered_as_stored(envelope, queue);
    if envelope.redelivered() {
        let mut headers = delivered.properties.headers().clone().unwrap_or_default();
        let before = i64::from(envelope.attempt - 1);
        headers.insert(DELIVERY_COUNT.into(), AMQPValue::LongLongInt(before));
        delivered.properties = delivered.properties.with_headers(headers);
    }
    delivered
}

/// The header of a redelivery that says how many times it was delivered before.
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// [`delivered`] without `x-delivery-count`.
fn delivered_as_stored(envelope: &Envelope, queue: &str) -> Delivered {
    let stored = decode_stored(&envelope.body).unwrap_or_else(|| Stored {
        properties: BasicProperties::default(),
        route: None,
        payload: envelope.body.clone(),
    });
    let default_route = || (String::new(), queue.to_string());
    match &envelope.death {
        Some(death) => {
            // Dead-lettered through the default exchange to this queue, its name the key.
            let (exchange, routing_key) = default_route();
            let (died_from, keys) = original_route(&stored, &death.queue);
            let reason = reason_text(&death.reason);
            let died = Died {
                queue: &death.queue,
                reason,
                exchange: &died_from,
                keys: &keys,
            };
            Delivered {
                // Delivered straight from a dead-letter queue: when it died is not known.
                properties: with_death(stored.properties, &died, None),
                exchange,
                routing_key,
                payload: stored.payload,
            }
        }
        None => {
            let (exchange, routing_key) = stored.route.unwrap_or_else(default_route);
            Delivered {
                properties: stored.properties,
                exchange,
                routing_key,
                payload: stored.payload,
            }
        }
    }
}

/// The exchange a dead letter was last published to (or routed through to `queue`, the
/// broker name of the queue it died in) and its routing keys with its `CC` keys, as
/// RabbitMQ's `x-death` records them: a publish through the default exchange had the
/// queue's name as its key.
fn original_route(stored: &Stored, queue: &str) -> (String, Vec<String>) {
    let queue = || names::amqp(queue).into_owned();
    let (exchange, key) = (stored.route.clone()).unwrap_or_else(|| (String::new(), queue()));
    let mut keys = vec![key];
    if let Ok(Some(routes)) = sender_routes(&stored.properties) {
        // `BCC` was taken out before the message was stored: these are its `CC` keys.
        keys.extend(routes.keys);
    }
    (exchange, keys)
}

fn decode_stored(body: &Bytes) -> Option<Stored> {
    let parts = split(body)?;
    let properties = parse_whole(parts.properties)?;
    let route = parts
        .route
        .map(|(exchange, key)| (exchange.to_string(), key.to_string()));
    Some(Stored {
        properties,
        route,
        payload: body.slice(parts.payload_start..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::FieldArray;
    use leasemq::{DeathReason, DeathRecord};

    #[test]
    fn cc_and_bcc_add_routing_keys_and_bcc_is_taken_out() {
        let keys = |names: &[&str]| {
            let mut array = FieldArray::default();
            for name in names {
                array.push(AMQPValue::LongString((*name).into()));
            }
            array.push(AMQPValue::LongInt(7));
            AMQPValue::FieldArray(array)
        };
        let mut headers = FieldTable::default();
        headers.insert("CC".into(), keys(&["b", "c"]));
        headers.insert("BCC".into(), keys(&["d"]));
        headers.insert("kept".into(), AMQPValue::Boolean(true));
        let properties = BasicProperties::default().with_headers(headers);
        let routes = sender_routes(&properties).unwrap().unwrap();
        assert_eq!(routes.keys, ["b", "c", "d"], "other values passed over");
        assert!(routes.bcc);
        let stored = without_bcc(properties).headers().clone().unwrap();
        let mut names: Vec<&str> = stored.inner().keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["CC", "kept"]);
        assert_eq!(sender_routes(&BasicProperties::default()), Ok(None));
        let mut plain = FieldTable::default();
        plain.insert("CC".into(), AMQPValue::LongString("b".into()));
        let refused = sender_routes(&BasicProperties::default().with_headers(plain)).unwrap_err();
        assert_eq!(
            refused,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
        );
    }

    #[test]
    fn properties_and_payload_come_back_unchanged() {
        let mut headers = FieldTable::default();
        headers.insert("attempt".into(), AMQPValue::LongInt(3));
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_correlation_id("req-17".into())
            .with_headers(headers);
        let stored = encode(&properties, b"{\"to\":\"sam\"}").unwrap();
        let (back, payload) = decode(&stored);
        assert_eq!(back, properties);
        assert_eq!(&payload[..], b"{\"to\":\"sam\"}");
    }

    #[test]
    fn a_dead_letter_carries_rabbitmqs_x_death_headers() {
        let mut headers = FieldTable::default();
        headers.insert("tenant".into(), AMQPValue::LongInt(7));
        let properties = BasicProperties::default().with_headers(headers);
        let envelope = Envelope {
            id: "m1".into(),
            body: encode(&properties, b"poison").unwrap(),
            attempt: 1,
            death: Some(DeathRecord {
                queue: "jobs".into(),
                reason: DeathReason::MaxDeliveries,
                attempts: 5,
            }),
        };
        let d = delivered(&envelope, "jobs.dead");
        assert_eq!(&d.payload[..], b"poison");
        assert_eq!(
            (d.exchange.as_str(), d.routing_key.as_str()),
            ("", "jobs.dead")
        );
        let headers = d.properties.headers().clone().unwrap();
        let headers = headers.inner();
        assert_eq!(headers.get("tenant"), Some(&AMQPValue::LongInt(7)));
        let reason = AMQPValue::LongString("delivery_limit".into());
        assert_eq!(headers.get("x-first-death-reason"), Some(&reason));
        let Some(AMQPValue::FieldArray(deaths)) = headers.get("x-death") else {
            panic!("no x-death array in {headers:?}");
        };
        let [AMQPValue::FieldTable(record)] = deaths.as_slice() else {
            panic!("one death record expected: {deaths:?}");
        };
        let record = record.inner();
        assert_eq!(
            record.get("queue"),
            Some(&AMQPValue::LongString("jobs".into()))
        );
        assert_eq!(record.get("count"), Some(&AMQPValue::LongLongInt(1)));
        // A message that did not die gets no such headers.
        let plain = Envelope {
            death: None,
            ..envelope
        };
        let d = delivered(&plain, "jobs");
        assert_eq!(d.properties.headers().clone().unwrap().inner().len(), 1);
    }

    /// The headers of a stored body, by name.
    fn headers_of(properties: &BasicProperties) -> std::collections::BTreeMap<String, AMQPValue> {
        let headers = properties.headers().clone().unwrap_or_default();
        (headers.inner().iter())
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn death_records(properties: &BasicProperties) -> Vec<FieldTable> {
        match headers_of(properties).get("x-death") {
            Some(AMQPValue::FieldArray(deaths)) => (deaths.as_slice().iter())
                .map(|d| match d {
                    AMQPValue::FieldTable(t) => t.clone(),
                    other => panic!("an x-death entry that is no table: {other:?}"),
                })
                .collect(),
            other => panic!("no x-death array: {other:?}"),
        }
    }

    #[test]
    fn a_dead_letter_sent_through_an_exchange_reports_it_and_keeps_where_it_came_from() {
        let mut cc = FieldArray::default();
        cc.push(AMQPValue::LongString("audit".into()));
        let mut headers = FieldTable::default();
        headers.insert("CC".into(), AMQPValue::FieldArray(cc));
        let properties = BasicProperties::default()
            .with_message_id("m-7".into())
            .with_expiration("60000".into())
            .with_content_type("text/plain".into())
            .with_headers(headers);
        let death = DeathRecord {
            queue: "orders".into(),
            reason: DeathReason::Rejected,
            attempts: 1,
        };
        let envelope = Envelope {
            id: "m-7".into(),
            body: encode_routed(&properties, "shop", "order.paid", b"pay").unwrap(),
            attempt: 1,
            death: Some(death.clone()),
        };
        // With a dead-letter routing key: routed with it alone.
        let letter = dead_letter(&envelope, "jobs", "dlx", Some("failed"), 5_000).unwrap();
        assert_eq!(letter.keys, ["failed"]);
        assert_eq!(
            arrival(&letter.body),
            Some(5_000),
            "its TTL counts from now"
        );
        let forwarded = Envelope {
            body: letter.body.clone(),
            death: None,
            ..envelope.clone()
        };
        let d = delivered(&forwarded, "failures");
        assert_eq!(&d.payload[..], b"pay");
        assert_eq!(
            (d.exchange.as_str(), d.routing_key.as_str()),
            ("dlx", "failed"),
            "delivered as published to the dead-letter exchange"
        );
        let [record] = &death_records(&d.properties)[..] else {
            panic!("one record");
        };
        let text = |s: &str| AMQPValue::LongString(s.into());
        let keys = AMQPValue::FieldArray(vec![text("order.paid"), text("audit")].into());
        assert_eq!(record.inner().get("exchange"), Some(&text("shop")));
        assert_eq!(record.inner().get("routing-keys"), Some(&keys));
        assert_eq!(record.inner().get("reason"), Some(&text("rejected")));
        let died_at = Some(&AMQPValue::Timestamp(5));
        assert_eq!(record.inner().get("time"), died_at, "seconds, from `now`");
        // As RabbitMQ: its own expiration is taken out, kept in the record; the rest stays.
        assert_eq!(
            record.inner().get("original-expiration"),
            Some(&text("60000"))
        );
        assert_eq!(d.properties.expiration(), &None);
        assert_eq!(
            d.properties.content_type().as_ref().map(|t| t.as_str()),
            Some("text/plain")
        );
        assert_eq!(
            d.properties.message_id().as_ref().map(|t| t.as_str()),
            Some("m-7")
        );
        assert_eq!(
            headers_of(&d.properties).get("x-first-death-exchange"),
            Some(&text("shop"))
        );
        // Without one: its own keys, CC too.
        let letter = dead_letter(&envelope, "jobs", "dlx", None, 5_000).unwrap();
        assert_eq!(letter.keys, ["order.paid", "audit"]);
        // Dead again in the same queue for the same reason: that record counts two, and
        // comes first; the first death's headers stay.
        let again = Envelope {
            body: letter.body.clone(),
            death: Some(death),
            ..envelope.clone()
        };
        let twice = dead_letter(&again, "jobs", "dlx", None, 6_000).unwrap();
        let d = delivered(
            &Envelope {
                body: twice.body,
                death: None,
                ..envelope.clone()
            },
            "failures",
        );
        let records = death_records(&d.properties);
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].inner().get("count"),
            Some(&AMQPValue::LongLongInt(2))
        );
        // As RabbitMQ 3: the time of its first death in that queue for that reason.
        assert_eq!(records[0].inner().get("time"), died_at);
        // Dead elsewhere for another reason: a second record, first.
        let elsewhere = Envelope {
            body: letter.body.clone(),
            death: Some(DeathRecord {
                queue: "failures".into(),
                reason: DeathReason::MaxDeliveries,
                attempts: 3,
            }),
            ..envelope
        };
        let d = delivered(&elsewhere, "last-resort");
        let records = death_records(&d.properties);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].inner().get("queue"), Some(&text("failures")));
        assert_eq!(records[0].inner().get("exchange"), Some(&text("dlx")));
        assert_eq!(records[1].inner().get("queue"), Some(&text("orders")));
        assert_eq!(
            headers_of(&d.properties).get("x-first-death-queue"),
            Some(&text("orders"))
        );
    }

    #[test]
    fn a_dead_letter_counts_deaths_of_any_integer_drops_cc_for_its_own_key_and_sees_cycles() {
        let text = |s: &str| AMQPValue::LongString(s.into());
        // Headers a client copied when it published a dead letter again: its count is a
        // 32-bit integer (as pika writes small ones), its record that of queue `jobs`.
        let mut record = FieldTable::default();
        record.insert("count".into(), AMQPValue::LongInt(3));
        record.insert("reason".into(), text("delivery_limit"));
        record.insert("queue".into(), text("jobs"));
        record.insert("exchange".into(), text("first"));
        let mut cc = FieldArray::default();
        cc.push(text("audit"));
        let mut headers = FieldTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(record)].into()),
        );
        headers.insert("CC".into(), AMQPValue::FieldArray(cc));
        let properties = BasicProperties::default().with_headers(headers);
        let died = |queue: &str, reason| Envelope {
            id: "m".into(),
            body: encode(&properties, b"x").unwrap(),
            attempt: 1,
            death: Some(DeathRecord {
                queue: queue.into(),
                reason,
                attempts: 1,
            }),
        };
        let letter = dead_letter(
            &died("jobs", DeathReason::MaxDeliveries),
            "jobs",
            "dlx",
            Some("k"),
            0,
        )
        .unwrap();
        let d = delivered(
            &Envelope {
                body: letter.body.clone(),
                death: None,
                ..died("jobs", DeathReason::Rejected)
            },
            "next",
        );
        let records = death_records(&d.properties);
        assert_eq!(records.len(), 1);
        let record = records[0].inner();
        assert_eq!(record.get("count"), Some(&AMQPValue::LongLongInt(4)));
        assert_eq!(
            record.get("exchange"),
            Some(&text("first")),
            "kept as it was"
        );
        assert!(
            !headers_of(&d.properties).contains_key("CC"),
            "its own key: no CC"
        );
        // Back to `jobs` with no reject on the way: a cycle RabbitMQ drops.
        assert!(letter.cycles_to("jobs"));
        assert!(!letter.cycles_to("elsewhere"));
        let rejected =
            dead_letter(&died("jobs", DeathReason::Rejected), "jobs", "dlx", None, 0).unwrap();
        assert!(!rejected.cycles_to("jobs"), "a reject ends any cycle");
        let kept = Envelope {
            body: rejected.body,
            death: None,
            ..died("x", DeathReason::Rejected)
        };
        let properties = delivered(&kept, "x").properties;
        assert!(
            headers_of(&properties).contains_key("CC"),
            "its own keys: CC stays"
        );
    }

    #[test]
    fn a_stored_body_whose_headers_nest_too_deep_is_never_parsed() {
        // As a damaged data dir could hold one: headers of 10 000 arrays, one inside the
        // other, which the codec's recursion would meet at the bottom of the stack.
        let levels = 10_000;
        let mut value = Vec::new();
        for level in 0..levels {
            value.push(b'A');
            value.extend_from_slice(&(5 * (levels - 1 - level) as u32 + 1).to_be_bytes());
        }
        value.push(b'V');
        let mut properties = vec![0x20, 0];
        properties.extend_from_slice(&(2 + value.len() as u32).to_be_bytes());
        properties.extend_from_slice(&[1, b'x']);
        properties.extend_from_slice(&value);
        let mut body = start(&properties, None, 4).unwrap();
        body.extend_from_slice(b"kept");
        let body = Bytes::from(body);
        assert_eq!(stored_headers(&body), None);
        assert!(decode_stored(&body).is_none());
        let envelope = Envelope {
            id: "m-1".into(),
            body: body.clone(),
            attempt: 1,
            death: None,
        };
        // Delivered as a body not in the layout is: as it is.
        assert_eq!(delivered(&envelope, "jobs").payload, body);
        assert!(PropertiesSeen::default().check(&properties).is_none());
    }

    #[test]
    fn a_message_with_no_death_record_expired_in_the_queue_the_holding_queue_is_for() {
        let properties = BasicProperties::default().with_expiration("250".into());
        let mut body = encode_routed(&properties, "shop", "order.paid", b"pay")
            .unwrap()
            .to_vec();
        stamp(&mut body, 1_000, true);
        let expired = Envelope {
            id: "m".into(),
            body: Bytes::from(body),
            attempt: 1,
            death: None,
        };
        let letter = dead_letter(&expired, "delayed", "dlx", None, 7_000).unwrap();
        assert_eq!(letter.keys, ["order.paid"], "its own key");
        assert_eq!(
            arrival(&letter.body),
            Some(7_000),
            "its TTL counts from now"
        );
        let envelope = Envelope {
            body: letter.body.clone(),
            ..expired.clone()
        };
        let d = delivered(&envelope, "next");
        let text = |s: &str| AMQPValue::LongString(s.into());
        assert_eq!(d.properties.expiration(), &None, "taken out");
        let records = death_records(&d.properties);
        assert_eq!(records.len(), 1);
        let record = records[0].inner();
        assert_eq!(record.get("reason"), Some(&text("expired")));
        assert_eq!(record.get("queue"), Some(&text("delayed")));
        assert_eq!(record.get("exchange"), Some(&text("shop")));
        assert_eq!(record.get("count"), Some(&AMQPValue::LongLongInt(1)));
        assert_eq!(record.get("time"), Some(&AMQPValue::Timestamp(7)));
        assert_eq!(record.get("original-expiration"), Some(&text("250")));
        let first = headers_of(&d.properties);
        assert_eq!(first.get("x-first-death-reason"), Some(&text("expired")));
        // Expired in `delayed` again with no reject since: a cycle RabbitMQ drops.
        assert!(letter.cycles_to("delayed"));
        assert!(!letter.cycles_to("work"));
    }

    #[test]
    fn a_stamped_body_keeps_its_arrival_and_expires_by_the_shorter_ttl() {
        let properties = BasicProperties::default().with_expiration("250".into());
        let mut body = encode_routed(&properties, "shop", "paid", b"pay")
            .unwrap()
            .to_vec();
        let unstamped = body.clone();
        stamp(&mut body, 1_000, true);
        stamp(&mut body, 9_999, true);
        assert_eq!(arrival(&body), Some(1_000), "stamped once");
        assert_eq!(arrival(&unstamped), None);
        let envelope = Envelope {
            id: "m".into(),
            body: Bytes::from(body.clone()),
            attempt: 1,
            death: None,
        };
        let d = delivered(&envelope, "q");
        assert_eq!((&d.payload[..], d.exchange.as_str()), (&b"pay"[..], "shop"));
        let mut seen = PropertiesSeen::default();
        let encoded = delivered_encoded(&envelope, "q", &mut seen).unwrap();
        assert_eq!(encoded.payload, b"pay");
        assert_eq!(expires_at(&body, None, &mut seen), Some(1_250));
        assert_eq!(expires_at(&body, Some(100), &mut seen), Some(1_100));
        assert_eq!(expires_at(&body, Some(1_000), &mut seen), Some(1_250));
        assert_eq!(expires_at(&unstamped, Some(100), &mut seen), None);
        let plain = encode(&BasicProperties::default(), b"x").unwrap().to_vec();
        let mut stamped = plain.clone();
        stamp(&mut stamped, 7, false);
        assert_eq!(expires_at(&stamped, None, &mut seen), None, "no TTL at all");
        // Marked with no TTL of its own: an `expiration` it carries is not its TTL (a dead
        // letter's was taken out; this one is kept only to show the mark decides).
        let mut unmarked = body.clone();
        unmarked[0] &= !OWN_TTL;
        assert_eq!(expires_at(&unmarked, None, &mut seen), None);
        assert_eq!(expires_at(&stamped, Some(0), &mut seen), Some(7));
    }

    #[test]
    fn an_expiration_is_read_as_rabbitmq_reads_it() {
        assert_eq!(parse_expiration("60000"), Ok(60_000));
        assert_eq!(parse_expiration("+5"), Ok(5));
        assert_eq!(parse_expiration("-0"), Ok(0));
        assert_eq!(parse_expiration("315360000000"), Ok(MAX_TTL_MS));
        for (bad, why) in [
            ("315360000001", "{value_too_large,315360000001}"),
            (
                "18446744073709551615",
                "{value_too_large,18446744073709551615}",
            ),
            ("abc", "no_integer"),
            ("", "no_integer"),
            (" 5", "no_integer"),
            ("-5", "{value_negative,-5}"),
            ("1.5", "{leftover_string,\".5\"}"),
            ("99999999999999999999", "value_too_large"),
        ] {
            let text = parse_expiration(bad).unwrap_err();
            assert!(
                text.contains(why) && text.starts_with("PRECONDITION_FAILED"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_publish_through_an_exchange_keeps_its_exchange_and_routing_key() {
        let properties = BasicProperties::default().with_message_id("m-1".into());
        let stored = encode_routed(&properties, "orders", "paid", b"order 7").unwrap();
        let envelope = Envelope {
            id: "m-1".into(),
            body: stored.clone(),
            attempt: 1,
            death: None,
        };
        let d = delivered(&envelope, "billing");
        assert_eq!(
            (d.exchange.as_str(), d.routing_key.as_str(), &d.payload[..]),
            ("orders", "paid", &b"order 7"[..])
        );
        assert_eq!(d.properties, properties);
        assert_eq!(
            decode(&stored),
            (properties, Bytes::from_static(b"order 7"))
        );
        // Through the default exchange the routing key is the queue's name.
        let plain = Envelope {
            body: encode(&BasicProperties::default(), b"x").unwrap(),
            ..envelope
        };
        let d = delivered(&plain, "billing");
        assert_eq!(
            (d.exchange.as_str(), d.routing_key.as_str()),
            ("", "billing")
        );
    }

    #[test]
    fn empty_payload_and_no_properties_round_trip() {
        let stored = encode(&BasicProperties::default(), b"").unwrap();
        assert_eq!(decode(&stored), (BasicProperties::default(), Bytes::new()));
    }

    #[test]
    fn a_body_from_the_rust_api_is_delivered_as_it_is() {
        let body = Bytes::from_static(b"resize photo 17");
        assert_eq!(decode(&body), (BasicProperties::default(), body.clone()));
        // A first byte that happens to match, with a length past the end.
        let odd = Bytes::from_static(&[1, 0, 0, 0, 200, 7]);
        assert_eq!(decode(&odd).1, odd);
    }

    #[test]
    fn an_encoded_delivery_reads_a_stored_body_as_delivered_does() {
        let properties = BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_priority(3);
        let bodies = [
            encode(&properties, b"default route").unwrap(),
            encode_routed(&properties, "orders", "eu.paid", b"routed").unwrap(),
            encode(&BasicProperties::default(), b"").unwrap(),
            encode_routed(&BasicProperties::default(), "x", "", b"empty key").unwrap(),
        ];
        let mut seen = PropertiesSeen::default();
        for body in bodies {
            let envelope = Envelope {
                id: "m".into(),
                body,
                attempt: 1,
                death: None,
            };
            let encoded = delivered_encoded(&envelope, "jobs", &mut seen).unwrap();
            let parsed = delivered(&envelope, "jobs");
            let (rest, back) = parse_properties(encoded.properties).unwrap();
            assert!(rest.is_empty());
            assert_eq!(back, parsed.properties);
            assert_eq!(encoded.exchange, parsed.exchange);
            assert_eq!(encoded.routing_key, parsed.routing_key);
            assert_eq!(encoded.payload, &parsed.payload[..]);
        }
    }

    #[test]
    fn a_redelivery_says_how_many_times_it_was_delivered_before() {
        let mut headers = FieldTable::default();
        headers.insert("trace".into(), AMQPValue::LongString("t-1".into()));
        let properties = BasicProperties::default().with_headers(headers.clone());
        let mut envelope = Envelope {
            id: "m".into(),
            body: encode(&properties, b"job").unwrap(),
            attempt: 1,
            death: None,
        };
        let first = delivered(&envelope, "jobs").properties;
        assert_eq!(first, properties, "a first delivery as it was published");
        envelope.attempt = 3;
        let mut seen = PropertiesSeen::default();
        assert!(delivered_encoded(&envelope, "jobs", &mut seen).is_none());
        let again = delivered(&envelope, "jobs");
        headers.insert(DELIVERY_COUNT.into(), AMQPValue::LongLongInt(2));
        assert_eq!(again.properties.headers().as_ref(), Some(&headers));
        assert_eq!(&again.payload[..], b"job");
    }

    #[test]
    fn a_body_with_no_room_for_property_flags_is_not_taken_for_a_stored_one() {
        // A Rust API body that looks stored, with a properties length of 0, delivered first
        // on its connection (nothing seen yet) and after well-formed properties.
        for seen_before in [false, true] {
            let mut seen = PropertiesSeen::default();
            if seen_before {
                assert!(seen.check(&[0, 0]).is_some());
            }
            for body in [
                &[1u8, 0, 0, 0, 0, b'x'][..],
                &[2, 0, 0, 0, 0, 1, b'e', 0, b'y'],
            ] {
                assert_left_to_delivered(body, &mut seen);
            }
        }
    }

    #[test]
    fn what_needs_writing_anew_is_left_to_delivered() {
        let mut seen = PropertiesSeen::default();
        let stored = encode(&BasicProperties::default(), b"poison").unwrap();
        let dead = Envelope {
            id: "m".into(),
            body: stored.clone(),
            attempt: 5,
            death: Some(DeathRecord {
                queue: "jobs".into(),
                reason: DeathReason::Rejected,
                attempts: 5,
            }),
        };
        assert_eq!(delivered_encoded(&dead, "jobs.dead", &mut seen), None);
        // Bodies from the Rust API: not the layout, a length past the end, and properties
        // that do not parse (flags announcing a content type the bytes do not hold).
        let rust_bodies: [&'static [u8]; 3] = [
            b"plain bytes",
            &[1, 0, 0, 0, 200, 7],
            &[1, 0, 0, 0, 2, 0x80, 0, 9],
        ];
        for body in rust_bodies {
            assert_left_to_delivered(body, &mut seen);
        }
    }

    /// A body put through the Rust API is not taken for a stored one: it is delivered as
    /// it is, through `delivered`.
    fn assert_left_to_delivered(body: &[u8], seen: &mut PropertiesSeen) {
        let envelope = Envelope {
            id: "m".into(),
            body: Bytes::copy_from_slice(body),
            attempt: 1,
            death: None,
        };
        assert_eq!(delivered_encoded(&envelope, "jobs", seen), None, "{body:?}");
        assert_eq!(&delivered(&envelope, "jobs").payload[..], body);
    }

    #[test]
    fn properties_seen_before_are_not_taken_for_others() {
        let mut seen = PropertiesSeen::default();
        let typed = [0x80, 0, 4, b't', b'e', b'x', b't'];
        assert_eq!(seen.check(&[0, 0]), Some(&BasicProperties::default()));
        let text = BasicProperties::default().with_content_type("text".into());
        assert_eq!(seen.check(&typed), Some(&text));
        assert_eq!(seen.check(&typed), Some(&text));
        // A content type flag with no string after it, then the empty set again.
        assert_eq!(seen.check(&[0x80, 0]), None);
        assert_eq!(seen.check(&[0, 0]), Some(&BasicProperties::default()));
    }

    #[test]
    fn flag_bits_that_announce_nothing_are_not_stored() {
        // Content type "a", with the two low flag bits set.
        let encoded = [0x80, 0b11, 1, b'a'];
        let stored = stored_start(&encoded, "", "", 0).unwrap();
        assert_eq!(&stored[PREFIX..], &[0x80, 0, 1, b'a']);
        let (properties, payload) = decode(&Bytes::from(stored));
        assert_eq!(properties.content_type().as_ref().unwrap().as_str(), "a");
        assert!(payload.is_empty());
    }
}
