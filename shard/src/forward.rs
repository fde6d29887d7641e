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

use std::collections::HashMap;
use std::sync::Mutex;

use crossbeam_channel::Receiver;
use leasemq_engine::{
    Command, ConsumeOptions, ConsumerConfig, ConsumerKey, Delivered, DeliveryTag, Error,
    QueueConfig, Reply,
};
use leasemq_replica::link::{ForwardError, Forwarded, Link};
use leasemq_replica::ReplayApplier;
use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterInner, Outgoing};
use crate::protocol::{
    numbered_key, Answer, Inbox, QueueCell, Readers, ReplyTo, Request, Sink, WakeOnDrop,
};
use crate::remote::{Pump, Streams};
use crate::reply::{call_async, call_parked};

/// How much longer than the call timeout a forwarded call may take on the link: the
/// leader's own wait is bounded by the call timeout.
const LINK_SLACK: Duration = Duration::from_secs(2);

/// A call for a shard's leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Call {
    /// A command; the queue it names by number (`protocol::numbered_key`), the leader's
    /// shard thread finds.
    Engine { cmd: Command },
    /// A declare or a lookup.
    Declare { cmd: Command },
    /// A consumer of the queue numbered `number` for node `from`, whose deliveries are
    /// pushed there as stream `stream` (`remote.rs`).
    Consume {
        number: u32,
        name: String,
        config: ConsumerConfig,
        options: ConsumeOptions,
        from: u64,
        stream: u64,
    },
    /// For a consumer registered here for another node: `ack_up_to`.
    AckUpTo {
        consumer: ConsumerKey,
        tag: DeliveryTag,
    },
    /// For a consumer registered here for another node: `stop` or `cancel`, with the
    /// deliveries its node holds unread.
    End {
        consumer: ConsumerKey,
        unread: Vec<DeliveryTag>,
        keep_leases: bool,
    },
    /// Deliveries for stream `stream` of this node.
    Push {
        stream: u64,
        deliveries: Vec<Delivered>,
    },
    /// Stream `stream` of this node is over; `unavailable` where its lead ended.
    Over { stream: u64, unavailable: bool },
}

impl Call {
    /// The request a call for the leader's shard thread is there; `None` for the calls
    /// about consumers and streams, which the forward server serves itself.
    fn into_request(self, reply: ReplyTo) -> Request {
        match self {
            Call::Engine { cmd } => Request::Engine { cmd, reply },
            Call::Declare { cmd } => Request::Declare { cmd, reply },
            call => unreachable!("{call:?} is no call for a shard thread"),
        }
    }

    /// The call a request for a shard thread makes, and where its answer goes; the
    /// request itself where it is no such call.
    pub(crate) fn from_request(req: Request) -> Result<(Call, ReplyTo), Request> {
        match req {
            Request::Engine { cmd, reply } => Ok((Call::Engine { cmd }, reply)),
            Request::Declare { cmd, reply } => Ok((Call::Declare { cmd }, reply)),
            req => Err(req),
        }
    }

    /// The answer to this call when it is refused for `e`.
    fn refused(&self, e: Error) -> Answer {
        match self {
            Call::Engine { cmd } => Answer::Engine(crate::runtime::refusal(cmd, e)),
            Call::Declare { .. } => Answer::Queue(Err(e)),
            Call::Consume { .. } => Answer::Engine(Reply::Consumed(Err(e))),
            Call::AckUpTo { .. } => Answer::Engine(Reply::Count(0)),
            Call::End { .. } | Call::Push { .. } | Call::Over { .. } => Answer::Done,
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
    Done,
    /// Whether a push found its stream.
    Pushed(bool),
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
            Answer::Done => Answered::Done,
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
                    (key, Arc::new(QueueCell::new(config, number)))
                })
            })),
            Answered::NotLeader(hint) => Answer::NotLeader(hint),
            Answered::Failed(e) => Answer::Failed(e),
            Answered::Done | Answered::Pushed(_) => Answer::Done,
        }
    }
}

