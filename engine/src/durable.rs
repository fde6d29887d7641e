//! What the log of a durable queue holds: [`Change`]s, their byte form, and log time.
//!
//! The engine stays pure: for a durable queue (contract §7) each state change that must
//! survive a restart comes out in [`Effects::log`](crate::Effects::log), and the runtime
//! writes it before anything it caused leaves the shard. At the next start the runtime
//! hands the same changes back to [`Shard::restore`](crate::Shard::restore), in order, and
//! then calls [`Shard::finish_restore`](crate::Shard::finish_restore). A snapshot is the
//! same thing in short: [`Shard::image`](crate::Shard::image) lists the changes that
//! rebuild what the durable queues hold now, so one decoder serves the log and the
//! snapshot, and a replicated log could ship either.
//!
//! What is logged is the change, not the command: the effect of a lease running out or a
//! timer firing is not logged at all, because after a restart it is what recovery does
//! anyway (a leased message is ready at once with its attempt kept; a delay or dedup
//! window that ended while the broker was down has simply ended).
//!
//! Instants are **log time**: nanoseconds on the clock the runtime gives the log (the
//! wall clock under a system clock, the manual clock's own count otherwise), so that a
//! delay or dedup window ends at the same instant after a restart (contract §7 item 2).
//! The engine maps its ticks to log time with the epoch the runtime sets
//! ([`Shard::set_log_epoch`](crate::Shard::set_log_epoch)).
//!
//! Messages and queues are named in the log by numbers that are never reused in a data
//! dir ([`Change::Counters`] carries the next ones across snapshots), not by their slots
//! in memory, so a log written by one run and continued by the next reads as one history.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

use crate::types::{DeathReason, DeathRecord, MsgId, Overflow, QueueConfig, RetryPolicy};

/// The version byte that starts every encoded batch of changes.
pub const FORMAT: u8 = 1;

/// One change to the durable state of a shard.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The log time when the changes after it were made; the runtime starts each batch with
    /// one, and a restart under the manual clock resumes from the last.
    Clock {
        /// Log time, in nanoseconds.
        now: u64,
    },
    /// The numbers to hand out next (written in snapshots, so that numbers of messages and
    /// queues that are gone are never reused).
    Counters {
        /// The next durable queue number.
        next_queue: u32,
        /// The next durable message number.
        next_seq: u64,
        /// The shard's next broker id sequence (ids stay unique across restarts).
        next_auto_id: u64,
    },
    /// A durable queue was declared.
    Declared {
        /// Its number in the log.
        queue: u32,
        /// Its name.
        name: Arc<str>,
        /// Its config.
        config: Box<QueueConfig>,
    },
    /// A durable queue was closed: it and everything in it are gone.
    Closed {
        /// Its number in the log.
        queue: u32,
    },
    /// The next delivery tag of a queue is at least `next` (written in snapshots).
    Tags {
        /// The queue's number.
        queue: u32,
        /// Its next tag.
        next: u64,
    },
    /// A message entered the queue (a put or a dead letter taken in; in a snapshot, a
    /// message it holds).
    Enqueued {
        /// The queue's number.
        queue: u32,
        /// The message's number in the log.
        seq: u64,
        /// Its id.
        id: MsgId,
        /// Its body.
        body: Bytes,
        /// Deliveries so far.
        attempt: u32,
        /// Its priority as put (`Message::with_priority`).
        priority: u8,
        /// Log time it becomes ready; `None` when it is ready now.
        ready_at: Option<u64>,
        /// Log time its id's dedup window ends; `None` without a window.
        dedup_until: Option<u64>,
        /// Set for a dead letter.
        death: Option<Box<DeathRecord>>,
    },
    /// A message was delivered (leases themselves do not survive a restart).
    Delivered {
        /// The queue's number.
        queue: u32,
        /// The message's number.
        seq: u64,
        /// The delivery's tag.
        tag: u64,
        /// The message's attempt now, this delivery included.
        attempt: u32,
    },
    /// A message came back from a lease by a nack (ready at `ready_at`) or a release (its
    /// attempt given back).
    Returned {
        /// The queue's number.
        queue: u32,
        /// The message's number.
        seq: u64,
        /// Its attempt now.
        attempt: u32,
        /// Log time it becomes ready; `None` when it is ready now.
        ready_at: Option<u64>,
    },
    /// A message left the queue for good: acked, dropped, or taken by its dead-letter queue.
    Removed {
        /// The queue's number.
        queue: u32,
        /// The message's number.
        seq: u64,
    },
    /// An id whose message is gone still counts as a duplicate until `until` (snapshots).
    Windowed {
        /// The queue's number.
        queue: u32,
        /// The id.
        id: Arc<str>,
        /// Log time the window ends.
        until: u64,
    },
}

