//! Replicas of two shards' groups on three nodes, over the node link on loopback: every
//! group commits through it, and a node that does not know the cluster's secret is kept
//! out of every group.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::group::WAIT;
use common::Recorder;
use leasemq_replica::link::Link;
use leasemq_replica::{Batch, GroupDir, Identity, Raft};
use leasemq_wal::{MemDisk, Options};
use openraft::async_runtime::WatchReceiver;
use openraft::BasicNode;
use tokio::net::TcpListener;

const SHARDS: u16 = 2;

struct Node {
    rafts: Vec<Raft<Recorder>>,
    recorders: Vec<Recorder>,
}

/// Starts nodes 1 to 3, node `id` knowing `secrets[id - 1]`, each serving its groups on
/// its listener.
async fn start(secrets: [&[u8]; 3]) -> BTreeMap<u64, Node> {
    let mut listeners = Vec::new();
    let mut peers = HashMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        peers.insert(id, listener.local_addr().unwrap().to_string());
        listeners.push(listener);
    }
    let mut nodes = BTreeMap::new();
    for (id, listener) in (1..=3u64).zip(listeners) {
        let identity = Identity {
            tls: None,
            cluster: "orders".into(),
            node: id,
            shards: SHARDS,
            secret: secrets[id as usize - 1].to_vec(),
        };
        let link = Link::new(identity, peers.clone());
        let disk = MemDisk::new();
        let (mut rafts, mut recorders) = (Vec::new(), Vec::new());
        for shard in 0..SHARDS {
            let config = leasemq_replica::config("orders", Duration::from_millis(150)).unwrap();
            let group = GroupDir::new(
                Arc::new(disk.clone()),
                PathBuf::from(format!("/shard-{shard}")),
            );
            let recorder = Recorder::default();
            let network = link.network(shard);
            let raft = leasemq_replica::start(
                id,
                Arc::new(config),
                &group,
                Options::default(),
                recorder.clone(),
                network,
            )
            .await
            .unwrap();
            link.serve_group(shard, raft.clone());
            rafts.push(raft);
            recorders.push(recorder);
        }
        tokio::spawn(link.serve(listener));
        nodes.insert(id, Node { rafts, recorders });
    }
    let members: BTreeMap<u64, BasicNode> = peers
        .iter()
        .map(|(&id, addr)| (id, BasicNode::new(addr)))
        .collect();
    for shard in 0..SHARDS {
        nodes[&1].rafts[usize::from(shard)]
            .initialize(members.clone())
            .await
            .unwrap();
    }
    nodes
}

/// Waits for shard `shard`'s leader, as node 1 sees it, to hold its lease.
async fn leader(nodes: &BTreeMap<u64, Node>, shard: usize) -> u64 {
    let known = |m: &openraft::RaftMetrics<_>| m.current_leader.is_some();
    let metrics = nodes[&1].rafts[shard]
        .wait(WAIT)
        .metrics(known, "a leader")
        .await
        .unwrap();
    let leader = metrics.current_leader.unwrap();
    let wait = nodes[&leader].rafts[shard].wait(WAIT);
    wait.leader_with_quorum_acked(None, "a lease")
        .await
        .unwrap();
    leader
}

async fn write(raft: &Raft<Recorder>, shard: usize, n: u64) {
    for p in 1..=n {
        let changes = format!("shard {shard} change {p}").into_bytes();
        raft.client_write(Batch { inc: 1, p, changes })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shard_s_group_commits_over_the_node_link() {
    let nodes = start([b"s3cret"; 3]).await;
    for shard in 0..usize::from(SHARDS) {
        let leader = leader(&nodes, shard).await;
        write(&nodes[&leader].rafts[shard], shard, 25).await;
        let last = nodes[&leader].rafts[shard]
            .metrics()
            .borrow_watched()
            .last_log_index;
        for node in nodes.values() {
            let wait = node.rafts[shard].wait(WAIT);
            wait.applied_index_at_least(last, "caught up")
                .await
                .unwrap();
        }
        let expected = nodes[&leader].recorders[shard].batches();
        assert_eq!(expected.len(), 25);
        assert!(expected
            .iter()
            .all(|(_, b)| b.changes.starts_with(format!("shard {shard} ").as_bytes())));
        for (id, node) in &nodes {
            assert_eq!(
                node.recorders[shard].batches(),
                expected,
                "node {id}, shard {shard}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_know_the_secret_is_kept_out() {
    let nodes = start([b"s3cret", b"s3cret", b"a guess"]).await;
    let leader = leader(&nodes, 0).await;
    assert_ne!(leader, 3, "node 3 cannot win votes it cannot ask for");
    write(&nodes[&leader].rafts[0], 0, 10).await;
    let last = nodes[&leader].rafts[0]
        .metrics()
        .borrow_watched()
        .last_log_index;
    let other = if leader == 1 { 2 } else { 1 };
    let wait = nodes[&other].rafts[0].wait(WAIT);
    wait.applied_index_at_least(last, "caught up")
        .await
        .unwrap();
    // The two that know the secret committed ten batches between them; node 3 got none,
    // not even the membership that formed the group.
    assert_eq!(nodes[&other].recorders[0].batches().len(), 10);
    assert!(nodes[&3].recorders[0].batches().is_empty());
    let metrics = nodes[&3].rafts[0].metrics().borrow_watched().clone();
    assert_eq!(metrics.last_log_index, None, "{metrics:?}");
}