/// The consumers registered on a node for other nodes, by shard and key: their channels,
/// and whether they were stopped (a stopped one stays until it is cancelled).
type Pumps = HashMap<(u16, ConsumerKey), (Receiver<Delivered>, bool)>;

/// What a node's forward server works with.
pub(crate) struct Forwarding {
    pub inboxes: Vec<Inbox>,
    /// This node's remote consumers, which pushes reach.
    pub streams: Arc<Streams>,
    pumps: Mutex<Pumps>,
    pub link: Link<ReplayApplier>,
    pub call_timeout: Duration,
}

impl Forwarding {
    pub fn new(
        inboxes: Vec<Inbox>,
        streams: Arc<Streams>,
        link: Link<ReplayApplier>,
        call_timeout: Duration,
    ) -> Forwarding {
        Forwarding {
            inboxes,
            streams,
            pumps: Mutex::default(),
            link,
            call_timeout,
        }
    }

    fn pumps(&self) -> std::sync::MutexGuard<'_, Pumps> {
        self.pumps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves one call from another node.
    async fn serve(self: Arc<Self>, shard: u16, call: Call) -> Result<Answered, String> {
        let inbox = (self.inboxes.get(usize::from(shard)))
            .ok_or_else(|| format!("no shard {shard} here"))?;
        let answer = match call {
            Call::Push { stream, deliveries } => {
                return Ok(Answered::Pushed(self.streams.push(stream, deliveries)))
            }
            Call::Over {
                stream,
                unavailable,
            } => {
                self.streams.end(stream, unavailable);
                return Ok(Answered::Done);
            }
            Call::Consume {
                number,
                name,
                config,
                options,
                from,
                stream,
            } => {
                let consumer = (name, config, options);
                self.consume(shard, number, consumer, (from, stream)).await
            }
            Call::AckUpTo { consumer, tag } => {
                let cmd = Command::AckUpTo { consumer, tag };
                call_async(inbox, |reply| Request::Engine { cmd, reply }).await
            }
            Call::End {
                consumer,
                unread,
                keep_leases,
            } => match self.end(shard, consumer, unread, keep_leases).await {
                Some(answer) => answer,
                None => return Ok(Answered::Done),
            },
            // Handed to the shard thread as they came (`server`).
            Call::Engine { .. } | Call::Declare { .. } => {
                return Err("a call for the shard thread went astray".into())
            }
        };
        Ok(Answered::from_answer(answer))
    }

    /// Registers a consumer of the queue numbered `number` for node `to`, and streams what
    /// it receives there as `stream`.
    async fn consume(
        self: &Arc<Self>,
        shard: u16,
        number: u32,
        (name, config, options): (String, ConsumerConfig, ConsumeOptions),
        (to, stream): (u64, u64),
    ) -> Answer {
        let (tx, rx) = crossbeam_channel::unbounded();
        let readers = Arc::new(Readers::default());
        let sink = Sink {
            tx,
            rx: rx.clone(),
            prefetch: config.prefetch as usize,
            readers: WakeOnDrop(readers.clone()),
        };
        let inbox = &self.inboxes[usize::from(shard)];
        let answer = call_async(inbox, |reply| Request::Consume {
            queue: numbered_key(number),
            name: name.into(),
            config,
            options: Box::new(options),
            sink,
            reply,
        })
        .await;
        if let Answer::Engine(Reply::Consumed(Ok(consumer))) = &answer {
            self.pumps().insert((shard, *consumer), (rx.clone(), false));
            let pump = Pump {
                rx,
                readers,
                consumer: *consumer,
            };
            tokio::spawn(Arc::clone(self).pump(shard, to, stream, pump));
        }
        answer
    }

