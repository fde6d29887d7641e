//! The seeded workload: which op comes next.
//!
//! Each seed draws its own mix (how often each kind of op comes, how many consumers go
//! silent), then each step draws an op, looking at the world only to aim well (settle a
//! delivery that is in some hand, declare a name that is not live). The op itself carries
//! every choice, so a trace replays without this generator.

use std::time::Duration;

use leasemq_engine::Settle;

use crate::op::{Handle, IdSpec, MsgSpec, Op};
use crate::rng::{Rng, Source};
use crate::setup::{BAD_NAME, CONFIGS, CONSUMER_NAMES, NAMES};
use crate::world::World;

#[derive(Clone, Copy)]
enum Kind {
    Declare,
    Put,
    PutBatch,
    Consume,
    Recv,
    Settle,
    SettleBatch,
    SettleTag,
    AckUpTo,
    AckUpToEnded,
    Cancel,
    Close,
    Stats,
    Jump,
    Deliver,
    Flush,
}

const KINDS: [Kind; 16] = [
    Kind::Declare,
    Kind::Put,
    Kind::PutBatch,
    Kind::Consume,
    Kind::Recv,
    Kind::Settle,
    Kind::SettleBatch,
    Kind::SettleTag,
    Kind::AckUpTo,
    Kind::AckUpToEnded,
    Kind::Cancel,
    Kind::Close,
    Kind::Stats,
    Kind::Jump,
    Kind::Deliver,
    Kind::Flush,
];
/// The base mix, in the order of [`KINDS`].
const BASE: [u32; 16] = [3, 24, 3, 4, 14, 16, 3, 2, 2, 1, 2, 1, 1, 9, 4, 2];

/// The seed's mix: how often each kind of op comes, and how the consumers behave.
struct Mix {
    weights: [u32; 16],
    /// Percent of consumers that never settle: their leases run out.
    silent_percent: u64,
    /// Whether time mostly moves a few ticks at a time, so that consumers settle in time.
    calm: bool,
}

impl Mix {
    /// Draws the mix from `seed`, and returns it with the generator that drew it, which a
    /// seeded run goes on drawing its ops from.
    fn from_seed(seed: u64) -> (Mix, Rng) {
        let mut rng = Rng::new(seed ^ 0x6e6e_0000_0000_0002);
        let mut weights = BASE;
        for (i, w) in weights.iter_mut().enumerate() {
            *w *= rng.pick(&[1, 1, 1, 2, 3]);
            // Now and then a seed goes without one kind of op (never the basic ones).
            let optional = !matches!(
                KINDS[i],
                Kind::Put | Kind::Jump | Kind::Declare | Kind::Consume | Kind::Recv | Kind::Settle
            );
            if optional && rng.one_in(15) {
                *w = 0;
            }
        }
        let silent_percent = rng.pick(&[0, 10, 30, 60]);
        let calm = rng.percent(50);
        let mix = Mix {
            weights,
            silent_percent,
            calm,
        };
        (mix, rng)
    }
}

/// Draws ops from a [`Source`]: a seeded [`Rng`], or a fuzzer's bytes (`crate::fuzz`).
pub(crate) struct Generator<R = Rng> {
    rng: R,
    weights: [u32; 16],
    silent_percent: u64,
    calm: bool,
    /// Per consumer (by ledger number): whether it is silent, drawn when first seen.
    silent: Vec<bool>,
    next_id: u32,
    recent_ids: Vec<u32>,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Generator {
    /// The seed's mix, then every op drawn from the seed.
    pub fn new(seed: u64) -> Generator {
        let (mix, rng) = Mix::from_seed(seed);
        Generator::with_mix(mix, rng)
    }
}

impl<R: Source> Generator<R> {
    /// The seed's mix, with every choice of every op taken from `source` instead.
    pub fn with_source(seed: u64, source: R) -> Generator<R> {
        Generator::with_mix(Mix::from_seed(seed).0, source)
    }

    fn with_mix(mix: Mix, rng: R) -> Generator<R> {
        Generator {
            rng,
            weights: mix.weights,
            silent_percent: mix.silent_percent,
            calm: mix.calm,
            silent: Vec::new(),
            next_id: 0,
            recent_ids: Vec::new(),
        }
    }

