//! The node link: Raft's messages between the nodes of a cluster, over TCP.
//!
//! Each node dials each peer for the calls it makes, one connection per peer, and serves
//! the connections its peers dialled; the calls of every shard's group share them. A
//! connection begins with a handshake ([`handshake`]): both sides check the cluster's
//! name, the node ids and the shard count, and prove they know the cluster's secret
//! by a challenge and response (HMAC-SHA256 over both sides' fresh nonces), so that the
//! secret never crosses the wire. A peer that fails it is dropped, and the reason logged.
//!
//! Then frames, each `u32 length | u8 kind | u16 shard | u64 call | body`, the body in
//! postcard: a call (append entries, vote, pre-vote, snapshot) names its shard's group
//! and a number the answer carries back; answers come in any order, and calls run
//! concurrently. A call that is not answered within its time limit, or whose connection
//! breaks, finds the peer unreachable; the next call dials again.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::io::Cursor;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::handshake::{self, Identity, LinkTls};
use crate::{Applier, Raft, ShardRaft, SnapshotMeta, Vote};

/// The largest frame a link takes: a snapshot is one frame.
const MAX_FRAME: u32 = 1 << 30;
/// How long dialling a peer and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

const APPEND: u8 = 1;
const VOTE: u8 = 2;
const PRE_VOTE: u8 = 3;
const SNAPSHOT: u8 = 4;
const PING: u8 = 5;
const FORWARD: u8 = 6;
const ADMIN: u8 = 7;
const ANSWER: u8 = 128;
const REFUSED: u8 = 129;

/// This node's end of the node link: it dials its peers and serves them. Clones share
/// the same connections.
pub struct Link<A: Applier> {
    inner: Arc<Inner<A>>,
}

impl<A: Applier> Clone for Link<A> {
    fn clone(&self) -> Self {
        Link {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<A: Applier> {
    identity: Identity,
    /// Where each peer listens, by node id.
    peers: HashMap<u64, String>,
    /// The connection to each peer that this node dialled, while it works. One lock per
    /// peer: a dial holds up only the calls to its peer.
    dialled: HashMap<u64, tokio::sync::Mutex<Dialled>>,
    /// This node's replica of each shard's group, once started.
    groups: RwLock<Vec<Option<Raft<A>>>>,
    /// When each peer was last heard from: an answer to a call, or a call it made.
    heard: Mutex<HashMap<u64, Instant>>,
    /// What serves the calls peers forward here, once set.
    forwarded: RwLock<Option<Forwarded>>,
    /// What serves an admin tool's calls, once set.
    admin: RwLock<Option<Admin>>,
}

/// What an admin tool asks of a node over its link (`leasemqd cluster ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum AdminCall {
    /// Form the cluster ([`Node::init`](crate::Node::init)).
    Init,
    /// Where the cluster stands as the node sees it, as JSON.
    Status,
}

/// What serves an admin tool's calls: the answer's bytes, or why none.
pub type Admin = Arc<
    dyn Fn(AdminCall) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>
        + Send
        + Sync,
>;

/// What serves the calls peers forward to this node (a broker's calls for a shard this
/// node leads): given the shard and the call's bytes, the answer's bytes, or why none.
/// It is called as each call comes off its connection, in order, before the next is read:
/// what it does before it returns its future happens in the order the calls were sent.
pub type Forwarded = Arc<dyn Fn(u16, Vec<u8>) -> Answering + Send + Sync>;

/// An answer on its way: its bytes, or why none.
pub type Answering = std::pin::Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// Why a forwarded call got no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardError {
    /// No connection to the peer could be made: the call was not sent.
    Unreachable(String),
    /// The call may have reached the peer and run there: the connection broke, or no
    /// answer came within the time limit.
    Lost(String),
    /// The peer could not serve the call (it does not decode, or nothing serves
    /// forwarded calls there).
    Refused(String),
}

/// Where a call's answer goes: its body, or why the peer refused it.
type Answer = oneshot::Sender<Result<Vec<u8>, String>>;

/// One dialled connection. Frames go out whole through its writer task, so that a
/// caller that gives up (openraft drops a call that runs out of time) never leaves half
/// a frame on the wire. Dropping it (once no call holds it) ends the writer, which
/// closes the connection.
struct Connection {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    calls: Arc<Calls>,
}

/// The calls in flight on a connection, shared with its reader.
#[derive(Default)]
struct Calls {
    waiting: Mutex<HashMap<u64, Answer>>,
    next: AtomicU64,
    /// The connection broke: its reader or writer ended.
    broken: AtomicBool,
}

impl Calls {
    /// Marks the connection broken; every caller still waiting learns so (its sender is
    /// dropped).
    fn break_off(&self) {
        self.broken.store(true, Ordering::Release);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Takes a call out of the waiting map when its caller is done with it, answered or not.
struct Waiting {
    calls: Arc<Calls>,
    call: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = self.calls.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.remove(&self.call);
    }
}

/// Why a call got no answer.
enum CallError {
    /// No connection to the peer could be made.
    Unreachable(String),
    /// The connection broke, or was found broken: the next call dials again.
    Broken(String),
    /// No answer in the call's time limit.
    TimedOut(Duration),
    /// The peer answered with an error.
    Refused(String),
}

impl<A: Applier> Link<A> {
    /// A link for node `identity.node`, which reaches each peer (by node id) at its
    /// address; it serves nothing until [`serve`](Link::serve) runs.
    pub fn new(identity: Identity, peers: HashMap<u64, String>) -> Link<A> {
        let groups = (0..identity.shards).map(|_| None).collect();
        Link {
            inner: Arc::new(Inner {
                identity,
                dialled: (peers.keys())
                    .map(|&id| (id, tokio::sync::Mutex::default()))
                    .collect(),
                groups: RwLock::new(groups),
                heard: Mutex::new(HashMap::new()),
                forwarded: RwLock::new(None),
                admin: RwLock::new(None),
                peers,
            }),
        }
    }

