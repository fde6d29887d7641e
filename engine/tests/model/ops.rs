use std::time::Duration;

use leasemq_engine::{Message, Overflow, QueueConfig, RetryPolicy, Settle};

use crate::harness::Harness;
use crate::model::check_config;
use crate::{ms, Tick, CONSUMER_NAMES, IDS, QUEUE_NAMES, SEVEN_DAYS, SMALL_BODY_LIMIT};

// ----- operations --------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub(crate) enum IdSpec {
    None,
    Pool(usize),
    /// The longest valid id: 1 024 bytes.
    Longest,
    /// Invalid: empty.
    Empty,
    /// Invalid: 1 025 bytes.
    TooLong,
}

#[derive(Clone, Debug)]
pub(crate) struct MessageSpec {
    pub(crate) body: String,
    id: IdSpec,
    pub(crate) delay: Duration,
    pub(crate) priority: u8,
}

impl MessageSpec {
    pub(crate) fn id(&self) -> Option<String> {
        match self.id {
            IdSpec::None => None,
            IdSpec::Pool(i) => Some(IDS[i].to_string()),
            IdSpec::Longest => Some("x".repeat(1024)),
            IdSpec::Empty => Some(String::new()),
            IdSpec::TooLong => Some("x".repeat(1025)),
        }
    }

    pub(crate) fn message(&self) -> Message {
        let message = (Message::new(self.body.clone()))
            .with_delay(self.delay)
            .with_priority(self.priority);
        match self.id() {
            Some(id) => message.with_id(id),
            None => message,
        }
    }
}

/// One step. Queues and consumers are named by handle: the index of the declare or consume
/// that created them, in this run (closed and cancelled ones stay, so old handles get used).
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// Only `handle_timeout`.
    Wait,
    Declare {
        name: &'static str,
        config: QueueConfig,
    },
    Put {
        queue: usize,
        message: MessageSpec,
    },
    PutBatch {
        queue: usize,
        messages: Vec<MessageSpec>,
    },
    Consume {
        queue: usize,
        name: String,
        prefetch: u32,
        priority: i64,
        /// The consumer's own lease, in place of the queue's.
        ack_timeout: Option<Duration>,
    },
    /// `unread`: the consumer's latest deliveries, still in its channel.
    Cancel {
        consumer: usize,
        unread: Vec<u64>,
    },
    /// `unread`: as for `Cancel`.
    Stop {
        consumer: usize,
        unread: Vec<u64>,
    },
    Purge {
        queue: usize,
    },
    Settle {
        queue: usize,
        tag: u64,
        settle: Settle,
    },
    SettleBatch {
        queue: usize,
        settles: Vec<(u64, Settle)>,
    },
    AckUpTo {
        consumer: usize,
        tag: u64,
    },
    Stats {
        queue: usize,
    },
    Lookup {
        name: &'static str,
    },
    Close {
        queue: usize,
    },
}

/// An operation and the tick it is carried out at; a tick later than the previous step's
/// lets the command fire the timers due by then itself.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub(crate) at: Tick,
    pub(crate) op: Op,
}

impl Harness {
    // ----- generating --------------------------------------------------------------------

    pub(crate) fn generate(&mut self) -> Step {
        let op = self.gen_op();
        let touched = match &op {
            Op::Settle { queue, settle, .. } => (*settle == Settle::Touch).then_some(*queue),
            Op::SettleBatch { queue, settles } => {
                (settles.iter().any(|(_, s)| *s == Settle::Touch)).then_some(*queue)
            }
            _ => None,
        };
        let touches = touched.is_some();
        let tick_ms = u64::try_from(self.model.tick.0 / ms(1).as_nanos()).expect("whole ms");
        let rng = &mut self.rng;
        let mut dt = match op {
            // Long waits in milliseconds, whatever the tick.
            Op::Wait => match rng.below(100) {
                0..=9 => 0,
                10..=44 => rng.range(1, 10),
                45..=79 => rng.range(11, 300),
                80..=96 => rng.range(301, 3_000) / tick_ms,
                _ => rng.range(5_000, 20_000) / tick_ms,
            },
            _ => match rng.below(20) {
                0..=12 => 0,
                13..=17 => rng.range(1, 15),
                _ => rng.range(16, 400),
            },
        };
        if dt == 0 && (touches || self.touched_last) && !rng.one_in(10) {
            dt = rng.range(1, 15);
        }
        self.touched_last = touches;
        let mut at = self.now + dt;
        if let (Some(queue), true) = (touched, dt > 0) {
            at = self.quiet_tick(queue, at);
        }
        Step { at, op }
    }

