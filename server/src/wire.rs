//! Frames in and out, on top of `amq-protocol`'s codec.
//!
//! [`next_frame`] cuts one whole frame off the front of the input (reading only the length
//! in the frame header, so that a frame over `frame_max` is refused before it is buffered)
//! and has `amq-protocol` parse it, except the frames that come with every message: a
//! `basic.publish` is read here (tested equal to `parse_class`), and content frames are
//! handed over unparsed, borrowed from the input (a header's properties are checked by the
//! connection, once per distinct encoding). A method or properties whose field tables
//! nest too deep are malformed ([`MAX_NESTING`], `nesting.rs`). [`Output`] appends frames made by
//! `amq_protocol::frame::gen_frame` to the bytes waiting for the socket, and splits a
//! message's content over body frames that fit `frame_max`. The frames of a delivery, one
//! set per message a consumer gets, are laid out by [`Output`] itself (and tested equal to
//! `gen_frame`'s).

use amq_protocol::frame::parsing::{parse_frame_type, parse_raw_frame};
use amq_protocol::frame::{
    gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, AMQPFrameType, AMQPRawFrame, WriteContext,
};
use amq_protocol::protocol::basic::{self, parse_properties, AMQPMethod};
use amq_protocol::protocol::constants::{FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD};
use amq_protocol::protocol::parse_class;
use amq_protocol::protocol::AMQPClass;
use amq_protocol::types::ShortString;

mod nesting;
pub use nesting::{properties_too_deep, MAX_NESTING};

/// Bytes a frame adds around its payload: type (1), channel (2), size (4), end marker (1).
pub const FRAME_OVERHEAD: usize = 8;

/// The class id of `basic`, the only class with content.
pub const BASIC_CLASS: u16 = 60;

/// What the front of the input holds.
#[derive(Debug, PartialEq)]
// Returned once per frame and matched at once: boxing the frame would cost an allocation
// per frame to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
pub enum Next<'a> {
    /// One whole frame, and how many bytes it took.
    Frame(AMQPFrame, usize),
    /// A content header, its properties not parsed yet, and how many bytes it took.
    Header(Header<'a>, usize),
    /// A content body frame: its channel and its bytes (borrowed from the input, for the
    /// publish being put together to copy once), and how many bytes it took.
    Body(u16, &'a [u8], usize),
    /// Not a whole frame yet: read more.
    Incomplete,
    /// A frame header announcing more than `frame_max` bytes.
    TooLarge(usize),
    /// A whole frame that `amq-protocol` could not parse (bad end marker, unknown class or
    /// method, a field cut short).
    Malformed,
}

/// The 8 bytes a client opens with, or `None` until 8 have arrived; `Some(Err)` for
/// anything but the AMQP 0-9-1 header.
pub fn protocol_header(input: &[u8]) -> Option<Result<(), ()>> {
    if input.len() < 8 {
        return None;
    }
    let ours = AMQPFrame::ProtocolHeader(amq_protocol::frame::ProtocolVersion::amqp_0_9_1());
    Some(match parse_frame(&input[..8]) {
        Ok((_, frame)) if frame == ours => Ok(()),
        _ => Err(()),
    })
}

/// A content header as it came: its properties still encoded, as a message stores them
/// (see `content`), for the reader to check with `content::PropertiesSeen`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header<'a> {
    /// The channel it came on.
    pub channel: u16,
    /// The class of the method it belongs to (`basic` is the only one with content).
    pub class_id: u16,
    /// The size of the body to follow.
    pub body_size: u64,
    /// The property flags and the properties they announce.
    pub properties: &'a [u8],
}

impl Header<'_> {
    /// The header as `amq-protocol` parses it, or `None` for properties it cannot parse.
    pub fn to_frame(&self) -> Option<AMQPFrame> {
        if properties_too_deep(self.properties) {
            return None;
        }
        let properties = match parse_properties(self.properties).ok()? {
            ([], properties) => properties,
            _ => return None,
        };
        let header = AMQPContentHeader {
            class_id: self.class_id,
            body_size: self.body_size,
            properties,
        };
        Some(AMQPFrame::Header(self.channel, header))
    }
}

/// A frame's type (1), channel (2) and payload size (4).
const FRAME_HEADER_LEN: usize = 7;

