//! Frames in and out of a raw connection, made by `amq-protocol`'s codec and read with it.
//!
//! [`Inbox`] holds the bytes read from the socket, cuts whole frames off their front by
//! the size in their header (a frame cut short by the end of a read waits for the next
//! one) and assembles deliveries from their three parts: `basic.deliver`, the content
//! header, and body frames until the header's body size is reached; it reads those three
//! itself and parses every other method with `amq-protocol`. [`append`]
//! adds a frame made by `amq_protocol::frame::gen_frame` to the bytes waiting for the socket.

use std::ops::Range;

use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::constants::{
    FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
};
use amq_protocol::protocol::{basic, parse_class, AMQPClass, BasicProperties};

/// The one channel each raw connection opens.
pub(super) const CHANNEL: u16 = 1;
/// Bytes a frame adds around its payload: type (1), channel (2), size (4), end marker (1).
pub(super) const FRAME_OVERHEAD: usize = 8;
/// The class id of `basic`, the class whose methods carry content.
const BASIC_CLASS: u16 = 60;
/// Room made in the inbox before each read: a read takes whatever the socket holds, up to
/// this, so one read (and the one write of its acks) covers many deliveries.
const READ_CHUNK: usize = 256 * 1024;

/// Appends one frame to `out`.
pub(super) fn append(out: &mut Vec<u8>, frame: &AMQPFrame) -> Result<(), String> {
    // The generator takes the buffer by value and hands it back on success. It fails only
    // for a field over its wire limit, which ends the run, so losing the buffer then is fine.
    match gen_frame(frame)(WriteContext::from(std::mem::take(out))) {
        Ok(written) => {
            *out = written.into_inner().0;
            Ok(())
        }
        Err(e) => Err(format!("encoding {frame}: {e:?}")),
    }
}

/// Appends a method frame on `channel`.
pub(super) fn append_method(out: &mut Vec<u8>, channel: u16, m: AMQPClass) -> Result<(), String> {
    append(out, &AMQPFrame::Method(channel, m))
}

/// The frames that open every publish to `queue` of a `body_bytes` body through the
/// default exchange: the `basic.publish` method and the content header. They are the same
/// for every such publish, so a producer makes them once and copies them.
pub(super) fn publish_prefix(queue: &str, body_bytes: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let publish = basic::Publish {
        exchange: "".into(),
        routing_key: queue.into(),
        mandatory: false,
        immediate: false,
    };
    append_method(
        &mut out,
        CHANNEL,
        AMQPClass::Basic(basic::AMQPMethod::Publish(publish)),
    )?;
    let header = AMQPContentHeader {
        class_id: BASIC_CLASS,
        body_size: body_bytes as u64,
        properties: BasicProperties::default(),
    };
    append(&mut out, &AMQPFrame::Header(CHANNEL, header))?;
    Ok(out)
}

/// Appends `body` as body frames of at most `frame_max` bytes each (0: no limit). `frame`
/// is a body frame kept between calls, so its buffer is allocated once.
pub(super) fn append_body(
    out: &mut Vec<u8>,
    frame: &mut AMQPFrame,
    body: &[u8],
    frame_max: u32,
) -> Result<(), String> {
    let most = match frame_max as usize {
        0 => usize::MAX,
        n => n.saturating_sub(FRAME_OVERHEAD).max(1),
    };
    for piece in body.chunks(most) {
        if let AMQPFrame::Body(_, bytes) = frame {
            bytes.clear();
            bytes.extend_from_slice(piece);
        }
        append(out, frame)?;
    }
    Ok(())
}

/// A `basic.ack` of `tag` (and, with `multiple`, of every delivery before it).
pub(super) fn ack(tag: u64, multiple: bool) -> AMQPClass {
    AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
        delivery_tag: tag,
        multiple,
    }))
}

/// One message the server delivered, whole.
#[derive(Debug, PartialEq)]
pub(super) struct Delivery {
    pub(super) tag: u64,
    pub(super) redelivered: bool,
    pub(super) body: Vec<u8>,
}

/// What the front of the inbox holds.
#[derive(Debug, PartialEq)]
pub(super) enum Event {
    /// A whole delivery.
    Delivery(Delivery),
    /// Any other method, with its channel (boxed: a method is far larger than a delivery,
    /// and every event is moved a few times on its way out).
    Method(u16, Box<AMQPClass>),
}

/// A delivery whose content has not all come yet.
#[derive(Debug)]
struct Assembling {
    tag: u64,
    redelivered: bool,
    /// The body size from the content header, once it has come.
    size: Option<u64>,
    body: Vec<u8>,
}