    /// The first tick from `at` (at most 20 on) at which no timer of `queue` fires, so that
    /// no lease of it is set at the tick of a touch (see [`Model::order_is_open`]).
    fn quiet_tick(&self, queue: usize, mut at: Tick) -> Tick {
        let mut model = self.model.clone();
        for _ in 0..20 {
            model.run_timers(at - 1);
            if !(model.timers().iter()).any(|t| t.queue == queue && t.at == at) {
                break;
            }
            at += 1;
        }
        at
    }

    fn open_queues(&self) -> Vec<usize> {
        (0..self.model.queues.len())
            .filter(|&q| self.model.queues[q].open)
            .collect()
    }

    /// Mostly an open queue; now and then any handle, closed ones included.
    fn pick_queue(&mut self) -> usize {
        let open = self.open_queues();
        if !open.is_empty() && !self.rng.one_in(12) {
            self.rng.pick(&open)
        } else {
            self.rng.below(self.model.queues.len())
        }
    }

    fn pick_consumer(&mut self) -> usize {
        let open: Vec<usize> = (0..self.model.consumers.len())
            .filter(|&c| self.model.consumers[c].open)
            .collect();
        if !open.is_empty() && !self.rng.one_in(8) {
            self.rng.pick(&open)
        } else {
            self.rng.below(self.model.consumers.len())
        }
    }

    /// A live tag, an earlier one (mostly stale), or any number.
    fn pick_tag(&mut self, q: usize) -> u64 {
        let queue = &self.model.queues[q];
        let live: Vec<u64> = queue.leases.keys().copied().collect();
        let next = queue.next_tag;
        match self.rng.below(10) {
            0..=5 if !live.is_empty() => self.rng.pick(&live),
            0..=7 if next > 1 => self.rng.range(1, next - 1),
            _ => self.rng.range(0, next + 2),
        }
    }

    fn gen_op(&mut self) -> Op {
        if self.model.queues.is_empty() || (self.open_queues().is_empty() && self.rng.one_in(2)) {
            return self.gen_declare();
        }
        let no_consumers = self.model.consumers.is_empty();
        match self.rng.weighted(&[6, 20, 6, 8, 4, 26, 6, 4, 2, 2, 14]) {
            0 => self.gen_declare(),
            1 => {
                let queue = self.pick_queue();
                let message = self.gen_message();
                Op::Put { queue, message }
            }
            2 => {
                let queue = self.pick_queue();
                let n = self.rng.below(5);
                let messages = (0..n).map(|_| self.gen_message()).collect();
                Op::PutBatch { queue, messages }
            }
            3 | 4 | 7 if no_consumers => self.gen_consume(),
            3 => self.gen_consume(),
            4 => {
                let consumer = self.pick_consumer();
                let tags = &self.model.consumers[consumer].tags;
                let n = self.rng.below(tags.len().min(3) + 1);
                let unread = tags[tags.len() - n..].to_vec();
                if self.rng.one_in(3) {
                    Op::Stop { consumer, unread }
                } else {
                    Op::Cancel { consumer, unread }
                }
            }
            5 => {
                let queue = self.pick_queue();
                let tag = self.pick_tag(queue);
                let settle = self.gen_settle();
                Op::Settle { queue, tag, settle }
            }
            6 => {
                let queue = self.pick_queue();
                let n = self.rng.below(5);
                let settles = (0..n)
                    .map(|_| (self.pick_tag(queue), self.gen_settle()))
                    .collect();
                Op::SettleBatch { queue, settles }
            }
            7 => {
                let consumer = self.pick_consumer();
                let c = &self.model.consumers[consumer];
                let tag = if !c.tags.is_empty() && !self.rng.one_in(4) {
                    let tags = c.tags.clone();
                    self.rng.pick(&tags)
                } else {
                    self.rng.range(0, self.model.queues[c.queue].next_tag + 2)
                };
                Op::AckUpTo { consumer, tag }
            }
            8 if self.rng.one_in(3) => Op::Lookup {
                name: self.rng.pick(&QUEUE_NAMES),
            },
            8 => Op::Stats {
                queue: self.pick_queue(),
            },
            9 if self.rng.one_in(3) => Op::Purge {
                queue: self.pick_queue(),
            },
            9 => Op::Close {
                queue: self.pick_queue(),
            },
            _ => Op::Wait,
        }
    }