    /// Where the choices come from.
    pub fn source(&self) -> &R {
        &self.rng
    }

    pub fn next(&mut self, world: &World) -> Op {
        while self.silent.len() < world.ledger.consumers.len() {
            let silent = self.rng.percent(self.silent_percent);
            self.silent.push(silent);
        }
        if world.setup().durable {
            if let Some(op) = self.storage_op(world) {
                return op;
            }
        }
        let live_names = live_names(world);
        let mix = self.mix(world, &live_names);
        match KINDS[self.rng.weighted(&mix)] {
            Kind::Declare => self.declare(world),
            Kind::Put => {
                let (queue, handle) = self.queue(world, &live_names);
                let msg = self.message();
                Op::Put { queue, handle, msg }
            }
            Kind::PutBatch => {
                let (queue, handle) = self.queue(world, &live_names);
                let n = self.rng.range(1, 5);
                let msgs = (0..n).map(|_| self.message()).collect();
                Op::PutBatch {
                    queue,
                    handle,
                    msgs,
                }
            }
            Kind::Consume => self.consume(&live_names),
            kind @ (Kind::Recv | Kind::Settle | Kind::SettleBatch | Kind::AckUpTo) => {
                self.consumer_op(kind, world)
            }
            Kind::SettleTag => {
                let name = self.rng.index(NAMES) as u8;
                let stale = world.has_closed(name) && self.rng.one_in(4);
                Op::SettleTag {
                    queue: name,
                    handle: if stale { Handle::Stale } else { Handle::Live },
                    back: self.rng.below(6) as u16,
                    op: self.settle(),
                }
            }
            Kind::AckUpToEnded => Op::AckUpToEnded {
                consumer: self.rng.below(64) as u16,
            },
            Kind::Cancel => Op::Cancel {
                consumer: self.rng.below(64) as u16,
            },
            Kind::Close => Op::Close {
                queue: self.rng.pick(&live_names),
            },
            Kind::Stats => {
                let name = self.rng.index(NAMES) as u8;
                let stale = world.has_closed(name) && self.rng.one_in(3);
                Op::Stats {
                    queue: name,
                    handle: if stale { Handle::Stale } else { Handle::Live },
                }
            }
            Kind::Jump => Op::Jump {
                ticks: self.jump().min(churn_bound(world)),
                order: self.rng.next_u64(),
                interleave: self.rng.one_in(3),
            },
            Kind::Deliver => Op::Deliver {
                pick: self.rng.below(1 << 12) as u16,
            },
            Kind::Flush => Op::Flush,
        }
    }

    /// This step's mix: the seed's, with the ops that would find nothing to act on left out.
    fn mix(&self, world: &World, live_names: &[u8]) -> [u32; 16] {
        let mut w = self.weights;
        let set = |w: &mut [u32; 16], k: Kind, v: u32| w[k as usize] = v;
        if world.live_consumers().is_empty() {
            w[Kind::Consume as usize] += 6;
            for k in [Kind::Recv, Kind::Settle, Kind::SettleBatch, Kind::AckUpTo] {
                set(&mut w, k, 0);
            }
            set(&mut w, Kind::Cancel, 0);
        }
        if live_names.len() < 2 {
            w[Kind::Declare as usize] += 40;
        }
        if live_names.is_empty() {
            for k in [Kind::Put, Kind::PutBatch, Kind::Consume, Kind::Close] {
                set(&mut w, k, 0);
            }
        }
        if world.in_flight() == 0 {
            set(&mut w, Kind::Deliver, 0);
            set(&mut w, Kind::Flush, 0);
        }
        w
    }

    /// Durable runs: now and then an fsync of one shard's log (mostly one that holds
    /// something back), rarely a crash.
    fn storage_op(&mut self, world: &World) -> Option<Op> {
        match self.rng.below(1000) {
            0..=3 => Some(Op::Crash {
                seed: self.rng.next_u64(),
                flip: self.rng.one_in(3),
            }),
            4..=119 => {
                let waiting: Vec<u8> = (0..world.pending.len())
                    .filter(|&s| !world.pending[s].is_empty())
                    .map(|s| s as u8)
                    .collect();
                let shard = if !waiting.is_empty() && self.rng.percent(80) {
                    self.rng.pick(&waiting)
                } else {
                    self.rng.below(world.pending.len() as u64) as u8
                };
                Some(Op::Sync { shard })
            }
            _ => None,
        }
    }

