//! A seeded, deterministic simulation of one replicated shard (contract §9): three
//! replicas of its group on openraft, in one thread on `openraft-rt-sim`'s virtual time,
//! under crashes, partitions and clocks that disagree, checked against a ledger.
//!
//! # What is simulated
//!
//! The shard's leader runs an engine as the shard thread of a cluster does
//! (`leasemq-shard`'s `runtime/lead.rs`): once its group made a node leader and that
//! node applied the leader's first entry of the term, the node builds its engine from
//! its replay's image (`Replay::resume`, then `promote` with its own clock: every lease
//! ended, attempts kept, log time never going back), and each engine call's changes are
//! proposed as one batch of the leader's chain. A call is answered, and what it delivered
//! handed to its consumer, once the batch is committed; a proposal that fails (the lead
//! moved, no majority within the call timeout) leaves the call's outcome unknown, and the
//! engine stands down. Consumers live on the leader and end with its lead.
//!
//! The workload, from the seed: puts (some delayed) to two queues, acks and nacks of
//! deliveries in hand, time moving on (past leases' ends at times), a replica crashed and
//! restarted from its disk, two replicas cut apart and joined again. Each replica's clock
//! is off the others' by up to seconds either way.
//!
//! # What is checked
//!
//! - **R1/R2**: every put answered is delivered, and by the end acked (or in an ack whose
//!   outcome is unknown), whatever leaders came and went;
//! - **no ack undone**: no message is delivered again after an ack of it was answered;
//! - **R3**: each delivery of a message has a greater attempt than the one before, across
//!   leaders;
//! - **R4**: no delivery tag of a queue is given twice, across leaders;
//! - **R5**: a delayed message is not delivered before its time in log time, however far
//!   behind a new leader's clock is;
//! - nothing is delivered that was never put;
//! - at the end every replica's copy (chain and engine image) is the same bytes.

mod ledger;
mod ops;
mod raft;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use leasemq_engine::durable::{begin_batch, Change};
use leasemq_engine::{
    Command, ConsumerConfig, ConsumerKey, Effects, QueueConfig, QueueKey, Reply, RetryPolicy,
    Settle, Shard, TickLength,
};
use leasemq_replica::{Batch, Replay};
use openraft::async_runtime::WatchReceiver;
use openraft::{AsyncRuntime, BasicNode, ServerState};
use openraft_rt_sim::{SimInstant, SimRuntime};

use crate::rng::Rng;
use crate::Violation;
use ledger::Ledger;
use raft::{Disk, Machine, Net, Raft};

const NODES: [u64; 3] = [1, 2, 3];
const QUEUES: [&str; 2] = ["jobs", "mail"];
const TICK: Duration = Duration::from_millis(10);
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a nacked message waits before it is ready again.
const MAX_RETRY: Duration = Duration::from_secs(4);
/// How long a proposal may wait for its commit before the leader gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Long enough for a group to elect a leader after a fault (a few election timeouts).
const SETTLE: Duration = Duration::from_millis(1500);

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub steps: u32,
    pub leads: u32,
    pub crashes: u32,
    pub cuts: u32,
    pub puts: u32,
    pub deliveries: u32,
    pub acks: u32,
    pub unknown: u32,
}

/// Runs seed `seed` for `steps` steps, then heals every fault and drains the queues.
///
/// # Errors
///
/// The first invariant that broke.
pub fn run_replicated_seed(seed: u64, steps: u32) -> Result<Summary, Violation> {
    run_replicated_seed_with(seed, steps, false)
}

/// [`run_replicated_seed`]; with `planted`, a put is answered as soon as its leader's
/// engine took it, before its batch is committed: a bug the ledger must catch.
///
/// # Errors
///
/// The first invariant that broke.
pub fn run_replicated_seed_with(
    seed: u64,
    steps: u32,
    planted: bool,
) -> Result<Summary, Violation> {
    let mut rt = SimRuntime::with_seed(seed);
    rt.block_on(async move {
        let mut world = World::start(seed).await;
        world.planted = planted;
        let run = world.run(steps).await;
        world.stop().await;
        run.map(|()| world.summary)
    })
}

struct Node {
    disk: Disk,
    up: Option<(Raft, Machine)>,
    /// How far this node's clock is off the simulation's, in ns.
    offset: i64,
    /// Where the next engine's key generations start, past every earlier one's here.
    generations: u32,
    /// The next chain's incarnation.
    next_inc: u32,
}

/// The engine of the node that leads, as its shard thread has it.
struct Lead {
    node: u64,
    term: u64,
    engine: Shard,
    inc: u32,
    p: u64,
    /// When the engine's tick 0 was, in simulated ns.
    epoch: u64,
    queues: Vec<QueueKey>,
    consumers: Vec<ConsumerKey>,
    /// Deliveries handed to consumers and not settled: (queue, tag, body, attempt).
    held: Vec<(usize, leasemq_engine::DeliveryTag, Bytes, u32)>,
}