    fn gen_declare(&mut self) -> Op {
        if self.rng.one_in(40) {
            let name = self.rng.pick(&["", "no spaces", "q/0"]);
            return Op::Declare {
                name,
                config: QueueConfig::default(),
            };
        }
        let name = self.rng.pick(&QUEUE_NAMES);
        if let Some(config) = self.remembered.get(name) {
            let dead_letter_open =
                (config.dead_letter.as_deref()).is_none_or(|to| self.model.lookup(to).is_some());
            if dead_letter_open && self.rng.below(10) < 4 {
                return Op::Declare {
                    name,
                    config: config.clone(),
                };
            }
        }
        let config = self.gen_config(name);
        if check_config(name, &config).is_ok() {
            self.remembered.insert(name, config.clone());
        }
        Op::Declare { name, config }
    }

    fn gen_config(&mut self, name: &str) -> QueueConfig {
        let whole_ms = self.model.tick.0 == ms(1).as_nanos();
        let rng = &mut self.rng;
        let ack_timeout = ms(rng.pick(&[20, 50, 100, 250]));
        let retry = match rng.below(4) {
            0 => RetryPolicy::default(),
            1 => RetryPolicy::immediate(),
            _ => RetryPolicy {
                initial: ms(rng.pick(&[10, 40, 125])),
                multiplier: rng.pick(&[1.0, 1.5, 2.0]),
                max: ms(rng.pick(&[10, 100, 500, 2_000])),
                jitter: 0.0,
            },
        };
        let others: Vec<&'static str> = (QUEUE_NAMES.iter().copied())
            .filter(|&n| n != name && self.model.lookup(n).is_some())
            .collect();
        let mut config = QueueConfig {
            ack_timeout,
            // With ticks coarser than the durations, whether `max_lease` is rounded up to a
            // tick before the comparison is the contract's to say; it leaves it open
            // (contract §4 Ticks).
            max_lease: (whole_ms && rng.one_in(3)).then(|| ack_timeout * rng.range(1, 3) as u32),
            retry,
            max_deliveries: rng.one_in(2).then(|| rng.range(1, 3) as u32),
            dead_letter: (!others.is_empty() && !rng.one_in(3))
                .then(|| rng.pick(&others).to_string()),
            dedup_window: rng.pick(&[
                Duration::ZERO,
                Duration::ZERO,
                Duration::from_micros(30_500),
                ms(200),
                ms(1_000),
            ]),
            max_length: rng.one_in(3).then(|| rng.pick(&[1, 3, 6])),
            overflow: if rng.one_in(2) {
                Overflow::DropHead
            } else {
                Overflow::RejectPublish
            },
            max_body_bytes: if rng.one_in(4) {
                SMALL_BODY_LIMIT
            } else {
                QueueConfig::default().max_body_bytes
            },
            durable: false,
            max_priority: rng.one_in(3).then(|| rng.pick(&[0, 1, 3])),
        };
        if rng.one_in(25) {
            match rng.below(7) {
                0 => config.ack_timeout = Duration::ZERO,
                1 => config.max_lease = Some(config.ack_timeout - ms(1)),
                2 => config.retry.multiplier = 0.5,
                3 => config.max_deliveries = Some(0),
                4 => config.dead_letter = Some(name.to_string()),
                5 => config.max_length = Some(0),
                _ => config.max_body_bytes = 0,
            }
        }
        config
    }