    fn consume(&mut self, live_names: &[u8]) -> Op {
        Op::Consume {
            queue: self.rng.pick(live_names),
            name: if self.rng.one_in(50) {
                CONSUMER_NAMES.len() as u8
            } else {
                self.rng.index(CONSUMER_NAMES.len()) as u8
            },
            prefetch: if self.rng.one_in(100) {
                0
            } else {
                self.rng.pick(&[1, 1, 2, 3, 5, 10, 100])
            },
        }
    }

    /// An op of a live consumer: read, settle, settle a batch, or `ack_up_to`.
    fn consumer_op(&mut self, kind: Kind, world: &World) -> Op {
        match kind {
            Kind::Recv => Op::Recv {
                consumer: self.consumer(world, |c| !c.channel.is_empty(), false),
                max: self.rng.pick(&[1, 2, 4, u16::MAX, u16::MAX]),
            },
            Kind::Settle => Op::Settle {
                consumer: self.consumer(world, |c| !c.hand.is_empty(), true),
                pick: self.pick(),
                op: self.settle(),
            },
            Kind::SettleBatch => {
                let consumer = self.consumer(world, |c| !c.hand.is_empty(), true);
                if self.rng.one_in(3) {
                    // A heartbeat: touch everything in hand, so some leases live long while
                    // later ones come and go.
                    let live = world.live_consumers();
                    let c = live[usize::from(consumer) % live.len()];
                    let hand = world.consumer(c).hand.len() as u16;
                    let picks = (0..hand).map(|i| (i, Settle::Touch)).collect();
                    return Op::SettleBatch { consumer, picks };
                }
                let n = self.rng.range(1, 4);
                Op::SettleBatch {
                    consumer,
                    picks: (0..n).map(|_| (self.pick(), self.settle())).collect(),
                }
            }
            _ => Op::AckUpTo {
                consumer: self.consumer(world, |c| !c.hand.is_empty(), true),
                pick: self.pick(),
            },
        }
    }

    fn declare(&mut self, world: &World) -> Op {
        let idle: Vec<u8> = (0..NAMES as u8)
            .filter(|&n| world.ledger.by_name[usize::from(n)].is_none())
            .collect();
        let name = if self.rng.one_in(60) {
            BAD_NAME
        } else if !idle.is_empty() && self.rng.percent(75) {
            self.rng.pick(&idle)
        } else {
            self.rng.index(NAMES) as u8
        };
        let config = match self.rng.below(100) {
            0..=59 => 0,
            60..=94 => 1,
            _ => (CONFIGS - 1) as u8,
        };
        Op::Declare { name, config }
    }

    fn queue(&mut self, world: &World, live: &[u8]) -> (u8, Handle) {
        let name = self.rng.index(NAMES) as u8;
        if world.has_closed(name) && self.rng.one_in(30) {
            return (name, Handle::Stale);
        }
        (self.rng.pick(live), Handle::Live)
    }

    /// Index into the live consumers: one that `wanted` (and, for settles, is not silent)
    /// when there is one.
    fn consumer(
        &mut self,
        world: &World,
        wanted: impl Fn(&crate::world::SimConsumer) -> bool,
        settles: bool,
    ) -> u16 {
        let live = world.live_consumers();
        let good: Vec<usize> = (0..live.len())
            .filter(|&i| {
                let c = live[i];
                wanted(world.consumer(c)) && !(settles && self.silent[c as usize])
            })
            .collect();
        if good.is_empty() || self.rng.one_in(20) {
            self.rng.below(64) as u16
        } else {
            self.rng.pick(&good) as u16
        }
    }

    /// A delivery in a hand, counted from the newest: mostly one of the last few.
    fn pick(&mut self) -> u16 {
        if self.rng.one_in(5) {
            self.rng.below(64) as u16
        } else {
            self.rng.below(3) as u16
        }
    }