struct World {
    rng: Rng,
    net: Net,
    nodes: BTreeMap<u64, Node>,
    lead: Option<Lead>,
    ledger: Ledger,
    summary: Summary,
    next_body: u64,
    tick: TickLength,
    /// Answer puts before their commit (a planted bug).
    planted: bool,
}

/// Simulated time now, in ns since the run began.
fn sim_now() -> u64 {
    let now = SimInstant::try_now().expect("inside the simulated runtime");
    u64::try_from(now.elapsed_since_start().as_nanos()).unwrap_or(u64::MAX)
}

/// The wall clock at the run's start, in ns since the Unix epoch: the nodes' clocks are
/// this, the simulated time since, and each node's offset.
const WALL_AT_START: u64 = 1_700_000_000 * 1_000_000_000;

impl World {
    async fn start(seed: u64) -> World {
        let mut rng = Rng::new(seed ^ 0x5eed_c105);
        let net = Net::new(rng.next_u64(), 20);
        let mut nodes = BTreeMap::new();
        for id in NODES {
            let disk = Disk::default();
            let up = raft::start(id, &disk, &net, TICK).await;
            let offset = (rng.below(6_000) as i64 - 3_000) * 1_000_000;
            nodes.insert(
                id,
                Node {
                    disk,
                    up: Some(up),
                    offset,
                    generations: 0,
                    next_inc: 0,
                },
            );
        }
        let members: BTreeMap<u64, BasicNode> = NODES
            .iter()
            .map(|&id| (id, BasicNode::new(format!("node {id}"))))
            .collect();
        let first = &nodes[&1].up.as_ref().expect("up").0;
        first.initialize(members).await.expect("the group forms");
        World {
            rng,
            net,
            nodes,
            lead: None,
            ledger: Ledger::default(),
            summary: Summary::default(),
            next_body: 0,
            tick: TickLength::new(TICK),
            planted: false,
        }
    }

    async fn run(&mut self, steps: u32) -> Result<(), Violation> {
        for _ in 0..steps {
            self.summary.steps += 1;
            self.follow().await?;
            match self.rng.weighted(&[40, 25, 8, 15, 4, 4, 4]) {
                0 => self.put().await?,
                1 => self.settle(Settle::Ack).await?,
                2 => self.settle(Settle::Nack).await?,
                3 => {
                    let ms = self.rng.range(10, 400);
                    self.pass(ms).await?;
                }
                4 => {
                    let ms = self.rng.range(2_000, 5_000);
                    self.pass(ms).await?;
                }
                5 => self.crash_or_restart().await,
                _ => self.cut_or_heal(),
            }
        }
        self.drain().await
    }

    /// Takes the lead where the group made a node leader that applied its term's first
    /// entry, after the engine of a lead that moved stood down.
    async fn follow(&mut self) -> Result<(), Violation> {
        if let Some(lead) = &self.lead {
            if self.still_leads(lead.node, lead.term) {
                return Ok(());
            }
            self.stand_down();
        }
        if let Some((node, term)) = self.ready_leader() {
            let promoted = self.take_lead(node, term)?;
            self.open(promoted).await?;
        }
        Ok(())
    }

    /// Whether node `id` still leads in `term`, as its replica sees it.
    fn still_leads(&self, id: u64, term: u64) -> bool {
        let Some((raft, _)) = self.nodes[&id].up.as_ref() else {
            return false;
        };
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        m.current_leader == Some(id) && m.current_term == term
    }

    /// The node that leads and may serve, and its term: of those that think so (one cut
    /// off may not know yet that it no longer does), the one of the newest term.
    fn ready_leader(&self) -> Option<(u64, u64)> {
        let ready = self.nodes.iter().filter_map(|(&id, node)| {
            let (raft, _) = node.up.as_ref()?;
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            let leading = m.state == ServerState::Leader && m.current_leader == Some(id);
            let applied = m
                .last_applied
                .is_some_and(|a| a.leader_id.term == m.current_term);
            let settled = m.last_applied.map(|a| a.index) >= m.last_log_index;
            (leading && applied && settled).then_some((id, m.current_term))
        });
        ready.max_by_key(|&(_, term)| term)
    }

    fn stand_down(&mut self) {
        if let Some(lead) = self.lead.take() {
            let node = self.nodes.get_mut(&lead.node).expect("a node");
            node.generations = node.generations.max(lead.engine.next_generation());
            // Its consumers end with it: what they held goes back with the next leader.
        }
    }

    /// Builds node `id`'s engine from its replay's image, promoted on its own clock, as
    /// a shard thread that takes the lead does; returns what the promotion changed.
    fn take_lead(&mut self, id: u64, term: u64) -> Result<Effects, Violation> {
        let node = self.nodes.get_mut(&id).expect("a node");
        let (_, machine) = node.up.as_ref().expect("up");
        let image = machine
            .replay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .image();
        let fresh = Shard::new(0, TICK).generations_after(node.generations);
        let replay = Replay::resume(fresh, &image)
            .map_err(|e| Violation::new("image", format!("node {id}: {e}")))?;
        let wall = (WALL_AT_START + sim_now()).saturating_add_signed(node.offset);
        let mut out = Effects::new();
        let (engine, _) = replay.promote(wall, &mut out);
        let inc = node.next_inc;
        node.next_inc += 1;
        self.summary.leads += 1;
        self.lead = Some(Lead {
            node: id,
            term,
            engine,
            inc,
            p: 0,
            epoch: sim_now(),
            queues: Vec::new(),
            consumers: Vec::new(),
            held: Vec::new(),
        });
        Ok(out)
    }

