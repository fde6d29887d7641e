use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, DeadLetter, DeathOutcome, Delivered, DeliveryTag,
    Effects, Error, MsgId, Origin, QueueConfig, QueueKey, Reply, Shard,
};

use crate::model::{Answer, Id, Letter, Model, ModelDelivery};
use crate::ops::{MessageSpec, Op, Step};
use crate::rng::Rng;
use crate::{ms, Tick, QUEUE_NAMES};

// ----- the harness: engine and model side by side -------------------------------------------

/// What the engine did in one step, dead letters and their outcomes fed back as the runtime
/// does for a dead-letter queue on the same shard.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    reply: Option<Reply>,
    deliveries: Vec<(ConsumerKey, Delivered)>,
    letters: Vec<DeadLetter>,
    outcomes: Vec<DeathOutcome>,
    gone: Vec<ConsumerKey>,
    /// A reply to a silent command.
    stray_reply: Option<Reply>,
}

pub(crate) struct Harness {
    seed: u64,
    pub(crate) rng: Rng,
    shard: Shard,
    pub(crate) model: Model,
    pub(crate) now: Tick,
    queue_keys: Vec<QueueKey>,
    consumer_keys: Vec<ConsumerKey>,
    consumer_of: HashMap<ConsumerKey, usize>,
    /// Model broker id ↔ engine broker id, one to one.
    auto_ids: HashMap<u64, MsgId>,
    auto_ids_back: HashMap<MsgId, u64>,
    /// The last config each name was declared with.
    pub(crate) remembered: HashMap<&'static str, QueueConfig>,
    pub(crate) steps: Vec<Step>,
    pub(crate) bodies: u64,
    /// The previous step had a touch.
    pub(crate) touched_last: bool,
}

pub(crate) fn same_error(a: &Error, b: &Error) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

pub(crate) fn same_result<T: PartialEq>(a: &Result<T, Error>, b: &Result<T, Error>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => same_error(a, b),
        _ => false,
    }
}

impl Harness {
    /// Most runs count time in ticks of 1 ms; some in coarser ticks, to which every
    /// duration is rounded up.
    pub(crate) fn new(seed: u64, eager_ties: bool) -> Harness {
        let mut rng = Rng::new(seed);
        let tick = match rng.below(8) {
            0 => ms(3),
            1 => ms(10),
            _ => ms(1),
        };
        Harness {
            seed,
            rng,
            shard: Shard::new(0, tick),
            model: Model::new(tick, eager_ties),
            now: 0,
            queue_keys: Vec::new(),
            consumer_keys: Vec::new(),
            consumer_of: HashMap::new(),
            auto_ids: HashMap::new(),
            auto_ids_back: HashMap::new(),
            remembered: HashMap::new(),
            steps: Vec::new(),
            bodies: 0,
            touched_last: false,
        }
    }

    /// Runs `ops` steps; `Ok(false)` when the run stopped at a tie the contract leaves open.
    pub(crate) fn run(&mut self, ops: usize) -> Result<bool, String> {
        for _ in 0..ops {
            let step = self.generate();
            self.steps.push(step.clone());
            let answer = self.model.apply(&step);
            let seen = self.carry_out(&step);
            self.now = step.at;
            if self.model.open_order.is_some() {
                return Ok(false);
            }
            self.compare_step(answer, seen)?;
            self.shard.check_invariants();
            self.compare_state()?;
        }
        Ok(true)
    }

    pub(crate) fn report(&self, what: &str) -> String {
        let mut s = String::new();
        let last = self.steps.len().saturating_sub(1);
        let tick = Duration::from_nanos(self.model.tick.0 as u64);
        let _ = writeln!(
            s,
            "model mismatch: seed {}, tick {tick:?}, step #{last}: {what}",
            self.seed
        );
        let _ = writeln!(
            s,
            "replay: LEASEMQ_MODEL_SEED={} LEASEMQ_MODEL_OPS={} cargo test -p leasemq-engine --test model",
            self.seed,
            self.steps.len()
        );
        let _ = writeln!(s, "steps:");
        for (i, step) in self.steps.iter().enumerate() {
            let _ = writeln!(s, "  #{i} @{} {:?}", step.at, step.op);
        }
        s
    }

