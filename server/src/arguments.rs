//! `queue.declare` arguments (RabbitMQ's `x-` arguments) read into a [`QueueConfig`], and
//! `basic.consume`'s (`x-priority`, `x-consumer-timeout`: [`consume_options`]).
//!
//! Served: `x-dead-letter-exchange` with `x-dead-letter-routing-key` or without (then a
//! dead letter keeps its own keys), read by [`dead_letter_route`]: the declare makes the
//! queue's holding queue its `dead_letter` (`dead_letter.rs`);
//! `x-consumer-timeout` (milliseconds: the queue's lease length); `x-delivery-limit` (how
//! many times a message may come back before it is dead-lettered, as in RabbitMQ's quorum
//! queues: `max_deliveries` is one more); `x-max-length` with `x-overflow` `drop-head`
//! (RabbitMQ's default: a publish to a full queue drops its oldest ready message, which is
//! not dead-lettered, so a dead-letter exchange with it is a 406; messages delivered and
//! not yet acked do not count) or `reject-publish` (a publish to a full queue is refused:
//! nacked under confirms; every live message counts);
//! `x-queue-type` `classic` or `quorum` (one kind of queue here; a quorum queue must be
//! durable, as in RabbitMQ); `x-expires` (milliseconds a queue may go unused before it is
//! deleted: not part of the config, read by [`expires`] for `expiry.rs`); `x-message-ttl`
//! (milliseconds a message may wait before it expires: not part of the config either, read
//! by [`message_ttl`] for `message_expiry.rs`; with `x-dead-letter-exchange`, expired
//! messages are dead-lettered); `x-queue-mode` and `x-queue-version` (hints on how
//! RabbitMQ keeps a classic queue's messages), `x-queue-master-locator` (a classic queue's)
//! and `x-queue-leader-locator` (a quorum queue's: on which node of a cluster the queue
//! lives): checked and kept, see [`StorageHints`];
//! `x-single-active-consumer` (read by [`single_active_consumer`]: the server gives the
//! queue's messages to one consumer at a time, `consumers.rs`);
//! `x-max-priority` (the queue's `max_priority`: its ready messages go out highest
//! `priority` first, as in RabbitMQ's priority queues); `x-dead-letter-strategy` (checked
//! and taken, see [`dead_letter_strategy_value`]).
//! Anything else is refused, never ignored: an argument or value RabbitMQ serves
//! with 540 (not implemented, the connection closes), a value RabbitMQ does not know
//! either with 406 (the channel closes), as RabbitMQ would. A value RabbitMQ checks and
//! refuses is refused with its text, `invalid arg 'KEY' for queue 'NAME' in vhost '/': WHY`,
//! the declare naming its queue ([`Refused::for_queue`]).

use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable};
use leasemq::{ConsumeOptions, Overflow, QueueConfig};

use crate::dead_letter::Route;
use crate::field::{signed, type_name};

/// Why the arguments were refused: a reply code and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// 540 for an argument not served, 406 for a value that is wrong.
    pub code: u16,
    /// What to change.
    pub text: String,
    /// Where in `text` [`Refused::for_queue`] names the queue: after the argument, in
    /// RabbitMQ's text for a value it does not take ([`invalid_arg`]).
    queue_at: Option<usize>,
}

impl Refused {
    /// A refusal with `code` and `text`, whose text names no queue of its own accord.
    pub fn new(code: u16, text: String) -> Refused {
        refused(code, text)
    }

    /// The refusal as the declare of the queue `shown` (its name as the client knows it)
    /// answers it: RabbitMQ's text for a value it does not take names the queue,
    /// `invalid arg 'x-max-priority' for queue 'jobs' in vhost '/': {max_value_exceeded,256}`.
    #[must_use]
    pub fn for_queue(mut self, shown: &str, vhost: &str) -> Refused {
        if let Some(at) = self.queue_at.take() {
            let queue = format!(" for queue '{shown}' in vhost '{vhost}'");
            self.text.insert_str(at, &queue);
        }
        self
    }
}

fn refused(code: u16, text: String) -> Refused {
    Refused {
        code,
        text,
        queue_at: None,
    }
}

/// RabbitMQ's 406 for a value of argument `key` that it does not take, `why` worded as
/// RabbitMQ words it (its `rabbit_amqqueue:check_arguments`); the declare names the
/// queue in it ([`Refused::for_queue`]).
fn invalid_arg(key: &str, why: impl std::fmt::Display) -> Refused {
    let head = format!("PRECONDITION_FAILED - invalid arg '{key}'");
    Refused {
        code: 406,
        queue_at: Some(head.len()),
        text: format!("{head}: {why}"),
    }
}