    fn gen_message(&mut self) -> MessageSpec {
        self.bodies += 1;
        let rng = &mut self.rng;
        let body = match rng.below(40) {
            0..=2 => format!("m{}-padded", self.bodies), // over SMALL_BODY_LIMIT
            3..=5 => format!("m{:05}", self.bodies % 100_000), // exactly SMALL_BODY_LIMIT
            6 => String::new(),
            _ => format!("m{}", self.bodies),
        };
        let id = match rng.below(80) {
            0..=35 => IdSpec::None,
            36..=75 => IdSpec::Pool(rng.below(IDS.len())),
            76 => IdSpec::Longest,
            77 => IdSpec::Empty,
            _ => IdSpec::TooLong,
        };
        let delay = match rng.below(48) {
            0..=33 => Duration::ZERO,
            34..=37 => Duration::from_micros(rng.range(1, 3_000)),
            38..=44 => ms(rng.range(3, 400)),
            45 => ms(rng.range(1_000, 5_000)),
            46 => SEVEN_DAYS,
            _ => SEVEN_DAYS + Duration::from_nanos(1),
        };
        // Mostly within the small maximums declared, sometimes above every one.
        let priority = match rng.below(10) {
            0..=4 => 0,
            5..=8 => rng.range(1, 3) as u8,
            _ => rng.pick(&[4, 255]),
        };
        MessageSpec {
            body,
            id,
            delay,
            priority,
        }
    }

    fn gen_consume(&mut self) -> Op {
        let queue = self.pick_queue();
        let rng = &mut self.rng;
        let (name, prefetch) = match rng.below(50) {
            0 => (String::new(), 1),
            1 => ("c".repeat(256), 1),
            2 => (
                rng.pick(&CONSUMER_NAMES).to_string(),
                rng.pick(&[0, 65_536]),
            ),
            _ => (
                rng.pick(&CONSUMER_NAMES).to_string(),
                rng.range(1, 4) as u32,
            ),
        };
        // A third of the consumers get a priority, so that queues mix them.
        let priority = if rng.one_in(3) {
            rng.below(3) as i64 - 1
        } else {
            0
        };
        // A quarter of them lease for their own length: shorter or longer than their
        // queue's (20 to 250 ms), now and then over its `max_lease` or out of limits.
        let ack_timeout = match rng.below(40) {
            0..=8 => Some(ms(rng.pick(&[10, 30, 80, 400]))),
            9 => Some(rng.pick(&[Duration::ZERO, SEVEN_DAYS + ms(1), SEVEN_DAYS])),
            _ => None,
        };
        Op::Consume {
            queue,
            name,
            prefetch,
            priority,
            ack_timeout,
        }
    }

    fn gen_settle(&mut self) -> Settle {
        let rng = &mut self.rng;
        match rng.weighted(&[30, 14, 12, 8, 12, 24]) {
            0 => Settle::Ack,
            1 => Settle::Nack,
            2 => Settle::NackWithDelay(match rng.below(24) {
                0..=5 => Duration::ZERO,
                6..=9 => Duration::from_micros(rng.range(1, 2_500)),
                10..=18 => ms(rng.range(2, 150)),
                19..=21 => ms(rng.range(500, 3_000)),
                22 => SEVEN_DAYS,
                _ => SEVEN_DAYS + ms(1),
            }),
            3 => Settle::Reject,
            4 => Settle::Release,
            _ => Settle::Touch,
        }
    }
}