/// The whole size of the frame `input` starts with, as its header says (header, payload,
/// end byte); `None` while the header itself is incomplete.
fn frame_len(input: &[u8]) -> Option<usize> {
    let size = input.get(3..FRAME_HEADER_LEN)?;
    let payload = u32::from_be_bytes(size.try_into().expect("4 bytes")) as usize;
    Some(payload.saturating_add(FRAME_OVERHEAD))
}

/// Cuts the next frame off `input`, refusing one whose whole size is over `frame_max`.
pub fn next_frame(input: &[u8], frame_max: usize) -> Next<'_> {
    let Some(whole) = frame_len(input) else {
        return Next::Incomplete;
    };
    if whole > frame_max {
        return Next::TooLarge(whole);
    }
    if input.len() < whole {
        return Next::Incomplete;
    }
    let Some((frame_type, channel, payload)) = cut_whole(&input[..whole]) else {
        return Next::Malformed;
    };
    match frame_type {
        AMQPFrameType::Header => match header(channel, payload) {
            Some(header) => Next::Header(header, whole),
            None => Next::Malformed,
        },
        AMQPFrameType::Body => Next::Body(channel, payload, whole),
        _ => match parse_payload(frame_type, channel, payload) {
            Some(frame) => Next::Frame(frame, whole),
            None => Next::Malformed,
        },
    }
}

/// A content header's fixed fields, read as `parse_content_header` reads them (the weight
/// is ignored), and the encoded properties after them.
fn header(channel: u16, payload: &[u8]) -> Option<Header<'_>> {
    // class (2), weight (2), body size (8); the property flags (2) at the least after.
    if payload.len() < 14 {
        return None;
    }
    let (fixed, properties) = payload.split_at(12);
    Some(Header {
        channel,
        class_id: u16::from_be_bytes([fixed[0], fixed[1]]),
        body_size: u64::from_be_bytes(fixed[4..12].try_into().expect("8 bytes")),
        properties,
    })
}

/// Cuts one whole frame with `amq-protocol` into its type, channel and payload. Done in
/// these steps rather than through `parse_frame`, whose outer combinators move the parsed
/// frame several times over and copy a body byte by byte.
fn cut_whole(frame: &[u8]) -> Option<(AMQPFrameType, u16, &[u8])> {
    let (rest, frame_type) = parse_frame_type(frame).ok()?;
    let (end, raw) = parse_raw_frame(frame_type)(rest).ok()?;
    if !end.is_empty() {
        return None;
    }
    let AMQPRawFrame {
        channel_id,
        payload,
        ..
    } = raw;
    Some((frame_type, channel_id, payload))
}

/// Parses the payload of a whole frame by its type.
fn parse_payload(frame_type: AMQPFrameType, channel_id: u16, payload: &[u8]) -> Option<AMQPFrame> {
    Some(match frame_type {
        AMQPFrameType::Method if payload.starts_with(&BASIC_PUBLISH) => {
            let publish = parse_publish(&payload[BASIC_PUBLISH.len()..])?;
            AMQPFrame::Method(channel_id, AMQPClass::Basic(AMQPMethod::Publish(publish)))
        }
        // Refused before `amq-protocol`'s recursion would reach the bottom of the stack.
        AMQPFrameType::Method if nesting::method_too_deep(payload) => return None,
        AMQPFrameType::Method => match parse_class(payload).ok()? {
            ([], method) => AMQPFrame::Method(channel_id, method),
            _ => return None,
        },
        AMQPFrameType::Heartbeat if channel_id == 0 => AMQPFrame::Heartbeat,
        AMQPFrameType::Heartbeat => AMQPFrame::InvalidHeartbeat(channel_id),
        // Content frames are taken apart by `next_frame` itself; the protocol header is not
        // a frame: only `protocol_header` reads it.
        AMQPFrameType::Header | AMQPFrameType::Body | AMQPFrameType::ProtocolHeader => return None,
    })
}

/// The fields of a `basic.deliver`, borrowed from where they are kept.
#[derive(Debug, Clone, Copy)]
pub struct Deliver<'a> {
    /// The consumer's tag.
    pub consumer_tag: &'a [u8],
    /// The channel's number for this delivery.
    pub delivery_tag: u64,
    /// Whether the message was delivered before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: &'a [u8],
    /// The routing key it was published with.
    pub routing_key: &'a [u8],
}

