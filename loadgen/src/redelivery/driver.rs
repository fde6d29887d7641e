//! The single thread that drives `redelivery`: receives, renews, acks and tops up.

use std::collections::VecDeque;
use std::time::Duration;

use leasemq::{Consumer, Delivery, DeliveryTag, Message, Queue, Settle};

use crate::common::{
    broker_error, chosen, nanos, read_header, threshold, BodyWriter, Clock, Ledger, HEADER_BYTES,
};
use crate::hist::Recorder;

/// The broker's tick (its default).
const TICK_NS: u64 = 1_000_000;
/// Deliveries taken from one consumer's channel per turn.
const RECV_PER_TURN: usize = 4096;
/// Put batches, and touch batches, per turn: so that neither starves the other, and the
/// channels are drained often.
const BATCHES_PER_TURN: usize = 8;

/// A lease the driver holds: its tag, the message's sequence number, and when its lease
/// clock last started (at the latest: the start of the put or touch call).
#[derive(Clone, Copy, Debug)]
struct Lease {
    tag: DeliveryTag,
    seq: u64,
    renewed_ns: u64,
}

/// Counts and histograms of one run.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) lateness: Recorder,
    pub(super) touch: Recorder,
    pub(super) ack: Recorder,
    pub(super) touch_batch: Recorder,
    pub(super) ack_batch: Recorder,
    pub(super) put_batch: Recorder,
    pub(super) ledger: Ledger,
    pub(super) put: u64,
    pub(super) acked: u64,
    pub(super) first_deliveries: u64,
    pub(super) redelivered: u64,
    pub(super) planned: u64,
    pub(super) planned_redelivered: u64,
    pub(super) unplanned_redelivered: u64,
    pub(super) refused: u64,
    pub(super) early: u64,
    pub(super) earliest_ns: i64,
    pub(super) too_early: u64,
    pub(super) renew_lag_max_ns: u64,
    /// The longest time between two looks at the consumers' channels.
    pub(super) poll_gap_max_ns: u64,
    // In the measured window:
    pub(super) w_put: u64,
    pub(super) w_acked: u64,
    pub(super) w_touched: u64,
    pub(super) w_redelivered: u64,
}