/// `config` with the declare's arguments applied.
///
/// # Errors
///
/// [`Refused`] 540 for an argument that is not served, 406 for a value of the wrong type
/// or out of range.
pub fn queue_config(
    arguments: &FieldTable,
    mut config: QueueConfig,
) -> Result<QueueConfig, Refused> {
    let args = arguments.inner();
    let mut dead_letter_exchange = None;
    let mut dead_letter_key = None;
    let mut overflow = None;
    for (key, value) in args {
        match key.as_str() {
            "x-dead-letter-exchange" => dead_letter_exchange = Some(string(key.as_str(), value)?),
            "x-dead-letter-routing-key" => dead_letter_key = Some(string(key.as_str(), value)?),
            "x-consumer-timeout" => {
                let ms = non_negative(key.as_str(), value)?;
                config.ack_timeout = Duration::from_millis(ms);
            }
            "x-delivery-limit" => {
                let limit = non_negative(key.as_str(), value)?;
                let deliveries = u32::try_from(limit.saturating_add(1)).map_err(|_| {
                    refused(406, format!("PRECONDITION_FAILED - {key} is too large"))
                })?;
                config.max_deliveries = Some(deliveries);
            }
            "x-max-length" => {
                let n = non_negative(key.as_str(), value)?;
                config.max_length = Some(usize::try_from(n).unwrap_or(usize::MAX));
            }
            "x-overflow" => overflow = Some(string(key.as_str(), value)?),
            // One kind of queue here; that a quorum queue is durable, the declare checks.
            "x-queue-type" => queue_type_value(value)?,
            // Read from the arguments where they are used; only checked here.
            "x-expires"
            | "x-message-ttl"
            | "x-queue-mode"
            | "x-single-active-consumer"
            | "x-queue-version"
            | "x-queue-master-locator"
            | "x-queue-leader-locator"
            | "x-dead-letter-strategy" => check_value(key.as_str(), value)?,
            "x-max-priority" => config.max_priority = Some(max_priority_value(value)?),
            other => {
                let text = format!("queue argument '{other}' is not supported by leasemqd yet");
                return Err(refused(540, text));
            }
        }
    }
    let dead_lettered = dead_letter_exchange.is_some();
    if let Some(behaviour) = overflow_value(config.max_length, overflow.as_deref(), dead_lettered)?
    {
        config.overflow = behaviour;
    }
    // The declare makes the queue's holding queue its dead-letter queue.
    match (dead_letter_exchange, dead_letter_key) {
        (None, Some(_)) => Err(refused(
            406,
            "PRECONDITION_FAILED - x-dead-letter-routing-key needs x-dead-letter-exchange".into(),
        )),
        _ => Ok(config),
    }
}

/// The overflow behaviour `x-overflow` (`overflow`) asks of a queue with `max_length`,
/// where it is not the config's own (`RejectPublish`). RabbitMQ's default, `drop-head`,
/// drops the head of a full queue; where there is no limit the config's is kept, so that
/// a queue's config is the same whether or not the declare says `drop-head`. A queue that
/// dead-letters (`dead_lettered`) may not drop its head: leasemqd would not dead-letter
/// it.
fn overflow_value(
    max_length: Option<usize>,
    overflow: Option<&str>,
    dead_lettered: bool,
) -> Result<Option<Overflow>, Refused> {
    match (max_length, overflow) {
        (_, Some("reject-publish")) | (None, None | Some("drop-head")) => Ok(None),
        (Some(_), None | Some("drop-head")) if dead_lettered => Err(refused(
            406,
            "PRECONDITION_FAILED - x-max-length with drop-head overflow (RabbitMQ's default) and x-dead-letter-exchange is not supported: leasemqd drops the head and does not dead-letter it; add x-overflow=reject-publish".into(),
        )),
        (Some(_), None | Some("drop-head")) => Ok(Some(Overflow::DropHead)),
        (_, Some(other @ "reject-publish-dlx")) => Err(refused(
            540,
            format!("x-overflow '{other}' is not supported by leasemqd: only drop-head and reject-publish"),
        )),
        // Not an overflow behaviour at all: the client's mistake, as RabbitMQ's 406.
        (_, Some(other)) => Err(invalid_arg(
            "x-overflow",
            format!("'{other}' is not one of drop-head, reject-publish, reject-publish-dlx"),
        )),
    }
}

/// `x-queue-type`: a classic or quorum queue is one kind of queue here (that a quorum
/// queue is durable, the declare checks); a stream is not served (540); anything else is
/// the client's mistake, as RabbitMQ's 406.
fn queue_type_value(value: &AMQPValue) -> Result<(), Refused> {
    let key = "x-queue-type";
    match string(key, value)?.as_str() {
        "classic" | "quorum" => Ok(()),
        "stream" => {
            let text = "queue type 'stream' is not supported by leasemqd".to_string();
            Err(refused(540, text))
        }
        other => {
            let why = format!("unknown queue type '{other}' (classic, quorum or stream)");
            Err(invalid_arg(key, why))
        }
    }
}

