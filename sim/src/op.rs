//! The operations of a trace.
//!
//! An op names what it acts on by small indices (a queue name, the n-th live consumer, the
//! n-th delivery in that consumer's hand), resolved when it runs, modulo what exists then.
//! So any subsequence of a trace is itself a valid trace, which is what lets a failing trace
//! be shrunk by deleting ops; an op whose target does not exist is a no-op.

use std::fmt;
use std::time::Duration;

use leasemq_engine::Settle;

/// Which handle of a queue name an op uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle {
    /// The live queue of that name.
    Live,
    /// The most recently closed queue of that name: a stale handle.
    Stale,
}

/// A message's id as the producer gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSpec {
    /// No id: the broker assigns one.
    None,
    /// `m<n>`; reusing an `n` is a deliberate duplicate.
    Given(u32),
    /// An empty id: `InvalidMessage`.
    Empty,
    /// 1 025 bytes: `InvalidMessage`.
    TooLong,
}

/// One message to put. Its body is made unique when it is put, so the ledger can tell
/// every message apart whatever its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgSpec {
    pub id: IdSpec,
    pub delay: Duration,
    /// A body of 200 bytes instead of 8: too large for a queue with a small `max_body_bytes`.
    pub big: bool,
}

/// One step of the simulation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Declares queue name `name` with config `config` of its palette (after looking its
    /// dead-letter queue up, as the broker does).
    Declare {
        name: u8,
        config: u8,
    },
    Put {
        queue: u8,
        handle: Handle,
        msg: MsgSpec,
    },
    PutBatch {
        queue: u8,
        handle: Handle,
        msgs: Vec<MsgSpec>,
    },
    /// A consumer named `CONSUMER_NAMES[name]` joins the live queue.
    Consume {
        queue: u8,
        name: u8,
        prefetch: u32,
    },
    /// The consumer reads up to `max` deliveries from its channel into its hand (which keeps
    /// the newest 16).
    Recv {
        consumer: u16,
        max: u16,
    },
    /// Settles (or touches) one delivery of the consumer's hand: `pick` counts from the
    /// newest.
    Settle {
        consumer: u16,
        pick: u16,
        op: Settle,
    },
    SettleBatch {
        consumer: u16,
        picks: Vec<(u16, Settle)>,
    },
    /// Settles tag `last + 1 - back` of the queue, whoever holds it (often stale).
    SettleTag {
        queue: u8,
        handle: Handle,
        back: u16,
        op: Settle,
    },
    /// `ack_up_to` the tag of one delivery in the consumer's hand.
    AckUpTo {
        consumer: u16,
        pick: u16,
    },
    /// `ack_up_to(u64::MAX)` through the handle of a consumer that ended (cancelled, or its
    /// queue closed): must ack nothing, even where its slot went to a new consumer.
    AckUpToEnded {
        consumer: u16,
    },
    /// The consumer crashes: cancelled with whatever is still unread in its channel.
    Cancel {
        consumer: u16,
    },
    Close {
        queue: u8,
    },
    Stats {
        queue: u8,
        handle: Handle,
    },
    /// Moves the clock `ticks` ahead and fires every shard's timers, in an order drawn from
    /// `order`; with `interleave`, messages between shards are delivered after each shard,
    /// so some reach a shard that has not caught up yet.
    Jump {
        ticks: u64,
        order: u64,
        interleave: bool,
    },
    /// Delivers one message in flight between shards (the oldest of its sender → receiver
    /// pair, which keeps each pair in order).
    Deliver {
        pick: u16,
    },
    /// Delivers every message in flight, and whatever that causes, until none is left
    /// (in a durable run, fsyncing the logs until nothing waits for them).
    Flush,
    /// Durable runs: the shard's log is written and fsynced (one group commit), and what
    /// waited for it leaves the shard.
    Sync {
        shard: u8,
    },
    /// Durable runs: the broker crashes. Every disk keeps, loses or tears what was not
    /// fsynced (chosen by `seed`); with `flip`, a bit of an old record of one log flips,
    /// which recovery must refuse, and the broker restarts from the disks as they were
    /// before that damage.
    Crash {
        seed: u64,
        flip: bool,
    },
}