impl Assembling {
    fn whole(self) -> Event {
        Event::Delivery(Delivery {
            tag: self.tag,
            redelivered: self.redelivered,
            body: self.body,
        })
    }
}

/// Bytes read from a connection and not yet parsed, and the delivery being assembled.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    /// Bytes read are `buf[start..end]`; the rest is room for the next read.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    assembling: Option<Assembling>,
}

impl Inbox {
    /// Room for one more read: what was parsed is dropped (an unfinished frame moves to
    /// the front) and at least `READ_CHUNK` bytes are free after the bytes read. Hand the
    /// count read to [`Inbox::filled`].
    pub(super) fn room(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + READ_CHUNK {
            self.buf.resize(self.end + READ_CHUNK, 0);
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`Inbox::room`].
    pub(super) fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// Adds bytes as a read would.
    #[cfg(test)]
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.room()[..bytes.len()].copy_from_slice(bytes);
        self.filled(bytes.len());
    }

    /// The next whole delivery or other method, if the inbox holds one; heartbeats are
    /// skipped. An error for a frame that does not parse, content out of order, or a
    /// protocol header (the server refusing the protocol version).
    ///
    /// Frames are cut by the size in their header. The frames of a delivery, one set per
    /// message, are read here (the delivery tag and flag, the body size, the body) rather
    /// than parsed whole into `amq-protocol`'s types, which for a message of a few bytes
    /// cost the client more than the server spends on it; every other method goes through
    /// `amq-protocol`'s `parse_class`.
    pub(super) fn next(&mut self) -> Result<Option<Event>, String> {
        loop {
            let Some((kind, channel, payload)) = self.cut_frame()? else {
                return Ok(None);
            };
            let payload = &self.buf[payload];
            let malformed = || format!("the server sent a frame that does not parse ({kind})");
            match kind {
                FRAME_METHOD if payload.starts_with(&BASIC_DELIVER) => {
                    let (tag, redelivered) =
                        deliver(&payload[BASIC_DELIVER.len()..]).ok_or_else(malformed)?;
                    if self.assembling.is_some() {
                        return Err("basic.deliver before the last delivery's content".into());
                    }
                    self.assembling = Some(Assembling {
                        tag,
                        redelivered,
                        size: None,
                        body: Vec::new(),
                    });
                }
                FRAME_METHOD => match parse_class(payload) {
                    Ok(([], m)) => return Ok(Some(Event::Method(channel, Box::new(m)))),
                    _ => return Err(malformed()),
                },
                FRAME_HEADER => {
                    // class (2), weight (2), body size (8), property flags (2) at the least.
                    if payload.len() < 14 {
                        return Err(malformed());
                    }
                    let size = u64::from_be_bytes(payload[4..12].try_into().expect("8 bytes"));
                    let Some(a) = self.assembling.as_mut().filter(|a| a.size.is_none()) else {
                        return Err("a content header without a basic.deliver before it".into());
                    };
                    if size == 0 {
                        return Ok(self.assembling.take().map(Assembling::whole));
                    }
                    a.size = Some(size);
                    // Room for what a read brings at most: the size is the server's word.
                    a.body.reserve_exact((size as usize).min(READ_CHUNK));
                }
                FRAME_BODY => {
                    let Some((a, size)) = self
                        .assembling
                        .as_mut()
                        .and_then(|a| a.size.map(|size| (a, size)))
                    else {
                        return Err("a body frame without a content header before it".into());
                    };
                    a.body.extend_from_slice(payload);
                    let got = a.body.len() as u64;
                    if got > size {
                        return Err(format!("a body of {got} bytes, announced as {size}"));
                    }
                    if got == size {
                        return Ok(self.assembling.take().map(Assembling::whole));
                    }
                }
                FRAME_HEARTBEAT => {}
                _ => return Err(malformed()),
            }
        }
    }

    /// Takes the next whole frame off the front of the bytes read: its type, its channel and
    /// where its payload lies in `buf`. `None` while the frame has not all come; an error
    /// for a protocol header (the server refusing the protocol version) or a frame without
    /// its end marker.
    #[inline]
    fn cut_frame(&mut self) -> Result<Option<(u8, u16, Range<usize>)>, String> {
        const HEADER: usize = 7;
        let input = &self.buf[self.start..self.end];
        if input.starts_with(b"AMQP") {
            return match parse_frame(input) {
                Ok((_, AMQPFrame::ProtocolHeader(version))) => Err(format!(
                    "the server refused AMQP 0-9-1: it speaks {version}"
                )),
                Err(e) if e.is_incomplete() => Ok(None),
                _ => Err("the server sent a frame that does not parse".into()),
            };
        }
        if input.len() < HEADER {
            return Ok(None);
        }
        let size = u32::from_be_bytes([input[3], input[4], input[5], input[6]]) as usize;
        let whole = size + FRAME_OVERHEAD;
        if input.len() < whole {
            return Ok(None);
        }
        if input[whole - 1] != FRAME_END {
            return Err("the server sent a frame without its end marker".into());
        }
        let (kind, channel) = (input[0], u16::from_be_bytes([input[1], input[2]]));
        let payload = self.start + HEADER..self.start + HEADER + size;
        self.start += whole;
        if self.start == self.end {
            // The bytes stay where they are until the next read.
            (self.start, self.end) = (0, 0);
        }
        Ok(Some((kind, channel, payload)))
    }
}

