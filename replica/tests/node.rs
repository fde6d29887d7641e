//! Nodes of a cluster, each with every shard's group, on loopback: formed once, they
//! elect a leader for every shard, come back formed after a restart, and refuse a
//! directory made for another node.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasemq_replica::{Batch, ClusterStatus, Identity, Node, NodeConfig, Outcome, Proposer};
use leasemq_wal::{DiskStorage, Options};
use openraft::async_runtime::WatchReceiver;

const SHARDS: u16 = 2;

fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

fn config(dir: &Path, id: u64, peers: &BTreeMap<u64, String>) -> NodeConfig {
    NodeConfig {
        identity: Identity {
            tls: None,
            cluster: "orders".into(),
            node: id,
            shards: SHARDS,
            secret: b"s3cret".to_vec(),
        },
        listen: peers[&id].clone(),
        peers: peers.clone(),
        election_timeout: Duration::from_millis(150),
        dir: dir.join(format!("node-{id}")),
        storage: Arc::new(DiskStorage),
        log: Options::default(),
        tick: Duration::from_millis(1),
    }
}

fn start_all(dir: &Path, peers: &BTreeMap<u64, String>) -> Vec<Node> {
    (1..=3)
        .map(|id| Node::start(config(dir, id, peers)).unwrap())
        .collect()
}

/// Waits until every node knows the same leader for every shard and hears from every
/// peer; returns the statuses.
fn settled(nodes: &[Node]) -> Vec<ClusterStatus> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let statuses: Vec<ClusterStatus> = nodes.iter().map(Node::status).collect();
        let leaders = |s: &ClusterStatus| s.shards.iter().map(|g| g.leader).collect::<Vec<_>>();
        let agreed = statuses.iter().all(|s| leaders(s) == leaders(&statuses[0]));
        let led = leaders(&statuses[0]).iter().all(Option::is_some);
        let reachable = statuses.iter().all(|s| s.peers.iter().all(|p| p.reachable));
        if agreed && led && reachable {
            return statuses;
        }
        assert!(Instant::now() < deadline, "not settled: {statuses:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn peers() -> BTreeMap<u64, String> {
    (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect()
}

/// Proposes `n` batches with no changes on `leader`'s replica of shard 0, and waits
/// until every one is committed.
fn propose(nodes: &[Node], leader: u64, n: u64) {
    let node = &nodes[leader as usize - 1];
    let (raft, _) = node.group(0).unwrap();
    let vote = raft.metrics().borrow_watched().vote;
    let (tx, rx) = std::sync::mpsc::channel();
    let report = move |outcome| {
        let _ = tx.send(outcome);
    };
    let leader_id = (vote.leader_id.term, vote.leader_id.node_id);
    let proposer = Proposer::start(raft.clone(), leader_id, report, node.runtime());
    for p in 1..=n {
        let changes = Vec::new();
        proposer.propose(Batch { inc: 0, p, changes });
    }
    for _ in 0..n {
        let outcome = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(matches!(outcome, Outcome::Committed { .. }), "{outcome:?}");
    }
}

#[test]
fn a_cluster_formed_once_leads_every_shard_and_comes_back_formed() {
    let tmp = tempfile::tempdir().unwrap();
    let peers = peers();
    let nodes = start_all(tmp.path(), &peers);
    nodes[1].init().unwrap();
    let statuses = settled(&nodes);
    for status in &statuses {
        assert_eq!(status.shards.len(), usize::from(SHARDS));
        for shard in &status.shards {
            assert_eq!(shard.voters, [1, 2, 3]);
        }
    }
    // Forming a formed cluster does nothing.
    let terms: Vec<u64> = statuses[0].shards.iter().map(|s| s.term).collect();
    nodes[0].init().unwrap();
    let again: Vec<u64> = nodes[0].status().shards.iter().map(|s| s.term).collect();
    assert_eq!(again, terms);
    let json = serde_json::to_value(&statuses[0]).unwrap();
    assert_eq!(json["shards"][0]["voters"], serde_json::json!([1, 2, 3]));
    // A node that stops is soon unreachable to the others.
    let mut nodes = nodes;
    nodes.pop().unwrap().shutdown();
    let deadline = Instant::now() + Duration::from_secs(30);
    while nodes[0]
        .status()
        .peers
        .iter()
        .any(|p| p.node == 3 && p.reachable)
    {
        assert!(Instant::now() < deadline, "node 3 still reachable");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(nodes[0]
        .status()
        .peers
        .iter()
        .any(|p| p.node == 2 && p.reachable));
    // Back, it is reached again: the others find their old connections broken and
    // dial anew.
    nodes.push(Node::start(config(tmp.path(), 3, &peers)).unwrap());
    settled(&nodes);
    for node in nodes {
        node.shutdown();
    }
    // Restarted from their directories, without init, they form the same cluster.
    let nodes = start_all(tmp.path(), &peers);
    let statuses = settled(&nodes);
    assert!(statuses[0]
        .shards
        .iter()
        .all(|s| s.term > 0 && s.voters == [1, 2, 3]));
    for node in nodes {
        node.shutdown();
    }
}

#[test]
fn a_directory_made_for_another_node_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let peers = peers();
    let made = config(tmp.path(), 1, &peers);
    Node::start(made.clone()).unwrap().shutdown();
    let mut other = made.clone();
    other.identity.node = 2;
    let mut shards = made.clone();
    shards.identity.shards = 4;
    let mut cluster = made.clone();
    cluster.identity.cluster = "billing".into();
    for wrong in [other, shards, cluster] {
        let wrong_dir = NodeConfig {
            dir: made.dir.clone(),
            ..wrong
        };
        let err = Node::start(wrong_dir).err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        assert!(
            err.to_string()
                .contains("cluster orders\\nnode 1\\nshards 2"),
            "{err}"
        );
    }
    Node::start(made).unwrap().shutdown();
}

#[test]
fn a_group_whose_log_grew_takes_a_snapshot_and_lets_its_log_go() {
    let tmp = tempfile::tempdir().unwrap();
    let peers = peers();
    let small = |id| NodeConfig {
        log: Options {
            segment_bytes: 16 << 10,
            ..Options::default()
        },
        ..config(tmp.path(), id, &peers)
    };
    let nodes: Vec<Node> = (1..=3).map(|id| Node::start(small(id)).unwrap()).collect();
    nodes[0].init().unwrap();
    let leader = settled(&nodes)[0].shards[0].leader.unwrap();
    // About 40 bytes a record: over twice the 32 KiB of two segments.
    propose(&nodes, leader, 2_000);
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in &nodes {
        let (raft, _) = node.group(0).unwrap();
        loop {
            let metrics = raft.metrics().borrow_watched().clone();
            if metrics.snapshot.is_some() && metrics.purged.is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "no snapshot: {metrics:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for node in nodes {
        node.shutdown();
    }
}
