//! A dead letter's body: its properties written anew with RabbitMQ's `x-death` record,
//! its `expiration` taken out, and the routing keys it goes on with.

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::Bytes;
use leasemq::{DeathReason, Envelope};

use super::{
    decode_stored, encode_properties, original_route, stamp, stored_start_keeping_key,
    without_header, Stored,
};
use crate::names;

/// `properties`, whose latest `x-death` record gains `original-expiration`.
fn with_original_expiration(
    properties: BasicProperties,
    expiration: ShortString,
) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    if let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") {
        let mut deaths = deaths.as_slice().to_vec();
        if let Some(AMQPValue::FieldTable(latest)) = deaths.first_mut() {
            let value = AMQPValue::LongString(expiration.as_str().into());
            latest.insert("original-expiration".into(), value);
        }
        headers.insert("x-death".into(), AMQPValue::FieldArray(deaths.into()));
    }
    properties.with_headers(headers)
}

/// `properties` without their `expiration`.
fn without_expiration(p: BasicProperties) -> BasicProperties {
    let mut kept = BasicProperties::default();
    macro_rules! keep {
        ($($get:ident => $set:ident),* $(,)?) => {
            $(if let Some(value) = p.$get().clone() { kept = kept.$set(value); })*
        };
    }
    keep!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        headers => with_headers,
        delivery_mode => with_delivery_mode,
        priority => with_priority,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        message_id => with_message_id,
        timestamp => with_timestamp,
        kind => with_type,
        user_id => with_user_id,
        app_id => with_app_id,
        cluster_id => with_cluster_id,
    );
    kept
}

/// One death of a message, as its `x-death` record tells it.
pub(super) struct Died<'a> {
    /// The broker name of the queue it died in.
    pub(super) queue: &'a str,
    /// Why: `rejected`, `delivery_limit` or [`EXPIRED`].
    pub(super) reason: &'static str,
    /// The exchange it was published to, and its routing keys ([`original_route`]).
    pub(super) exchange: &'a str,
    pub(super) keys: &'a [String],
}

/// `properties` with RabbitMQ's record of one more death: an `x-death` entry per queue and
/// reason, the latest first, each counting its deaths and with the `time` (seconds since
/// the Unix epoch) of its first, where `time` gives it, and the `x-first-death-…` headers
/// of the first one.
pub(super) fn with_death(
    properties: BasicProperties,
    died: &Died<'_>,
    time: Option<u64>,
) -> BasicProperties {
    let Died {
        queue,
        reason,
        exchange,
        keys,
    } = *died;
    let queue = names::amqp(queue);
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    let mut headers = properties.headers().clone().unwrap_or_default();
    let mut deaths = match headers.inner().get("x-death") {
        Some(AMQPValue::FieldArray(deaths)) => deaths.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |entry: &AMQPValue| match entry {
        AMQPValue::FieldTable(record) => {
            let record = record.inner();
            record.get("queue") == Some(&text(&queue))
                && record.get("reason") == Some(&text(reason))
        }
        _ => false,
    };
    // As RabbitMQ 3: a record of the same queue and reason counts one more (whatever
    // integer type a client that copied the headers gave its count) and comes first,
    // keeping where it was published then; else a new record comes first.
    let record = match deaths.iter().position(same).map(|i| deaths.remove(i)) {
        Some(AMQPValue::FieldTable(mut record)) => {
            let count = record.inner().get("count").and_then(crate::field::signed);
            let count = i64::try_from(count.unwrap_or(0)).unwrap_or(i64::MAX);
            let count = AMQPValue::LongLongInt(count.saturating_add(1));
            record.insert("count".into(), count);
            record
        }
        _ => {
            let mut record = FieldTable::default();
            record.insert("count".into(), AMQPValue::LongLongInt(1));
            record.insert("reason".into(), text(reason));
            record.insert("queue".into(), text(&queue));
            record.insert("exchange".into(), text(exchange));
            let keys = keys.iter().map(|key| text(key)).collect::<Vec<_>>();
            record.insert("routing-keys".into(), AMQPValue::FieldArray(keys.into()));
            if let Some(seconds) = time {
                record.insert("time".into(), AMQPValue::Timestamp(seconds));
            }
            record
        }
    };
    deaths.insert(0, AMQPValue::FieldTable(record));
    headers.insert("x-death".into(), AMQPValue::FieldArray(deaths.into()));
    if !headers.contains_key("x-first-death-queue") {
        headers.insert("x-first-death-queue".into(), text(&queue));
        headers.insert("x-first-death-reason".into(), text(reason));
        headers.insert("x-first-death-exchange".into(), text(exchange));
    }
    properties.with_headers(headers)
}

/// The `x-death` reason of a message that expired (message TTL).
pub const EXPIRED: &str = "expired";

/// What RabbitMQ's `x-death` records call `reason`.
pub(super) fn reason_text(reason: &DeathReason) -> &'static str {
    match reason {
        DeathReason::Rejected => "rejected",
        DeathReason::MaxDeliveries => "delivery_limit",
    }
}

