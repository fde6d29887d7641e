//! How an AMQP message is kept in a leasemq message body.
//!
//! A leasemq [`Message`](leasemq::Message) holds a body of bytes; an AMQP message also has
//! properties (content type, headers, correlation id, …) that must come back unchanged on
//! delivery. leasemqd stores both in the body:
//!
//! ```text
//! [format: u8 = 1][properties length: u32 big-endian][properties][payload]
//! ```
//!
//! where the properties are written and read by `amq-protocol`'s
//! `gen_properties`/`parse_properties` (the content header's own encoding). Keeping them in
//! the body means they travel wherever the body does: through a redelivery, a dead letter
//! and, later, the log of a durable queue. A body that does not start with this layout (a
//! message put through the Rust API) is delivered as it is, with no properties.

use amq_protocol::frame::WriteContext;
use amq_protocol::protocol::basic::{gen_properties, parse_properties};
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString};
use bytes::{BufMut, Bytes, BytesMut};
use leasemq::{DeathReason, DeathRecord, Envelope};

const FORMAT: u8 = 1;
const PREFIX: usize = 5;

/// Writes `properties` and `payload` into one stored body, or `None` if the properties
/// cannot be written (a value over its wire limit).
pub fn encode(properties: &BasicProperties, payload: &[u8]) -> Option<Bytes> {
    let props = gen_properties(properties)(WriteContext::from(Vec::new()))
        .ok()?
        .into_inner()
        .0;
    let mut body = BytesMut::with_capacity(PREFIX + props.len() + payload.len());
    body.put_u8(FORMAT);
    body.put_u32(u32::try_from(props.len()).ok()?);
    body.put_slice(&props);
    body.put_slice(payload);
    Some(body.freeze())
}

/// Splits a stored body into its properties and payload (sharing the body's memory).
pub fn decode(body: &Bytes) -> (BasicProperties, Bytes) {
    decode_stored(body).unwrap_or_else(|| (BasicProperties::default(), body.clone()))
}

/// What a delivery of `envelope` carries: its stored properties and payload, and for a
/// dead letter RabbitMQ's `x-death` headers (`x-death` with `count`, `reason` — `rejected`
/// or `delivery_limit` —, `queue`, `exchange` and `routing-keys`; `x-first-death-queue`,
/// `-reason` and `-exchange`), so that a consumer of a dead-letter queue reads why as it
/// would from RabbitMQ.
pub fn delivered(envelope: &Envelope) -> (BasicProperties, Bytes) {
    let (properties, payload) = decode(&envelope.body);
    match &envelope.death {
        Some(death) => (with_death(properties, death), payload),
        None => (properties, payload),
    }
}

fn with_death(properties: BasicProperties, death: &DeathRecord) -> BasicProperties {
    let reason = match death.reason {
        DeathReason::Rejected => "rejected",
        DeathReason::MaxDeliveries => "delivery_limit",
    };
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    let mut record = FieldTable::default();
    record.insert("count".into(), AMQPValue::LongLongInt(1));
    record.insert("reason".into(), text(reason));
    record.insert("queue".into(), text(&death.queue));
    record.insert("exchange".into(), text(""));
    let keys = FieldArray::from(vec![text(&death.queue)]);
    record.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
    let mut headers = properties.headers().clone().unwrap_or_default();
    let deaths = FieldArray::from(vec![AMQPValue::FieldTable(record)]);
    headers.insert("x-death".into(), AMQPValue::FieldArray(deaths));
    headers.insert("x-first-death-queue".into(), text(&death.queue));
    headers.insert("x-first-death-reason".into(), text(reason));
    headers.insert("x-first-death-exchange".into(), text(""));
    properties.with_headers(headers)
}

fn decode_stored(body: &Bytes) -> Option<(BasicProperties, Bytes)> {
    if body.len() < PREFIX || body[0] != FORMAT {
        return None;
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let end = PREFIX.checked_add(len).filter(|&end| end <= body.len())?;
    match parse_properties(&body[PREFIX..end]) {
        Ok(([], properties)) => Some((properties, body.slice(end..))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (properties, payload) = delivered(&envelope);
        assert_eq!(&payload[..], b"poison");
        let headers = properties.headers().clone().unwrap();
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
        assert_eq!(
            delivered(&plain).0.headers().clone().unwrap().inner().len(),
            1
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
}