    /// Stops (keeping its leases) or cancels a consumer registered here for another node,
    /// with the deliveries that node held unread; `None` for one that ended already.
    async fn end(
        &self,
        shard: u16,
        consumer: ConsumerKey,
        unread: Vec<DeliveryTag>,
        keep_leases: bool,
    ) -> Option<Answer> {
        let rx = {
            let mut pumps = self.pumps();
            match keep_leases {
                true => pumps.get_mut(&(shard, consumer)).map(|(rx, stopped)| {
                    *stopped = true;
                    rx.clone()
                }),
                false => pumps.remove(&(shard, consumer)).map(|(rx, _)| rx),
            }
        }?;
        let inbox = &self.inboxes[usize::from(shard)];
        Some(match keep_leases {
            true => {
                let request = |reply| Request::Stop {
                    consumer,
                    rx,
                    unread,
                    reply,
                };
                call_async(inbox, request).await
            }
            false => {
                let request = |reply| Request::Cancel {
                    consumer,
                    rx,
                    unread,
                    reply: Some(reply),
                };
                call_async(inbox, request).await
            }
        })
    }

    /// Streams what a consumer registered here for node `to` receives there, until its
    /// channel closes, the consumer ended there, or a push gets no answer (then the
    /// consumer is cancelled here, and its leases come back).
    async fn pump(self: Arc<Self>, shard: u16, to: u64, stream: u64, pump: Pump) {
        let key = (shard, pump.consumer);
        while let Some(deliveries) = pump.next_batch().await {
            let push = Call::Push { stream, deliveries };
            let pushed = self.send(to, shard, &push).await;
            // The consumer ended there (stopped, or dropped): its node tells this one how,
            // and what was on its way counts as read.
            if let Some(Answered::Pushed(false)) = pushed {
                return;
            }
            if !matches!(pushed, Some(Answered::Pushed(true))) {
                self.end(shard, pump.consumer, Vec::new(), false).await;
                return;
            }
        }
        // The channel closed: the consumer ended here, unless it was only stopped.
        {
            let mut pumps = self.pumps();
            if pumps.get(&key).is_some_and(|&(_, stopped)| !stopped) {
                pumps.remove(&key);
            }
        }
        let over = Call::Over {
            stream,
            unavailable: pump.lead_ended(),
        };
        self.send(to, shard, &over).await;
    }

    /// Sends `call` to node `to`: its answer, or `None` where none came.
    async fn send(&self, to: u64, shard: u16, call: &Call) -> Option<Answered> {
        let bytes = postcard::to_stdvec(call).ok()?;
        let answer = self
            .link
            .forward(to, shard, &bytes, self.call_timeout)
            .await;
        postcard::from_bytes(&answer.ok()?).ok()
    }
}