    // ----- the engine side ---------------------------------------------------------------

    fn command(&self, op: &Op) -> Option<Command> {
        let queue = |q: &usize| self.queue_keys[*q];
        let consumer = |c: &usize| self.consumer_keys[*c];
        Some(match op {
            Op::Wait => return None,
            Op::Declare { name, config } => Command::Declare {
                name: name.to_string(),
                config: Box::new(config.clone()),
            },
            Op::Put { queue: q, message } => Command::Put {
                queue: queue(q),
                message: message.message(),
            },
            Op::PutBatch { queue: q, messages } => Command::PutBatch {
                queue: queue(q),
                messages: messages.iter().map(MessageSpec::message).collect(),
            },
            Op::Consume {
                queue: q,
                name,
                prefetch,
                priority,
                ack_timeout,
            } => Command::Consume {
                queue: queue(q),
                name: name.clone(),
                config: ConsumerConfig {
                    prefetch: *prefetch,
                },
                priority: *priority,
                ack_timeout: *ack_timeout,
            },
            Op::Cancel {
                consumer: c,
                unread,
            } => Command::Cancel {
                consumer: consumer(c),
                unread: unread.iter().map(|&t| DeliveryTag(t)).collect(),
            },
            Op::Settle {
                queue: q,
                tag,
                settle,
            } => Command::Settle {
                queue: queue(q),
                tag: DeliveryTag(*tag),
                op: *settle,
            },
            Op::SettleBatch { queue: q, settles } => Command::SettleBatch {
                queue: queue(q),
                settles: settles.iter().map(|&(t, s)| (DeliveryTag(t), s)).collect(),
            },
            Op::AckUpTo { consumer: c, tag } => Command::AckUpTo {
                consumer: consumer(c),
                tag: DeliveryTag(*tag),
            },
            Op::Stats { queue: q } => Command::Stats { queue: queue(q) },
            Op::Lookup { name } => Command::Lookup {
                name: name.to_string(),
            },
            Op::Close { queue: q } => Command::Close { queue: queue(q) },
            Op::Stop {
                consumer: c,
                unread,
            } => Command::Stop {
                consumer: consumer(c),
                unread: unread.iter().map(|&t| DeliveryTag(t)).collect(),
            },
            Op::Purge { queue: q } => Command::Purge { queue: queue(q) },
        })
    }

    fn carry_out(&mut self, step: &Step) -> Observed {
        let mut seen = Observed::default();
        let mut out = Effects::new();
        match self.command(&step.op) {
            Some(cmd) => self.shard.handle(step.at, cmd, &mut out),
            None => self.shard.handle_timeout(step.at, &mut out),
        }
        seen.reply = out.reply.take();
        loop {
            Self::collect(&mut out, &mut seen);
            let letters = std::mem::take(&mut out.dead_letters);
            let mut outcomes = std::mem::take(&mut out.outcomes);
            if letters.is_empty() && outcomes.is_empty() {
                break;
            }
            if !letters.is_empty() {
                seen.letters.extend(letters.iter().cloned());
                self.shard
                    .handle(step.at, Command::DeadLetters { letters }, &mut out);
                Self::collect(&mut out, &mut seen);
                outcomes.append(&mut out.outcomes);
            }
            if !outcomes.is_empty() {
                seen.outcomes.extend(outcomes.iter().copied());
                self.shard
                    .handle(step.at, Command::Outcomes { outcomes }, &mut out);
            }
        }
        seen
    }

    fn collect(out: &mut Effects, seen: &mut Observed) {
        seen.deliveries.append(&mut out.deliveries);
        seen.gone.append(&mut out.consumers_gone);
        if let Some(reply) = out.reply.take() {
            seen.stray_reply.get_or_insert(reply);
        }
    }

    // ----- comparing ---------------------------------------------------------------------

    fn bind_queue(&mut self, q: usize, key: QueueKey) -> Result<(), String> {
        if q < self.queue_keys.len() {
            if self.queue_keys[q] != key {
                return Err(format!(
                    "declare gave {key:?}, the queue has {:?}",
                    self.queue_keys[q]
                ));
            }
        } else if self.queue_keys.contains(&key) {
            return Err(format!("a new queue got the key {key:?} of an earlier one"));
        } else {
            self.queue_keys.push(key);
        }
        Ok(())
    }

