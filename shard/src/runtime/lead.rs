//! A cluster shard thread's roles (contract §9): it follows while another node leads its
//! shard or none does, leads once its group made this node leader and applied everything
//! earlier leaders committed, and stands down when the lead ends or its chain of
//! proposals breaks.
//!
//! - **Following**: the engine is idle. Calls wait in `pending` for a leader here, up to
//!   the call timeout. Once another node leads, the calls made on this node are taken to
//!   it from here, and those a peer forwarded are answered `NotLeader` for the peer to
//!   take there; the rest (consumers, streams) are answered `Unavailable`, naming it.
//! - **Leading**: the engine is built from the group's copy of the shard (its replay's
//!   image) in the state a restart leaves (contract §9 R3: every lease ended, attempts
//!   kept), with key generations after every earlier engine's here, so that no key given
//!   out before names anything in it. Its log proposes to the group.
//! - **Standing down**: what waits on the log is refused `Unavailable` (its outcome is
//!   unknown), every consumer ends, and the engine goes. Where this node still leads (its
//!   chain broke: a proposal was not committed), it waits until every proposal has its
//!   outcome and the group applied its whole log, then leads again with a new chain,
//!   whose first batch every replica takes after whatever it took of the broken one.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use leasemq_engine::{Error, QueueStats, Reply, Shard};
use leasemq_replica::Replay;

use super::{new_engine, ShardThread, TimeSource};
use crate::cluster::{ClusterInner, Ending, Proposing, Replica, RoleView};
use crate::forward::Call;
use crate::protocol::{Answer, Deferred, Inbox, Request};
use crate::route;
use crate::store::ShardLog;

/// A cluster shard thread's role, and the calls that wait for it.
pub(crate) struct Steering {
    replica: Arc<Replica>,
    /// The node's cluster, to take a call made on this node to the leader elsewhere, and
    /// this shard's own inbox, where it comes back should that leader be gone.
    cluster: Arc<ClusterInner>,
    inbox: Inbox,
    /// The role version last acted on.
    seen: u64,
    mode: Mode,
    /// Calls that came while no one here led, each with when it came.
    pending: VecDeque<(Instant, Request)>,
    /// The generation the next engine's keys start after.
    generations: u32,
    /// The next chain's incarnation: each chain this thread starts has a greater one.
    next_inc: u32,
}

enum Mode {
    Following,
    Leading {
        term: u64,
    },
    /// The chain broke while this node led in `term`: it waits to start a new one.
    Ending(Ending),
}

impl Steering {
    pub fn new(replica: Arc<Replica>, cluster: Arc<ClusterInner>, inbox: Inbox) -> Steering {
        Steering {
            replica,
            cluster,
            inbox,
            seen: 0,
            mode: Mode::Following,
            pending: VecDeque::new(),
            generations: 0,
            next_inc: 0,
        }
    }

    pub fn is_leading(&self) -> bool {
        matches!(self.mode, Mode::Leading { .. })
    }

    /// Whether the thread has something to look at: its role may have changed, or a
    /// waiting call may be answered.
    pub fn has_news(&self) -> bool {
        self.seen != self.replica.version()
    }

    /// When the oldest waiting call runs out of time.
    pub fn deadline(&self) -> Option<Instant> {
        let (at, _) = self.pending.front()?;
        Some(*at + self.replica.call_timeout)
    }

    fn unavailable(&self, view: &RoleView) -> Error {
        let shard = self.replica.shard;
        Error::Unavailable(match view.leader {
            Some(node) if node != self.replica.node => {
                format!("shard {shard} is led by node {node} now, not this one; call again")
            }
            _ => format!(
                "shard {shard} found no leader within the call timeout ({:?})",
                self.replica.call_timeout
            ),
        })
    }
}

