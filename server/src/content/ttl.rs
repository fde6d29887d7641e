//! Message TTL in a stored body: the arrival stamp, and when a message expires.

use super::{split, PropertiesSeen, OWN_TTL, STAMP, TIMED};

/// Stamps a body made by [`stored_start`](super::stored_start) (whose payload may follow
/// already) with its arrival, `at` milliseconds since the Unix epoch, and whether its
/// message has an `expiration` of its own (`own_ttl`); a body stamped before keeps its
/// stamp.
pub fn stamp(stored: &mut Vec<u8>, at: u64, own_ttl: bool) {
    if stored.first().is_some_and(|format| format & TIMED == 0) {
        stored[0] |= if own_ttl { TIMED | OWN_TTL } else { TIMED };
        // Moved up in place (`start` left room): no allocation.
        let len = stored.len();
        stored.resize(len + STAMP, 0);
        stored.copy_within(1..len, 1 + STAMP);
        stored[1..1 + STAMP].copy_from_slice(&at.to_be_bytes());
    }
}

/// Whether the message in `body` was stamped as having an `expiration` of its own.
pub fn has_own_ttl(body: &[u8]) -> bool {
    body.first().is_some_and(|format| format & OWN_TTL != 0)
}

/// When the message in `body` arrived, in milliseconds since the Unix epoch, if it was
/// stamped ([`stamp`]).
pub fn arrival(body: &[u8]) -> Option<u64> {
    split(body)?.arrival
}

/// When the message in `body` expires, in milliseconds since the Unix epoch: its arrival
/// plus the shorter of `queue_ttl` (the queue's `x-message-ttl`) and its own `expiration`.
/// `None` for a message that does not expire: one not stamped, or with neither (a dead
/// letter's `expiration` was taken out when it died, as RabbitMQ takes it out). `seen`
/// parses its properties.
pub fn expires_at(body: &[u8], queue_ttl: Option<u64>, seen: &mut PropertiesSeen) -> Option<u64> {
    // The common case, a message with no TTL, is told by its first byte.
    let format = *body.first()?;
    if format & TIMED == 0 || (queue_ttl.is_none() && format & OWN_TTL == 0) {
        return None;
    }
    let parts = split(body)?;
    let arrival = parts.arrival?;
    let own = (seen.check(parts.properties))
        .and_then(|p| p.expiration().as_ref().map(|e| e.as_str().to_string()))
        .and_then(|e| parse_expiration(&e).ok());
    let ttl = match (queue_ttl, own) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(arrival.saturating_add(ttl))
}

/// The longest time to live RabbitMQ takes, in milliseconds (ten years): a message's
/// `expiration` and a queue's `x-message-ttl` over it are refused with
/// `{value_too_large,N}`, so that no arrival plus its time to live is near `u64::MAX`.
pub const MAX_TTL_MS: u64 = 315_360_000_000;

/// A publish's `expiration` property: milliseconds, as RabbitMQ reads it.
///
/// # Errors
///
/// RabbitMQ's 406 text for one that is not a non-negative integer up to [`MAX_TTL_MS`].
pub fn parse_expiration(expiration: &str) -> Result<u64, String> {
    let invalid =
        |why: &str| format!("PRECONDITION_FAILED - invalid expiration '{expiration}': {why}");
    let (negative, rest) = match expiration.as_bytes().first() {
        Some(b'-') => (true, &expiration[1..]),
        Some(b'+') => (false, &expiration[1..]),
        _ => (false, expiration),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(invalid("no_integer"));
    }
    if digits < rest.len() {
        return Err(invalid(&format!(
            "{{leftover_string,\"{}\"}}",
            &rest[digits..]
        )));
    }
    let value =
        (rest.parse::<u64>()).map_err(|_| invalid(&format!("{{value_too_large,{rest}}}")))?;
    if negative && value != 0 {
        return Err(invalid(&format!("{{value_negative,{expiration}}}")));
    }
    if value > MAX_TTL_MS {
        return Err(invalid(&format!("{{value_too_large,{rest}}}")));
    }
    Ok(value)
}
