//! Nodes of a cluster, each with every shard's group, on loopback: formed once, they
//! elect a leader for every shard, come back formed after a restart, and refuse a
//! directory made for another node.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasemq_replica::{ClusterStatus, Identity, Node, NodeConfig};
use leasemq_wal::{DiskStorage, Options};

const SHARDS: u16 = 2;

fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

fn config(dir: &Path, id: u64, peers: &BTreeMap<u64, String>) -> NodeConfig {
    NodeConfig {
        identity: Identity {
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