    /// Makes `raft` the replica that peers' calls for `shard`'s group reach.
    pub fn serve_group(&self, shard: u16, raft: Raft<A>) {
        let mut groups = self.inner.groups.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = groups.get_mut(usize::from(shard)) {
            *slot = Some(raft);
        }
    }

    /// Makes `serve` what answers an admin tool's calls.
    pub fn serve_admin(&self, serve: Admin) {
        *self.inner.admin.write().unwrap_or_else(|e| e.into_inner()) = Some(serve);
    }

    /// Makes `serve` what answers the calls peers forward here.
    pub fn serve_forwarded(&self, serve: Forwarded) {
        *self
            .inner
            .forwarded
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(serve);
    }

    /// Forwards a call for `shard` to `peer`, and waits for its answer within `limit`.
    ///
    /// # Errors
    ///
    /// Whether the call was not sent, may have run, or was refused: [`ForwardError`].
    pub async fn forward(
        &self,
        peer: u64,
        shard: u16,
        call: &[u8],
        limit: Duration,
    ) -> Result<Vec<u8>, ForwardError> {
        (self.call(peer, FORWARD, shard, call, limit).await).map_err(|e| forward_error(peer, e))
    }

    /// The network `shard`'s replica sends through.
    pub fn network(&self, shard: u16) -> LinkNetwork<A> {
        LinkNetwork {
            link: self.clone(),
            shard,
        }
    }

    /// Calls every peer every `every`, so that [`last_heard`](Link::last_heard) tells
    /// which it reaches, even a peer this node's groups have nothing to send (a follower
    /// of every shard that another node leads); until the task running it is dropped.
    pub async fn ping(self, every: Duration) {
        let peers: Vec<u64> = self.inner.peers.keys().copied().collect();
        let me = self.inner.identity.node;
        loop {
            for &peer in peers.iter().filter(|&&p| p != me) {
                let link = self.clone();
                tokio::spawn(async move { link.call(peer, PING, 0, &[], every).await });
            }
            tokio::time::sleep(every).await;
        }
    }

    /// When `peer` was last heard from over the link, if ever.
    pub fn last_heard(&self, peer: u64) -> Option<Instant> {
        let heard = self.inner.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.get(&peer).copied()
    }

    fn heard(&self, peer: u64) {
        let mut heard = self.inner.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.insert(peer, Instant::now());
    }

    /// Serves the peers that connect to `listener`, until the task running it is
    /// dropped.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            let (stream, from) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    eprintln!("leasemq: node link: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let link = self.clone();
            tokio::spawn(async move {
                if let Err(e) = link.serve_connection(stream).await {
                    eprintln!("leasemq: node link from {from}: {e}");
                }
            });
        }
    }