fn settle_text(op: Settle) -> String {
    match op {
        Settle::Ack => "ack".into(),
        Settle::Nack => "nack".into(),
        Settle::NackWithDelay(d) => format!("nack_with_delay({d:?})"),
        Settle::Reject => "reject".into(),
        Settle::Release => "release".into(),
        Settle::Touch => "touch".into(),
    }
}

impl fmt::Display for MsgSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            IdSpec::None => f.write_str("no id")?,
            IdSpec::Given(n) => write!(f, "id m{n}")?,
            IdSpec::Empty => f.write_str("empty id")?,
            IdSpec::TooLong => f.write_str("1025-byte id")?,
        }
        if !self.delay.is_zero() {
            write!(f, " delay {:?}", self.delay)?;
        }
        if self.big {
            f.write_str(" big")?;
        }
        Ok(())
    }
}

/// Writes `items` separated by commas, each as `each` writes it.
fn write_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    mut each: impl FnMut(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, item)?;
    }
    Ok(())
}

fn handle_text(handle: Handle) -> &'static str {
    match handle {
        Handle::Live => "",
        Handle::Stale => " (stale handle)",
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Declare { name, config } => write!(f, "declare q{name} with config {config}"),
            Op::Put { queue, handle, msg } => {
                write!(f, "put q{queue}{} [{msg}]", handle_text(*handle))
            }
            Op::PutBatch {
                queue,
                handle,
                msgs,
            } => {
                write!(f, "put_batch q{queue}{} [", handle_text(*handle))?;
                write_list(f, msgs, |f, m| write!(f, "{m}"))?;
                f.write_str("]")
            }
            Op::Consume {
                queue,
                name,
                prefetch,
            } => write!(f, "consume q{queue} as name {name}, prefetch {prefetch}"),
            Op::Recv { consumer, max } => write!(f, "consumer #{consumer} reads up to {max}"),
            Op::Settle { consumer, pick, op } => {
                write!(f, "consumer #{consumer}: {} hand[{pick}]", settle_text(*op))
            }
            Op::SettleBatch { consumer, picks } => {
                write!(f, "consumer #{consumer}: settle_batch [")?;
                write_list(f, picks, |f, (pick, op)| {
                    write!(f, "{} hand[{pick}]", settle_text(*op))
                })?;
                f.write_str("]")
            }
            Op::SettleTag {
                queue,
                handle,
                back,
                op,
            } => write!(
                f,
                "{} tag last+1-{back} of q{queue}{}",
                settle_text(*op),
                handle_text(*handle)
            ),
            Op::AckUpTo { consumer, pick } => {
                write!(f, "consumer #{consumer}: ack_up_to hand[{pick}]")
            }
            Op::AckUpToEnded { consumer } => {
                write!(f, "ended consumer #{consumer}: ack_up_to(u64::MAX)")
            }
            Op::Cancel { consumer } => write!(f, "consumer #{consumer} crashes (cancel)"),
            Op::Close { queue } => write!(f, "close q{queue}"),
            Op::Stats { queue, handle } => write!(f, "stats q{queue}{}", handle_text(*handle)),
            Op::Jump {
                ticks,
                order,
                interleave,
            } => {
                let mixed = if *interleave { ", interleaved" } else { "" };
                write!(f, "advance {ticks} ticks (shard order {order:#x}{mixed})")
            }
            Op::Deliver { pick } => write!(f, "deliver in-flight message {pick}"),
            Op::Flush => f.write_str("deliver all in-flight messages"),
            Op::Sync { shard } => write!(f, "fsync the log of shard {shard}"),
            Op::Crash { seed, flip } => {
                let flipped = ", a bit flipped in an old record";
                let flipped = if *flip { flipped } else { "" };
                write!(f, "crash and restart (disk seed {seed:#x}{flipped})")
            }
        }
    }
}