/// What serves the calls other nodes forward here: each goes to this node's shard
/// thread, as a local call would, save those about remote consumers.
pub(crate) fn server(state: Arc<Forwarding>) -> Forwarded {
    Arc::new(move |shard, bytes| {
        let state = Arc::clone(&state);
        let call = postcard::from_bytes::<Call>(&bytes).map_err(|e| format!("decode: {e}"));
        let encode =
            |answered: &Answered| postcard::to_stdvec(answered).map_err(|e| format!("encode: {e}"));
        match call {
            // Into the shard's inbox now, before the connection's next call is read: the
            // calls of one node reach the shard in the order they were made there.
            Ok(call @ (Call::Engine { .. } | Call::Declare { .. })) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                if let Some(inbox) = state.inboxes.get(usize::from(shard)) {
                    // A stopped shard drops it, which answers `ShutDown`.
                    drop(inbox.send(call.into_request(ReplyTo::peer(tx))));
                }
                Box::pin(async move {
                    let answer = rx.await.unwrap_or(Answer::ShutDown);
                    encode(&Answered::from_answer(answer))
                })
            }
            Ok(call) => Box::pin(async move { encode(&state.serve(shard, call).await?) }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    })
}

impl ClusterInner {
    /// Serves the calls peers forward here, each on this node's shard threads (`inboxes`).
    pub fn serve_calls(&self, inboxes: Vec<Inbox>) {
        let forwarding = Forwarding::new(
            inboxes,
            Arc::clone(&self.streams),
            self.link.clone(),
            self.call_timeout,
        );
        let serve = server(Arc::new(forwarding));
        let node = self.node.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(node) = node.as_ref() {
            node.serve_forwarded(serve);
        }
    }

    /// The node that leads `shard`, where that is another node than this one.
    pub fn elsewhere(&self, shard: usize) -> Option<u64> {
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

    /// Makes `call` on node `peer` once and blocks until its answer, as it came.
    pub fn call_at(&self, peer: u64, shard: usize, call: &Call) -> Answer {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let forward = self.forward(peer, shard, call);
        self.runtime.spawn(async move {
            let _ = tx.send(forward.await);
        });
        rx.recv().unwrap_or(Answer::ShutDown)
    }

    /// Makes `call` on node `peer` once, without waiting for its answer.
    pub fn tell(&self, peer: u64, shard: usize, call: &Call) {
        self.runtime.spawn(self.forward(peer, shard, call));
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

    /// Sends `call` to `shard`'s leader and its answer to `reply`, without waiting. Where
    /// this node's shard thread takes it and finds that another node leads, the thread
    /// takes it there ([`send_to`](ClusterInner::send_to)).
    pub fn send(self: &Arc<Self>, inbox: &Inbox, shard: usize, call: Call, reply: ReplyTo) {
        match self.elsewhere(shard) {
            None => drop(inbox.send(call.into_request(reply))),
            Some(peer) => self.send_to(peer, inbox, shard, call, reply),
        }
    }

    /// Sends `call` to `shard`'s leader, which `peer` is thought to be, and its answer to
    /// `reply`, without waiting.
    pub fn send_to(
        self: &Arc<Self>,
        peer: u64,
        inbox: &Inbox,
        shard: usize,
        call: Call,
        reply: ReplyTo,
    ) {
        // Forwarded now, in order with this thread's other calls; tried again elsewhere
        // only where it did not run.
        let first = self.forward(peer, shard, &call);
        let (cluster, inbox) = (Arc::clone(self), inbox.clone());
        let deadline = Instant::now() + self.call_timeout;
        self.runtime.spawn(async move {
            let answer = match cluster.next_step(first.await, &call, deadline) {
                Ok(answer) => answer,
                Err(_) => Arc::clone(&cluster).call_async(inbox, shard, call).await,
            };
            reply.send(answer);
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
        let shard = u16::try_from(shard).expect("at most MAX_SHARDS");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let encoded = postcard::to_stdvec(call).map_err(|e| e.to_string());
        // On `peer`'s queue now, in the order of the calls made here.
        let queued = encoded.map(|bytes| match self.outgoing.get(&peer) {
            Some(queue) => drop(queue.send(Outgoing {
                shard,
                bytes,
                answer: tx,
            })),
            None => drop(tx),
        });
        async move {
            if let Err(e) = queued {
                return Answer::Failed(Error::InvalidMessage(format!("encode: {e}")));
            }
            // A queue or a dispatcher gone: the node is stopping, and nothing was sent.
            let answer = rx
                .await
                .unwrap_or_else(|_| Err(ForwardError::Unreachable(String::new())));
            match answer {
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

/// Puts the calls forwarded to `peer` on the link's queue of frames in the order they
/// were made, each before the next is taken (dialling first where there is no
/// connection), and hands each answer back; until every sender is gone.
pub(crate) async fn dispatch(
    link: Link<ReplayApplier>,
    peer: u64,
    limit: Duration,
    mut calls: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some(out) = calls.recv().await {
        match link.send_forward(peer, out.shard, &out.bytes, limit).await {
            Ok(answer) => {
                tokio::spawn(async move {
                    let _ = out.answer.send(answer.await);
                });
            }
            Err(e) => drop(out.answer.send(Err(e))),
        }
    }
}

/// Starts a dispatcher for each peer of `cluster` on `node`'s runtime: their queues.
pub(crate) fn dispatchers(
    node: &leasemq_replica::Node,
    cluster: &crate::Cluster,
) -> HashMap<u64, tokio::sync::mpsc::UnboundedSender<Outgoing>> {
    let limit = cluster.call_timeout + LINK_SLACK;
    (cluster.peers.keys())
        .filter(|&&peer| peer != cluster.id)
        .map(|&peer| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            node.runtime()
                .spawn(dispatch(node.link().clone(), peer, limit, rx));
            (peer, tx)
        })
        .collect()
}

/// How long a call waits before it looks for a leader again, when none is known.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(20);
