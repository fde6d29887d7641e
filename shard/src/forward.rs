//! Calls that reach their shard's leader from any node (contract §9 R6).
//!
//! In a cluster a queue's handles name it by its durable number, which every engine that
//! leads its shard knows, rather than by an engine's key. A call goes to this node's shard
//! thread while this node leads the shard (or no one is known to), else over the node link
//! to the node that leads it, whose forward server hands it to its own shard thread.
//! A shard thread that does not lead answers `NotLeader`: the call did not run, and goes
//! again to the leader it names, until the call timeout. A call whose answer is lost on
//! the link may have run: it answers `Unavailable`, never retried (a put again could be a
//! second copy; with an id it is a `Duplicate` while the first is live).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasemq_engine::{Command, Error, QueueConfig, Reply};
use leasemq_replica::link::{ForwardError, Forwarded};
use serde::{Deserialize, Serialize};

use crate::cluster::ClusterInner;
use crate::protocol::{numbered_key, Answer, Inbox, QueueCell, ReplyTo, Request};
use crate::reply::{call_async, call_parked};

/// How much longer than the call timeout a forwarded call may take on the link: the
/// leader's own wait is bounded by the call timeout.
const LINK_SLACK: Duration = Duration::from_secs(2);

/// A call for a shard's leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Call {
    /// A command about the queue numbered `number`; its own queue key is set by the
    /// leader's shard thread.
    Engine { number: u32, cmd: Command },
    /// A declare or a lookup.
    Declare { cmd: Command },
}

impl Call {
    fn into_request(self, reply: ReplyTo) -> Request {
        match self {
            Call::Engine { number, cmd } => Request::ByNumber { number, cmd, reply },
            Call::Declare { cmd } => Request::Declare { cmd, reply },
        }
    }

    /// The answer to this call when it is refused for `e`.
    fn refused(&self, e: Error) -> Answer {
        match self {
            Call::Engine { cmd, .. } => Answer::Engine(crate::runtime::refusal(cmd, e)),
            Call::Declare { .. } => Answer::Queue(Err(e)),
        }
    }
}

/// An answer as it crosses the link.
#[derive(Debug, Serialize, Deserialize)]
enum Answered {
    Engine(Reply),
    /// The queue declared or found: its config and durable number.
    Queue(Result<Option<(QueueConfig, Option<u32>)>, Error>),
    /// The node does not lead the shard (the call did not run); it names the leader if it
    /// knows one.
    NotLeader(Option<u64>),
    Failed(Error),
}

impl Answered {
    fn from_answer(answer: Answer) -> Answered {
        match answer {
            Answer::Engine(reply) => Answered::Engine(reply),
            Answer::Queue(found) => Answered::Queue(
                found.map(|q| q.map(|(_, cell)| (cell.config().clone(), cell.number()))),
            ),
            Answer::NotLeader(hint) => Answered::NotLeader(hint),
            Answer::Failed(e) => Answered::Failed(e),
            // A request dropped by a stopping shard did not run.
            Answer::ShutDown => Answered::NotLeader(None),
            other => Answered::Failed(Error::Unavailable(format!(
                "a forwarded call was answered {other:?}"
            ))),
        }
    }

    fn into_answer(self) -> Answer {
        match self {
            Answered::Engine(reply) => Answer::Engine(reply),
            // The queue's cell here, naming it by number as every cell of a cluster does.
            Answered::Queue(found) => Answer::Queue(found.map(|q| {
                q.map(|(config, number)| {
                    let key = numbered_key(number.unwrap_or(u32::MAX));
                    (key, Arc::new(QueueCell::new(config, key, number)))
                })
            })),
            Answered::NotLeader(hint) => Answer::NotLeader(hint),
            Answered::Failed(e) => Answer::Failed(e),
        }
    }
}

/// What serves the calls other nodes forward here: each goes to this node's shard
/// thread, as a local call would.
pub(crate) fn server(inboxes: Vec<Inbox>) -> Forwarded {
    let inboxes = Arc::new(inboxes);
    Arc::new(move |shard, bytes| {
        let inboxes = Arc::clone(&inboxes);
        Box::pin(async move {
            let call: Call = postcard::from_bytes(&bytes).map_err(|e| format!("decode: {e}"))?;
            let inbox = (inboxes.get(usize::from(shard)))
                .ok_or_else(|| format!("no shard {shard} here"))?;
            let answer = call_async(inbox, |reply| call.into_request(reply)).await;
            postcard::to_stdvec(&Answered::from_answer(answer)).map_err(|e| format!("encode: {e}"))
        })
    })
}

impl ClusterInner {
    /// The node that leads `shard`, where that is another node than this one.
    fn elsewhere(&self, shard: usize) -> Option<u64> {
        self.replicas[shard]
            .leader()
            .filter(|&node| node != self.id)
    }