    /// The new lead's first turns: what the promotion changed, then its queues (declared
    /// where the group never had them) and a consumer of each.
    async fn open(&mut self, promoted: Effects) -> Result<(), Violation> {
        if !self.commit(promoted).await? {
            return Ok(());
        }
        for name in QUEUES {
            let found = match self
                .turn(Some(Command::Lookup { name: name.into() }))
                .await?
            {
                Some(Reply::Found(found)) => found,
                _ => return Ok(()),
            };
            let key = match found {
                Some(key) => key,
                None => {
                    let config = QueueConfig {
                        durable: true,
                        ack_timeout: ACK_TIMEOUT,
                        retry: RetryPolicy {
                            initial: Duration::from_millis(100),
                            multiplier: 2.0,
                            max: MAX_RETRY,
                            jitter: 0.0,
                        },
                        ..QueueConfig::default()
                    };
                    let declare = Command::Declare {
                        name: name.into(),
                        config: Box::new(config),
                    };
                    match self.turn(Some(declare)).await? {
                        Some(Reply::Declared(Ok(key))) => key,
                        _ => return Ok(()),
                    }
                }
            };
            let Some(lead) = self.lead.as_mut() else {
                return Ok(());
            };
            lead.queues.push(key);
        }
        for q in 0..QUEUES.len() {
            let Some(lead) = self.lead.as_ref() else {
                return Ok(());
            };
            let consume = Command::Consume {
                queue: lead.queues[q],
                name: format!("worker {q}"),
                config: ConsumerConfig { prefetch: 5 },
                priority: 0,
                ack_timeout: None,
            };
            match self.turn(Some(consume)).await? {
                Some(Reply::Consumed(Ok(key))) => {
                    self.lead.as_mut().expect("leads").consumers.push(key);
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// The lead's engine tick now.
    fn now(&self) -> leasemq_engine::Tick {
        let lead = self.lead.as_ref().expect("leads");
        self.tick
            .tick_of(sim_now().saturating_sub(lead.epoch))
            .max(lead.engine.now())
    }

    /// One engine call on the lead (`None`: its timers), answered once its changes are
    /// committed; `None` where no one leads, or the lead ended before the commit (the
    /// call's outcome is then unknown).
    async fn turn(&mut self, cmd: Option<Command>) -> Result<Option<Reply>, Violation> {
        if self.lead.is_none() {
            return Ok(None);
        }
        let now = self.now();
        let lead = self.lead.as_mut().expect("leads");
        let mut out = Effects::new();
        match cmd {
            Some(cmd) => lead.engine.handle(now, cmd, &mut out),
            None => lead.engine.handle_timeout(now, &mut out),
        }
        let reply = out.reply.take();
        Ok(if self.commit(out).await? { reply } else { None })
    }

    /// Proposes what a turn logged as the next batch of the lead's chain and waits for its
    /// commit; then hands its deliveries to their consumers. `false` where the proposal
    /// failed: the engine stands down.
    async fn commit(&mut self, mut out: Effects) -> Result<bool, Violation> {
        let now = self.now();
        let lead = self.lead.as_mut().expect("leads");
        if !out.log.is_empty() {
            let mut changes = Vec::new();
            begin_batch(&mut changes);
            Change::Clock {
                now: lead.engine.log_time(now),
            }
            .encode(&mut changes);
            for change in out.log.drain(..) {
                change.encode(&mut changes);
            }
            lead.p += 1;
            let batch = Batch {
                inc: lead.inc,
                p: lead.p,
                changes,
            };
            let (raft, _) = self.nodes[&lead.node]
                .up
                .as_ref()
                .expect("the leader is up");
            let write = SimRuntime::timeout(CALL_TIMEOUT, raft.client_write(batch)).await;
            if !matches!(write, Ok(Ok(_))) {
                self.summary.unknown += 1;
                self.stand_down();
                return Ok(false);
            }
        }
        let lead = self.lead.as_mut().expect("leads");
        let log_time = lead.engine.log_time(now);
        for (consumer, delivered) in out.deliveries.drain(..) {
            let Some(q) = lead.consumers.iter().position(|&c| c == consumer) else {
                continue;
            };
            let body = delivered.body.clone();
            self.ledger
                .delivered(q, delivered.tag.0, &body, delivered.attempt, log_time)?;
            lead.held.push((q, delivered.tag, body, delivered.attempt));
            self.summary.deliveries += 1;
        }
        Ok(true)
    }
}