/// A dead letter taken from the queue that holds it on its way to a dead-letter exchange
/// (`dead_letter.rs`), made ready to go on as RabbitMQ publishes one.
#[derive(Debug)]
pub struct DeadLetter {
    /// The stored body of its copies: its properties with one more `x-death` record, and
    /// the exchange and routing key its deliveries report.
    pub body: Bytes,
    /// The routing keys it is routed with.
    pub keys: Vec<String>,
    /// Why it died this time (`x-death`'s reason).
    reason: &'static str,
    /// Its `x-death` records, latest first: (queue, reason).
    deaths: Vec<(String, String)>,
}

impl DeadLetter {
    /// Whether putting it to `queue` would close a cycle RabbitMQ drops: it died in
    /// `queue` before and no death since (that one included) was a reject, so nothing
    /// but the broker itself would ever end the loop. A reject now is never a cycle.
    pub fn cycles_to(&self, queue: &str) -> bool {
        if self.reason == "rejected" {
            return false;
        }
        let Some(at) = self.deaths.iter().position(|(q, _)| q == queue) else {
            return false;
        };
        self.deaths[..=at]
            .iter()
            .all(|(_, reason)| reason != "rejected")
    }
}

/// The (queue, reason) of each `x-death` record of `properties`, latest first.
fn death_list(properties: &BasicProperties) -> Vec<(String, String)> {
    let headers = properties.headers().clone().unwrap_or_default();
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return Vec::new();
    };
    let text = |record: &FieldTable, key: &str| match record.inner().get(key) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        _ => String::new(),
    };
    (deaths.as_slice().iter())
        .filter_map(|d| match d {
            AMQPValue::FieldTable(record) => Some((text(record, "queue"), text(record, "reason"))),
            _ => None,
        })
        .collect()
}

/// `envelope`, a message that died, on its way to `exchange` with `routing_key`
/// (`x-dead-letter-routing-key`; without one, it keeps its own keys, `CC` ones too),
/// stamped as arriving `now` (milliseconds since the Unix epoch: a dead-letter queue's
/// message TTL counts from then). A dead letter of the broker's says where and why it died;
/// a message with no death record was put in the holding queue by the server as it expired
/// in `holding_for`, the broker name of the queue whose dead letters the holding queue
/// holds (`message_expiry.rs`). As RabbitMQ, its `expiration` is taken out and kept as the
/// `original-expiration` of its `x-death` record. `None` if its properties cannot be
/// written back (a value over its wire limit).
pub fn dead_letter(
    envelope: &Envelope,
    holding_for: &str,
    exchange: &str,
    routing_key: Option<&str>,
    now: u64,
) -> Option<DeadLetter> {
    let stored = decode_stored(&envelope.body).unwrap_or_else(|| Stored {
        properties: BasicProperties::default(),
        route: None,
        payload: envelope.body.clone(),
    });
    let (queue, reason) = match &envelope.death {
        Some(death) => (death.queue.as_str(), reason_text(&death.reason)),
        None => (holding_for, EXPIRED),
    };
    let (died_from, keys) = original_route(&stored, queue);
    let expiration = stored.properties.expiration().clone();
    let died = Died {
        queue,
        reason,
        exchange: &died_from,
        keys: &keys,
    };
    let mut properties = with_death(stored.properties, &died, Some(now / 1000));
    if let Some(expiration) = expiration {
        properties = with_original_expiration(without_expiration(properties), expiration);
    }
    let (properties, keys) = match routing_key {
        // RabbitMQ takes `CC` out of a dead letter given a routing key of its own.
        Some(key) => (without_header(properties, "CC"), vec![key.to_string()]),
        None => (properties, keys),
    };
    let deaths = death_list(&properties);
    let encoded = encode_properties(&properties)?;
    let mut body = stored_start_keeping_key(&encoded, exchange, &keys[0], stored.payload.len())?;
    // Its `expiration` was taken out.
    stamp(&mut body, now, false);
    body.extend_from_slice(&stored.payload);
    Some(DeadLetter {
        body: Bytes::from(body),
        keys,
        reason,
        deaths,
    })
}