impl ShardThread {
    /// A request that came while this node does not lead the shard: what needs no leader
    /// is answered now, the rest waits for one.
    pub(super) fn follow_request(&mut self, req: Request) {
        match req {
            Request::Shutdown => self.stopping = true,
            // The consumer ended when the lead did.
            Request::Cancel { reply, .. } => {
                if let Some(reply) = reply {
                    reply.send(Answer::Done);
                }
            }
            Request::Stop { reply, .. } => reply.send(Answer::Done),
            Request::Barrier { reply } | Request::Advance { reply, .. } => {
                reply.send(Answer::Step { cross_sent: 0 });
            }
            // The group's copy, as of its last commit.
            Request::Names { reply } => {
                let replica = &self.cluster.as_ref().expect("a cluster shard").replica;
                let names = (replica.replay)
                    .with(|replay| replay.engine().queue_names().map(str::to_string).collect());
                reply.send(Answer::Names(names));
            }
            Request::Stats { reply } => {
                let replica = &self.cluster.as_ref().expect("a cluster shard").replica;
                let stats = (replica.replay).with(|replay| {
                    (replay.engine().queue_stats())
                        .map(|(name, stats)| (name.to_string(), stats))
                        .collect()
                });
                reply.send(Answer::Stats(stats));
            }
            // Dead letters are not served in a cluster.
            Request::Hop(_) => {}
            req => {
                let steering = self.cluster.as_mut().expect("a cluster shard");
                steering.pending.push_back((Instant::now(), req));
            }
        }
    }

    /// Acts on the shard's role: stands down when the lead ended or the log broke, leads
    /// once the group is ready, answers the calls that waited. Cheap while leading with
    /// nothing new.
    pub(super) fn steer(&mut self) {
        let Some(steering) = self.cluster.as_mut() else {
            return;
        };
        let version = steering.replica.version();
        let news = steering.seen != version;
        steering.seen = version;
        if let Mode::Leading { term } = steering.mode {
            let failed = self.log.as_ref().and_then(|log| log.failed().cloned());
            if let Some(e) = failed {
                self.stand_down(e);
            } else if news {
                let view = steering.replica.view();
                if !(view.leader == Some(steering.replica.node) && view.term == term) {
                    let e = Error::Unavailable(format!(
                        "the lead of shard {} moved to {} in term {}",
                        steering.replica.shard,
                        view.leader
                            .map_or("no node yet".into(), |n| format!("node {n}")),
                        view.term
                    ));
                    self.stand_down(e);
                }
            }
        }
        let steering = self.cluster.as_mut().expect("a cluster shard");
        if steering.is_leading() {
            return;
        }
        let view = steering.replica.view();
        let lead = match &steering.mode {
            Mode::Ending(ending) if ending.term != view.term || !view.ready => {
                steering.mode = Mode::Following;
                view.ready
            }
            Mode::Ending(ending) => ending.resolved() && view.settled,
            _ => view.ready,
        };
        let ending = matches!(steering.mode, Mode::Ending(_));
        steering.replica.want_every_change(ending);
        if lead {
            self.lead(view.term);
        }
        self.answer_pending(&view);
    }

    /// Hands the waiting calls to the engine once this node leads; else refuses those
    /// that another node's lead, or the call timeout, leaves no hope for.
    fn answer_pending(&mut self, view: &RoleView) {
        let steering = self.cluster.as_mut().expect("a cluster shard");
        if steering.pending.is_empty() {
            return;
        }
        if steering.is_leading() {
            let pending = std::mem::take(&mut steering.pending);
            for (_, req) in pending {
                self.process(req);
            }
            self.flush();
            self.pump_log();
            return;
        }
        let elsewhere = view.leader.is_some_and(|n| n != steering.replica.node);
        let now = Instant::now();
        let timeout = steering.replica.call_timeout;
        while let Some((at, _)) = steering.pending.front() {
            if !elsewhere && now.duration_since(*at) < timeout {
                break;
            }
            let (_, req) = steering.pending.pop_front().expect("looked at it");
            let leader = view.leader.filter(|_| elsewhere);
            match (leader, req) {
                // Did not run: a peer that forwarded it takes it to the leader.
                (Some(_), Request::Engine { reply, .. } | Request::Declare { reply, .. })
                    if reply.is_from_peer() =>
                {
                    reply.send(Answer::NotLeader(view.leader))
                }
                // Made on this node: taken there from here, so that a call whose caller
                // does not wait (or cannot go again) is not lost.
                (Some(leader), req) => match Call::from_request(req) {
                    Ok((call, reply)) => {
                        let (cluster, inbox) = (&steering.cluster, &steering.inbox);
                        let shard = usize::from(steering.replica.shard);
                        cluster.send_to(leader, inbox, shard, call, reply);
                    }
                    Err(req) => refuse_request(req, steering.unavailable(view)),
                },
                (None, req) => refuse_request(req, steering.unavailable(view)),
            }
        }
    }