/// xorshift64*: the choice between ack and touch at renewal.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub(super) struct Driver {
    queue: Queue,
    pub(super) consumers: Vec<Consumer>,
    pub(super) clock: Clock,
    leases: u64,
    pub(super) timeout_ns: u64,
    never_ack: u64,
    ack_share: u64,
    put_batch: usize,
    settle_batch: usize,
    kept: VecDeque<Lease>,
    doomed: VecDeque<Lease>,
    acks: Vec<(DeliveryTag, u64)>,
    bodies: BodyWriter,
    rng: Rng,
    /// Set once every lease is out: [filled, end) is the measured window.
    pub(super) filled_ns: Option<u64>,
    pub(super) end_ns: u64,
    pub(super) draining: bool,
    last_poll_ns: u64,
    pub(super) t: Tally,
    pub(super) problems: Vec<String>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        queue: Queue,
        consumers: Vec<Consumer>,
        ack_timeout: Duration,
        leases: u64,
        never_ack_fraction: f64,
        ack_fraction: f64,
        put_batch: usize,
        settle_batch: usize,
    ) -> Driver {
        Driver {
            queue,
            consumers,
            clock: Clock::start(),
            leases,
            timeout_ns: nanos(ack_timeout),
            never_ack: threshold(never_ack_fraction),
            ack_share: threshold(ack_fraction),
            put_batch,
            settle_batch,
            // Room for every lease up front: growing a deque of millions mid-run stalls the
            // loop.
            kept: VecDeque::with_capacity(leases as usize + leases as usize / 8),
            doomed: VecDeque::with_capacity(
                (leases as f64 * never_ack_fraction * 1.5) as usize + 1024,
            ),
            acks: Vec::new(),
            bodies: BodyWriter::new(HEADER_BYTES),
            rng: Rng(0x9E37_79B9_7F4A_7C15),
            filled_ns: None,
            end_ns: u64::MAX,
            draining: false,
            last_poll_ns: 0,
            t: Tally {
                earliest_ns: i64::MAX,
                ..Tally::default()
            },
            problems: Vec::new(),
        }
    }

    /// Memory the driver itself holds per lease, to leave out of the broker's share.
    pub(super) fn bookkeeping_bytes(&self) -> usize {
        (self.kept.len() + self.doomed.len()) * std::mem::size_of::<Lease>()
    }

    fn measuring(&self, at: u64) -> bool {
        self.filled_ns.is_some_and(|f| at >= f) && at < self.end_ns
    }

    /// One turn of the loop.
    pub(super) fn turn(&mut self) {
        self.receive();
        // Filled once N messages are live and every one of them has been received.
        if self.filled_ns.is_none()
            && self.t.put - self.t.acked >= self.leases
            && self.t.first_deliveries == self.t.put
        {
            self.filled_ns = Some(self.clock.now_ns());
            return;
        }
        let now = self.clock.now_ns();
        if self.draining {
            let all = self.kept.drain(..).chain(self.doomed.drain(..));
            self.acks.extend(all.map(|l| (l.tag, l.seq)));
        } else {
            while self
                .doomed
                .front()
                .is_some_and(|l| l.renewed_ns + self.timeout_ns <= now)
            {
                self.doomed.pop_front();
            }
            self.renew(now);
        }
        self.settle_acks();
        if !self.draining {
            self.top_up();
        }
    }

    /// Leases ran out before the driver could renew them, more than now and then: it cannot
    /// keep N alive with this ack_timeout.
    pub(super) fn overwhelmed(&self) -> bool {
        !self.draining && self.t.unplanned_redelivered > (self.leases / 100).max(100)
    }

    /// Drains every consumer's channel.
    fn receive(&mut self) {
        let now = self.clock.now_ns();
        if self.measuring(now) && self.last_poll_ns > 0 {
            let gap = now - self.last_poll_ns;
            self.t.poll_gap_max_ns = self.t.poll_gap_max_ns.max(gap);
        }
        self.last_poll_ns = now;
        for i in 0..self.consumers.len() {
            for _ in 0..RECV_PER_TURN {
                match self.consumers[i].try_recv() {
                    Ok(Some(d)) => {
                        let at = self.clock.now_ns();
                        self.on_delivery(&d, at);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.problems.push(broker_error("receiving", e));
                        return;
                    }
                }
            }
        }
    }

    fn on_delivery(&mut self, d: &Delivery, at: u64) {
        let Some((sent, seq)) = read_header(&d.envelope().body) else {
            self.problems
                .push("a delivery without the 16-byte header".into());
            return;
        };
        let lease = Lease {
            tag: d.tag(),
            seq,
            renewed_ns: sent,
        };
        if d.envelope().attempt == 1 {
            self.t.first_deliveries += 1;
            if self.draining {
                self.acks.push((lease.tag, seq));
            } else if chosen(seq, self.never_ack) {
                self.t.planned += 1;
                self.doomed.push_back(lease);
            } else {
                self.kept.push_back(lease);
            }
            return;
        }
        self.t.redelivered += 1;
        if self.measuring(at) {
            self.t.w_redelivered += 1;
        }
        if d.envelope().attempt == 2 && chosen(seq, self.never_ack) {
            self.t.planned_redelivered += 1;
            let deadline = sent + self.timeout_ns;
            if self.measuring(deadline) {
                let late = at as i64 - deadline as i64;
                if late < 0 {
                    self.t.early += 1;
                    self.t.earliest_ns = self.t.earliest_ns.min(late);
                    if -late > TICK_NS as i64 {
                        self.t.too_early += 1;
                    }
                }
                self.t.lateness.record(late.max(0) as u64);
            }
        } else {
            self.t.unplanned_redelivered += 1;
        }
        self.acks.push((lease.tag, seq));
    }

    /// Renews the leases that reached half their lease: acks some, touches the rest.
    fn renew(&mut self, now: u64) {
        let half = self.timeout_ns / 2;
        let most = self.settle_batch * BATCHES_PER_TURN;
        let mut touches: Vec<Lease> = Vec::new();
        let mut taken = 0;
        while taken < most {
            let Some(front) = self.kept.front() else {
                break;
            };
            if front.renewed_ns + half > now {
                break;
            }
            let lease = self.kept.pop_front().expect("front exists");
            taken += 1;
            if self.measuring(now) {
                let lag = now - (lease.renewed_ns + half);
                self.t.renew_lag_max_ns = self.t.renew_lag_max_ns.max(lag);
            }
            if self.rng.next() < self.ack_share {
                self.acks.push((lease.tag, lease.seq));
            } else {
                touches.push(lease);
            }
        }
        let Some((first, rest)) = touches.split_first() else {
            return;
        };
        let t0 = self.clock.now_ns();
        let ok = self.queue.touch(first.tag);
        let t1 = self.clock.now_ns();
        if self.measuring(t0) {
            self.t.touch.record(t1 - t0);
        }
        self.touched(*first, ok, t0);
        for chunk in rest.chunks(self.settle_batch) {
            let ops: Vec<(DeliveryTag, Settle)> =
                chunk.iter().map(|l| (l.tag, Settle::Touch)).collect();
            let t0 = self.clock.now_ns();
            let results = self.queue.settle_batch(&ops);
            let t1 = self.clock.now_ns();
            if self.measuring(t0) {
                self.t.touch_batch.record(t1 - t0);
            }
            for (lease, ok) in chunk.iter().zip(results) {
                self.touched(*lease, ok, t0);
            }
            self.receive();
        }
    }

    fn touched(&mut self, lease: Lease, ok: bool, at: u64) {
        if ok {
            if self.measuring(at) {
                self.t.w_touched += 1;
            }
            self.kept.push_back(Lease {
                renewed_ns: at,
                ..lease
            });
        } else if !self.draining {
            // It ran out first; its redelivery comes (or came) and is acked.
            self.t.refused += 1;
        }
    }

    /// Acks everything waiting: the first alone (timed as a single call), the rest batched.
    fn settle_acks(&mut self) {
        if self.acks.is_empty() {
            return;
        }
        let acks = std::mem::take(&mut self.acks);
        let (first, rest) = acks.split_first().expect("not empty");
        let t0 = self.clock.now_ns();
        let ok = self.queue.ack(first.0);
        let t1 = self.clock.now_ns();
        if self.measuring(t0) {
            self.t.ack.record(t1 - t0);
        }
        self.acked(first.1, ok, t1);
        for chunk in rest.chunks(self.settle_batch) {
            let ops: Vec<(DeliveryTag, Settle)> =
                chunk.iter().map(|&(tag, _)| (tag, Settle::Ack)).collect();
            let t0 = self.clock.now_ns();
            let results = self.queue.settle_batch(&ops);
            let t1 = self.clock.now_ns();
            if self.measuring(t0) {
                self.t.ack_batch.record(t1 - t0);
            }
            for (&(_, seq), ok) in chunk.iter().zip(results) {
                self.acked(seq, ok, t1);
            }
            self.receive();
        }
        // Keep the larger allocation; what arrived meanwhile goes after.
        let newer = std::mem::replace(&mut self.acks, acks);
        self.acks.clear();
        self.acks.extend(newer);
    }

    fn acked(&mut self, seq: u64, ok: bool, at: u64) {
        if ok {
            self.t.ledger.mark(seq);
            self.t.acked += 1;
            if self.measuring(at) {
                self.t.w_acked += 1;
            }
        } else if !self.draining {
            self.t.refused += 1;
        }
    }

    /// Puts fresh messages until N are live again (a few batches per turn at most).
    fn top_up(&mut self) {
        for _ in 0..BATCHES_PER_TURN {
            let live = self.t.put - self.t.acked;
            if live >= self.leases {
                return;
            }
            let n = (self.leases - live).min(self.put_batch as u64);
            let t0 = self.clock.now_ns();
            let batch: Vec<Message> = (0..n)
                .map(|k| Message::new(self.bodies.body(t0, self.t.put + k)))
                .collect();
            let t1 = self.clock.now_ns();
            if let Err(e) = self.queue.put_batch(batch) {
                self.problems.push(broker_error("put_batch failed", e));
                return;
            }
            if self.measuring(t1) {
                self.t.put_batch.record(self.clock.now_ns() - t1);
            }
            self.t.put += n;
            if self.measuring(t0) {
                self.t.w_put += n;
            }
            self.receive();
        }
    }
}
