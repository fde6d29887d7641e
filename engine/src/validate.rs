//! Checks of names, configs and messages (contract §3 Limits). Each broken limit is an
//! error, never a clamp. The engine runs them before it changes anything; the shard crate's
//! handles run the ones they can without a round trip to the shard.

use std::time::Duration;

use crate::types::{
    ConsumerConfig, Error, Message, QueueConfig, MAX_BODY_LIMIT, MAX_DURATION, MAX_ID_BYTES,
    MAX_NAME_BYTES, MAX_PREFETCH, MIN_ACK_TIMEOUT,
};

/// Queue names: 1–255 bytes of `[A-Za-z0-9._:-]`.
///
/// # Errors
///
/// [`Error::InvalidName`] for a name that is empty, longer than 255 bytes, or has a byte
/// outside that set.
pub fn queue_name(name: &str) -> Result<(), Error> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.bytes().all(allowed) {
        return Err(Error::InvalidName);
    }
    Ok(())
}

/// Consumer names: 1–255 bytes of UTF-8 (a `&str` is UTF-8 already).
///
/// # Errors
///
/// [`Error::InvalidName`] for a name that is empty or longer than 255 bytes.
pub fn consumer_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidName);
    }
    Ok(())
}

/// A consumer's config: a prefetch from 1 to [`MAX_PREFETCH`].
///
/// # Errors
///
/// [`Error::InvalidConfig`] for a prefetch of 0 or over [`MAX_PREFETCH`], saying so.
pub fn consumer_config(config: &ConsumerConfig) -> Result<(), Error> {
    if config.prefetch == 0 || config.prefetch > MAX_PREFETCH {
        return Err(Error::InvalidConfig(format!(
            "prefetch must be from 1 to {MAX_PREFETCH}, got {}",
            config.prefetch
        )));
    }
    Ok(())
}

/// Checks a consumer's own lease ([`ConsumeOptions::ack_timeout`](crate::ConsumeOptions))
/// against the limits of a queue's `ack_timeout` and the queue's `max_lease`.
///
/// # Errors
///
/// [`Error::InvalidConfig`] for a lease outside 1 ms to 7 days, or over `max_lease`.
pub fn consumer_lease(lease: Duration, max_lease: Option<Duration>) -> Result<(), Error> {
    if !(MIN_ACK_TIMEOUT..=MAX_DURATION).contains(&lease) {
        return invalid(format!(
            "a consumer's ack_timeout must be between 1 ms and 7 days, got {lease:?}"
        ));
    }
    match max_lease {
        Some(max) if lease > max => invalid(format!(
            "a consumer's ack_timeout ({lease:?}) must be at most the queue's max_lease ({max:?})"
        )),
        _ => Ok(()),
    }
}

fn invalid(what: String) -> Result<(), Error> {
    Err(Error::InvalidConfig(what))
}

/// Checks a queue's config on its own; whether its `dead_letter` queue exists is the
/// broker's question, since that queue may live on another shard.
///
/// # Errors
///
/// [`Error::InvalidConfig`], naming the first field out of its limits: `ack_timeout` outside
/// 1 ms to 7 days, `max_lease` under `ack_timeout`, `retry.multiplier` under 1.0 or not
/// finite, `retry.jitter` outside 0.0 to 1.0, `retry.initial` or `retry.max` over 7 days,
/// `max_deliveries` or `max_length` of 0, `max_body_bytes` outside 1 to 64 MiB,
/// `dedup_window` over 7 days, or a `dead_letter` that names queue `name` itself or is not a
/// valid queue name.
pub fn queue_config(name: &str, config: &QueueConfig) -> Result<(), Error> {
    let ack = config.ack_timeout;
    if !(MIN_ACK_TIMEOUT..=MAX_DURATION).contains(&ack) {
        return invalid(format!(
            "ack_timeout must be between 1 ms and 7 days, got {ack:?}"
        ));
    }
    if let Some(max_lease) = config.max_lease {
        if max_lease < ack {
            return invalid(format!(
                "max_lease ({max_lease:?}) must be at least ack_timeout ({ack:?})"
            ));
        }
    }
    let retry = &config.retry;
    if retry.multiplier.is_nan() || retry.multiplier < 1.0 || retry.multiplier.is_infinite() {
        return invalid(format!(
            "retry.multiplier must be a finite number >= 1.0, got {}",
            retry.multiplier
        ));
    }
    if !(0.0..=1.0).contains(&retry.jitter) {
        return invalid(format!(
            "retry.jitter must be in [0, 1], got {}",
            retry.jitter
        ));
    }
    for (field, value) in [("retry.initial", retry.initial), ("retry.max", retry.max)] {
        if value > MAX_DURATION {
            return invalid(format!("{field} must be at most 7 days, got {value:?}"));
        }
    }
    if config.max_deliveries == Some(0) {
        return invalid("max_deliveries must be at least 1".to_string());
    }
    if config.max_length == Some(0) {
        return invalid("max_length must be at least 1".to_string());
    }
    if config.max_body_bytes == 0 || config.max_body_bytes > MAX_BODY_LIMIT {
        return invalid(format!(
            "max_body_bytes must be from 1 to {MAX_BODY_LIMIT} (64 MiB), got {}",
            config.max_body_bytes
        ));
    }
    if config.dedup_window > MAX_DURATION {
        return invalid(format!(
            "dedup_window must be at most 7 days, got {:?}",
            config.dedup_window
        ));
    }
    if let Some(dead_letter) = &config.dead_letter {
        if dead_letter == name {
            return invalid(format!(
                "dead_letter must name another queue, not {name:?} itself"
            ));
        }
        queue_name(dead_letter).map_err(|_| {
            Error::InvalidConfig(format!(
                "dead_letter {dead_letter:?} is not a valid queue name"
            ))
        })?;
    }
    Ok(())
}

/// Checks a message against a queue's limits, in the order of contract §3 Put errors: id
/// and delay (`InvalidMessage`), then the body size (`MessageTooLarge`).
///
/// # Errors
///
/// [`Error::InvalidMessage`] for an id that is empty or over [`MAX_ID_BYTES`] bytes, then
/// for a delay over 7 days; [`Error::MessageTooLarge`] for a body over `max_body_bytes`.
pub fn message(message: &Message, max_body_bytes: usize) -> Result<(), Error> {
    if let Some(id) = &message.id {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return Err(Error::InvalidMessage(format!(
                "the id must be 1 to {MAX_ID_BYTES} bytes, got {} bytes",
                id.len()
            )));
        }
    }
    if message.delay > MAX_DURATION {
        return Err(Error::InvalidMessage(format!(
            "the delay must be at most 7 days, got {:?}",
            message.delay
        )));
    }
    if message.body.len() > max_body_bytes {
        return Err(Error::MessageTooLarge);
    }
    Ok(())
}

/// `nack_with_delay` accepts a delay of at most 7 days.
pub fn nack_delay(delay: Duration) -> bool {
    delay <= MAX_DURATION
}