/// Checks the value of argument `key`, one the declare reads where it is used.
fn check_value(key: &str, value: &AMQPValue) -> Result<(), Refused> {
    match key {
        "x-expires" => expires_value(value).map(drop),
        "x-message-ttl" => message_ttl_value(value).map(drop),
        "x-queue-mode" => queue_mode_value(value).map(drop),
        "x-single-active-consumer" => single_active_value(value).map(drop),
        "x-queue-version" => queue_version_value(value).map(drop),
        "x-dead-letter-strategy" => dead_letter_strategy_value(value),
        _ => locator_value(key, value).map(drop),
    }
}

/// Where the declare's dead letters go: its `x-dead-letter-exchange`, with its
/// `x-dead-letter-routing-key` if it has one; `None` without the exchange. The values are
/// those [`queue_config`] took.
pub fn dead_letter_route(arguments: &FieldTable) -> Option<Route> {
    let text = |key: &str| match arguments.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    };
    Some(Route {
        exchange: text("x-dead-letter-exchange")?,
        routing_key: text("x-dead-letter-routing-key"),
    })
}

/// The declare's `x-message-ttl`, in milliseconds: how long a message may wait in the
/// queue before it expires (a consumer or `basic.get` that reaches it then drops it).
/// `None` without one.
///
/// # Errors
///
/// RabbitMQ's 406 for a value that is not a non-negative integer, or is too large.
pub fn message_ttl(arguments: &FieldTable) -> Result<Option<u64>, Refused> {
    let value = arguments.inner().get("x-message-ttl");
    value.map(message_ttl_value).transpose()
}

fn message_ttl_value(value: &AMQPValue) -> Result<u64, Refused> {
    match non_negative("x-message-ttl", value)? {
        n if n > crate::content::MAX_TTL_MS => Err(invalid_arg(
            "x-message-ttl",
            format!("{{value_too_large,{n}}}"),
        )),
        n => Ok(n),
    }
}

/// `x-max-priority`, the queue's highest priority level: from 0 (one level) to 255, as
/// RabbitMQ takes it (its `MAX_SUPPORTED_PRIORITY`; a message's `priority` is an octet).
fn max_priority_value(value: &AMQPValue) -> Result<u8, Refused> {
    let n = non_negative("x-max-priority", value)?;
    u8::try_from(n)
        .map_err(|_| invalid_arg("x-max-priority", format!("{{max_value_exceeded,{n}}}")))
}

/// The declare's `x-single-active-consumer`: one consumer of the queue at a time gets its
/// messages, the others waiting their turn in the order they came (`None` without it).
///
/// # Errors
///
/// RabbitMQ's 406 for a value that is not a boolean.
pub fn single_active_consumer(arguments: &FieldTable) -> Result<Option<bool>, Refused> {
    let value = arguments.inner().get("x-single-active-consumer");
    value.map(single_active_value).transpose()
}

/// What a `basic.consume`'s arguments ask, checked as RabbitMQ checks them (its
/// `check_consume_arguments`): `x-priority`, an integer of any width (0 without one; every
/// integer type of a field table fits in an `i64`); `x-consumer-timeout`, the consumer's
/// own lease in milliseconds (RabbitMQ 3.12's consumer timeout), 1 ms to 7 days; and
/// `x-cancel-on-ha-failover`, a boolean that asks to hear of a mirrored queue's failover (a
/// leasemqd queue has no mirrors, so there is nothing to tell).
///
/// # Errors
///
/// RabbitMQ's 406 for a value of these that it refuses; 540 for any other argument, which
/// is refused rather than ignored.
pub fn consume_options(arguments: &FieldTable) -> Result<ConsumeOptions, Refused> {
    // RabbitMQ's order: `x-priority`, then `x-cancel-on-ha-failover`; then what is not
    // served, whatever the keys' order.
    let table = arguments.inner();
    let mut options = ConsumeOptions::default();
    if let Some(value) = table.get("x-priority") {
        let n = integer_arg("x-priority", value)?;
        options.priority = i64::try_from(n).expect("a field table's integers are 64 bits at most");
    }
    if let Some(value) = table.get("x-consumer-timeout") {
        let ms = non_negative("x-consumer-timeout", value)?;
        let lease = Duration::from_millis(ms);
        if !(leasemq::MIN_ACK_TIMEOUT..=leasemq::MAX_DURATION).contains(&lease) {
            let why = format!("{{value_out_of_range,{ms}}}: from 1 ms to 7 days");
            return Err(invalid_arg("x-consumer-timeout", why));
        }
        options.ack_timeout = Some(lease);
    }
    if let Some(value) = table.get("x-cancel-on-ha-failover") {
        if !matches!(value, AMQPValue::Boolean(_)) {
            let why = format!("{{unacceptable_type,{}}}", type_name(value));
            return Err(invalid_arg("x-cancel-on-ha-failover", why));
        }
    }
    let served = [
        "x-priority",
        "x-consumer-timeout",
        "x-cancel-on-ha-failover",
    ];
    if let Some(other) = table.keys().find(|k| !served.contains(&k.as_str())) {
        let text = format!("consumer argument '{other}' is not supported by leasemqd yet");
        return Err(refused(540, text));
    }
    Ok(options)
}