    /// Takes the lead in `term`: the engine from the group's copy, a new chain.
    fn lead(&mut self, term: u64) {
        let steering = self.cluster.as_mut().expect("a cluster shard");
        let replica = steering.replica.clone();
        let image = replica.replay.with(Replay::image);
        let tick = self.tick.as_duration();
        let time = TimeSource::System(Instant::now());
        let fresh = new_engine(self.index, &time, tick).generations_after(steering.generations);
        let replay = match Replay::resume(fresh, &image) {
            Ok(replay) => replay,
            Err(e) => {
                // The group's copy is broken: this replica cannot lead, and another must.
                eprintln!(
                    "leasemq: shard {}: cannot lead from the group's copy: {e}",
                    replica.shard
                );
                return;
            }
        };
        let inc = steering.next_inc;
        steering.next_inc += 1;
        steering.mode = Mode::Leading { term };
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        // The thread's clock starts at the promotion, tick 0, and log time goes on from
        // the later of the wall clock and the last logged time (contract §9 R5).
        self.time = time;
        let (engine, _) = replay.promote(wall, &mut self.out);
        self.engine = engine;
        let chain = Proposing::start(&replica, term, inc, self.sleeper.clone());
        self.log = Some(ShardLog::proposing(chain));
        self.rekey_cells();
        // What the promotion changed (messages past their last delivery dropped) is the
        // chain's first batch.
        let now = self.now();
        route::dead_letters(self, now, None);
        self.flush();
        self.pump_log();
    }

    /// Finds each queue's cell its slot in the new engine, by the queue's durable number;
    /// a queue that is gone (another leader closed it) is closed for its handles.
    fn rekey_cells(&mut self) {
        let cells: Vec<_> = self.cells.drain(..).flatten().collect();
        for (_, cell) in cells {
            let key = cell.number().and_then(|n| self.engine.queue_by_number(n));
            let Some(key) = key else {
                cell.close(QueueStats::default());
                continue;
            };
            let slot = key.slot();
            if self.cells.len() <= slot {
                self.cells.resize_with(slot + 1, || None);
            }
            self.cells[slot] = Some((key, cell));
        }
    }

    /// Ends every consumer of the shard with its lead: each reads `Unavailable` once its
    /// channel, closed here, is empty.
    pub(super) fn end_consumers_with_lead(&mut self) {
        for sink in self.sinks.drain(..).flatten() {
            sink.readers.0.unavailable.store(true, Ordering::Release);
            // Dropping it closes the channel, then wakes its readers.
            drop(sink);
        }
    }

    /// Ends this node's lead of the shard (contract §9 R3): what waits on the log is
    /// refused with `why`, every consumer ends, the engine goes.
    fn stand_down(&mut self, why: Error) {
        self.flush();
        let ending = self.log.as_mut().and_then(|log| log.end_chain(why.clone()));
        self.release_held();
        self.end_consumers_with_lead();
        let steering = self.cluster.as_mut().expect("a cluster shard");
        let Mode::Leading { term } = steering.mode else {
            return;
        };
        steering.generations = steering.generations.max(self.engine.next_generation());
        let view = steering.replica.view();
        steering.mode = match ending {
            Some(ending) if view.leader == Some(steering.replica.node) && view.term == term => {
                Mode::Ending(ending)
            }
            _ => Mode::Following,
        };
        self.log = None;
        let tick = self.tick.as_duration();
        self.engine = Shard::new(self.engine.index(), tick);
        self.out = leasemq_engine::Effects::new();
        self.backlog.clear();
    }
}

/// Answers a call that found no leader: `Unavailable`, in the shape its caller reads.
fn refuse_request(req: Request, e: Error) {
    let (reply, answer) = match req {
        Request::Engine { cmd, reply } => (reply, Answer::Engine(super::refusal(&cmd, e))),
        Request::Declare { reply, .. } => (reply, Answer::Queue(Err(e))),
        Request::Consume { reply, .. } => (reply, Answer::Engine(Reply::Consumed(Err(e)))),
        // Nothing else waits for a leader.
        _ => return,
    };
    Deferred::plain(reply, answer).send(None);
}
