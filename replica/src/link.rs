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

use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::handshake::{self, Identity};
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
    /// The connection to each peer this node dialled, while it works.
    dialled: tokio::sync::Mutex<HashMap<u64, Arc<Connection>>>,
    /// This node's replica of each shard's group, once started.
    groups: RwLock<Vec<Option<Raft<A>>>>,
    /// When each peer was last heard from: an answer to a call, or a call it made.
    heard: Mutex<HashMap<u64, Instant>>,
}

/// Where a call's answer goes: its body, or why the peer refused it.
type Answer = oneshot::Sender<Result<Vec<u8>, String>>;

/// One dialled connection: calls go out on it, answers come back on it.
struct Connection {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Mutex<HashMap<u64, Answer>>,
    next_call: AtomicU64,
    /// Its reader ended: the peer closed it, or it broke.
    broken: AtomicBool,
}

impl<A: Applier> Link<A> {
    /// A link for node `identity.node`, which reaches each peer (by node id) at its
    /// address; it serves nothing until [`serve`](Link::serve) runs.
    pub fn new(identity: Identity, peers: HashMap<u64, String>) -> Link<A> {
        let groups = (0..identity.shards).map(|_| None).collect();
        Link {
            inner: Arc::new(Inner {
                identity,
                peers,
                dialled: tokio::sync::Mutex::new(HashMap::new()),
                groups: RwLock::new(groups),
                heard: Mutex::new(HashMap::new()),
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
            let Ok((stream, from)) = listener.accept().await else {
                continue;
            };
            let link = self.clone();
            tokio::spawn(async move {
                if let Err(e) = link.serve_connection(stream).await {
                    eprintln!("leasemq: node link from {from}: {e}");
                }
            });
        }
    }

    async fn serve_connection(&self, mut stream: TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)?;
        let accept = handshake::accept(&mut stream, &self.inner.identity);
        let peer = tokio::time::timeout(CONNECT_TIMEOUT, accept)
            .await
            .map_err(|_| timed_out())??;
        let (mut reader, writer) = stream.into_split();
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        loop {
            let Some((kind, shard, call, body)) = read_frame(&mut reader).await? else {
                return Ok(());
            };
            self.heard(peer);
            let (link, writer) = (self.clone(), Arc::clone(&writer));
            tokio::spawn(async move {
                let (kind, answer) = match link.answer(kind, shard, body).await {
                    Ok(answer) => (ANSWER, answer),
                    Err(e) => (REFUSED, e.into_bytes()),
                };
                let mut writer = writer.lock().await;
                // A write that fails ends the connection; its reader sees it.
                let _ = write_frame(&mut writer, kind, shard, call, &answer).await;
            });
        }
    }

    /// Hands a peer's call to this node's replica of its shard's group.
    async fn answer(&self, kind: u8, shard: u16, body: Vec<u8>) -> Result<Vec<u8>, String> {
        if kind == PING {
            return Ok(Vec::new());
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

    /// Makes a call to `peer` and waits for its answer, at most `limit`.
    async fn call(
        &self,
        peer: u64,
        kind: u8,
        shard: u16,
        body: &[u8],
        limit: Duration,
    ) -> Result<Vec<u8>, String> {
        let connection = self.connection(peer).await?;
        let call = connection.next_call.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        connection
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(call, tx);
        if connection.broken.load(Ordering::Acquire) {
            return Err(format!("node {peer}: the connection broke"));
        }
        let sent = {
            let mut writer = connection.writer.lock().await;
            write_frame(&mut writer, kind, shard, call, body).await
        };
        if let Err(e) = sent {
            self.forget(peer, &connection).await;
            return Err(format!("node {peer}: {e}"));
        }
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(answer)) => {
                self.heard(peer);
                answer
            }
            Ok(Err(_)) => Err(format!("node {peer}: the connection broke")),
            Err(_) => {
                connection
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&call);
                Err(format!("node {peer}: no answer within {limit:?}"))
            }
        }
    }