fn single_active_value(value: &AMQPValue) -> Result<bool, Refused> {
    match value {
        AMQPValue::Boolean(b) => Ok(*b),
        other => Err(invalid_arg(
            "x-single-active-consumer",
            format!("{{unacceptable_type,{}}}", type_name(other)),
        )),
    }
}

/// RabbitMQ's hints on how and where it keeps a queue: `x-queue-mode` (`default` or
/// `lazy`) and `x-queue-version` (1 or 2) for a classic queue's messages, and which node of
/// a cluster the queue lives on, `x-queue-master-locator` for a classic queue and
/// `x-queue-leader-locator` for a quorum one. They change nothing here (a queue keeps its
/// messages in memory, and a durable one on disk as well, on the one node there is,
/// whatever they say), and are kept so that a redeclare is compared as RabbitMQ compares
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageHints {
    /// `x-queue-mode`.
    pub mode: Option<String>,
    /// `x-queue-version`.
    pub version: Option<u8>,
    /// `x-queue-master-locator`.
    pub master_locator: Option<String>,
    /// `x-queue-leader-locator`.
    pub leader_locator: Option<String>,
}

/// The declare's [`StorageHints`].
///
/// # Errors
///
/// RabbitMQ's 406 for a mode or version it does not know.
pub fn storage_hints(arguments: &FieldTable) -> Result<StorageHints, Refused> {
    let args = arguments.inner();
    Ok(StorageHints {
        mode: args.get("x-queue-mode").map(queue_mode_value).transpose()?,
        version: (args.get("x-queue-version"))
            .map(queue_version_value)
            .transpose()?,
        master_locator: (args.get("x-queue-master-locator"))
            .map(|v| locator_value("x-queue-master-locator", v))
            .transpose()?,
        leader_locator: (args.get("x-queue-leader-locator"))
            .map(|v| locator_value("x-queue-leader-locator", v))
            .transpose()?,
    })
}

/// A locator, `key` being `x-queue-master-locator` or `x-queue-leader-locator`: one of the
/// values RabbitMQ 3.10 takes for it, as a long string (the leader locator's `random` and
/// `least-leaders` are its older names for `balanced`). Its refusals are RabbitMQ's words
/// (for a master locator it does not know, RabbitMQ 3.10 fails with 541 instead).
fn locator_value(key: &str, value: &AMQPValue) -> Result<String, Refused> {
    let AMQPValue::LongString(text) = value else {
        return Err(invalid_arg(
            key,
            format!("{{unacceptable_type,{}}}", type_name(value)),
        ));
    };
    let (known, why): (&[&str], _) = match key {
        "x-queue-master-locator" => (
            &["client-local", "min-masters", "random"],
            "invalid_queue_master_locator_arg",
        ),
        _ => (
            &["client-local", "balanced", "random", "least-leaders"],
            "invalid_queue_locator_arg",
        ),
    };
    match std::str::from_utf8(text.as_bytes()) {
        Ok(locator) if known.contains(&locator) => Ok(locator.to_string()),
        _ => Err(invalid_arg(key, why)),
    }
}

fn queue_mode_value(value: &AMQPValue) -> Result<String, Refused> {
    let mode = string("x-queue-mode", value)?;
    match mode.as_str() {
        "default" | "lazy" => Ok(mode),
        other => Err(invalid_arg(
            "x-queue-mode",
            format!("\"unsupported queue mode '{other}'\""),
        )),
    }
}

/// `x-dead-letter-strategy`, as RabbitMQ's quorum queues take it: `at-most-once` or
/// `at-least-once` (a classic queue refuses it, as in RabbitMQ: `vhost/declare.rs`). Both
/// are taken, and leasemqd dead-letters one way whichever is asked (`dead_letter.rs`): a
/// dead letter waits in its queue's holding queue until its exchange has routed it, so a
/// crash never loses one and may route one twice. A dead letter the exchange routes
/// nowhere, or that a full queue refuses, is dropped and counted, as under `at-most-once`;
/// RabbitMQ's `at-least-once` would keep it and try again.
fn dead_letter_strategy_value(value: &AMQPValue) -> Result<(), Refused> {
    let key = "x-dead-letter-strategy";
    let strategy = match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        other => {
            let why = format!("{{unacceptable_type,{}}}", type_name(other));
            return Err(invalid_arg(key, why));
        }
    };
    match strategy.as_str() {
        "at-most-once" | "at-least-once" => Ok(()),
        _ => Err(invalid_arg(key, "invalid_dlx_strategy")),
    }
}