    fn message(&mut self) -> MsgSpec {
        let id = match self.rng.below(100) {
            0..=54 => {
                self.next_id += 1;
                self.recent_ids.push(self.next_id);
                if self.recent_ids.len() > 16 {
                    self.recent_ids.remove(0);
                }
                IdSpec::Given(self.next_id)
            }
            55..=74 => IdSpec::None,
            75..=96 if !self.recent_ids.is_empty() => {
                IdSpec::Given(self.rng.pick(&self.recent_ids))
            }
            75..=96 => IdSpec::None,
            97..=98 => IdSpec::Empty,
            _ => IdSpec::TooLong,
        };
        let delay = match self.rng.below(100) {
            0..=69 => Duration::ZERO,
            70..=87 => ms(self.rng.range(1, 150)),
            88..=95 => ms(self.rng.range(150, 20_000)),
            96..=98 => ms(self.rng.range(20_000, 7 * 24 * 3_600_000)),
            _ => ms(7 * 24 * 3_600_000 + self.rng.range(1, 1000)),
        };
        MsgSpec {
            id,
            delay,
            big: self.rng.one_in(25),
        }
    }

    fn settle(&mut self) -> Settle {
        match self.rng.weighted(&[45, 12, 8, 8, 8, 19]) {
            0 => Settle::Ack,
            1 => Settle::Nack,
            2 => Settle::NackWithDelay(match self.rng.below(100) {
                0..=39 => Duration::ZERO,
                40..=89 => ms(self.rng.range(1, 200)),
                90..=97 => ms(self.rng.range(200, 60_000)),
                _ => ms(8 * 24 * 3_600_000),
            }),
            3 => Settle::Reject,
            4 => Settle::Release,
            _ => Settle::Touch,
        }
    }

    /// Mostly small steps (within a lease), now and then minutes, hours or days; calm
    /// seeds mostly move a few ticks at a time.
    fn jump(&mut self) -> u64 {
        if self.calm && self.rng.percent(85) {
            let most = if self.rng.percent(80) { 4 } else { 40 };
            return self.rng.range(1, most);
        }
        match self.rng.below(100) {
            0..=44 => self.rng.range(1, 10),
            45..=69 => self.rng.range(10, 300),
            70..=84 => self.rng.range(300, 3_000),
            85..=94 => self.rng.range(3_000, 600_000),
            95..=98 => self.rng.range(600_000, 86_400_000),
            _ => self.rng.range(6 * 86_400_000, 8 * 86_400_000),
        }
    }
}

fn live_names(world: &World) -> Vec<u8> {
    (0..NAMES as u8)
        .filter(|&n| world.ledger.by_name[usize::from(n)].is_some())
        .collect()
}

/// Redeliveries one jump may cause, at most (roughly): a lease of 2 ms held through a jump of
/// a week would be redelivered 300 million times.
const CHURN_LIMIT: u64 = 400;

/// The longest jump whose lease expiries stay within [`CHURN_LIMIT`]: each live message of a
/// queue with consumers may come back once per `ack_timeout` (or `max_deliveries` times in
/// all), up to the consumers' total prefetch at a time. A queue that may redeliver without
/// end counts as busy as its prefetch allows, not as its messages now: delayed messages
/// come due and dead letters arrive during the jump (a week-long jump once met a dead-letter
/// queue that was empty when it began, and redelivered 48 million times).
fn churn_bound(world: &World) -> u64 {
    let (mut bounded, mut rate) = (0u64, 0f64);
    for rec in world
        .ledger
        .queues
        .iter()
        .filter(|q| q.live && !q.consumers.is_empty())
    {
        let prefetch = rec.free + rec.leases.len() as u64;
        match rec.config.max_deliveries {
            Some(m) => bounded += (rec.members.len() as u64).min(prefetch) * u64::from(m),
            None => rate += prefetch as f64 / rec.ack.max(1) as f64,
        }
    }
    if rate == 0.0 {
        return u64::MAX;
    }
    let room = CHURN_LIMIT.saturating_sub(bounded).max(20);
    ((room as f64 / rate) as u64).max(1)
}