    /// Makes `call` on `shard`'s leader and blocks until its answer: this node's shard
    /// thread (`inbox`), or another node's.
    pub fn call(&self, inbox: &Inbox, shard: usize, call: Call) -> Answer {
        let deadline = Instant::now() + self.call_timeout;
        let mut hint = None;
        loop {
            let answer = match hint.take().or_else(|| self.elsewhere(shard)) {
                None => call_parked(inbox, |reply| call.clone().into_request(reply)),
                Some(peer) => {
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    let forward = self.forward(peer, shard, &call);
                    self.runtime.spawn(async move {
                        let _ = tx.send(forward.await);
                    });
                    rx.recv().unwrap_or(Answer::ShutDown)
                }
            };
            match self.next_step(answer, &call, deadline) {
                Ok(answer) => return answer,
                Err(next) => {
                    hint = next;
                    if hint.is_none() {
                        // No leader known yet: an election takes a few hundred ms.
                        std::thread::sleep(NO_LEADER_PAUSE);
                    }
                }
            }
        }
    }

    /// [`call`](ClusterInner::call) without blocking: for a task.
    pub async fn call_async(self: Arc<Self>, inbox: Inbox, shard: usize, call: Call) -> Answer {
        let deadline = Instant::now() + self.call_timeout;
        let mut hint = None;
        loop {
            let answer = match hint.take().or_else(|| self.elsewhere(shard)) {
                None => call_async(&inbox, |reply| call.clone().into_request(reply)).await,
                Some(peer) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let forward = self.forward(peer, shard, &call);
                    self.runtime.spawn(async move {
                        let _ = tx.send(forward.await);
                    });
                    rx.await.unwrap_or(Answer::ShutDown)
                }
            };
            match self.next_step(answer, &call, deadline) {
                Ok(answer) => return answer,
                Err(next) => {
                    hint = next;
                    if hint.is_none() {
                        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                        self.runtime.spawn(async move {
                            tokio::time::sleep(NO_LEADER_PAUSE).await;
                            let _ = tx.send(());
                        });
                        let _ = rx.await;
                    }
                }
            }
        }
    }

    /// Sends `call` to `shard`'s leader and its answer to `reply`, without waiting.
    pub fn send(self: &Arc<Self>, inbox: &Inbox, shard: usize, call: Call, reply: ReplyTo) {
        if self.elsewhere(shard).is_none() {
            drop(inbox.send(call.into_request(reply)));
            return;
        }
        let (cluster, inbox) = (Arc::clone(self), inbox.clone());
        self.runtime.spawn(async move {
            reply.send(cluster.call_async(inbox, shard, call).await);
        });
    }

    /// The final answer, or where to try next: `Err(hint)` for a call that did not run
    /// and has time left.
    fn next_step(
        &self,
        answer: Answer,
        call: &Call,
        deadline: Instant,
    ) -> Result<Answer, Option<u64>> {
        match answer {
            Answer::NotLeader(hint) if Instant::now() < deadline => {
                Err(hint.filter(|&node| node != self.id))
            }
            Answer::NotLeader(hint) => Ok(call.refused(Error::Unavailable(match hint {
                Some(node) => format!("node {node} leads the shard but was not reached"),
                None => format!(
                    "no leader within the call timeout ({:?})",
                    self.call_timeout
                ),
            }))),
            Answer::Failed(e) => Ok(call.refused(e)),
            answer => Ok(answer),
        }
    }

    /// Forwards `call` to `peer`, giving its answer: `NotLeader` where it did not run.
    fn forward(
        &self,
        peer: u64,
        shard: usize,
        call: &Call,
    ) -> impl std::future::Future<Output = Answer> + Send + 'static {
        let bytes = postcard::to_stdvec(call);
        let link = self.link.clone();
        let limit = self.call_timeout + LINK_SLACK;
        let shard = u16::try_from(shard).expect("at most MAX_SHARDS");
        async move {
            let bytes = match bytes {
                Ok(bytes) => bytes,
                Err(e) => return Answer::Failed(Error::InvalidMessage(format!("encode: {e}"))),
            };
            match link.forward(peer, shard, &bytes, limit).await {
                Ok(answer) => match postcard::from_bytes::<Answered>(&answer) {
                    Ok(answered) => answered.into_answer(),
                    Err(e) => Answer::Failed(Error::Unavailable(format!(
                        "node {peer} answered what does not decode: {e}"
                    ))),
                },
                Err(ForwardError::Unreachable(_)) => Answer::NotLeader(None),
                Err(ForwardError::Lost(e) | ForwardError::Refused(e)) => {
                    Answer::Failed(Error::Unavailable(format!("forwarded to node {peer}: {e}")))
                }
            }
        }
    }
}

/// How long a call waits before it looks for a leader again, when none is known.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(20);
