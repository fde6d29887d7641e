//! How deep field tables and arrays nest in what a client sends, measured before
//! `amq-protocol` parses it.
//!
//! `amq-protocol` parses a table or array inside another by recursion, with no limit of
//! its own: a frame within `frame_max` can nest some 26 000 levels (five bytes each, a
//! type and a length), which overflows a worker thread's stack and aborts the process,
//! every client's connection with it. So the frames whose fields hold tables (the methods
//! with `arguments` or `client_properties`, and a content header's `headers`) are walked
//! first, without recursion past [`MAX_NESTING`], and one that nests deeper is malformed:
//! its connection ends with a frame error, as for any frame the codec refuses. A header's
//! properties are walked where they are parsed, once per distinct encoding
//! (`content::PropertiesSeen`), not with every publish.
//!
//! The walk reads the encoding as `amq-protocol` does (RabbitMQ's field types, each table
//! and array a 32-bit length and then what it holds): a table's or array's contents can
//! only be read within its length, so where the walk finds the bytes cut short or a type
//! it does not know, so would the parser, which then refuses the frame itself.

/// The most levels of tables and arrays inside one another: a method's or header's own
/// table is level 1. Far more than any client sends (a dead letter's `x-death` headers
/// are four levels: headers, the array of deaths, a death, its routing keys).
pub const MAX_NESTING: usize = 64;

/// Whether a method frame's payload (class and method ids first) holds a table nested
/// deeper than [`MAX_NESTING`]. A method with no table, or one cut short, is not.
pub fn method_too_deep(payload: &[u8]) -> bool {
    let mut at = Reader(payload);
    let (Some(class), Some(method)) = (at.u16(), at.u16()) else {
        return false;
    };
    // Up to the method's one table, as `amq-protocol`'s generated parsers read them: a
    // reserved short, short strings, then a byte of flags where the method has any.
    let found = match (class, method) {
        // connection.start: two version octets, then the server's properties.
        (10, 10) => at.skip(2),
        // connection.start-ok: the client's properties first.
        (10, 11) => Some(()),
        // exchange.declare: exchange and type; queue.declare: queue.
        (40, 10) => at
            .skip(2)
            .and_then(|()| at.short_strings(2))
            .and_then(|()| at.skip(1)),
        (50, 10) => at
            .skip(2)
            .and_then(|()| at.short_strings(1))
            .and_then(|()| at.skip(1)),
        // exchange.bind/unbind and queue.bind: three names and the nowait flag.
        (40, 30 | 40) | (50, 20) => {
            (at.skip(2).and_then(|()| at.short_strings(3))).and_then(|()| at.skip(1))
        }
        // queue.unbind: three names and no flags.
        (50, 50) => at.skip(2).and_then(|()| at.short_strings(3)),
        // basic.consume: queue and consumer tag.
        (60, 20) => at
            .skip(2)
            .and_then(|()| at.short_strings(2))
            .and_then(|()| at.skip(1)),
        _ => None,
    };
    found.is_some() && at.table_too_deep(1)
}

/// Whether a content header's encoded properties (their flags first) hold `headers`
/// nested deeper than [`MAX_NESTING`].
pub fn properties_too_deep(properties: &[u8]) -> bool {
    let mut at = Reader(properties);
    let Some(flags) = at.u16() else {
        return false;
    };
    // `content-type` and `content-encoding` come before `headers`.
    for bit in [15, 14] {
        if flags & (1 << bit) != 0 && at.short_strings(1).is_none() {
            return false;
        }
    }
    flags & (1 << 13) != 0 && at.table_too_deep(1)
}

