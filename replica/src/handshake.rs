//! The node link's handshake: who is calling, and the proof that it knows the secret.
//!
//! ```text
//! dialler  → hello: "LMQLINK1", version, node id, shard count, nonce (32 bytes), name
//! listener → hello, then its proof: HMAC-SHA256(secret, "server" | nonces | ids)
//! dialler  → its proof: HMAC-SHA256(secret, "client" | nonces | ids)
//! listener → 1 (welcome)
//! ```
//!
//! Each side checks the other's cluster name and shard count against its own, and the
//! dialler checks it reached the node it meant to. The nonces are fresh on each side, so
//! a proof is good for one connection only; the two proofs are labelled apart, so one
//! side's proof never serves as the other's; and the secret itself never crosses the wire
//! (as the Erlang cookie does not, between RabbitMQ's nodes). A side that finds anything
//! wrong closes the connection.

use std::io;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAGIC: &[u8; 8] = b"LMQLINK1";
const VERSION: u8 = 1;
const NONCE: usize = 32;
const PROOF: usize = 32;
const WELCOME: u8 = 1;
/// The longest cluster name.
pub const MAX_NAME: usize = 255;

/// Who this node is in its cluster, and the secret its nodes share.
#[derive(Clone)]
pub struct Identity {
    /// The cluster's name.
    pub cluster: String,
    /// This node's id.
    pub node: u64,
    /// The cluster's shard count.
    pub shards: u16,
    /// The secret every node of the cluster knows.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

/// What a hello says that outlives its checks.
struct Hello {
    node: u64,
    nonce: [u8; NONCE],
}

/// Dials' side: proves this node to `peer`, which must prove itself.
///
/// # Errors
///
/// An io error saying what did not match or did not check out; the caller drops the
/// connection.
pub(crate) async fn connect(stream: &mut TcpStream, me: &Identity, peer: u64) -> io::Result<()> {
    let ours = fresh_nonce()?;
    write_hello(stream, me, &ours).await?;
    let theirs = read_hello(stream, me).await?;
    if theirs.node != peer {
        return Err(refused(format!(
            "reached node {} where node {peer} was expected",
            theirs.node
        )));
    }
    let mut proof = [0; PROOF];
    stream.read_exact(&mut proof).await?;
    let server = prove(me, b"server", &ours, &theirs.nonce, me.node, theirs.node);
    server.verify_slice(&proof).map_err(|_| {
        refused(format!(
            "node {peer} could not prove it knows the cluster secret"
        ))
    })?;
    let client = prove(me, b"client", &theirs.nonce, &ours, me.node, theirs.node);
    stream.write_all(&client.finalize().into_bytes()).await?;
    if stream.read_u8().await? != WELCOME {
        return Err(refused(format!("node {peer} refused this node")));
    }
    Ok(())
}

/// Listener's side: learns who dialled and checks its proof. Returns its node id.
///
/// # Errors
///
/// As [`connect`].
pub(crate) async fn accept(stream: &mut TcpStream, me: &Identity) -> io::Result<u64> {
    let theirs = read_hello(stream, me).await?;
    if theirs.node == me.node {
        return Err(refused(format!(
            "a peer calls itself node {}, as this node is",
            me.node
        )));
    }
    let ours = fresh_nonce()?;
    write_hello(stream, me, &ours).await?;
    let server = prove(me, b"server", &theirs.nonce, &ours, theirs.node, me.node);
    stream.write_all(&server.finalize().into_bytes()).await?;
    let mut proof = [0; PROOF];
    stream.read_exact(&mut proof).await?;
    let client = prove(me, b"client", &ours, &theirs.nonce, theirs.node, me.node);
    client.verify_slice(&proof).map_err(|_| {
        refused(format!(
            "node {} could not prove it knows the cluster secret",
            theirs.node
        ))
    })?;
    stream.write_u8(WELCOME).await?;
    Ok(theirs.node)
}

/// The proof that one side knows the secret: HMAC-SHA256 over a label, the nonces (the
/// listener's view: the dialler's first) and the ids (dialler, listener).
fn prove(
    me: &Identity,
    label: &[u8],
    first: &[u8],
    second: &[u8],
    dialler: u64,
    listener: u64,
) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(&me.secret).expect("HMAC takes a key of any length");
    mac.update(b"leasemq node link ");
    mac.update(label);
    mac.update(first);
    mac.update(second);
    mac.update(&dialler.to_be_bytes());
    mac.update(&listener.to_be_bytes());
    mac.update(me.cluster.as_bytes());
    mac
}