fn queue_version_value(value: &AMQPValue) -> Result<u8, Refused> {
    match non_negative("x-queue-version", value)? {
        1 => Ok(1),
        2 => Ok(2),
        other => Err(invalid_arg(
            "x-queue-version",
            format!("\"unsupported queue version '{other}'\""),
        )),
    }
}

/// The declare's `x-expires`, in milliseconds: how long the queue may go unused before it
/// is deleted (RabbitMQ's queue TTL). `None` without one.
///
/// # Errors
///
/// RabbitMQ's 406 for a value that is not an integer from 1 to 2^32 - 1.
pub fn expires(arguments: &FieldTable) -> Result<Option<u32>, Refused> {
    let value = arguments.inner().get("x-expires");
    value.map(expires_value).transpose()
}

fn expires_value(value: &AMQPValue) -> Result<u32, Refused> {
    let invalid = |why: String| invalid_arg("x-expires", why);
    match integer_arg("x-expires", value)? {
        0 => Err(invalid("{value_zero,0}".into())),
        n if n < 0 => Err(invalid(format!("{{value_negative,{n}}}"))),
        n => u32::try_from(n).map_err(|_| invalid(format!("{{value_too_large,{n}}}"))),
    }
}

/// Argument `key`'s value, an integer of any width, as RabbitMQ's `check_int_arg` takes it.
fn integer_arg(key: &str, value: &AMQPValue) -> Result<i128, Refused> {
    signed(value).ok_or_else(|| {
        invalid_arg(
            key,
            format!("\"expected integer, got {}\"", type_name(value)),
        )
    })
}

/// Argument `key`'s value, a non-negative integer of any width, as RabbitMQ's
/// `check_non_neg_int_arg` takes it.
fn non_negative(key: &str, value: &AMQPValue) -> Result<u64, Refused> {
    let n = integer_arg(key, value)?;
    u64::try_from(n).map_err(|_| invalid_arg(key, format!("{{value_negative,{n}}}")))
}