/// A batch of changes that does not decode: damage the frame checksum did not catch, or
/// a log written by a newer version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Where in the batch, in bytes.
    pub offset: usize,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "undecodable change at byte {}: {}",
            self.offset, self.what
        )
    }
}

impl std::error::Error for DecodeError {}

/// A change that does not fit the state it is applied to (a message the log never
/// enqueued, a queue declared twice): the log and its snapshot disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreError(pub String);

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "log does not fit its state: {}", self.0)
    }
}

impl std::error::Error for RestoreError {}

const CLOCK: u8 = 0;
const COUNTERS: u8 = 1;
const DECLARED: u8 = 2;
const CLOSED: u8 = 3;
const TAGS: u8 = 4;
const ENQUEUED: u8 = 5;
const DELIVERED: u8 = 6;
const RETURNED: u8 = 7;
const REMOVED: u8 = 8;
const WINDOWED: u8 = 9;
/// `ENQUEUED` with a priority byte before the body: a message of priority 0 is written
/// as `ENQUEUED`, as before priorities existed, and a build from then refuses this kind
/// rather than lose the priority.
const ENQUEUED_WITH_PRIORITY: u8 = 10;

impl Change {
    /// Appends the change's bytes to `buf`. A batch is [`FORMAT`] followed by changes;
    /// [`begin_batch`] writes the version byte.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        match self {
            Change::Clock { now } => {
                buf.push(CLOCK);
                put_u64(buf, *now);
            }
            Change::Counters {
                next_queue,
                next_seq,
                next_auto_id,
            } => {
                buf.push(COUNTERS);
                put_u32(buf, *next_queue);
                put_u64(buf, *next_seq);
                put_u64(buf, *next_auto_id);
            }
            Change::Declared {
                queue,
                name,
                config,
            } => {
                buf.push(DECLARED);
                put_u32(buf, *queue);
                put_str(buf, name);
                put_config(buf, config);
            }
            Change::Closed { queue } => {
                buf.push(CLOSED);
                put_u32(buf, *queue);
            }
            Change::Tags { queue, next } => {
                buf.push(TAGS);
                put_u32(buf, *queue);
                put_u64(buf, *next);
            }
            Change::Windowed { queue, id, until } => {
                buf.push(WINDOWED);
                put_u32(buf, *queue);
                put_str(buf, id);
                put_u64(buf, *until);
            }
            message => message.encode_message(buf),
        }
    }

    /// [`encode`](Self::encode) of a change to one message: enqueued, delivered, returned
    /// or removed.
    fn encode_message(&self, buf: &mut Vec<u8>) {
        match self {
            Change::Enqueued {
                queue,
                seq,
                id,
                body,
                attempt,
                priority,
                ready_at,
                dedup_until,
                death,
            } => {
                buf.push(if *priority == 0 {
                    ENQUEUED
                } else {
                    ENQUEUED_WITH_PRIORITY
                });
                put_u32(buf, *queue);
                put_u64(buf, *seq);
                put_id(buf, id);
                put_u32(buf, *attempt);
                put_opt_u64(buf, *ready_at);
                put_opt_u64(buf, *dedup_until);
                put_death(buf, death.as_deref());
                if *priority != 0 {
                    buf.push(*priority);
                }
                put_bytes(buf, body);
            }
            Change::Delivered {
                queue,
                seq,
                tag,
                attempt,
            } => {
                buf.push(DELIVERED);
                put_u32(buf, *queue);
                put_u64(buf, *seq);
                put_u64(buf, *tag);
                put_u32(buf, *attempt);
            }
            Change::Returned {
                queue,
                seq,
                attempt,
                ready_at,
            } => {
                buf.push(RETURNED);
                put_u32(buf, *queue);
                put_u64(buf, *seq);
                put_u32(buf, *attempt);
                put_opt_u64(buf, *ready_at);
            }
            Change::Removed { queue, seq } => {
                buf.push(REMOVED);
                put_u32(buf, *queue);
                put_u64(buf, *seq);
            }
            // The rest are `encode`'s own.
            _ => {}
        }
    }
}