async fn write_hello(stream: &mut TcpStream, me: &Identity, nonce: &[u8; NONCE]) -> io::Result<()> {
    let name = me.cluster.as_bytes();
    if name.len() > MAX_NAME {
        return Err(refused(format!("a cluster name of {} bytes", name.len())));
    }
    let mut hello = Vec::with_capacity(8 + 1 + 8 + 2 + NONCE + 1 + name.len());
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.extend_from_slice(&me.node.to_be_bytes());
    hello.extend_from_slice(&me.shards.to_be_bytes());
    hello.extend_from_slice(nonce);
    hello.push(name.len() as u8);
    hello.extend_from_slice(name);
    stream.write_all(&hello).await
}

async fn read_hello(stream: &mut TcpStream, me: &Identity) -> io::Result<Hello> {
    let mut magic = [0; 8];
    stream.read_exact(&mut magic).await?;
    if &magic != MAGIC {
        return Err(refused("not a leasemq node link".to_string()));
    }
    let version = stream.read_u8().await?;
    if version != VERSION {
        return Err(refused(format!(
            "node link version {version}, this node speaks {VERSION}"
        )));
    }
    let node = stream.read_u64().await?;
    let shards = stream.read_u16().await?;
    let mut nonce = [0; NONCE];
    stream.read_exact(&mut nonce).await?;
    let len = stream.read_u8().await?;
    let mut name = vec![0; usize::from(len)];
    stream.read_exact(&mut name).await?;
    let cluster = String::from_utf8_lossy(&name).into_owned();
    if cluster != me.cluster {
        return Err(refused(format!(
            "node {node} is of cluster {cluster:?}, this node of {:?}",
            me.cluster
        )));
    }
    if shards != me.shards {
        return Err(refused(format!(
            "node {node} has {shards} shards, this node {}",
            me.shards
        )));
    }
    Ok(Hello { node, nonce })
}

fn fresh_nonce() -> io::Result<[u8; NONCE]> {
    let mut nonce = [0; NONCE];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(format!("no random nonce: {e}")))?;
    Ok(nonce)
}

fn refused(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn identity(cluster: &str, node: u64, shards: u16, secret: &[u8]) -> Identity {
        Identity {
            cluster: cluster.into(),
            node,
            shards,
            secret: secret.to_vec(),
        }
    }

    /// Node `dialler` dials node `listener` (expecting node `expected`): what each side
    /// says.
    async fn meet(
        dialler: Identity,
        listener: Identity,
        expected: u64,
    ) -> (io::Result<()>, io::Result<u64>) {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let accepted = tokio::spawn(async move {
            let (mut stream, _) = socket.accept().await.unwrap();
            accept(&mut stream, &listener).await
        });
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let dialled = connect(&mut stream, &dialler, expected).await;
        drop(stream);
        (dialled, accepted.await.unwrap())
    }

    #[tokio::test]
    async fn nodes_of_one_cluster_that_share_its_secret_meet() {
        let (dialled, accepted) = meet(
            identity("orders", 1, 4, b"s3cret"),
            identity("orders", 2, 4, b"s3cret"),
            2,
        )
        .await;
        dialled.unwrap();
        assert_eq!(accepted.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_dialler_without_the_secret_is_refused_and_so_is_a_listener() {
        let (dialled, accepted) = meet(
            identity("orders", 1, 4, b"guess"),
            identity("orders", 2, 4, b"s3cret"),
            2,
        )
        .await;
        let err = dialled.unwrap_err();
        assert!(err.to_string().contains("node 2 could not prove"), "{err}");
        // The dialler found the listener's proof wrong and never sent its own.
        assert!(accepted.is_err());
        let (dialled, accepted) = meet(
            identity("orders", 1, 4, b"s3cret"),
            identity("orders", 2, 4, b"guess"),
            2,
        )
        .await;
        assert!(dialled.is_err());
        assert!(accepted.is_err());
    }

    #[tokio::test]
    async fn another_cluster_another_shard_count_or_another_node_is_refused() {
        let (dialled, accepted) = meet(
            identity("orders", 1, 4, b"s"),
            identity("billing", 2, 4, b"s"),
            2,
        )
        .await;
        let err = accepted.unwrap_err();
        assert!(
            err.to_string().contains("\"orders\"") && err.to_string().contains("\"billing\""),
            "{err}"
        );
        assert!(dialled.is_err());
        let (_, accepted) = meet(
            identity("orders", 1, 4, b"s"),
            identity("orders", 2, 8, b"s"),
            2,
        )
        .await;
        let err = accepted.unwrap_err();
        assert!(err.to_string().contains("4 shards, this node 8"), "{err}");
        let (dialled, _) = meet(
            identity("orders", 1, 4, b"s"),
            identity("orders", 3, 4, b"s"),
            2,
        )
        .await;
        let err = dialled.unwrap_err();
        assert!(
            err.to_string().contains("reached node 3 where node 2"),
            "{err}"
        );
    }
}