    async fn serve_connection(&self, stream: TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)?;
        let accept = async {
            let mut stream = secure_accept(self.inner.identity.tls.as_ref(), stream).await?;
            let peer = handshake::accept(&mut stream, &self.inner.identity).await?;
            Ok::<_, io::Error>((stream, peer))
        };
        let (stream, peer) = tokio::time::timeout(CONNECT_TIMEOUT, accept)
            .await
            .map_err(|_| timed_out())??;
        let (mut reader, writer) = tokio::io::split(stream);
        let (answers, to_write) = mpsc::unbounded_channel();
        tokio::spawn(write_frames(writer, to_write, None));
        loop {
            let Some((kind, shard, call, body)) = read_frame(&mut reader).await? else {
                return Ok(());
            };
            self.heard(peer);
            // A forwarded call is handed on before the next frame is read, so that the
            // calls of one connection reach their shard in the order they were sent.
            let answering = match (peer == handshake::ADMIN_NODE && kind != ADMIN, kind) {
                (true, _) => Box::pin(async { Err("an admin tool makes admin calls only".into()) }),
                (false, FORWARD) => self.forwarded(shard, body),
                (false, _) => {
                    let link = self.clone();
                    Box::pin(async move { link.answer(kind, shard, body).await })
                }
            };
            let answers = answers.clone();
            tokio::spawn(async move {
                let (kind, answer) = match answering.await {
                    Ok(answer) => (ANSWER, answer),
                    Err(e) => (REFUSED, e.into_bytes()),
                };
                // An answer that cannot be framed, or a connection gone, is not sent:
                // the caller's time limit runs out.
                if let Ok(frame) = frame(kind, shard, call, &answer) {
                    let _ = answers.send(frame);
                }
            });
        }
    }

    /// Hands a peer's call to this node's replica of its shard's group.
    async fn answer(&self, kind: u8, shard: u16, body: Vec<u8>) -> Result<Vec<u8>, String> {
        if kind == PING {
            return Ok(Vec::new());
        }
        if kind == ADMIN {
            let serve = (self.inner.admin.read())
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let serve = serve.ok_or("nothing serves admin calls here")?;
            return serve(decode(&body)?).await;
        }

        let raft = {
            let groups = self.inner.groups.read().unwrap_or_else(|e| e.into_inner());
            groups.get(usize::from(shard)).cloned().flatten()
        };
        let raft = raft.ok_or_else(|| format!("shard {shard} is not served here"))?;
        match kind {
            APPEND => {
                let rpc: AppendEntriesRequest<ShardRaft> = decode(&body)?;
                encode(&raft.append_entries(rpc).await.map_err(|e| e.to_string())?)
            }
            VOTE => {
                let rpc: VoteRequest<ShardRaft> = decode(&body)?;
                encode(&raft.vote(rpc).await.map_err(|e| e.to_string())?)
            }
            PRE_VOTE => {
                let rpc: VoteRequest<ShardRaft> = decode(&body)?;
                encode(&raft.pre_vote(rpc).await.map_err(|e| e.to_string())?)
            }
            SNAPSHOT => {
                let (vote, meta, data): (Vote, SnapshotMeta, Vec<u8>) = decode(&body)?;
                let snapshot = openraft::alias::SnapshotOf::<ShardRaft, _> {
                    meta,
                    snapshot: Cursor::new(data),
                };
                let answer = raft.install_full_snapshot(vote, snapshot).await;
                encode(&answer.map_err(|e| e.to_string())?)
            }
            kind => Err(format!("a call of unknown kind {kind}")),
        }
    }

    /// Hands a forwarded call to what serves them here; the future gives its answer.
    fn forwarded(&self, shard: u16, body: Vec<u8>) -> Answering {
        let serve = (self.inner.forwarded.read())
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match serve {
            Some(serve) => serve(shard, body),
            None => Box::pin(async { Err("nothing serves forwarded calls here".into()) }),
        }
    }

    /// Makes a call to `peer` and waits for its answer: dialling, sending and waiting
    /// all within `limit`.
    async fn call(
        &self,
        peer: u64,
        kind: u8,
        shard: u16,
        body: &[u8],
        limit: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let work = async {
            let sent = self.send_call(peer, kind, shard, body).await?;
            self.answer_to(sent).await
        };
        match tokio::time::timeout(limit, work).await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::TimedOut(limit)),
        }
    }

    /// Puts a call to `peer` on its connection's queue of frames (dialling first if there
    /// is no working connection): calls sent one after another go out in that order.
    async fn send_call(
        &self,
        peer: u64,
        kind: u8,
        shard: u16,
        body: &[u8],
    ) -> Result<Sent, CallError> {
        let connection = self.connection(peer).await?;
        let calls = Arc::clone(&connection.calls);
        let call = calls.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        calls
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(call, tx);
        let waiting = Waiting { calls, call };
        if waiting.calls.broken.load(Ordering::Acquire) {
            return Err(broke(peer));
        }
        let frame =
            frame(kind, shard, call, body).map_err(|e| CallError::Refused(e.to_string()))?;
        connection.frames.send(frame).map_err(|_| broke(peer))?;
        Ok(Sent {
            peer,
            rx,
            _waiting: waiting,
        })
    }

    /// Waits for the answer to a call sent.
    async fn answer_to(&self, sent: Sent) -> Result<Vec<u8>, CallError> {
        let answer = sent.rx.await.map_err(|_| broke(sent.peer))?;
        self.heard(sent.peer);
        answer.map_err(CallError::Refused)
    }

    /// Forwards a call for `shard` to `peer` in two steps: this puts it on the queue of
    /// frames to `peer` (dialling first if need be), so that calls forwarded one after
    /// another reach `peer` in that order; the future it gives waits for the answer
    /// within `limit`.
    ///
    /// # Errors
    ///
    /// [`ForwardError::Unreachable`] where the call could not be sent.
    pub async fn send_forward(
        &self,
        peer: u64,
        shard: u16,
        call: &[u8],
        limit: Duration,
    ) -> Result<impl Future<Output = Result<Vec<u8>, ForwardError>> + Send + 'static, ForwardError>
    {
        let sent =
            match tokio::time::timeout(limit, self.send_call(peer, FORWARD, shard, call)).await {
                Ok(Ok(sent)) => sent,
                Ok(Err(e)) => return Err(forward_error(peer, e)),
                Err(_) => {
                    return Err(ForwardError::Unreachable(format!(
                        "node {peer}: no connection within {limit:?}"
                    )))
                }
            };
        let link = self.clone();
        Ok(async move {
            match tokio::time::timeout(limit, link.answer_to(sent)).await {
                Ok(answer) => answer.map_err(|e| forward_error(peer, e)),
                Err(_) => Err(forward_error(peer, CallError::TimedOut(limit))),
            }
        })
    }

    /// The working connection to `peer`, dialled now if there is none or it broke.
    async fn connection(&self, peer: u64) -> Result<Arc<Connection>, CallError> {
        let unknown = || CallError::Unreachable(format!("node {peer} is no peer"));
        let slot = self.inner.dialled.get(&peer).ok_or_else(unknown)?;
        let mut slot = slot.lock().await;
        if let Some(connection) = slot.connection.as_ref() {
            if !connection.calls.broken.load(Ordering::Acquire) {
                return Ok(Arc::clone(connection));
            }
        }
        // A broken connection closes once the calls that hold it let go.
        slot.connection = None;
        let addr = self.inner.peers.get(&peer).ok_or_else(unknown)?;
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, self.dial(peer, addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(slot.failed(format!("node {peer} at {addr}: {e}"))),
            Err(_) => {
                let detail =
                    format!("node {peer} at {addr}: no connection within {CONNECT_TIMEOUT:?}");
                return Err(slot.failed(detail));
            }
        };
        if std::mem::take(&mut slot.unreachable) {
            eprintln!("leasemq: node link: node {peer} at {addr} is reachable again");
        }
        let (reader, writer) = tokio::io::split(stream);
        let calls = Arc::new(Calls::default());
        let (frames, to_write) = mpsc::unbounded_channel();
        tokio::spawn(write_frames(writer, to_write, Some(Arc::clone(&calls))));
        tokio::spawn(read_answers(reader, Arc::clone(&calls)));
        let connection = Arc::new(Connection { frames, calls });
        slot.connection = Some(Arc::clone(&connection));
        Ok(connection)
    }

    async fn dial(&self, peer: u64, addr: &str) -> io::Result<Stream> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut stream = secure_dial(self.inner.identity.tls.as_ref(), stream, addr).await?;
        handshake::connect(&mut stream, &self.inner.identity, peer).await?;
        Ok(stream)
    }
}

