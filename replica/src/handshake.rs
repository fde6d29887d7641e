//! The node link's handshake: who is calling, and the proof that it knows the secret.
//!
//! ```text
//! dialler  → hello: "LMQLINK1", version, node id, shard count, nonce (32 bytes), name
//! listener → its hello
//! dialler  → its proof: HMAC-SHA256(secret, "client" | both hellos)
//! listener → its proof: HMAC-SHA256(secret, "server" | both hellos)
//! ```
//!
//! Each side checks the other's cluster name and shard count against its own, and the
//! dialler checks it reached the node it meant to. A proof covers both hellos whole
//! (nonces, ids, versions, shard counts, names), so it is good for one connection only,
//! and the two are labelled apart, so one side's never serves as the other's. The
//! dialler proves itself first: a listener gives nothing that depends on the secret to
//! a dialler that has not shown it knows it. The secret itself never crosses the wire
//! (as the Erlang cookie does not, between RabbitMQ's nodes). A side that finds anything
//! wrong closes the connection. What follows the handshake is not authenticated frame
//! by frame: without TLS the link is for a trusted network. With TLS ([`LinkTls`]) the
//! handshake runs inside it, each node having verified the other's certificate first.

use std::io;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const MAGIC: &[u8; 8] = b"LMQLINK1";
const VERSION: u8 = 1;
const NONCE: usize = 32;
const PROOF: usize = 32;
/// The longest cluster name.
pub const MAX_NAME: usize = 255;
/// The node id an admin tool calls itself by: it knows the secret, not the cluster's name
/// or shard count, and may make admin calls only.
pub const ADMIN_NODE: u64 = 0;

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
    /// TLS on the link, where the cluster has it.
    pub tls: Option<LinkTls>,
}

/// TLS on the node link: a node serves its link with its certificate, dials with it as its
/// client certificate, and each side verifies the other's against the cluster's CA.
#[derive(Clone)]
pub struct LinkTls {
    /// The listener's side: its certificate, and clients' certificates required.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// The dialler's side: the CA it trusts, and its own certificate.
    pub connector: tokio_rustls::TlsConnector,
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

/// Dialler's side: proves this node to `peer`, which must prove itself.
///
/// # Errors
///
/// An io error saying what did not match or did not check out; the caller drops the
/// connection.
pub(crate) async fn connect(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    me: &Identity,
    peer: u64,
) -> io::Result<()> {
    let mut transcript = write_hello(stream, me).await?;
    let theirs = read_hello(stream, me, &mut transcript).await?;
    // An admin tool (node 0) takes whichever node it reached.
    if me.node != ADMIN_NODE && theirs != peer {
        return Err(refused(format!(
            "reached node {theirs} where node {peer} was expected"
        )));
    }
    let client = prove(me, b"client", &transcript);
    stream.write_all(&client.finalize().into_bytes()).await?;
    stream.flush().await?;
    let mut proof = [0; PROOF];
    stream.read_exact(&mut proof).await.map_err(|e| {
        refused(format!(
            "node {peer} refused this node's proof (or closed): {e}"
        ))
    })?;
    let server = prove(me, b"server", &transcript);
    server.verify_slice(&proof).map_err(|_| {
        refused(format!(
            "node {peer} could not prove it knows the cluster secret"
        ))
    })
}

/// Listener's side: learns who dialled and checks its proof, then proves itself.
/// Returns the dialler's node id.
///
/// # Errors
///
/// As [`connect`].
pub(crate) async fn accept(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    me: &Identity,
) -> io::Result<u64> {
    let mut transcript = Vec::new();
    let theirs = read_hello(stream, me, &mut transcript).await?;
    if theirs == me.node {
        return Err(refused(format!(
            "a peer calls itself node {}, as this node is",
            me.node
        )));
    }
    transcript.extend_from_slice(&write_hello(stream, me).await?);
    let mut proof = [0; PROOF];
    stream.read_exact(&mut proof).await?;
    let client = prove(me, b"client", &transcript);
    client.verify_slice(&proof).map_err(|_| {
        refused(format!(
            "node {theirs} could not prove it knows the cluster secret"
        ))
    })?;
    let server = prove(me, b"server", &transcript);
    stream.write_all(&server.finalize().into_bytes()).await?;
    stream.flush().await?;
    Ok(theirs)
}

/// The proof that one side knows the secret: HMAC-SHA256 over a label and the
/// transcript (the dialler's hello, then the listener's).
fn prove(me: &Identity, label: &[u8], transcript: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(&me.secret).expect("HMAC takes a key of any length");
    mac.update(b"leasemq node link ");
    mac.update(label);
    mac.update(transcript);
    mac
}

/// Sends this node's hello, with a fresh nonce; returns what it sent.
async fn write_hello(stream: &mut (impl AsyncWrite + Unpin), me: &Identity) -> io::Result<Vec<u8>> {
    let name = me.cluster.as_bytes();
    if name.len() > MAX_NAME {
        return Err(refused(format!("a cluster name of {} bytes", name.len())));
    }
    let mut hello = Vec::with_capacity(8 + 1 + 8 + 2 + NONCE + 1 + name.len());
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.extend_from_slice(&me.node.to_be_bytes());
    hello.extend_from_slice(&me.shards.to_be_bytes());
    hello.extend_from_slice(&fresh_nonce()?);
    hello.push(name.len() as u8);
    hello.extend_from_slice(name);
    stream.write_all(&hello).await?;
    stream.flush().await?;
    Ok(hello)
}

/// Reads the other side's hello, checks it, and adds it to `transcript`; returns the
/// other side's node id.
async fn read_hello(
    stream: &mut (impl AsyncRead + Unpin),
    me: &Identity,
    transcript: &mut Vec<u8>,
) -> io::Result<u64> {
    let mut head = [0; 8 + 1 + 8 + 2 + NONCE + 1];
    stream.read_exact(&mut head).await?;
    if &head[..8] != MAGIC {
        return Err(refused("not a leasemq node link".to_string()));
    }
    let version = head[8];
    if version != VERSION {
        return Err(refused(format!(
            "node link version {version}, this node speaks {VERSION}"
        )));
    }
    let node = u64::from_be_bytes(head[9..17].try_into().expect("8 bytes"));
    let shards = u16::from_be_bytes(head[17..19].try_into().expect("2 bytes"));
    let mut name = vec![0; usize::from(head[head.len() - 1])];
    stream.read_exact(&mut name).await?;
    transcript.extend_from_slice(&head);
    transcript.extend_from_slice(&name);
    // An admin tool knows only the secret: it learns the rest from the node it reached.
    if node == ADMIN_NODE || me.node == ADMIN_NODE {
        return Ok(node);
    }
    let cluster = String::from_utf8_lossy(&name);
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
    Ok(node)
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
    use tokio::net::{TcpListener, TcpStream};

    fn identity(cluster: &str, node: u64, shards: u16, secret: &[u8]) -> Identity {
        Identity {
            tls: None,
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
        // The dialler proves itself first: the listener checks, refuses, and gives
        // nothing back that depends on the secret.
        let (dialled, accepted) = meet(
            identity("orders", 1, 4, b"guess"),
            identity("orders", 2, 4, b"s3cret"),
            2,
        )
        .await;
        let err = accepted.unwrap_err();
        assert!(err.to_string().contains("node 1 could not prove"), "{err}");
        let err = dialled.unwrap_err();
        assert!(
            err.to_string().contains("node 2 refused this node's proof"),
            "{err}"
        );
        // A listener that does not know the secret cannot check the dialler's proof,
        // nor prove itself.
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