/// The method id of `basic.deliver` in class `basic`.
const BASIC_DELIVER: u16 = 60;

/// The class and method ids that open a `basic.publish` method frame's payload.
const BASIC_PUBLISH: [u8; 4] = [0, 60, 0, 40];

/// The arguments of a `basic.publish`, read as `parse_class` reads them (a test holds the
/// two to the same answers): one comes with every message published, and `parse_class`
/// allocates a `String` for the name of each of its two flags and reads the names byte by
/// byte. `None` for arguments cut short, a name not UTF-8, or bytes left over.
fn parse_publish(arguments: &[u8]) -> Option<basic::Publish> {
    // A reserved short, the exchange and routing key as short strings, one byte of flags.
    let mut rest = arguments.get(2..)?;
    let mut short_string = || {
        let (&len, tail) = rest.split_first()?;
        let (text, tail) = tail.split_at_checked(usize::from(len))?;
        rest = tail;
        std::str::from_utf8(text).ok().map(ShortString::from)
    };
    let exchange = short_string()?;
    let routing_key = short_string()?;
    let [flags] = rest else {
        return None;
    };
    Some(basic::Publish {
        exchange,
        routing_key,
        mandatory: flags & 1 != 0,
        immediate: flags & 2 != 0,
    })
}

/// A frame that `amq-protocol` refused to write (a field over its wire limit).
#[derive(Debug)]
pub struct GenFailed;

/// Bytes waiting for the socket, appended frame by frame.
#[derive(Debug, Default)]
pub struct Output {
    buf: Vec<u8>,
    scratch: Vec<u8>,
}