/// The connection this node dialled to a peer, while it works, and whether the last dial
/// failed.
#[derive(Default)]
struct Dialled {
    connection: Option<Arc<Connection>>,
    unreachable: bool,
}

impl Dialled {
    /// A dial that failed, for `detail`'s reason. It is logged when the peer becomes
    /// unreachable, not at every dial after (each call dials again), and its coming back
    /// is logged too: a peer down for an hour is two lines.
    fn failed(&mut self, detail: String) -> CallError {
        if !std::mem::replace(&mut self.unreachable, true) {
            eprintln!("leasemq: node link: {detail}; dialling on");
        }
        CallError::Unreachable(detail)
    }
}

/// A call on its connection's queue, waiting for its answer.
struct Sent {
    peer: u64,
    rx: oneshot::Receiver<Result<Vec<u8>, String>>,
    _waiting: Waiting,
}

fn broke(peer: u64) -> CallError {
    CallError::Broken(format!("node {peer}: the connection broke"))
}

/// What a forwarded call that got no answer tells its caller: whether it may have run.
fn forward_error(peer: u64, e: CallError) -> ForwardError {
    match e {
        CallError::Unreachable(e) => ForwardError::Unreachable(e),
        CallError::Broken(e) => ForwardError::Lost(e),
        CallError::TimedOut(limit) => {
            ForwardError::Lost(format!("node {peer} did not answer within {limit:?}"))
        }
        CallError::Refused(e) => ForwardError::Refused(e),
    }
}