/// The bytes still to read.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<usize> {
        let b = self.take(4)?;
        usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok()
    }

    fn short_strings(&mut self, n: usize) -> Option<()> {
        for _ in 0..n {
            let (&len, _) = self.0.split_first()?;
            self.skip(1 + usize::from(len))?;
        }
        Some(())
    }

    /// Whether the table that starts here, at nesting `level`, holds anything past
    /// [`MAX_NESTING`]. Reads past it.
    fn table_too_deep(&mut self, level: usize) -> bool {
        self.container_too_deep(level, true)
    }

    /// As [`table_too_deep`](Self::table_too_deep), for a table (each value after its
    /// name, a short string) or an array (values only).
    fn container_too_deep(&mut self, level: usize, named: bool) -> bool {
        let Some(mut inside) = self.u32().and_then(|len| self.take(len)).map(Reader) else {
            return false;
        };
        if level > MAX_NESTING {
            return true;
        }
        while !inside.0.is_empty() {
            if named && inside.short_strings(1).is_none() {
                return false;
            }
            match inside.value_too_deep(level) {
                Some(false) => {}
                Some(true) => return true,
                None => return false,
            }
        }
        false
    }

    /// Whether the value that starts here (its type first), inside a table or array at
    /// `level`, nests too deep; `None` where it cannot be read (the parser refuses it).
    fn value_too_deep(&mut self, level: usize) -> Option<bool> {
        let kind = *self.take(1)?.first()?;
        let fixed = match kind {
            b'F' => return Some(self.container_too_deep(level + 1, true)),
            b'A' => return Some(self.container_too_deep(level + 1, false)),
            b'S' | b'x' => self.u32()?,
            b'V' => 0,
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'D' => 5,
            b'L' | b'l' | b'd' | b'T' => 8,
            _ => return None,
        };
        self.skip(fixed).map(|()| false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::frame::{gen_frame, AMQPFrame, WriteContext};
    use amq_protocol::protocol::{basic, connection, queue, AMQPClass};
    use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};

    /// A table holding `levels` tables and arrays inside one another, alternating.
    fn nested(levels: usize) -> FieldTable {
        let mut value = AMQPValue::LongString("bottom".into());
        for level in (2..=levels).rev() {
            value = if level % 2 == 0 {
                let mut array = FieldArray::default();
                array.push(AMQPValue::Boolean(true));
                array.push(value);
                AMQPValue::FieldArray(array)
            } else {
                let mut table = FieldTable::default();
                table.insert("n".into(), AMQPValue::LongLongInt(7));
                table.insert("deeper".into(), value);
                AMQPValue::FieldTable(table)
            };
        }
        let mut table = FieldTable::default();
        table.insert("x-note".into(), AMQPValue::ShortString("first".into()));
        table.insert("x-nested".into(), value);
        table
    }

    /// The payload `gen_frame` writes for `method` on channel 1.
    fn method_payload(method: AMQPClass) -> Vec<u8> {
        let written = gen_frame(&AMQPFrame::Method(1, method))(WriteContext::from(Vec::new()));
        let out = written.unwrap().into_inner().0;
        out[7..out.len() - 1].to_vec()
    }

    #[test]
    fn tables_in_each_method_that_has_one_are_measured_to_the_level() {
        for (levels, too_deep) in [(1, false), (MAX_NESTING, false), (MAX_NESTING + 1, true)] {
            let table = nested(levels);
            let declare = queue::Declare {
                queue: "jobs".into(),
                durable: true,
                arguments: table.clone(),
                ..Default::default()
            };
            let consume = basic::Consume {
                queue: "jobs".into(),
                consumer_tag: "worker".into(),
                no_ack: true,
                arguments: table.clone(),
                ..Default::default()
            };
            let unbind = queue::Unbind {
                queue: "jobs".into(),
                exchange: "orders".into(),
                routing_key: "paid".into(),
                arguments: table.clone(),
            };
            let start_ok = connection::StartOk {
                client_properties: table.clone(),
                mechanism: "PLAIN".into(),
                response: "\0guest\0guest".into(),
                locale: "en_US".into(),
            };
            for method in [
                AMQPClass::Queue(queue::AMQPMethod::Declare(declare)),
                AMQPClass::Basic(basic::AMQPMethod::Consume(consume)),
                AMQPClass::Queue(queue::AMQPMethod::Unbind(unbind)),
                AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok)),
            ] {
                let payload = method_payload(method.clone());
                assert_eq!(method_too_deep(&payload), too_deep, "{levels}: {method:?}");
            }
        }
    }

    #[test]
    fn headers_are_measured_after_the_properties_before_them() {
        for (levels, too_deep) in [(MAX_NESTING, false), (MAX_NESTING + 1, true)] {
            let properties = basic::AMQPProperties::default()
                .with_content_type("text/plain".into())
                .with_content_encoding("gzip".into())
                .with_headers(nested(levels))
                .with_priority(3);
            let encoded = crate::content::encode_properties(&properties).unwrap();
            assert_eq!(properties_too_deep(&encoded), too_deep, "{levels}");
        }
        let plain = basic::AMQPProperties::default().with_message_id("m-1".into());
        let encoded = crate::content::encode_properties(&plain).unwrap();
        assert!(!properties_too_deep(&encoded));
    }

    #[test]
    fn a_frame_cut_short_or_with_no_table_is_left_to_the_parser() {
        let declare = queue::Declare {
            queue: "jobs".into(),
            arguments: nested(MAX_NESTING + 1),
            ..Default::default()
        };
        let payload = method_payload(AMQPClass::Queue(queue::AMQPMethod::Declare(declare)));
        assert!(method_too_deep(&payload));
        // Cut anywhere, the walk never reads past the end.
        for end in 0..payload.len() {
            let _ = method_too_deep(&payload[..end]);
        }
        let qos = basic::Qos {
            prefetch_count: 10,
            ..Default::default()
        };
        assert!(!method_too_deep(&method_payload(AMQPClass::Basic(
            basic::AMQPMethod::Qos(qos)
        ))));
    }
}
