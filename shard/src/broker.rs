//! The broker handle: builds the shards, routes declares, moves the manual clock, shuts down.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasemq_engine::{validate, Command, Error, QueueConfig};

use crate::protocol::{Answer, Inbox, ReplyTo, Request};
use crate::queue::Queue;
use crate::reply::{call, fan_in};
use crate::router::shard_for;
use crate::runtime::{ShardThread, TimeSource};

/// Builds a [`Broker`].
#[derive(Clone, Debug)]
pub struct BrokerBuilder {
    shards: Option<usize>,
    manual_clock: bool,
    tick: Duration,
}

impl Default for BrokerBuilder {
    fn default() -> Self {
        BrokerBuilder {
            shards: None,
            manual_clock: false,
            tick: Duration::from_millis(1),
        }
    }
}

/// The most shards a broker may run.
pub const MAX_SHARDS: usize = 1024;

impl BrokerBuilder {
    /// How many shard threads (default: the available parallelism).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Time moves only when [`Broker::advance`] says so: for tests and simulations.
    pub fn manual_clock(mut self) -> Self {
        self.manual_clock = true;
        self
    }

    /// The length of one tick, the unit deadlines are rounded up to (default 1 ms; from
    /// 1 µs to 1 s).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Starts the shard threads.
    pub fn build(self) -> Result<Broker, Error> {
        let shards = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if shards == 0 || shards > MAX_SHARDS {
            return Err(Error::InvalidConfig(format!(
                "shards must be from 1 to {MAX_SHARDS}, got {shards}"
            )));
        }
        if self.tick < Duration::from_micros(1) || self.tick > Duration::from_secs(1) {
            return Err(Error::InvalidConfig(format!(
                "tick must be from 1 µs to 1 s, got {:?}",
                self.tick
            )));
        }
        let time = if self.manual_clock {
            TimeSource::Manual
        } else {
            TimeSource::System(Instant::now())
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| {
                let (inbox, rx, sleeper) = Inbox::new();
                (inbox, (rx, sleeper))
            })
            .unzip();
        let mut threads = Vec::with_capacity(shards);
        for (index, (inbox, sleeper)) in receivers.into_iter().enumerate() {
            let after_panic = inbox.clone();
            let shard = ShardThread::new(
                index,
                inbox,
                sleeper,
                senders.clone(),
                time.clone(),
                self.tick,
            );
            let thread = std::thread::Builder::new()
                .name(format!("leasemq-shard-{index}"))
                .spawn(move || {
                    // A panic here is a broker bug, and it must not leave callers waiting
                    // for answers that will never come: unwinding drops every request the
                    // shard held, and the thread stays to drop each later one, until
                    // shutdown. A dropped request answers `ShutDown`.
                    if catch_unwind(AssertUnwindSafe(|| shard.run())).is_err() {
                        for request in after_panic.iter() {
                            if matches!(request, Request::Shutdown) {
                                break;
                            }
                        }
                    }
                })
                .map_err(|e| Error::InvalidConfig(format!("cannot start a shard thread: {e}")))?;
            threads.push(thread);
        }
        Ok(Broker {
            inner: Arc::new(BrokerInner {
                shards: senders,
                manual: self.manual_clock,
                manual_nanos: AtomicU64::new(0),
                shut_down: AtomicBool::new(false),
                threads: Mutex::new(threads),
            }),
        })
    }
}

pub(crate) struct BrokerInner {
    pub shards: Vec<Inbox>,
    manual: bool,
    manual_nanos: AtomicU64,
    shut_down: AtomicBool,
    /// Taken once, by the shutdown that joins them; never touched on the message path.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl BrokerInner {
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub fn inbox(&self, shard: usize) -> &Inbox {
        &self.shards[shard]
    }

    fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads.is_empty() {
            return;
        }
        for inbox in &self.shards {
            let _ = inbox.send(Request::Shutdown);
        }
        for thread in threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A running broker: a set of shard threads, each owning the queues that hash onto it.
///
/// Cheap to clone; every clone drives the same shards. The shards stop at
/// [`shutdown`](Broker::shutdown), or when the last handle of any kind (broker, queue,
/// consumer, delivery) is dropped.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerInner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("shards", &self.inner.shards.len())
            .field("manual_clock", &self.inner.manual)
            .field("shut_down", &self.inner.is_shut_down())
            .finish()
    }
}