/// A node link connection's bytes: TCP, or TLS over it.
trait Wire: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Wire for T {}

type Stream = Box<dyn Wire>;

/// The listener's side of a connection: over TLS where the cluster has it, the dialler's
/// certificate verified.
async fn secure_accept(tls: Option<&LinkTls>, stream: TcpStream) -> io::Result<Stream> {
    Ok(match tls {
        None => Box::new(stream),
        Some(tls) => Box::new(tls.acceptor.accept(stream).await?),
    })
}

/// The dialler's side of a connection to `addr`: over TLS where the cluster has it, the
/// listener's certificate verified for the host `addr` names.
async fn secure_dial(tls: Option<&LinkTls>, stream: TcpStream, addr: &str) -> io::Result<Stream> {
    let Some(tls) = tls else {
        return Ok(Box::new(stream));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(Box::new(tls.connector.connect(name, stream).await?))
}

/// Writes a connection's frames, whole and in order, until every sender is gone (then
/// the connection closes) or a write fails (then its calls, if it has any, break). Over
/// TLS what rustls holds back is flushed once no frame waits.
async fn write_frames(
    mut writer: WriteHalf<Stream>,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    calls: Option<Arc<Calls>>,
) {
    while let Some(frame) = frames.recv().await {
        if writer.write_all(&frame).await.is_err() {
            break;
        }
        if frames.is_empty() && writer.flush().await.is_err() {
            break;
        }
    }
    if let Some(calls) = calls {
        calls.break_off();
    }
}

/// Reads a dialled connection's answers and hands each to its caller; when it breaks,
/// every caller still waiting learns so, and the next call dials again.
async fn read_answers(mut reader: ReadHalf<Stream>, calls: Arc<Calls>) {
    loop {
        let frame = read_frame(&mut reader).await;
        let Ok(Some((kind, _, call, body))) = frame else {
            break;
        };
        let waiter = calls
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&call);
        let answer = match kind {
            ANSWER => Ok(body),
            _ => Err(String::from_utf8_lossy(&body).into_owned()),
        };
        if let Some(waiter) = waiter {
            let _ = waiter.send(answer);
        }
    }
    calls.break_off();
}

