//! What a `queue.declare` said of a queue beyond its config, and how a later declare of
//! the same queue is held against it (RabbitMQ's "inequivalent arg" 406).

use crate::arguments;
use crate::dead_letter;

/// What a `queue.declare` said of a queue beyond its config: a later declare of the same
/// queue must say the same, or RabbitMQ refuses it as inequivalent (`durable` counts even
/// where every queue is in memory, so that what runs here runs against RabbitMQ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// `durable`: the queue survives a restart (where the server has a data dir).
    pub durable: bool,
    /// `exclusive`: the queue is its connection's alone, and goes with it.
    pub exclusive: bool,
    /// `auto_delete`: the queue goes with its last consumer.
    pub auto_delete: bool,
    /// `x-queue-type` is `quorum` (else `classic`, said or not).
    pub quorum: bool,
    /// `x-expires`, in milliseconds (see `expiry.rs`).
    pub expires: Option<u32>,
    /// `x-dead-letter-exchange` and `x-dead-letter-routing-key`.
    pub dead_letter: Option<dead_letter::Route>,
    /// `x-message-ttl`, in milliseconds.
    pub message_ttl: Option<u64>,
    /// `x-queue-mode`, `x-queue-version` and the locators.
    pub hints: arguments::StorageHints,
    /// `x-single-active-consumer`, if the declare gave it.
    pub single_active: Option<bool>,
    /// `x-max-priority` (the queue's `max_priority`).
    pub max_priority: Option<u8>,
    /// Every argument of the declare, as JSON: what the management API shows and a
    /// definitions export writes. Not compared: the fields above are.
    pub arguments: std::sync::Arc<serde_json::Map<String, serde_json::Value>>,
}

impl Declared {
    /// Whether the queue gives its messages to one consumer at a time.
    pub fn is_single_active(&self) -> bool {
        self.single_active == Some(true)
    }

    /// The first flag or argument `other` differs in, as RabbitMQ's 406 names it: its
    /// name, then `other`'s value and this one's as the 406 words them (`exclusive` is a
    /// 405, checked apart).
    pub fn inequivalent(&self, other: &Declared) -> Option<(&'static str, String, String)> {
        let kind = |d: &Declared| if d.quorum { "quorum" } else { "classic" };
        let differs = |arg, ours: String, theirs: String| {
            (ours != theirs).then(|| (arg, format!("'{theirs}'"), format!("'{ours}'")))
        };
        differs(
            "durable",
            self.durable.to_string(),
            other.durable.to_string(),
        )
        .or_else(|| {
            differs(
                "auto_delete",
                self.auto_delete.to_string(),
                other.auto_delete.to_string(),
            )
        })
        .or_else(|| differs("x-queue-type", kind(self).into(), kind(other).into()))
        .or_else(|| differs_value("x-expires", "signedint", self.expires, other.expires))
        .or_else(|| {
            let (ours, theirs) = (self.message_ttl, other.message_ttl);
            differs_value("x-message-ttl", "signedint", ours, theirs)
        })
        .or_else(|| {
            let exchange = |d: &Declared| d.dead_letter.as_ref().map(|r| r.exchange.clone());
            differs_text("x-dead-letter-exchange", exchange(self), exchange(other))
        })
        .or_else(|| {
            let key = |d: &Declared| d.dead_letter.as_ref().and_then(|r| r.routing_key.clone());
            differs_text("x-dead-letter-routing-key", key(self), key(other))
        })
        .or_else(|| {
            let (ours, theirs) = (self.max_priority, other.max_priority);
            differs_value("x-max-priority", "signedint", ours, theirs)
        })
        .or_else(|| {
            let mode = |d: &Declared| d.hints.mode.clone();
            differs_text("x-queue-mode", mode(self), mode(other))
        })
        .or_else(|| {
            let (ours, theirs) = (self.single_active, other.single_active);
            differs_value("x-single-active-consumer", "bool", ours, theirs)
        })
        .or_else(|| {
            let (ours, theirs) = (self.hints.version, other.hints.version);
            differs_value("x-queue-version", "signedint", ours, theirs)
        })
        .or_else(|| {
            let locator = |d: &Declared| d.hints.master_locator.clone();
            differs_text("x-queue-master-locator", locator(self), locator(other))
        })
        .or_else(|| {
            let locator = |d: &Declared| d.hints.leader_locator.clone();
            differs_text("x-queue-leader-locator", locator(self), locator(other))
        })
    }
}

/// A string argument `arg` that differs, ours and theirs, as [`Declared::inequivalent`]
/// answers it.
fn differs_text(
    arg: &'static str,
    ours: Option<String>,
    theirs: Option<String>,
) -> Option<(&'static str, String, String)> {
    differs_value(arg, "longstr", ours, theirs)
}

/// An argument `arg` that differs, ours and theirs, as [`Declared::inequivalent`] answers
/// it: RabbitMQ names a value's type (`of_type`) only where the other is missing.
fn differs_value<T: PartialEq + std::fmt::Display>(
    arg: &'static str,
    of_type: &str,
    ours: Option<T>,
    theirs: Option<T>,
) -> Option<(&'static str, String, String)> {
    let typed = ours.is_none() || theirs.is_none();
    let word = |value: &Option<T>| match value {
        None => "none".to_string(),
        Some(v) if typed => format!("the value '{v}' of type '{of_type}'"),
        Some(v) => format!("'{v}'"),
    };
    (ours != theirs).then(|| (arg, word(&theirs), word(&ours)))
}
