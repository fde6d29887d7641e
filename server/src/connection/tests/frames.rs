//! Frames a test sends and reads: encoded and decoded with `amq-protocol`, methods built
//! with their usual arguments, and what the connection answered picked out.

use super::*;

pub(super) fn encode(frames: &[AMQPFrame]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for frame in frames {
        bytes = gen_frame(frame)(WriteContext::from(bytes))
            .unwrap()
            .into_inner()
            .0;
    }
    bytes
}

pub(super) fn decode(mut bytes: &[u8]) -> Vec<AMQPFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let (rest, frame) = parse_frame(bytes).expect("the server writes whole, valid frames");
        frames.push(frame);
        bytes = rest;
    }
    frames
}

pub(super) fn method(channel: u16, m: AMQPClass) -> AMQPFrame {
    AMQPFrame::Method(channel, m)
}

pub(super) fn conn_method(m: connection::AMQPMethod) -> AMQPFrame {
    method(0, AMQPClass::Connection(m))
}

pub(super) fn basic_method(channel: u16, m: basic::AMQPMethod) -> AMQPFrame {
    method(channel, AMQPClass::Basic(m))
}

/// `tune-ok` (frame_max 8192, no heartbeat), `connection.open` and `channel.open` 1.
pub(super) fn open_frames() -> [AMQPFrame; 3] {
    let tune_ok = conn_method(connection::AMQPMethod::TuneOk(connection::TuneOk {
        channel_max: 16,
        frame_max: 8192,
        heartbeat: 0,
    }));
    let open = conn_method(connection::AMQPMethod::Open(connection::Open {
        virtual_host: "/".into(),
    }));
    let channel_open = method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    );
    [tune_ok, open, channel_open]
}

pub(super) fn start_ok(user: &str, password: &str) -> AMQPFrame {
    conn_method(connection::AMQPMethod::StartOk(connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: "PLAIN".into(),
        response: format!("\0{user}\0{password}").into(),
        locale: "en_US".into(),
    }))
}

/// The (delivery tag, redelivered, body) of each basic.deliver in `out`, with its content
/// put back together.
pub(super) fn deliveries(out: &[AMQPFrame]) -> Vec<(u64, bool, Vec<u8>)> {
    let mut found: Vec<(u64, bool, Vec<u8>)> = Vec::new();
    for frame in out {
        match frame {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                found.push((d.delivery_tag, d.redelivered, Vec::new()));
            }
            AMQPFrame::Body(1, body) => found.last_mut().unwrap().2.extend_from_slice(body),
            _ => {}
        }
    }
    found
}

pub(super) fn channel_close_code(out: &[AMQPFrame]) -> Option<u16> {
    channel_close(out).map(|(code, _)| code)
}

/// The reply code and text of the `channel.close` in `out`.
pub(super) fn channel_close(out: &[AMQPFrame]) -> Option<(u16, String)> {
    out.iter().find_map(|f| match f {
        AMQPFrame::Method(_, AMQPClass::Channel(channel::AMQPMethod::Close(c))) => {
            Some((c.reply_code, c.reply_text.as_str().to_string()))
        }
        _ => None,
    })
}

pub(super) fn connection_close_code(out: &[AMQPFrame]) -> Option<u16> {
    out.iter().find_map(|f| match f {
        AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Close(c))) => {
            Some(c.reply_code)
        }
        _ => None,
    })
}

pub(super) fn ack(tag: u64, multiple: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag: tag,
            multiple,
        }),
    )
}

pub(super) fn nack(tag: u64, requeue: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: tag,
            multiple: false,
            requeue,
        }),
    )
}

/// A field table whose one value is `levels` field arrays, one inside the other.
pub(super) fn nested_table(levels: usize) -> Vec<u8> {
    let mut value = Vec::with_capacity(5 * levels + 1);
    for level in 0..levels {
        // Each array holds the ones inside it (5 bytes each) and the void at the bottom.
        let inside = u32::try_from(5 * (levels - 1 - level) + 1).unwrap();
        value.push(b'A');
        value.extend_from_slice(&inside.to_be_bytes());
    }
    value.push(b'V');
    let mut table = u32::try_from(2 + value.len())
        .unwrap()
        .to_be_bytes()
        .to_vec();
    table.extend_from_slice(&[1, b'x']);
    table.extend_from_slice(&value);
    table
}