    fn bind_consumer(&mut self, c: usize, key: ConsumerKey) -> Result<(), String> {
        assert_eq!(
            c,
            self.consumer_keys.len(),
            "consumers are numbered in order"
        );
        if self.consumer_of.contains_key(&key) {
            return Err(format!(
                "a new consumer got the key {key:?} of an earlier one"
            ));
        }
        self.consumer_keys.push(key);
        self.consumer_of.insert(key, c);
        Ok(())
    }

    fn compare_reply(&mut self, answer: Answer, reply: Option<Reply>) -> Result<(), String> {
        let mismatch = |answer: &Answer, reply: &Option<Reply>| {
            Err(format!("reply: model {answer:?}, engine {reply:?}"))
        };
        let same = match (&answer, &reply) {
            (Answer::Silent, None) => true,
            (Answer::Declared(Ok(q)), Some(Reply::Declared(Ok(key)))) => {
                return self.bind_queue(*q, *key);
            }
            (Answer::Declared(Err(a)), Some(Reply::Declared(Err(b)))) => same_error(a, b),
            (Answer::Consumed(Ok(c)), Some(Reply::Consumed(Ok(key)))) => {
                return self.bind_consumer(*c, *key);
            }
            (Answer::Consumed(Err(a)), Some(Reply::Consumed(Err(b)))) => same_error(a, b),
            (Answer::Put(a), Some(Reply::Put(b))) => same_result(a, b),
            (Answer::PutBatch(a), Some(Reply::PutBatch(b))) => same_result(a, b),
            (Answer::Settled(a), Some(Reply::Settled(b))) => a == b,
            (Answer::SettledBatch(a), Some(Reply::SettledBatch(b))) => a == b,
            (Answer::Count(a), Some(Reply::Count(b))) => a == b,
            (Answer::Purged(Ok(a)), Some(Reply::Purged(Ok(b)))) => a == b,
            (Answer::Purged(Err(a)), Some(Reply::Purged(Err(b)))) => same_error(a, b),
            (Answer::Stats(a), Some(Reply::Stats(b))) => a.as_ref() == b.as_deref(),
            (Answer::Found(a), Some(Reply::Found(b))) => a.map(|q| self.queue_keys[q]) == *b,
            (Answer::Closed(a), Some(Reply::Closed(b))) => a.as_ref() == b.as_deref(),
            _ => false,
        };
        if same {
            Ok(())
        } else {
            mismatch(&answer, &reply)
        }
    }

    /// Broker ids are the engine's to choose; they must map one to one onto the model's.
    fn same_id(&mut self, model: &Id, engine: &MsgId) -> bool {
        match (model, engine) {
            (Id::Given(a), MsgId::Given(b)) => **b == **a,
            (Id::Auto(n), MsgId::Auto(_)) => match self.auto_ids.get(n) {
                Some(known) => known == engine,
                None if self.auto_ids_back.contains_key(engine) => false,
                None => {
                    self.auto_ids.insert(*n, engine.clone());
                    self.auto_ids_back.insert(engine.clone(), *n);
                    true
                }
            },
            _ => false,
        }
    }

