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
//!
//! Those are the names of the virtual host `/`. A queue of any other virtual host is
//! [`IN_VHOST`], the virtual host's name escaped (a `.` too), a `.`, then the queue's
//! name escaped (a `.` kept): [`vhost_prefix`] and [`engine_in`]. The same name in two
//! virtual hosts is two queues; [`amqp`] gives the queue's own name back, and
//! [`vhost_of`] says whose it is.

use std::borrow::Cow;
use std::fmt::Write;

/// The start of every escaped name.
pub const ESCAPED: &str = "amq.name.";

/// The start of the names of queues in virtual hosts other than `/`.
pub const IN_VHOST: &str = "amq.vhost.";

/// The virtual host every server has, whose queues' names carry no prefix.
const DEFAULT_VHOST: &str = "/";

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
    // A name that holds another virtual host's prefix is escaped too: no client of `/`
    // reaches a queue of another virtual host (or its holding queue of dead letters).
    let own = !name.starts_with(ESCAPED) && !name.contains(IN_VHOST);
    if own && name.bytes().all(|b| PLAIN[usize::from(b)]) {
        return Cow::Borrowed(name);
    }
    let mut escaped = String::with_capacity(ESCAPED.len() + name.len() + 8);
    escaped.push_str(ESCAPED);
    escape_into(&mut escaped, name, true);
    Cow::Owned(escaped)
}

/// Appends `text` escaped: `_` doubled, and each byte outside `A-Z a-z 0-9 : -` (and
/// `.`, where `dots`) as `_` and two hex digits.
fn escape_into(out: &mut String, text: &str, dots: bool) {
    for b in text.bytes() {
        match b {
            b'_' => out.push_str("__"),
            b'.' if !dots => out.push_str("_2e"),
            b if kept_as_is(b) => out.push(char::from(b)),
            b => {
                let _ = write!(out, "_{b:02x}");
            }
        }
    }
}

/// The start of the broker names of `vhost`'s queues: empty for `/`.
pub fn vhost_prefix(vhost: &str) -> String {
    if vhost == DEFAULT_VHOST {
        return String::new();
    }
    let mut prefix = String::from(IN_VHOST);
    escape_into(&mut prefix, vhost, false);
    prefix.push('.');
    prefix
}

/// The broker's name for the queue a client of the virtual host whose [`vhost_prefix`]
/// is `prefix` calls `name` (an empty name stays empty).
pub fn engine_in<'a>(prefix: &str, name: &'a str) -> Cow<'a, str> {
    if prefix.is_empty() || name.is_empty() {
        return engine(name);
    }
    let mut broker = String::with_capacity(prefix.len() + name.len() + 8);
    broker.push_str(prefix);
    escape_into(&mut broker, name, true);
    Cow::Owned(broker)
}

/// The virtual host of the queue the broker calls `name` (a holding queue of dead letters,
/// `amq.dead-letters.` and its queue's name, is its queue's virtual host's).
pub fn vhost_of(name: &str) -> Cow<'_, str> {
    if name.starts_with(ESCAPED) {
        return Cow::Borrowed(DEFAULT_VHOST);
    }
    let within = name.find(IN_VHOST).map(|at| &name[at + IN_VHOST.len()..]);
    match within.and_then(|rest| rest.split_once('.')) {
        Some((vhost, _)) => unescape(vhost),
        None => Cow::Borrowed(DEFAULT_VHOST),
    }
}

/// The name a client knows the queue the broker calls `name` by.
pub fn amqp(name: &str) -> Cow<'_, str> {
    if let Some((_, queue)) = name
        .strip_prefix(IN_VHOST)
        .and_then(|rest| rest.split_once('.'))
    {
        return unescape(queue);
    }
    let Some(escaped) = name.strip_prefix(ESCAPED) else {
        return Cow::Borrowed(name);
    };
    unescape(escaped)
}

/// `escaped` with its escapes read back.
fn unescape(escaped: &str) -> Cow<'_, str> {
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

    #[test]
    fn a_vhost_s_queues_are_named_apart_and_read_back_to_the_client_s_names() {
        assert_eq!(vhost_prefix("/"), "");
        assert_eq!(engine_in("", "jobs"), "jobs");
        let orders = vhost_prefix("orders");
        assert_eq!(orders, "amq.vhost.orders.");
        assert_eq!(engine_in(&orders, "jobs"), "amq.vhost.orders.jobs");
        assert_eq!(engine_in(&orders, ""), "");
        // A dot in the vhost's name is escaped, so the first dot ends it.
        let dotted = vhost_prefix("a.b/c_d");
        assert_eq!(dotted, "amq.vhost.a_2eb_2fc__d.");
        for (prefix, vhost) in [(&orders, "orders"), (&dotted, "a.b/c_d")] {
            for name in ["jobs", "a.b", "celery@host", "amq.gen-1", "_x_", "café"] {
                let broker = engine_in(prefix, name);
                assert_eq!(amqp(&broker), name, "{broker}");
                assert_eq!(vhost_of(&broker), vhost, "{broker}");
                let allowed = |b: u8| kept_as_is(b) || b == b'_';
                assert!(broker.bytes().all(allowed), "{broker}");
                // Never the name the same queue has in another vhost.
                assert_ne!(broker, engine(name));
            }
        }
        assert_eq!(vhost_of("jobs"), "/");
        assert_eq!(vhost_of("amq.name.a_40b"), "/");
        assert_eq!(vhost_of("amq.dead-letters.amq.vhost.orders.jobs"), "orders");
        // A client of `/` naming another vhost's queue, or its holding queue, gets a
        // name of its own.
        for name in [
            "amq.vhost.orders.jobs",
            "amq.dead-letters.amq.vhost.orders.jobs",
        ] {
            assert_ne!(engine(name), name);
            assert_eq!(amqp(&engine(name)), name);
            assert_eq!(vhost_of(&engine(name)), "/");
        }
    }
}