impl Output {
    /// Appends one frame; on failure nothing is appended.
    pub fn frame(&mut self, frame: &AMQPFrame) -> Result<(), GenFailed> {
        // The frame is written into a scratch buffer first: a writer that fails consumes
        // its buffer, and the frames already waiting must survive that.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        match gen_frame(frame)(WriteContext::from(scratch)) {
            Ok(ctx) => {
                let written = ctx.into_inner().0;
                self.buf.extend_from_slice(&written);
                self.scratch = written;
                Ok(())
            }
            // `gen_frame` fails only for a value over its wire limit, which the state
            // machine never builds.
            Err(_) => Err(GenFailed),
        }
    }

    /// Appends a method frame.
    pub fn method(&mut self, channel: u16, method: AMQPClass) -> Result<(), GenFailed> {
        self.frame(&AMQPFrame::Method(channel, method))
    }

    /// Appends a `basic.deliver` method frame.
    ///
    /// One is written for every message a consumer gets, so it is laid out here directly
    /// rather than built as an `AMQPClass` and written by `gen_frame`, which would cost a
    /// `String` for each of its three names and a pass through a generic writer; a test
    /// holds the bytes equal to `gen_frame`'s. Fails, writing nothing, for a name over 255
    /// bytes, which a short string cannot hold.
    pub fn deliver(&mut self, channel: u16, deliver: &Deliver<'_>) -> Result<(), GenFailed> {
        let names = [deliver.consumer_tag, deliver.exchange, deliver.routing_key];
        if names.iter().any(|name| name.len() > usize::from(u8::MAX)) {
            return Err(GenFailed);
        }
        // class, method, three name lengths, delivery tag, flags
        let size = 2 + 2 + 3 + 8 + 1 + names.iter().map(|name| name.len()).sum::<usize>();
        self.buf.reserve(size + FRAME_OVERHEAD);
        self.frame_start(FRAME_METHOD, channel, size);
        self.buf.extend_from_slice(&BASIC_CLASS.to_be_bytes());
        self.buf.extend_from_slice(&BASIC_DELIVER.to_be_bytes());
        self.short_string(deliver.consumer_tag);
        self.buf
            .extend_from_slice(&deliver.delivery_tag.to_be_bytes());
        self.buf.push(u8::from(deliver.redelivered));
        self.short_string(deliver.exchange);
        self.short_string(deliver.routing_key);
        self.buf.push(FRAME_END);
        Ok(())
    }

    /// Appends a content header and the body, split into frames of at most `frame_max`.
    /// The properties come encoded as a content header carries them (property flags, then
    /// the properties present): a stored message's, so that a delivery copies them instead
    /// of parsing and writing them again.
    pub fn content_encoded(
        &mut self,
        channel: u16,
        properties: &[u8],
        body: &[u8],
        frame_max: usize,
    ) {
        // class, weight, body size
        let size = 2 + 2 + 8 + properties.len();
        self.buf.reserve(size + body.len() + 2 * FRAME_OVERHEAD);
        self.frame_start(FRAME_HEADER, channel, size);
        self.buf.extend_from_slice(&BASIC_CLASS.to_be_bytes());
        self.buf.extend_from_slice(&0u16.to_be_bytes());
        self.buf
            .extend_from_slice(&(body.len() as u64).to_be_bytes());
        self.buf.extend_from_slice(properties);
        self.buf.push(FRAME_END);
        self.body(channel, body, frame_max);
    }

    /// Body frames of at most `frame_max` bytes each, none for an empty body.
    fn body(&mut self, channel: u16, body: &[u8], frame_max: usize) {
        let chunk = frame_max.saturating_sub(FRAME_OVERHEAD).max(1);
        for piece in body.chunks(chunk) {
            self.frame_start(FRAME_BODY, channel, piece.len());
            self.buf.extend_from_slice(piece);
            self.buf.push(FRAME_END);
        }
    }

    /// A frame's type, channel and payload size.
    fn frame_start(&mut self, kind: u8, channel: u16, size: usize) {
        self.buf.push(kind);
        self.buf.extend_from_slice(&channel.to_be_bytes());
        // Callers bound `size` by `frame_max` (a `u32`) or by short strings.
        self.buf.extend_from_slice(&(size as u32).to_be_bytes());
    }

    /// A short string whose length the caller has checked.
    fn short_string(&mut self, text: &[u8]) {
        self.buf.push(text.len() as u8);
        self.buf.extend_from_slice(text);
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Moves everything waiting onto the end of `to`.
    pub fn drain_into(&mut self, to: &mut Vec<u8>) {
        if to.is_empty() {
            std::mem::swap(to, &mut self.buf);
        } else {
            to.append(&mut self.buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::basic::gen_properties;
    use amq_protocol::protocol::channel;
    use amq_protocol::protocol::BasicProperties;

    fn open_frame() -> Vec<u8> {
        let mut out = Output::default();
        out.method(
            3,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .unwrap();
        let mut bytes = Vec::new();
        out.drain_into(&mut bytes);
        bytes
    }

    #[test]
    fn a_frame_is_cut_only_once_it_is_whole() {
        let bytes = open_frame();
        for cut in 0..bytes.len() {
            assert_eq!(
                next_frame(&bytes[..cut], 4096),
                Next::Incomplete,
                "cut at {cut}"
            );
        }
        let Next::Frame(frame, used) = next_frame(&bytes, 4096) else {
            panic!("a whole frame");
        };
        assert_eq!((frame.channel_id(), used), (3, bytes.len()));
    }

    /// A frame `next_frame` cut, parsed whole as the connection parses it; `None` for a
    /// malformed one.
    fn parsed(next: Next<'_>) -> Option<(AMQPFrame, usize)> {
        match next {
            Next::Frame(frame, used) => Some((frame, used)),
            Next::Header(header, used) => Some((header.to_frame()?, used)),
            Next::Body(channel, body, used) => {
                Some((AMQPFrame::Body(channel, body.to_vec()), used))
            }
            Next::Malformed => None,
            other => panic!("not a whole frame: {other:?}"),
        }
    }

    #[test]
    fn a_content_header_too_short_for_its_fields_is_malformed() {
        for size in 0..14u32 {
            let mut frame = vec![FRAME_HEADER, 0, 1];
            frame.extend_from_slice(&size.to_be_bytes());
            frame.extend(std::iter::repeat_n(0, size as usize));
            frame.push(FRAME_END);
            assert_eq!(next_frame(&frame, 4096), Next::Malformed, "{size} bytes");
            assert!(parse_frame(&frame[..]).is_err(), "{size} bytes");
        }
    }

    #[test]
    fn frames_parse_as_amq_protocols_parse_frame_parses_them() {
        let header = AMQPContentHeader {
            class_id: BASIC_CLASS,
            body_size: 5,
            properties: BasicProperties::default()
                .with_content_type("text/plain".into())
                .with_message_id("m-1".into()),
        };
        let frames = [
            AMQPFrame::Method(
                3,
                AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
            ),
            AMQPFrame::Header(3, header),
            AMQPFrame::Body(3, b"hello".to_vec()),
            AMQPFrame::Body(3, Vec::new()),
            AMQPFrame::Heartbeat,
            AMQPFrame::InvalidHeartbeat(4),
        ];
        for frame in frames {
            let mut out = Output::default();
            out.frame(&frame).unwrap();
            let mut bytes = Vec::new();
            out.drain_into(&mut bytes);
            let theirs = parse_frame(&bytes[..]).unwrap().1;
            assert_eq!(theirs, frame);
            assert_eq!(
                parsed(next_frame(&bytes, 4096)),
                Some((frame, bytes.len())),
                "{bytes:?}"
            );
            // A payload with a byte more than its method or header holds is malformed.
            if bytes[0] == 1 || bytes[0] == 2 {
                let mut longer = bytes.clone();
                longer.insert(bytes.len() - 1, 0);
                longer[6] += 1;
                assert_eq!(parsed(next_frame(&longer, 4096)), None, "{longer:?}");
            }
        }
    }

    fn written(write: impl FnOnce(&mut Output)) -> Vec<u8> {
        let mut out = Output::default();
        write(&mut out);
        let mut bytes = Vec::new();
        out.drain_into(&mut bytes);
        bytes
    }

    #[test]
    fn a_deliver_is_written_as_gen_frame_writes_it() {
        let long = "k".repeat(255);
        let cases = [
            ("ctag-1", 1, false, "", "jobs"),
            ("amq.ctag-Zq", u64::MAX, true, "orders", "eu.paid"),
            ("", 1 << 40, true, "x", long.as_str()),
        ];
        for (consumer_tag, delivery_tag, redelivered, exchange, routing_key) in cases {
            let ours = written(|out| {
                let deliver = Deliver {
                    consumer_tag: consumer_tag.as_bytes(),
                    delivery_tag,
                    redelivered,
                    exchange: exchange.as_bytes(),
                    routing_key: routing_key.as_bytes(),
                };
                out.deliver(9, &deliver).unwrap();
            });
            let method = basic::Deliver {
                consumer_tag: consumer_tag.into(),
                delivery_tag,
                redelivered,
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            };
            let theirs = written(|out| {
                let method = AMQPClass::Basic(basic::AMQPMethod::Deliver(method));
                out.method(9, method).unwrap();
            });
            assert_eq!(ours, theirs, "{consumer_tag} {delivery_tag} {redelivered}");
        }
    }

    #[test]
    fn a_name_a_short_string_cannot_hold_writes_no_deliver() {
        let mut out = Output::default();
        let long = [b'q'; 256];
        let deliver = Deliver {
            consumer_tag: b"c",
            delivery_tag: 1,
            redelivered: false,
            exchange: b"",
            routing_key: &long,
        };
        assert!(out.deliver(1, &deliver).is_err());
        assert!(out.is_empty());
    }

    /// A content header and its body frames as `gen_frame` writes them.
    fn gen_content(
        out: &mut Output,
        channel: u16,
        properties: BasicProperties,
        body: &[u8],
        frame_max: usize,
    ) {
        let header = AMQPContentHeader {
            class_id: BASIC_CLASS,
            body_size: body.len() as u64,
            properties,
        };
        out.frame(&AMQPFrame::Header(channel, header)).unwrap();
        for piece in body.chunks(frame_max - FRAME_OVERHEAD) {
            out.frame(&AMQPFrame::Body(channel, piece.to_vec()))
                .unwrap();
        }
    }

    #[test]
    fn encoded_content_is_written_as_gen_frame_writes_it() {
        let mut headers = amq_protocol::types::FieldTable::default();
        headers.insert("n".into(), amq_protocol::types::AMQPValue::LongInt(-4));
        let properties = [
            BasicProperties::default(),
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_delivery_mode(2)
                .with_headers(headers),
        ];
        let bodies: [&[u8]; 4] = [b"", b"x", &[7; 100], &[1; 250]];
        for properties in properties {
            let encoded = gen_properties(&properties)(WriteContext::from(Vec::new()))
                .unwrap()
                .into_inner()
                .0;
            for body in bodies {
                // 100 bytes a frame: one body frame, or several with a short last one.
                let frame_max = 100 + FRAME_OVERHEAD;
                let ours = written(|out| out.content_encoded(5, &encoded, body, frame_max));
                let theirs =
                    written(|out| gen_content(out, 5, properties.clone(), body, frame_max));
                assert_eq!(ours, theirs, "{} body bytes", body.len());
                let mut frames = 0;
                let mut rest = &ours[..];
                while let Some((_, used)) = parsed(next_frame(rest, frame_max)) {
                    rest = &rest[used..];
                    frames += 1;
                    if rest.is_empty() {
                        break;
                    }
                }
                assert!(rest.is_empty());
                assert_eq!(frames, 1 + body.len().div_ceil(100));
            }
        }
    }

    /// What `parse_class` makes of a method payload, as `parse_payload` takes it.
    fn their_method(payload: &[u8]) -> Option<AMQPClass> {
        match parse_class(payload) {
            Ok(([], method)) => Some(method),
            _ => None,
        }
    }

    #[test]
    fn a_publish_is_read_as_parse_class_reads_it() {
        let mut payloads = Vec::new();
        for (exchange, routing_key) in [("", "jobs"), ("orders", ""), ("x", &*"k".repeat(255))] {
            for flags in [0u8, 1, 2, 3, 0xFC, 0xFF] {
                let mut p = BASIC_PUBLISH.to_vec();
                p.extend_from_slice(&[0, 0]);
                for name in [exchange, routing_key] {
                    p.push(name.len() as u8);
                    p.extend_from_slice(name.as_bytes());
                }
                p.push(flags);
                payloads.push(p);
            }
        }
        let whole = payloads[0].clone();
        // Every cut short, a byte too many, a routing key not UTF-8, a length past the end.
        for cut in BASIC_PUBLISH.len()..whole.len() {
            payloads.push(whole[..cut].to_vec());
        }
        payloads.push([&whole[..], &[0]].concat());
        let mut bad = whole.clone();
        bad[8] = 0xFF;
        payloads.push(bad);
        let mut long = whole.clone();
        long[7] = 200;
        payloads.push(long);
        for payload in payloads {
            let ours = parse_publish(&payload[BASIC_PUBLISH.len()..])
                .map(|p| AMQPClass::Basic(AMQPMethod::Publish(p)));
            assert_eq!(ours, their_method(&payload), "{payload:?}");
            // And through the whole frame path.
            let mut frame = vec![FRAME_METHOD, 0, 1];
            frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            frame.extend_from_slice(&payload);
            frame.push(FRAME_END);
            let expected = match their_method(&payload) {
                Some(method) => Next::Frame(AMQPFrame::Method(1, method), frame.len()),
                None => Next::Malformed,
            };
            assert_eq!(next_frame(&frame, 4096), expected);
        }
    }

    #[test]
    fn a_frame_over_frame_max_is_refused_from_its_header() {
        let header = [3u8, 0, 1, 0, 1, 0, 0]; // a body frame announcing 65 536 bytes
        assert_eq!(
            next_frame(&header, 8192),
            Next::TooLarge(65_536 + FRAME_OVERHEAD)
        );
    }

    #[test]
    fn a_bad_end_marker_is_malformed() {
        let mut bytes = open_frame();
        *bytes.last_mut().unwrap() = 0;
        assert_eq!(next_frame(&bytes, 4096), Next::Malformed);
    }

    #[test]
    fn content_is_split_into_frames_that_fit() {
        let mut out = Output::default();
        out.content_encoded(1, &[0, 0], &[7; 100], 48);
        let mut bytes = Vec::new();
        out.drain_into(&mut bytes);
        let mut sizes = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (frame, used) = parsed(next_frame(rest, 48)).unwrap();
            if let AMQPFrame::Body(_, body) = frame {
                sizes.push(body.len());
            }
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        assert_eq!(sizes, [40, 40, 20]);
    }
}