async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
) -> io::Result<Option<(u8, u16, u64, Vec<u8>)>> {
    let len = match reader.read_u32().await {
        Ok(len) => len,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    if !(11..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let kind = reader.read_u8().await?;
    let shard = reader.read_u16().await?;
    let call = reader.read_u64().await?;
    let mut body = vec![0; len as usize - 11];
    reader.read_exact(&mut body).await?;
    Ok(Some((kind, shard, call, body)))
}

/// A frame: its header, then `body`.
fn frame(kind: u8, shard: u16, call: u64, body: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(body.len() + 11)
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a frame over 1 GiB"))?;
    let mut frame = Vec::with_capacity(15 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.push(kind);
    frame.extend_from_slice(&shard.to_be_bytes());
    frame.extend_from_slice(&call.to_be_bytes());
    frame.extend_from_slice(body);
    Ok(frame)
}

/// Makes an admin call on the node whose link listens at `addr`, proving that this tool
/// knows the cluster's `secret` (over TLS with `tls`, where the cluster's link has it);
/// waits for the answer within `limit`.
///
/// # Errors
///
/// The connection's, the handshake's (a wrong secret), or the node's refusal.
pub async fn admin_call(
    addr: &str,
    secret: &[u8],
    tls: Option<&LinkTls>,
    call: AdminCall,
    limit: Duration,
) -> io::Result<Vec<u8>> {
    let me = Identity {
        cluster: String::new(),
        node: handshake::ADMIN_NODE,
        shards: 0,
        secret: secret.to_vec(),
        tls: tls.cloned(),
    };
    let work = async {
        let stream = TcpStream::connect(addr).await?;
        let mut stream = secure_dial(tls, stream, addr).await?;
        handshake::connect(&mut stream, &me, handshake::ADMIN_NODE).await?;
        let body = encode(&call).map_err(io::Error::other)?;
        stream.write_all(&frame(ADMIN, 0, 1, &body)?).await?;
        stream.flush().await?;
        let (mut reader, _writer) = tokio::io::split(stream);
        let closed = || io::Error::new(io::ErrorKind::UnexpectedEof, "the node closed the link");
        let (kind, _, _, body) = read_frame(&mut reader).await?.ok_or_else(closed)?;
        match kind {
            ANSWER => Ok(body),
            _ => Err(io::Error::other(
                String::from_utf8_lossy(&body).into_owned(),
            )),
        }
    };
    tokio::time::timeout(limit, work).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {limit:?}"),
        )
    })?
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    postcard::to_stdvec(value).map_err(|e| format!("encode: {e}"))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("decode: {e}"))
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no handshake within the time limit",
    )
}

/// The network a shard's replica sends through: its calls to each peer go over the link.
pub struct LinkNetwork<A: Applier> {
    link: Link<A>,
    shard: u16,
}

/// A shard's replica's calls to one peer.
pub struct LinkConnection<A: Applier> {
    link: Link<A>,
    shard: u16,
    peer: u64,
}

impl<A: Applier> RaftNetworkFactory<ShardRaft> for LinkNetwork<A> {
    type Network = LinkConnection<A>;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> LinkConnection<A> {
        LinkConnection {
            link: self.link.clone(),
            shard: self.shard,
            peer: target,
        }
    }
}

impl<A: Applier> LinkConnection<A> {
    async fn call<Q: Serialize, R: DeserializeOwned>(
        &self,
        action: RPCTypes,
        kind: u8,
        rpc: &Q,
        limit: Duration,
    ) -> Result<R, RPCError<ShardRaft>> {
        let unreachable = |e: String| RPCError::Unreachable(Unreachable::from_string(e));
        let body = encode(rpc).map_err(unreachable)?;
        let answer = self
            .link
            .call(self.peer, kind, self.shard, &body, limit)
            .await;
        let answer = answer.map_err(|e| match e {
            CallError::Unreachable(e) | CallError::Refused(e) => unreachable(e),
            // Dial again at once.
            CallError::Broken(e) => RPCError::Network(NetworkError::from_string(e)),
            CallError::TimedOut(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.link.inner.identity.node,
                target: self.peer,
                timeout,
            }),
        })?;
        decode(&answer).map_err(unreachable)
    }
}

impl<A: Applier> RaftNetworkV2<ShardRaft> for LinkConnection<A> {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<ShardRaft>, RPCError<ShardRaft>> {
        self.call(RPCTypes::AppendEntries, APPEND, &rpc, option.soft_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        self.call(RPCTypes::Vote, VOTE, &rpc, option.soft_ttl())
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        self.call(RPCTypes::Vote, PRE_VOTE, &rpc, option.soft_ttl())
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<ShardRaft, Cursor<Vec<u8>>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<ShardRaft>, StreamingError<ShardRaft>> {
        let call = (vote, snapshot.meta, snapshot.snapshot.into_inner());
        let answer = self
            .call(
                RPCTypes::InstallSnapshot,
                SNAPSHOT,
                &call,
                option.soft_ttl(),
            )
            .await;
        answer.map_err(|e| match e {
            RPCError::Timeout(e) => StreamingError::Timeout(e),
            RPCError::Network(e) => StreamingError::Network(e),
            RPCError::Unreachable(e) => StreamingError::Unreachable(e),
            RPCError::RemoteError(e) => StreamingError::Unreachable(Unreachable::from_string(e)),
        })
    }
}