/// A method frame on `channel` with this payload.
pub(super) fn raw_method(channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![1];
    frame.extend_from_slice(&channel.to_be_bytes());
    frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(payload);
    frame.push(0xCE);
    frame
}

pub(super) fn cancel(tag: &str) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: tag.into(),
            nowait: false,
        }),
    )
}

pub(super) fn get(queue: &str, no_ack: bool) -> AMQPFrame {
    basic_method(
        1,
        basic::AMQPMethod::Get(basic::Get {
            queue: queue.into(),
            no_ack,
        }),
    )
}

pub(super) fn queue_method(m: queue::AMQPMethod) -> AMQPFrame {
    method(1, AMQPClass::Queue(m))
}

/// The consumer tag `consume-ok` gave.
pub(super) fn consumer_tag(out: &[AMQPFrame]) -> String {
    out.iter()
        .find_map(|f| match f {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok))) => {
                Some(ok.consumer_tag.to_string())
            }
            _ => None,
        })
        .expect("consume-ok")
}

pub(super) fn qos(count: u16, global: bool) -> AMQPFrame {
    let qos = basic::Qos {
        prefetch_count: count,
        global,
    };
    basic_method(1, basic::AMQPMethod::Qos(qos))
}

pub(super) fn flow(active: bool) -> AMQPFrame {
    method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active })),
    )
}

/// The properties of the first content header in `out`.
pub(super) fn first_properties(out: &[AMQPFrame]) -> BasicProperties {
    out.iter()
        .find_map(|f| match f {
            AMQPFrame::Header(_, header) => Some(header.properties.clone()),
            _ => None,
        })
        .expect("a content header")
}

pub(super) fn declare_with(name: &str, exclusive: bool, expires: Option<i32>) -> queue::Declare {
    let mut arguments = FieldTable::default();
    if let Some(ms) = expires {
        arguments.insert("x-expires".into(), AMQPValue::LongInt(ms));
    }
    queue::Declare {
        queue: name.into(),
        exclusive,
        arguments,
        ..queue::Declare::default()
    }
}

/// The bodies of the deliveries and `get-ok`s in `out`, in order.
pub(super) fn delivered_bodies(out: &[AMQPFrame]) -> Vec<Vec<u8>> {
    (out.iter())
        .filter_map(|f| match f {
            AMQPFrame::Body(1, body) => Some(body.clone()),
            _ => None,
        })
        .collect()
}

/// A field table of `arguments`.
pub(super) fn table(arguments: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert((*key).into(), value.clone());
    }
    table
}

/// `channel.close` of channel 1 by the client, 200.
pub(super) fn close_channel() -> AMQPFrame {
    let close = channel::Close {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    };
    method(1, AMQPClass::Channel(channel::AMQPMethod::Close(close)))
}

pub(super) fn tx_method(m: amq_protocol::protocol::tx::AMQPMethod) -> AMQPFrame {
    method(1, AMQPClass::Tx(m))
}

/// The bodies of the deliveries and `get-ok`s in `out`, in order, as text.
pub(super) fn delivered_texts(out: &[AMQPFrame]) -> Vec<String> {
    (delivered_bodies(out).into_iter())
        .map(|body| String::from_utf8(body).expect("text"))
        .collect()
}

/// The consumer tag and body of each `basic.deliver` in `out`.
pub(super) fn deliveries_by_consumer(out: &[AMQPFrame]) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    for frame in out {
        match frame {
            AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
                found.push((d.consumer_tag.to_string(), String::new()));
            }
            AMQPFrame::Body(1, body) => {
                let text = std::str::from_utf8(body).expect("a text body");
                found.last_mut().expect("a deliver first").1.push_str(text);
            }
            _ => {}
        }
    }
    found
}
