//! Three replicas of a group in one process, over the in-memory network, each on a fake
//! disk of its own: what a leader commits reaches every replica's applier, a new leader
//! takes over from one cut off, a replica left behind a snapshot catches up from it, and
//! one that restarts from its disk catches up from its log.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::Recorder;
use leasemq_replica::mem_net::MemNetwork;
use leasemq_replica::{Batch, GroupDir, Raft};
use leasemq_wal::{Crash, MemDisk, Options};
use openraft::async_runtime::WatchReceiver;
use openraft::BasicNode;

/// Generous: a loaded 2-core machine runs other tests beside these.
const WAIT: Option<Duration> = Some(Duration::from_secs(30));

struct Node {
    disk: MemDisk,
    recorder: Recorder,
    raft: Raft<Recorder>,
}

struct Group {
    net: MemNetwork<Recorder>,
    nodes: BTreeMap<u64, Node>,
}

fn options() -> Options {
    Options {
        segment_bytes: 16 << 10,
        ..Options::default()
    }
}

async fn start(net: &MemNetwork<Recorder>, id: u64, disk: MemDisk) -> Node {
    let config = leasemq_replica::config("test", Duration::from_millis(150)).unwrap();
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let recorder = Recorder::default();
    let raft = leasemq_replica::start(
        id,
        Arc::new(config),
        &group,
        options(),
        recorder.clone(),
        net.from(id),
    )
    .await
    .unwrap();
    net.add(id, raft.clone());
    Node {
        disk,
        recorder,
        raft,
    }
}

impl Group {
    async fn new() -> Group {
        let net = MemNetwork::default();
        let mut nodes = BTreeMap::new();
        for id in 1..=3 {
            nodes.insert(id, start(&net, id, MemDisk::new()).await);
        }
        let members: BTreeMap<u64, BasicNode> = (1..=3)
            .map(|id| (id, BasicNode::new(format!("node {id}"))))
            .collect();
        nodes[&1].raft.initialize(members).await.unwrap();
        Group { net, nodes }
    }

    /// Waits for a leader that `among` agree on, and returns it.
    async fn leader(&self, among: &[u64]) -> u64 {
        let first = &self.nodes[&among[0]].raft;
        let metrics = first
            .wait(WAIT)
            .metrics(
                |m| m.current_leader.is_some_and(|l| among.contains(&l)),
                "a leader",
            )
            .await
            .unwrap();
        let leader = metrics.current_leader.unwrap();
        for id in among {
            self.nodes[id]
                .raft
                .wait(WAIT)
                .current_leader(leader, "the same leader")
                .await
                .unwrap();
        }
        // A new leader takes writes once a majority acknowledged it (its lease).
        let raft = &self.nodes[&leader].raft;
        raft.wait(WAIT)
            .leader_with_quorum_acked(None, "a lease")
            .await
            .unwrap();
        leader
    }

    /// Proposes `n` batches on `leader` from `p`, each answered once committed.
    async fn write(&self, leader: u64, p: std::ops::Range<u64>) {
        for p in p {
            let batch = Batch {
                inc: 1,
                p,
                changes: format!("change {p}").into_bytes(),
            };
            self.nodes[&leader].raft.client_write(batch).await.unwrap();
        }
    }

    /// Waits until `ids` applied everything `leader` has, and checks they hold the same.
    async fn converged(&self, leader: u64, ids: &[u64]) -> Vec<u64> {
        let last = self.nodes[&leader]
            .raft
            .metrics()
            .borrow_watched()
            .last_log_index;
        for id in ids {
            self.nodes[id]
                .raft
                .wait(WAIT)
                .applied_index_at_least(last, "caught up")
                .await
                .unwrap();
        }
        let expected = self.nodes[&leader].recorder.batches();
        for id in ids {
            assert_eq!(self.nodes[id].recorder.batches(), expected, "node {id}");
        }
        expected.iter().map(|(_, b)| b.p).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_applies_what_the_leader_commits_in_order() {
    let group = Group::new().await;
    let leader = group.leader(&[1, 2, 3]).await;
    group.write(leader, 1..41).await;
    let applied = group.converged(leader, &[1, 2, 3]).await;
    assert_eq!(applied, (1..41).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_is_replaced_and_nothing_it_committed_is_lost() {
    let mut group = Group::new().await;
    let old = group.leader(&[1, 2, 3]).await;
    group.write(old, 1..21).await;
    group.net.cut_off(old);
    let rest: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
    let new = group.leader(&rest).await;
    assert_ne!(new, old);
    group.write(new, 21..31).await;
    group.net.heal(old);
    let applied = group.converged(new, &[1, 2, 3]).await;
    assert_eq!(applied, (1..31).collect::<Vec<_>>());
    // The old leader's disk holds the same log: restarted from it, it applies the same.
    let node = group.nodes.remove(&old).unwrap();
    node.raft.shutdown().await.unwrap();
    group.net.remove(old);
    let restarted = start(&group.net, old, node.disk.crash(Crash::LoseUnsynced)).await;
    group.nodes.insert(old, restarted);
    group.write(new, 31..33).await;
    let applied = group.converged(new, &[1, 2, 3]).await;
    assert_eq!(applied, (1..33).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_the_leader_s_snapshot_catches_up_from_it() {
    let group = Group::new().await;
    let leader = group.leader(&[1, 2, 3]).await;
    let behind = (1..=3).find(|&id| id != leader).unwrap();
    group.write(leader, 1..11).await;
    group.converged(leader, &[1, 2, 3]).await;
    group.net.cut_off(behind);
    group.write(leader, 11..211).await;
    let raft = &group.nodes[&leader].raft;
    raft.trigger().snapshot().await.unwrap();
    let last = raft.metrics().borrow_watched().last_applied.unwrap().index;
    let taken = |m: &openraft::RaftMetrics<_>| m.snapshot.is_some_and(|s| s.index >= last);
    raft.wait(WAIT)
        .metrics(taken, "snapshot taken")
        .await
        .unwrap();
    raft.trigger().purge_log(last).await.unwrap();
    let purged = |m: &openraft::RaftMetrics<_>| m.purged.is_some_and(|p| p.index >= last);
    raft.wait(WAIT).metrics(purged, "log purged").await.unwrap();
    group.net.heal(behind);
    let applied = group.converged(leader, &[1, 2, 3]).await;
    assert_eq!(applied, (1..211).collect::<Vec<_>>());
    // It got there by the snapshot: its own log starts after it.
    let metrics = group.nodes[&behind].raft.metrics().borrow_watched().clone();
    assert!(
        metrics.snapshot.is_some_and(|s| s.index >= 200),
        "{metrics:?}"
    );
}