    /// The working connection to `peer`, dialled now if there is none. Dialling holds
    /// up no call to another peer.
    async fn connection(&self, peer: u64) -> Result<Arc<Connection>, String> {
        {
            let dialled = self.inner.dialled.lock().await;
            if let Some(connection) = dialled.get(&peer) {
                if !connection.broken.load(Ordering::Acquire) {
                    return Ok(Arc::clone(connection));
                }
            }
        }
        let addr = self
            .inner
            .peers
            .get(&peer)
            .ok_or_else(|| format!("node {peer} is no peer"))?;
        let dial = self.dial(peer, addr);
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(format!("node {peer} at {addr}: {e}")),
            Err(_) => {
                return Err(format!(
                    "node {peer} at {addr}: no connection within {CONNECT_TIMEOUT:?}"
                ))
            }
        };
        let (reader, writer) = stream.into_split();
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(writer),
            waiting: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        });
        tokio::spawn(read_answers(reader, Arc::clone(&connection)));
        // Another call may have dialled meanwhile: the newer connection serves.
        let mut dialled = self.inner.dialled.lock().await;
        dialled.insert(peer, Arc::clone(&connection));
        Ok(connection)
    }

    async fn dial(&self, peer: u64, addr: &str) -> io::Result<TcpStream> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        handshake::connect(&mut stream, &self.inner.identity, peer).await?;
        Ok(stream)
    }

    /// Drops the connection to `peer` if it is still `connection`: the next call dials.
    async fn forget(&self, peer: u64, connection: &Arc<Connection>) {
        let mut dialled = self.inner.dialled.lock().await;
        if dialled
            .get(&peer)
            .is_some_and(|c| Arc::ptr_eq(c, connection))
        {
            dialled.remove(&peer);
        }
    }
}

/// Reads a dialled connection's answers and hands each to its caller; when it breaks,
/// every caller still waiting learns so.
async fn read_answers(mut reader: OwnedReadHalf, connection: Arc<Connection>) {
    loop {
        let frame = read_frame(&mut reader).await;
        let Ok(Some((kind, _, call, body))) = frame else {
            break;
        };
        let waiter = connection
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
    // Dropping the senders tells each waiting caller the connection broke; the next
    // call dials again.
    connection.broken.store(true, Ordering::Release);
    connection
        .waiting
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
}

async fn read_frame(reader: &mut OwnedReadHalf) -> io::Result<Option<(u8, u16, u64, Vec<u8>)>> {
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

async fn write_frame(
    writer: &mut OwnedWriteHalf,
    kind: u8,
    shard: u16,
    call: u64,
    body: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(body.len() + 11)
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a frame over 1 GiB"))?;
    let mut head = Vec::with_capacity(15);
    head.extend_from_slice(&len.to_be_bytes());
    head.push(kind);
    head.extend_from_slice(&shard.to_be_bytes());
    head.extend_from_slice(&call.to_be_bytes());
    writer.write_all(&head).await?;
    writer.write_all(body).await?;
    writer.flush().await
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
        kind: u8,
        rpc: &Q,
        limit: Duration,
    ) -> Result<R, Unreachable<ShardRaft>> {
        let body = encode(rpc).map_err(Unreachable::from_string)?;
        let answer = self
            .link
            .call(self.peer, kind, self.shard, &body, limit)
            .await;
        decode(&answer.map_err(Unreachable::from_string)?).map_err(Unreachable::from_string)
    }
}

impl<A: Applier> RaftNetworkV2<ShardRaft> for LinkConnection<A> {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<ShardRaft>, RPCError<ShardRaft>> {
        Ok(self.call(APPEND, &rpc, option.soft_ttl()).await?)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        Ok(self.call(VOTE, &rpc, option.soft_ttl()).await?)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<ShardRaft>, RPCError<ShardRaft>> {
        Ok(self.call(PRE_VOTE, &rpc, option.soft_ttl()).await?)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<ShardRaft, Cursor<Vec<u8>>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<ShardRaft>, StreamingError<ShardRaft>> {
        let call = (vote, snapshot.meta, snapshot.snapshot.into_inner());
        Ok(self.call(SNAPSHOT, &call, option.soft_ttl()).await?)
    }
}