/// The class and method ids that open a `basic.deliver` method frame's payload.
const BASIC_DELIVER: [u8; 4] = [0, 60, 0, 60];

/// The delivery tag and `redelivered` flag of a `basic.deliver`'s arguments (consumer tag,
/// delivery tag, flags, exchange, routing key), or `None` if they are cut short or longer.
fn deliver(arguments: &[u8]) -> Option<(u64, bool)> {
    fn skip_short_string(rest: &[u8]) -> Option<&[u8]> {
        let (&len, tail) = rest.split_first()?;
        tail.get(usize::from(len)..)
    }
    let rest = skip_short_string(arguments)?;
    let (tag, rest) = rest.split_at_checked(8)?;
    let (&flags, rest) = rest.split_first()?;
    let rest = skip_short_string(skip_short_string(rest)?)?;
    rest.is_empty().then(|| {
        let tag = u64::from_be_bytes(tag.try_into().expect("8 bytes"));
        (tag, flags & 1 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::confirm;

    /// The frames of one delivery of `body`, its content split into frames of at most
    /// `frame_max` bytes.
    fn delivery(tag: u64, body: &[u8], frame_max: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let deliver = basic::Deliver {
            consumer_tag: "c".into(),
            delivery_tag: tag,
            redelivered: tag.is_multiple_of(2),
            exchange: "".into(),
            routing_key: "q".into(),
        };
        append_method(
            &mut out,
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver)),
        )
        .unwrap();
        let header = AMQPContentHeader {
            class_id: BASIC_CLASS,
            body_size: body.len() as u64,
            properties: BasicProperties::default(),
        };
        append(&mut out, &AMQPFrame::Header(CHANNEL, header)).unwrap();
        let mut frame = AMQPFrame::Body(CHANNEL, Vec::new());
        append_body(&mut out, &mut frame, body, frame_max).unwrap();
        out
    }

    fn expected(tag: u64, body: &[u8]) -> Event {
        Event::Delivery(Delivery {
            tag,
            redelivered: tag.is_multiple_of(2),
            body: body.to_vec(),
        })
    }

    fn drain(inbox: &mut Inbox) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(e) = inbox.next().unwrap() {
            events.push(e);
        }
        events
    }

    #[test]
    fn a_deliver_is_read_as_parse_class_reads_it() {
        let theirs = |payload: &[u8]| match parse_class(payload) {
            Ok(([], AMQPClass::Basic(basic::AMQPMethod::Deliver(d)))) => {
                Some((d.delivery_tag, d.redelivered))
            }
            _ => None,
        };
        let mut payloads = Vec::new();
        for (tag, redelivered, names) in
            [(1, false, ["c", "", "q"]), (u64::MAX, true, ["", "x", ""])]
        {
            let deliver = basic::Deliver {
                consumer_tag: names[0].into(),
                delivery_tag: tag,
                redelivered,
                exchange: names[1].into(),
                routing_key: names[2].into(),
            };
            let mut frame = Vec::new();
            let method = AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver));
            append_method(&mut frame, CHANNEL, method).unwrap();
            let payload = frame[7..frame.len() - 1].to_vec();
            for cut in BASIC_DELIVER.len()..payload.len() {
                payloads.push(payload[..cut].to_vec());
            }
            payloads.push([&payload[..], &[0]].concat());
            payloads.push(payload);
        }
        for payload in payloads {
            let ours = deliver(&payload[BASIC_DELIVER.len()..]);
            assert_eq!(ours, theirs(&payload), "{payload:?}");
        }
    }

    #[test]
    fn a_frame_without_its_end_marker_is_an_error() {
        let mut bytes = delivery(1, b"x", 4096);
        let last = bytes.len() - 1;
        bytes[last] = 0;
        let mut inbox = Inbox::default();
        inbox.push(&bytes);
        assert!(drain_until_error(&mut inbox).is_err());
    }

    /// Reads events until one fails.
    fn drain_until_error(inbox: &mut Inbox) -> Result<(), String> {
        while inbox.next()?.is_some() {}
        Ok(())
    }

    #[test]
    fn a_delivery_split_across_two_reads_at_every_byte_is_whole_once() {
        // A 50-byte body in frames of at most 24 bytes: three body frames.
        let body: Vec<u8> = (0..50).collect();
        let bytes = delivery(7, &body, 24 + FRAME_OVERHEAD as u32);
        for cut in 0..=bytes.len() {
            let mut inbox = Inbox::default();
            inbox.push(&bytes[..cut]);
            let first = drain(&mut inbox);
            inbox.push(&bytes[cut..]);
            let second = drain(&mut inbox);
            let all: Vec<Event> = first.into_iter().chain(second).collect();
            assert_eq!(all, [expected(7, &body)], "cut at {cut}");
            assert!(inbox.next().unwrap().is_none());
        }
    }

    #[test]
    fn a_delivery_fed_byte_by_byte_comes_out_at_its_last_byte() {
        let bytes = delivery(3, &[9; 20], 0);
        let mut inbox = Inbox::default();
        for (i, b) in bytes.iter().enumerate() {
            inbox.push(&[*b]);
            let events = drain(&mut inbox);
            if i + 1 < bytes.len() {
                assert!(events.is_empty(), "a delivery at byte {i}");
            } else {
                assert_eq!(events, [expected(3, &[9; 20])]);
            }
        }
    }

    #[test]
    fn several_deliveries_and_a_method_in_one_read() {
        let mut bytes = Vec::new();
        for tag in 1..=5 {
            bytes.extend(delivery(tag, &[tag as u8; 32], 0));
        }
        let nack = AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: 4,
            multiple: true,
            requeue: false,
        }));
        append_method(&mut bytes, CHANNEL, nack.clone()).unwrap();
        bytes.extend(delivery(6, &[], 0));
        append(&mut bytes, &AMQPFrame::Heartbeat).unwrap();
        let mut inbox = Inbox::default();
        inbox.push(&bytes);
        let mut want: Vec<Event> = (1..=5).map(|t| expected(t, &[t as u8; 32])).collect();
        want.push(Event::Method(CHANNEL, Box::new(nack)));
        want.push(expected(6, &[]));
        assert_eq!(drain(&mut inbox), want);
    }

    #[test]
    fn content_out_of_order_is_an_error() {
        let mut inbox = Inbox::default();
        let mut header = Vec::new();
        let content = AMQPContentHeader {
            class_id: BASIC_CLASS,
            body_size: 4,
            properties: BasicProperties::default(),
        };
        append(&mut header, &AMQPFrame::Header(CHANNEL, content)).unwrap();
        inbox.push(&header);
        assert!(inbox.next().is_err());

        let mut inbox = Inbox::default();
        let mut twice = delivery(1, &[1; 8], 0);
        let cut = twice.len() - 16; // drop the body frame: a second deliver follows a header
        twice.truncate(cut);
        twice.extend(delivery(2, &[2; 8], 0));
        inbox.push(&twice);
        assert!(inbox.next().is_err());

        let mut inbox = Inbox::default();
        inbox.push(&[1, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0]); // a method frame with a bad end marker
        assert!(inbox.next().is_err());
    }

    #[test]
    fn a_publish_is_its_prefix_and_its_body_frames() {
        let mut bytes = publish_prefix("some.queue", 40).unwrap();
        let mut frame = AMQPFrame::Body(CHANNEL, Vec::new());
        append_body(&mut bytes, &mut frame, &[5; 40], 16 + FRAME_OVERHEAD as u32).unwrap();
        let mut rest = &bytes[..];
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let (r, f) = parse_frame(rest).unwrap();
            frames.push(f);
            rest = r;
        }
        let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(p))) = &frames[0]
        else {
            panic!("{:?}", frames[0]);
        };
        assert_eq!(
            (p.exchange.as_str(), p.routing_key.as_str()),
            ("", "some.queue")
        );
        assert!(matches!(&frames[1], AMQPFrame::Header(1, h) if h.body_size == 40));
        let sizes: Vec<usize> = frames[2..]
            .iter()
            .map(|f| match f {
                AMQPFrame::Body(1, b) => b.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sizes, [16, 16, 8]);
        // A confirm-mode method, to check `append_method` on another class.
        let mut select = Vec::new();
        let m = AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        }));
        append_method(&mut select, CHANNEL, m.clone()).unwrap();
        assert_eq!(parse_frame(&select[..]).unwrap().1, AMQPFrame::Method(1, m));
    }
}