impl Broker {
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder::default()
    }

    /// A broker with the default settings: one shard per core, the system clock.
    pub fn new() -> Result<Broker, Error> {
        Broker::builder().build()
    }

    /// How many shards this broker runs.
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// The shard that owns (or would own) the queue `name`.
    pub fn shard_of(&self, name: &str) -> usize {
        shard_for(name, self.inner.shards.len())
    }

    /// Declares a queue, or returns the existing one when its config is equal.
    pub fn declare_queue(&self, name: &str, config: QueueConfig) -> Result<Queue, Error> {
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        validate::queue_name(name)?;
        validate::queue_config(name, &config)?;
        if let Some(dead_letter) = &config.dead_letter {
            if self.lookup(dead_letter)?.is_none() {
                return Err(Error::UnknownQueue(dead_letter.clone()));
            }
        }
        let shard = self.shard_of(name);
        let cmd = Command::Declare {
            name: name.to_string(),
            config: Box::new(config),
        };
        match call(self.inner.inbox(shard), |reply| Request::Declare {
            cmd,
            reply,
        }) {
            Answer::Queue(Ok(Some((key, cell)))) => {
                Ok(Queue::new(self.inner.clone(), name, shard, key, cell))
            }
            Answer::Queue(Err(e)) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("declare answered {other:?}"),
        }
    }

    /// The live queue called `name`, if there is one.
    pub fn queue(&self, name: &str) -> Option<Queue> {
        self.lookup(name).ok().flatten()
    }

    fn lookup(&self, name: &str) -> Result<Option<Queue>, Error> {
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        if validate::queue_name(name).is_err() {
            return Ok(None);
        }
        let shard = self.shard_of(name);
        let cmd = Command::Lookup {
            name: name.to_string(),
        };
        match call(self.inner.inbox(shard), |reply| Request::Declare {
            cmd,
            reply,
        }) {
            Answer::Queue(Ok(found)) => {
                Ok(found.map(|(key, cell)| Queue::new(self.inner.clone(), name, shard, key, cell)))
            }
            Answer::Queue(Err(e)) => Err(e),
            Answer::ShutDown => Err(Error::ShutDown),
            other => unreachable!("lookup answered {other:?}"),
        }
    }

    /// Moves the manual clock forward by `by` and returns once every shard has fired every
    /// timer due and pushed the deliveries that followed into consumer channels, and every
    /// dead letter that caused has landed.
    pub fn advance(&self, by: Duration) -> Result<(), Error> {
        if !self.inner.manual {
            return Err(Error::NotManualClock);
        }
        if self.inner.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let nanos = self
            .inner
            .manual_nanos
            .fetch_add(by, Ordering::AcqRel)
            .saturating_add(by);
        let mut moved = self.step_all(|reply| Request::Advance { nanos, reply })?;
        // Dead letters crossing shards, and the answers about them, take more steps.
        while moved > 0 {
            moved = self.step_all(|reply| Request::Barrier { reply })?;
        }
        Ok(())
    }

    /// Sends one step to every shard and waits for all; returns the messages they sent to
    /// each other meanwhile.
    fn step_all(&self, request: impl Fn(ReplyTo) -> Request) -> Result<u64, Error> {
        let (reply_to, answers) = fan_in(self.inner.shards.len());
        for inbox in &self.inner.shards {
            drop(inbox.send(request(reply_to())));
        }
        let mut moved = 0;
        for _ in 0..self.inner.shards.len() {
            match answers.recv() {
                Ok(Answer::Step { cross_sent }) => moved += cross_sent,
                _ => return Err(Error::ShutDown),
            }
        }
        Ok(moved)
    }

    /// Stops every shard and joins its thread. Idempotent. Afterwards `put`, `consume`,
    /// `declare_queue`, `advance` and `recv` give [`Error::ShutDown`]; settles return false.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    pub fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }
}