/// A message's id: a tag byte, then the broker id's number or the given id's text.
fn put_id(buf: &mut Vec<u8>, id: &MsgId) {
    match id {
        MsgId::Auto(n) => {
            buf.push(0);
            put_u64(buf, *n);
        }
        MsgId::Given(id) => {
            buf.push(1);
            put_str(buf, id);
        }
    }
}

/// A dead letter's death record, or a 0 byte for none.
fn put_death(buf: &mut Vec<u8>, death: Option<&DeathRecord>) {
    match death {
        None => buf.push(0),
        Some(death) => {
            buf.push(1);
            put_str(buf, &death.queue);
            buf.push(match death.reason {
                DeathReason::Rejected => 0,
                DeathReason::MaxDeliveries => 1,
            });
            put_u32(buf, death.attempts);
        }
    }
}

/// Starts a batch in `buf`: the version byte.
pub fn begin_batch(buf: &mut Vec<u8>) {
    buf.push(FORMAT);
}

/// Decodes a batch written by [`begin_batch`] and [`Change::encode`], calling `each` with
/// every change in order. Bodies are slices of `batch`, not copies.
///
/// # Errors
///
/// [`DecodeError`] for an unknown version or kind, a truncated field or bad UTF-8; the
/// changes before it were passed to `each`.
pub fn decode_batch(
    batch: Bytes,
    mut each: impl FnMut(Change) -> Result<(), RestoreError>,
) -> Result<Result<(), RestoreError>, DecodeError> {
    let total = batch.len();
    let mut r = Reader { buf: batch, total };
    let version = r.u8()?;
    if version != FORMAT {
        return Err(r.error(format!(
            "format version {version}, this build reads {FORMAT}"
        )));
    }
    while r.buf.has_remaining() {
        let change = r.change()?;
        if let Err(e) = each(change) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

struct Reader {
    buf: Bytes,
    total: usize,
}

impl Reader {
    fn error(&self, what: impl Into<String>) -> DecodeError {
        DecodeError {
            offset: self.total - self.buf.remaining(),
            what: what.into(),
        }
    }

    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.buf.remaining() < n {
            return Err(self.error(format!(
                "{n} more bytes needed, {} left",
                self.buf.remaining()
            )));
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.buf.get_u32_le())
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.buf.get_u64_le())
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.error(format!("flag byte {other}"))),
        }
    }

    fn opt_u64(&mut self) -> Result<Option<u64>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.u64()?)
        } else {
            None
        })
    }

    fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u32()? as usize;
        self.need(len)?;
        Ok(self.buf.split_to(len))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.error("text that is not UTF-8"))
    }

    fn duration(&mut self) -> Result<Duration, DecodeError> {
        let secs = self.u64()?;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(self.error(format!("{nanos} nanoseconds in a duration")));
        }
        Ok(Duration::new(secs, nanos))
    }

    fn config(&mut self) -> Result<QueueConfig, DecodeError> {
        let ack_timeout = self.duration()?;
        let max_lease = if self.flag()? {
            Some(self.duration()?)
        } else {
            None
        };
        let retry = RetryPolicy {
            initial: self.duration()?,
            multiplier: f64::from_bits(self.u64()?),
            max: self.duration()?,
            jitter: f64::from_bits(self.u64()?),
        };
        let max_deliveries = if self.flag()? {
            Some(self.u32()?)
        } else {
            None
        };
        let dead_letter = if self.flag()? {
            Some(self.string()?)
        } else {
            None
        };
        let dedup_window = self.duration()?;
        let max_length = self
            .opt_u64()?
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let max_body_bytes = usize::try_from(self.u64()?).unwrap_or(usize::MAX);
        let flags = self.u8()?;
        if flags > 0b111 {
            return Err(self.error(format!("queue flags {flags:#04x}")));
        }
        let durable = flags & 1 != 0;
        let overflow = if flags & 0b10 != 0 {
            Overflow::DropHead
        } else {
            Overflow::RejectPublish
        };
        let max_priority = if flags & 0b100 != 0 {
            Some(self.u8()?)
        } else {
            None
        };
        Ok(QueueConfig {
            ack_timeout,
            max_lease,
            retry,
            max_deliveries,
            dead_letter,
            dedup_window,
            max_length,
            overflow,
            max_body_bytes,
            durable,
            max_priority,
        })
    }

    /// A [`Change::Enqueued`], after its kind byte (`with_priority`: the kind that
    /// carries one).
    fn enqueued(&mut self, with_priority: bool) -> Result<Change, DecodeError> {
        let queue = self.u32()?;
        let seq = self.u64()?;
        let id = if self.flag()? {
            MsgId::Given(self.string()?.into())
        } else {
            MsgId::Auto(self.u64()?)
        };
        let attempt = self.u32()?;
        let ready_at = self.opt_u64()?;
        let dedup_until = self.opt_u64()?;
        let death = if self.flag()? {
            Some(Box::new(self.death()?))
        } else {
            None
        };
        let priority = if with_priority { self.u8()? } else { 0 };
        let body = self.bytes()?;
        Ok(Change::Enqueued {
            queue,
            seq,
            id,
            body,
            attempt,
            priority,
            ready_at,
            dedup_until,
            death,
        })
    }

    /// A death record, after the flag that says there is one.
    fn death(&mut self) -> Result<DeathRecord, DecodeError> {
        let queue = self.string()?;
        let reason = match self.u8()? {
            0 => DeathReason::Rejected,
            1 => DeathReason::MaxDeliveries,
            other => return Err(self.error(format!("death reason {other}"))),
        };
        let attempts = self.u32()?;
        Ok(DeathRecord {
            queue,
            reason,
            attempts,
        })
    }

    fn change(&mut self) -> Result<Change, DecodeError> {
        let kind = self.u8()?;
        Ok(match kind {
            CLOCK => Change::Clock { now: self.u64()? },
            COUNTERS => Change::Counters {
                next_queue: self.u32()?,
                next_seq: self.u64()?,
                next_auto_id: self.u64()?,
            },
            DECLARED => Change::Declared {
                queue: self.u32()?,
                name: self.string()?.into(),
                config: Box::new(self.config()?),
            },
            CLOSED => Change::Closed { queue: self.u32()? },
            TAGS => Change::Tags {
                queue: self.u32()?,
                next: self.u64()?,
            },
            ENQUEUED | ENQUEUED_WITH_PRIORITY => self.enqueued(kind == ENQUEUED_WITH_PRIORITY)?,
            DELIVERED => Change::Delivered {
                queue: self.u32()?,
                seq: self.u64()?,
                tag: self.u64()?,
                attempt: self.u32()?,
            },
            RETURNED => Change::Returned {
                queue: self.u32()?,
                seq: self.u64()?,
                attempt: self.u32()?,
                ready_at: self.opt_u64()?,
            },
            REMOVED => Change::Removed {
                queue: self.u32()?,
                seq: self.u64()?,
            },
            WINDOWED => Change::Windowed {
                queue: self.u32()?,
                id: self.string()?.into(),
                until: self.u64()?,
            },
            other => return Err(self.error(format!("unknown change kind {other}"))),
        })
    }
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_opt_u64(buf: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => buf.push(0),
        Some(v) => {
            buf.push(1);
            put_u64(buf, v);
        }
    }
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("bodies and names are far below 4 GiB");
    put_u32(buf, len);
    buf.extend_from_slice(bytes);
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_bytes(buf, s.as_bytes());
}

