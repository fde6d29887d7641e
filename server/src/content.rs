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
use bytes::{BufMut, Bytes, BytesMut};

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
    use amq_protocol::types::{AMQPValue, FieldTable};

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