    /// Deliveries, queue by queue in order (the order between queues is not part of the
    /// contract); dead letters and outcomes in order; ended consumers as a set.
    fn compare_step(&mut self, answer: Answer, seen: Observed) -> Result<(), String> {
        self.compare_reply(answer, seen.reply)?;
        if let Some(stray) = seen.stray_reply {
            return Err(format!("a silent command answered {stray:?}"));
        }
        let fx = std::mem::take(&mut self.model.fx);
        let mut engine: BTreeMap<usize, Vec<(usize, Delivered)>> = BTreeMap::new();
        for (key, delivered) in seen.deliveries {
            let Some(&c) = self.consumer_of.get(&key) else {
                return Err(format!(
                    "a delivery to an unknown consumer {key:?}: {delivered:?}"
                ));
            };
            let q = self.model.consumers[c].queue;
            engine.entry(q).or_default().push((c, delivered));
        }
        let mut model: BTreeMap<usize, Vec<ModelDelivery>> = BTreeMap::new();
        for d in fx.deliveries {
            model
                .entry(self.model.consumers[d.consumer].queue)
                .or_default()
                .push(d);
        }
        let queues: Vec<usize> = engine.keys().chain(model.keys()).copied().collect();
        for q in queues {
            let (e, m) = (
                engine.remove(&q).unwrap_or_default(),
                model.remove(&q).unwrap_or_default(),
            );
            if !self.same_deliveries(&m, &e) {
                return Err(format!(
                    "deliveries of queue handle {q}:\n  model  {m:?}\n  engine {e:?}"
                ));
            }
        }
        if !self.same_letters(&fx.letters, &seen.letters) {
            return Err(format!(
                "dead letters:\n  model  {:?}\n  engine {:?}",
                fx.letters, seen.letters
            ));
        }
        let outcomes: Vec<(Origin, bool)> = (fx.outcomes.iter())
            .map(|&(q, accepted)| (self.origin(q), accepted))
            .collect();
        let engine_outcomes: Vec<(Origin, bool)> = seen
            .outcomes
            .iter()
            .map(|o| (o.origin, o.accepted))
            .collect();
        if outcomes != engine_outcomes {
            return Err(format!(
                "dead-letter outcomes: model {outcomes:?}, engine {engine_outcomes:?}"
            ));
        }
        let mut gone = fx.gone;
        gone.sort_unstable();
        let mut engine_gone = Vec::new();
        for key in &seen.gone {
            match self.consumer_of.get(key) {
                Some(&c) => engine_gone.push(c),
                None => return Err(format!("an unknown consumer {key:?} ended")),
            }
        }
        engine_gone.sort_unstable();
        if gone != engine_gone {
            return Err(format!(
                "consumers ended: model {gone:?}, engine {engine_gone:?}"
            ));
        }
        Ok(())
    }

    fn origin(&self, q: usize) -> Origin {
        Origin {
            shard: 0,
            queue: self.queue_keys[q],
            msg: 0,
        }
    }

    fn same_deliveries(&mut self, model: &[ModelDelivery], engine: &[(usize, Delivered)]) -> bool {
        model.len() == engine.len()
            && model.iter().zip(engine).all(|(m, (c, e))| {
                m.consumer == *c
                    && DeliveryTag(m.tag) == e.tag
                    && m.body.as_bytes() == e.body.as_ref()
                    && m.attempt == e.attempt
                    && m.death.as_ref() == e.death.as_deref()
                    && self.same_id(&m.id, &e.id)
            })
    }

    fn same_letters(&mut self, model: &[Letter], engine: &[DeadLetter]) -> bool {
        model.len() == engine.len()
            && model.iter().zip(engine).all(|(m, e)| {
                *m.to == *e.to
                    && self.origin(m.origin) == e.origin
                    && m.body.as_bytes() == e.body.as_ref()
                    && m.death == e.death
                    && self.same_id(&m.id, &e.id)
            })
    }

    /// Every queue's stats (closed ones: none), the names in use, the next deadline.
    fn compare_state(&mut self) -> Result<(), String> {
        for q in 0..self.model.queues.len() {
            let model = self.model.queues[q].open.then(|| self.model.stats(q));
            let engine = self.shard.stats(self.queue_keys[q]);
            if model != engine {
                return Err(format!(
                    "stats of queue handle {q} ({}):\n  model  {model:?}\n  engine {engine:?}",
                    self.model.queues[q].name
                ));
            }
        }
        for name in QUEUE_NAMES {
            let model = self.model.lookup(name).map(|q| self.queue_keys[q]);
            let engine = self.shard.lookup(name);
            if model != engine {
                return Err(format!(
                    "lookup({name}): model {model:?}, engine {engine:?}"
                ));
            }
        }
        let (model, engine) = (self.model.next_deadline(), self.shard.next_deadline());
        let fine = match (model, engine) {
            (None, None) => true,
            (Some(m), Some(e)) => e <= m,
            _ => false,
        };
        if !fine {
            return Err(format!("next_deadline: model {model:?}, engine {engine:?}"));
        }
        Ok(())
    }
}
