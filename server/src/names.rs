//! Queue names as AMQP clients give them, and as the broker keeps them.
//!
//! AMQP names a queue with up to 255 bytes of UTF-8 (RabbitMQ takes any: `celery@host`,
//! `jobs/eu`, `café`); the broker's names are 1 to 255 bytes of `A-Z a-z 0-9 . _ : -`
//! (contract §3 Limits). A name the broker takes as it is, and that does not start with
//! [`ESCAPED`], is its own broker name; any other is [`ESCAPED`] followed by the name with
//! `_` doubled and every byte outside the broker's set written `_` and two lowercase hex
//! digits. The mapping is one to one both ways, so every table of the server keys queues
//! by broker name ([`engine`]), and names go back to clients through [`amqp`].
//!
//! `amq.` names are the server's: no client declares one, so no client name collides
//! with an escaped one, and names kept on disk before this mapping (all in the broker's
//! set, none starting `amq.name.`) are unchanged.

use std::borrow::Cow;
use std::fmt::Write;

/// The start of every escaped name.
pub const ESCAPED: &str = "amq.name.";

fn kept_as_is(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b':' | b'-')
}

/// The bytes a broker name may hold, by value: one lookup per byte of a name checked.
const PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        plain[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b':' | b'-' | b'_');
        b += 1;
    }
    plain
};

/// The broker's name for the queue a client calls `name` (an empty name stays empty).
/// One longer than 255 bytes once escaped is refused by the broker as any too-long name.
pub fn engine(name: &str) -> Cow<'_, str> {
    if name.bytes().all(|b| PLAIN[usize::from(b)]) && !name.starts_with(ESCAPED) {
        return Cow::Borrowed(name);
    }
    let mut escaped = String::with_capacity(ESCAPED.len() + name.len() + 8);
    escaped.push_str(ESCAPED);
    for b in name.bytes() {
        match b {
            b'_' => escaped.push_str("__"),
            b if kept_as_is(b) => escaped.push(char::from(b)),
            b => {
                let _ = write!(escaped, "_{b:02x}");
            }
        }
    }
    Cow::Owned(escaped)
}

/// The name a client knows the queue the broker calls `name` by.
pub fn amqp(name: &str) -> Cow<'_, str> {
    let Some(escaped) = name.strip_prefix(ESCAPED) else {
        return Cow::Borrowed(name);
    };
    let (bytes, mut out) = (escaped.as_bytes(), Vec::with_capacity(escaped.len()));
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            let digits = std::str::from_utf8(bytes.get(at..at + 2)?).ok()?;
            u8::from_str_radix(digits, 16).ok()
        };
        match bytes[i] {
            b'_' if bytes.get(i + 1) == Some(&b'_') => {
                out.push(b'_');
                i += 2;
            }
            b'_' if hex(i + 1).is_some() => {
                out.push(hex(i + 1).expect("just read"));
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_broker_takes_are_their_own_and_others_are_escaped_one_to_one() {
        for plain in ["jobs", "a.b:c-d_e", "amq.gen-1", "amq.rabbitmq.reply-to.x"] {
            assert!(matches!(engine(plain), Cow::Borrowed(_)), "{plain}");
            assert_eq!(amqp(plain), plain);
        }
        for (name, escaped) in [
            (
                "celery@host.celery.pidbox",
                "amq.name.celery_40host.celery.pidbox",
            ),
            ("jobs/eu", "amq.name.jobs_2feu"),
            ("a b_c", "amq.name.a_20b__c"),
            ("café", "amq.name.caf_c3_a9"),
            ("amq.name.x", "amq.name.amq.name.x"),
            ("_40", "_40"),
        ] {
            assert_eq!(engine(name), escaped);
            assert_eq!(amqp(&engine(name)), name);
        }
        assert_eq!(engine(""), "");
        let odd = "\u{1f600} é @/ _ ~";
        assert_eq!(amqp(&engine(odd)), odd);
        // Every escaped name is one the broker takes, if short enough.
        let allowed = |b: u8| kept_as_is(b) || b == b'_';
        assert!(engine(odd).bytes().all(allowed));
    }
}