fn string(key: &str, value: &AMQPValue) -> Result<String, Refused> {
    match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec())
            .map_err(|_| refused(406, format!("PRECONDITION_FAILED - {key} is not UTF-8"))),
        AMQPValue::ShortString(s) => Ok(s.as_str().to_string()),
        other => Err(refused(
            406,
            format!("PRECONDITION_FAILED - {key} must be a string, not {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (k, v) in pairs {
            table.insert((*k).into(), v.clone());
        }
        table
    }

    #[test]
    fn no_arguments_keep_the_config() {
        assert_eq!(
            queue_config(&FieldTable::default(), QueueConfig::default()),
            Ok(QueueConfig::default())
        );
    }

    #[test]
    fn a_dead_letter_exchange_is_a_route_and_no_queue_of_the_config() {
        let table = args(&[
            (
                "x-dead-letter-exchange",
                AMQPValue::LongString("dlx".into()),
            ),
            (
                "x-dead-letter-routing-key",
                AMQPValue::LongString("jobs.dead".into()),
            ),
        ]);
        let config = queue_config(&table, QueueConfig::default()).unwrap();
        assert_eq!(
            config.dead_letter, None,
            "the declare sets the holding queue"
        );
        let route = Route {
            exchange: "dlx".into(),
            routing_key: Some("jobs.dead".into()),
        };
        assert_eq!(dead_letter_route(&table), Some(route));
        let table = args(&[("x-dead-letter-exchange", AMQPValue::LongString("".into()))]);
        assert!(queue_config(&table, QueueConfig::default()).is_ok());
        let keyless = dead_letter_route(&table).unwrap();
        assert_eq!((keyless.exchange.as_str(), keyless.routing_key), ("", None));
        assert_eq!(dead_letter_route(&FieldTable::default()), None);
        let keyed = args(&[(
            "x-dead-letter-routing-key",
            AMQPValue::LongString("k".into()),
        )]);
        assert_eq!(refusal_code(&keyed), 406);
    }

    /// The reply code a declare with these arguments is refused with.
    fn refusal_code(table: &FieldTable) -> u16 {
        queue_config(table, QueueConfig::default())
            .unwrap_err()
            .code
    }

    #[test]
    fn a_dead_letter_routing_key_without_an_exchange_is_a_406() {
        let table = args(&[(
            "x-dead-letter-routing-key",
            AMQPValue::LongString("d".into()),
        )]);
        assert_eq!(refusal_code(&table), 406);
    }

    #[test]
    fn consumer_timeout_is_the_lease_length() {
        let table = args(&[("x-consumer-timeout", AMQPValue::LongLongInt(90_000))]);
        let config = queue_config(&table, QueueConfig::default()).unwrap();
        assert_eq!(config.ack_timeout, Duration::from_secs(90));
        let table = args(&[("x-consumer-timeout", AMQPValue::LongLongInt(-1))]);
        assert_eq!(refusal_code(&table), 406);
        let table = args(&[("x-consumer-timeout", AMQPValue::LongString("soon".into()))]);
        assert_eq!(refusal_code(&table), 406);
    }

    #[test]
    fn a_dead_letter_strategy_is_taken_as_quorum_queues_take_it() {
        let dlx = (
            "x-dead-letter-exchange",
            AMQPValue::LongString("dlx".into()),
        );
        for strategy in ["at-most-once", "at-least-once"] {
            let value = AMQPValue::LongString(strategy.into());
            let table = args(&[dlx.clone(), ("x-dead-letter-strategy", value)]);
            assert!(
                queue_config(&table, QueueConfig::default()).is_ok(),
                "{strategy}"
            );
        }
        let table = args(&[(
            "x-dead-letter-strategy",
            AMQPValue::LongString("exactly-once".into()),
        )]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        assert_eq!(refused.code, 406);
        assert!(
            refused.text.contains("x-dead-letter-strategy"),
            "{}",
            refused.text
        );
        let table = args(&[("x-dead-letter-strategy", AMQPValue::LongInt(1))]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        let expected = "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': {unacceptable_type,signedint}";
        assert_eq!(refused.for_queue("q", "/").text, expected);
    }

    #[test]
    fn other_arguments_are_refused_not_ignored() {
        let table = args(&[("x-max-length-bytes", AMQPValue::LongInt(10))]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        assert_eq!(refused.code, 540);
        assert!(refused.text.contains("x-max-length-bytes"));
        let table = args(&[("x-queue-type", AMQPValue::LongString("stream".into()))]);
        assert_eq!(refusal_code(&table), 540);
    }

    #[test]
    fn delivery_limit_counts_returns_as_rabbitmq_does() {
        let table = args(&[("x-delivery-limit", AMQPValue::LongInt(3))]);
        let config = queue_config(&table, QueueConfig::default()).unwrap();
        assert_eq!(config.max_deliveries, Some(4));
        let table = args(&[("x-delivery-limit", AMQPValue::LongInt(-1))]);
        assert_eq!(refusal_code(&table), 406);
    }

    #[test]
    fn max_length_drops_the_head_unless_the_declare_says_reject_publish() {
        let with = |overflow: Option<&str>, limit: Option<i32>| {
            let mut pairs = Vec::new();
            if let Some(n) = limit {
                pairs.push(("x-max-length", AMQPValue::LongInt(n)));
            }
            if let Some(o) = overflow {
                pairs.push(("x-overflow", AMQPValue::LongString(o.into())));
            }
            queue_config(&args(&pairs), QueueConfig::default())
        };
        let config = with(Some("reject-publish"), Some(10)).unwrap();
        assert_eq!(
            (config.max_length, config.overflow),
            (Some(10), Overflow::RejectPublish)
        );
        for overflow in [None, Some("drop-head")] {
            let config = with(overflow, Some(10)).unwrap();
            assert_eq!(
                (config.max_length, config.overflow),
                (Some(10), Overflow::DropHead)
            );
            // Without a limit the overflow means nothing, and the config is the default.
            assert_eq!(with(overflow, None).unwrap(), QueueConfig::default());
        }
        let refused = with(Some("reject-publish-dlx"), Some(10)).unwrap_err();
        assert_eq!(refused.code, 540);
        // The dropped head would be dead-lettered by RabbitMQ, and is not here.
        let table = args(&[
            ("x-max-length", AMQPValue::LongInt(10)),
            (
                "x-dead-letter-exchange",
                AMQPValue::LongString("dlx".into()),
            ),
        ]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        assert_eq!(refused.code, 406);
        assert!(
            refused.text.contains("x-overflow=reject-publish"),
            "{}",
            refused.text
        );
        let table = args(&[
            ("x-max-length", AMQPValue::LongInt(10)),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
            (
                "x-dead-letter-exchange",
                AMQPValue::LongString("dlx".into()),
            ),
        ]);
        assert!(queue_config(&table, QueueConfig::default()).is_ok());
    }

    #[test]
    fn a_value_rabbitmq_does_not_know_either_is_a_406_not_a_missing_feature() {
        let table = args(&[
            ("x-max-length", AMQPValue::LongInt(10)),
            ("x-overflow", AMQPValue::LongString("bogus".into())),
        ]);
        assert_eq!(refusal_code(&table), 406);
        let table = args(&[("x-queue-type", AMQPValue::LongString("bogus".into()))]);
        assert_eq!(refusal_code(&table), 406);
    }

    #[test]
    fn expires_is_a_positive_32_bit_count_of_milliseconds_as_in_rabbitmq() {
        let table = args(&[("x-expires", AMQPValue::LongInt(1_500))]);
        assert_eq!(expires(&table), Ok(Some(1_500)));
        assert_eq!(
            queue_config(&table, QueueConfig::default()),
            Ok(QueueConfig::default()),
            "not part of the config"
        );
        assert_eq!(expires(&FieldTable::default()), Ok(None));
        let max = args(&[("x-expires", AMQPValue::LongLongInt(u32::MAX.into()))]);
        assert_eq!(expires(&max), Ok(Some(u32::MAX)));
        for (value, why) in [
            (AMQPValue::LongInt(0), "{value_zero,0}"),
            (AMQPValue::LongInt(-5), "{value_negative,-5}"),
            (
                AMQPValue::LongLongInt(1 << 40),
                "{value_too_large,1099511627776}",
            ),
            (
                AMQPValue::LongString("100".into()),
                "\"expected integer, got longstr\"",
            ),
        ] {
            let table = args(&[("x-expires", value)]);
            let refused = expires(&table).unwrap_err();
            assert_eq!(refused.code, 406);
            assert!(refused.text.ends_with(why), "{}", refused.text);
            assert_eq!(refusal_code(&table), 406, "the declare refuses it too");
        }
    }

    #[test]
    fn single_active_consumer_is_a_boolean() {
        let sac = |value: AMQPValue| args(&[("x-single-active-consumer", value)]);
        assert_eq!(
            single_active_consumer(&sac(AMQPValue::Boolean(true))),
            Ok(Some(true))
        );
        assert_eq!(single_active_consumer(&FieldTable::default()), Ok(None));
        let yes = sac(AMQPValue::LongString("yes".into()));
        let refused = single_active_consumer(&yes).unwrap_err();
        assert_eq!(refused.code, 406);
        assert!(
            refused.text.contains("unacceptable_type,longstr"),
            "{}",
            refused.text
        );
        assert_eq!(refusal_code(&yes), 406, "the declare refuses it too");
    }

    #[test]
    fn queue_mode_and_version_are_hints_checked_as_rabbitmq_checks_them() {
        let hints = args(&[
            ("x-queue-mode", AMQPValue::LongString("lazy".into())),
            ("x-queue-version", AMQPValue::ShortShortUInt(2)),
        ]);
        assert!(queue_config(&hints, QueueConfig::default()).is_ok());
        let expected = StorageHints {
            mode: Some("lazy".into()),
            version: Some(2),
            ..StorageHints::default()
        };
        assert_eq!(storage_hints(&hints), Ok(expected));
        assert_eq!(
            storage_hints(&FieldTable::default()),
            Ok(StorageHints::default())
        );
        for (bad, why) in [
            (
                ("x-queue-mode", AMQPValue::LongString("eager".into())),
                "unsupported queue mode 'eager'",
            ),
            (
                ("x-queue-version", AMQPValue::LongInt(3)),
                "unsupported queue version '3'",
            ),
            (
                ("x-queue-version", AMQPValue::LongString("2".into())),
                "\"expected integer, got longstr\"",
            ),
        ] {
            let bad = args(&[bad]);
            let refused = storage_hints(&bad).unwrap_err();
            assert_eq!(refused.code, 406);
            assert!(refused.text.contains(why), "{}", refused.text);
            assert_eq!(refusal_code(&bad), 406, "the declare refuses it too");
        }
    }

    #[test]
    fn locators_are_hints_checked_as_rabbitmq_checks_them() {
        let text = |s: &str| AMQPValue::LongString(s.into());
        let hints = args(&[
            ("x-queue-master-locator", text("min-masters")),
            ("x-queue-leader-locator", text("least-leaders")),
        ]);
        assert!(queue_config(&hints, QueueConfig::default()).is_ok());
        let expected = StorageHints {
            master_locator: Some("min-masters".into()),
            leader_locator: Some("least-leaders".into()),
            ..StorageHints::default()
        };
        assert_eq!(storage_hints(&hints), Ok(expected));
        for (bad, why) in [
            (
                ("x-queue-master-locator", text("balanced")),
                "invalid_queue_master_locator_arg",
            ),
            (
                ("x-queue-leader-locator", text("min-masters")),
                "invalid_queue_locator_arg",
            ),
            (
                ("x-queue-leader-locator", AMQPValue::LongInt(5)),
                "{unacceptable_type,signedint}",
            ),
            (
                (
                    "x-queue-master-locator",
                    AMQPValue::ShortString("random".into()),
                ),
                "{unacceptable_type,shortstr}",
            ),
        ] {
            let bad = args(&[bad]);
            let refused = storage_hints(&bad).unwrap_err();
            assert_eq!(refused.code, 406);
            assert!(refused.text.ends_with(why), "{}", refused.text);
            assert_eq!(refusal_code(&bad), 406, "the declare refuses it too");
        }
    }

    #[test]
    fn message_ttl_is_checked_as_rabbitmq_checks_it_and_served_with_dead_lettering() {
        let ttl = |value: AMQPValue| args(&[("x-message-ttl", value)]);
        let ten_years = AMQPValue::LongLongInt(315_360_000_000);
        for ok in [
            AMQPValue::LongInt(60_000),
            AMQPValue::ShortShortUInt(0),
            ten_years,
        ] {
            assert!(queue_config(&ttl(ok.clone()), QueueConfig::default()).is_ok());
        }
        assert_eq!(
            message_ttl(&ttl(AMQPValue::LongInt(60_000))),
            Ok(Some(60_000))
        );
        assert_eq!(message_ttl(&FieldTable::default()), Ok(None));
        for (bad, why) in [
            (AMQPValue::LongInt(-1), "{value_negative,-1}"),
            (AMQPValue::LongLongInt(1 << 60), "value_too_large"),
            (
                AMQPValue::LongLongInt(315_360_000_001),
                "{value_too_large,315360000001}",
            ),
            (
                AMQPValue::LongString("soon".into()),
                "expected integer, got longstr",
            ),
        ] {
            let refused = message_ttl(&ttl(bad.clone())).unwrap_err();
            assert_eq!(refused.code, 406);
            assert!(refused.text.contains(why), "{}", refused.text);
            assert_eq!(refusal_code(&ttl(bad)), 406, "the declare refuses it too");
        }
        let mut with_dlx = ttl(AMQPValue::LongInt(1_000));
        with_dlx.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        assert!(
            queue_config(&with_dlx, QueueConfig::default()).is_ok(),
            "expired messages are dead-lettered"
        );
    }

    #[test]
    fn max_priority_takes_0_to_255_of_any_integer_type_as_rabbitmq_does() {
        let priority = |value: AMQPValue| args(&[("x-max-priority", value)]);
        for (value, max) in [
            (AMQPValue::ShortShortUInt(0), 0),
            (AMQPValue::LongInt(10), 10),
            (AMQPValue::ShortInt(255), 255),
            (AMQPValue::LongLongInt(7), 7),
        ] {
            let config = queue_config(&priority(value), QueueConfig::default()).unwrap();
            assert_eq!(config.max_priority, Some(max));
        }
        let none = queue_config(&FieldTable::default(), QueueConfig::default()).unwrap();
        assert_eq!(
            none.max_priority, None,
            "no priorities without the argument"
        );
        for (value, why) in [
            (AMQPValue::LongInt(256), "{max_value_exceeded,256}"),
            (
                AMQPValue::LongLongInt(1 << 40),
                "{max_value_exceeded,1099511627776}",
            ),
            (AMQPValue::LongInt(-1), "{value_negative,-1}"),
            (
                AMQPValue::LongString("5".into()),
                "\"expected integer, got longstr\"",
            ),
            (AMQPValue::Boolean(true), "\"expected integer, got bool\""),
        ] {
            let refused = queue_config(&priority(value), QueueConfig::default()).unwrap_err();
            assert_eq!(refused.code, 406);
            let expected = format!("PRECONDITION_FAILED - invalid arg 'x-max-priority': {why}");
            assert_eq!(refused.text, expected);
        }
    }

    #[test]
    fn the_declare_names_its_queue_in_rabbitmqs_text_for_a_value_it_does_not_take() {
        let table = args(&[("x-max-priority", AMQPValue::LongInt(256))]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        assert_eq!(
            refused.for_queue("jobs", "/").text,
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'jobs' in vhost '/': {max_value_exceeded,256}"
        );
        let table = args(&[("x-message-ttl", AMQPValue::LongInt(-1))]);
        assert_eq!(
            queue_config(&table, QueueConfig::default()).unwrap_err().for_queue("jobs", "/").text,
            "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'jobs' in vhost '/': {value_negative,-1}"
        );
        // Texts of leasemqd's own are left as they are.
        let table = args(&[("x-max-length-bytes", AMQPValue::LongInt(10))]);
        let refused = queue_config(&table, QueueConfig::default()).unwrap_err();
        assert_eq!(refused.clone().for_queue("jobs", "/"), refused);
    }
}