fn put_duration(buf: &mut Vec<u8>, d: Duration) {
    put_u64(buf, d.as_secs());
    put_u32(buf, d.subsec_nanos());
}

fn put_config(buf: &mut Vec<u8>, c: &QueueConfig) {
    put_duration(buf, c.ack_timeout);
    match c.max_lease {
        None => buf.push(0),
        Some(d) => {
            buf.push(1);
            put_duration(buf, d);
        }
    }
    put_duration(buf, c.retry.initial);
    put_u64(buf, c.retry.multiplier.to_bits());
    put_duration(buf, c.retry.max);
    put_u64(buf, c.retry.jitter.to_bits());
    match c.max_deliveries {
        None => buf.push(0),
        Some(n) => {
            buf.push(1);
            put_u32(buf, n);
        }
    }
    match &c.dead_letter {
        None => buf.push(0),
        Some(name) => {
            buf.push(1);
            put_str(buf, name);
        }
    }
    put_duration(buf, c.dedup_window);
    put_opt_u64(buf, c.max_length.map(|n| n as u64));
    put_u64(buf, c.max_body_bytes as u64);
    // One byte of flags: bit 0 durable, bit 1 `Overflow::DropHead`, bit 2 a `max_priority`
    // byte follows. A log written before `overflow` existed has 0 or 1 here, which reads
    // as `RejectPublish`; one from before `max_priority`, at most 0b11, as no priorities.
    // A build from before either refuses the byte rather than misread the queue.
    let drop_head = c.overflow == Overflow::DropHead;
    let priorities = c.max_priority.is_some();
    buf.push(u8::from(c.durable) | u8::from(drop_head) << 1 | u8::from(priorities) << 2);
    if let Some(max) = c.max_priority {
        buf.push(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Change> {
        let config = QueueConfig {
            ack_timeout: Duration::new(3, 7),
            max_lease: Some(Duration::from_secs(9)),
            retry: RetryPolicy {
                initial: Duration::from_millis(5),
                multiplier: 1.5,
                max: Duration::from_secs(2),
                jitter: 0.25,
            },
            max_deliveries: Some(4),
            dead_letter: Some("dlq".into()),
            dedup_window: Duration::from_secs(60),
            max_length: Some(10),
            overflow: Overflow::DropHead,
            max_body_bytes: 77,
            durable: true,
            max_priority: Some(9),
        };
        vec![
            Change::Clock { now: 123_456 },
            Change::Counters {
                next_queue: 3,
                next_seq: 1 << 40,
                next_auto_id: 12,
            },
            Change::Declared {
                queue: 2,
                name: "jobs".into(),
                config: Box::new(config),
            },
            Change::Declared {
                queue: 3,
                name: "plain".into(),
                config: Box::default(),
            },
            Change::Closed { queue: 3 },
            Change::Tags { queue: 2, next: 99 },
            Change::Enqueued {
                queue: 2,
                seq: 5,
                id: MsgId::Auto(MsgId::auto_number(1, 8)),
                body: Bytes::from_static(b"body"),
                attempt: 0,
                priority: 0,
                ready_at: None,
                dedup_until: None,
                death: None,
            },
            Change::Enqueued {
                queue: 2,
                seq: 6,
                id: MsgId::Given("book-1".into()),
                body: Bytes::new(),
                attempt: 2,
                priority: 200,
                ready_at: Some(1_000),
                dedup_until: Some(2_000),
                death: Some(Box::new(DeathRecord {
                    queue: "src".into(),
                    reason: DeathReason::MaxDeliveries,
                    attempts: 2,
                })),
            },
            Change::Delivered {
                queue: 2,
                seq: 5,
                tag: 17,
                attempt: 1,
            },
            Change::Returned {
                queue: 2,
                seq: 5,
                attempt: 0,
                ready_at: Some(u64::MAX),
            },
            Change::Removed { queue: 2, seq: 6 },
            Change::Windowed {
                queue: 2,
                id: "book-1".into(),
                until: 2_000,
            },
        ]
    }

    fn encode(changes: &[Change]) -> Vec<u8> {
        let mut buf = Vec::new();
        begin_batch(&mut buf);
        for change in changes {
            change.encode(&mut buf);
        }
        buf
    }

    fn decode(bytes: &[u8]) -> Result<Vec<Change>, DecodeError> {
        let mut out = Vec::new();
        decode_batch(Bytes::copy_from_slice(bytes), |c| {
            out.push(c);
            Ok(())
        })?
        .expect("the callback never refuses");
        Ok(out)
    }

    #[test]
    fn every_change_decodes_to_itself() {
        let changes = every_kind();
        assert_eq!(decode(&encode(&changes)).unwrap(), changes);
    }

    #[test]
    fn every_truncation_is_an_error_and_never_a_panic() {
        let bytes = encode(&every_kind());
        let mut boundaries = 0;
        for cut in 0..bytes.len() {
            // A cut between two changes decodes as the shorter batch; anywhere else is an
            // error naming an offset within the batch.
            match decode(&bytes[..cut]) {
                Ok(changes) => {
                    boundaries += 1;
                    assert_eq!(changes, every_kind()[..changes.len()].to_vec());
                }
                Err(e) => assert!(e.offset <= cut, "{e}"),
            }
        }
        assert_eq!(boundaries, every_kind().len(), "one clean cut per change");
    }

    #[test]
    fn a_queue_flags_byte_from_before_overflow_reads_as_reject_publish() {
        let declared = |overflow| Change::Declared {
            queue: 1,
            name: "jobs".into(),
            config: Box::new(QueueConfig {
                durable: true,
                overflow,
                ..QueueConfig::default()
            }),
        };
        // The flags byte ends the change: a durable queue's was 1 before `overflow`.
        let old = encode(&[declared(Overflow::RejectPublish)]);
        assert_eq!(old.last(), Some(&1));
        assert_eq!(decode(&old).unwrap(), [declared(Overflow::RejectPublish)]);
        let mut bytes = encode(&[declared(Overflow::DropHead)]);
        assert_eq!(bytes.last(), Some(&0b11));
        *bytes.last_mut().unwrap() = 0b1000;
        assert!(decode(&bytes).unwrap_err().what.contains("queue flags"));
    }

    #[test]
    fn a_message_of_priority_zero_is_written_as_before_priorities() {
        let enqueued = |priority| Change::Enqueued {
            queue: 1,
            seq: 2,
            id: MsgId::Given("a".into()),
            body: Bytes::from_static(b"b"),
            attempt: 0,
            priority,
            ready_at: None,
            dedup_until: None,
            death: None,
        };
        let plain = encode(&[enqueued(0)]);
        let ranked = encode(&[enqueued(3)]);
        assert_eq!((plain[1], ranked[1]), (ENQUEUED, ENQUEUED_WITH_PRIORITY));
        assert_eq!(ranked.len(), plain.len() + 1, "one byte more");
        assert_eq!(decode(&ranked).unwrap(), [enqueued(3)]);
    }

    #[test]
    fn an_unknown_version_or_kind_is_refused() {
        let mut bytes = encode(&every_kind());
        bytes[0] = FORMAT + 1;
        assert!(decode(&bytes).unwrap_err().what.contains("version"));
        let mut bytes = encode(&every_kind()[..1]);
        bytes[1] = 200;
        assert!(decode(&bytes).unwrap_err().what.contains("kind 200"));
    }
}
