//! Three replicas of a group in one process, over the in-memory network, each on a fake
//! disk of its own.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasemq_replica::mem_net::MemNetwork;
use leasemq_replica::{Applier, Batch, GroupDir, Raft};
use leasemq_wal::{Crash, MemDisk, Options};
use openraft::async_runtime::WatchReceiver;
use openraft::BasicNode;

/// Generous: a loaded 2-core machine runs other tests beside these.
pub const WAIT: Option<Duration> = Some(Duration::from_secs(30));

/// An applier the tests can make afresh and compare.
pub trait TestApplier: Applier + Clone {
    fn fresh() -> Self;
    /// Its state, as bytes equal for equal states.
    fn state(&self) -> Vec<u8>;
}

pub struct Node<A: TestApplier> {
    pub disk: MemDisk,
    pub applier: A,
    pub raft: Raft<A>,
}

pub struct Group<A: TestApplier> {
    pub net: MemNetwork<A>,
    pub nodes: BTreeMap<u64, Node<A>>,
}

fn options() -> Options {
    Options {
        segment_bytes: 16 << 10,
        ..Options::default()
    }
}

async fn start<A: TestApplier>(net: &MemNetwork<A>, id: u64, disk: MemDisk) -> Node<A> {
    let config = leasemq_replica::config("test", Duration::from_millis(150)).unwrap();
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let applier = A::fresh();
    let raft = leasemq_replica::start(
        id,
        Arc::new(config),
        &group,
        options(),
        applier.clone(),
        net.from(id),
    )
    .await
    .unwrap();
    net.add(id, raft.clone());
    Node {
        disk,
        applier,
        raft,
    }
}

impl<A: TestApplier> Group<A> {
    /// Three replicas, nodes 1 to 3, formed into a group.
    pub async fn new() -> Group<A> {
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

    /// Waits for a leader that `among` agree on and that a majority acknowledged (a new
    /// leader takes writes only then: its lease), and returns it.
    pub async fn leader(&self, among: &[u64]) -> u64 {
        let first = &self.nodes[&among[0]].raft;
        let agreed =
            |m: &openraft::RaftMetrics<_>| m.current_leader.is_some_and(|l| among.contains(&l));
        let metrics = first.wait(WAIT).metrics(agreed, "a leader").await.unwrap();
        let leader = metrics.current_leader.unwrap();
        for id in among {
            let wait = self.nodes[id].raft.wait(WAIT);
            wait.current_leader(leader, "the same leader")
                .await
                .unwrap();
        }
        let wait = self.nodes[&leader].raft.wait(WAIT);
        wait.leader_with_quorum_acked(None, "a lease")
            .await
            .unwrap();
        leader
    }

    /// Proposes `batches` on `leader`, each answered once committed.
    pub async fn write(&self, leader: u64, batches: impl IntoIterator<Item = Batch>) {
        for batch in batches {
            self.nodes[&leader].raft.client_write(batch).await.unwrap();
        }
    }

    /// Waits until `ids` applied everything `leader` has (and the leader's log stopped
    /// growing meanwhile: a write given up on may still commit), checks their states
    /// are equal, and returns the leader's.
    pub async fn converged(&self, leader: u64, ids: &[u64]) -> Vec<u8> {
        let last_index = || {
            self.nodes[&leader]
                .raft
                .metrics()
                .borrow_watched()
                .last_log_index
        };
        let mut last = last_index();
        loop {
            for id in ids {
                let wait = self.nodes[id].raft.wait(WAIT);
                wait.applied_index_at_least(last, "caught up")
                    .await
                    .unwrap();
            }
            let now = last_index();
            if now == last {
                break;
            }
            last = now;
        }
        let expected = self.nodes[&leader].applier.state();
        for id in ids {
            assert!(
                self.nodes[id].applier.state() == expected,
                "node {id} differs"
            );
        }
        expected
    }

    /// Cuts `id` off while `leader` snapshots and purges its log, then joins it again.
    pub async fn snapshot_while_cut_off(&self, leader: u64, id: u64, meanwhile: Vec<Batch>) {
        self.net.cut_off(id);
        self.write(leader, meanwhile).await;
        let raft = &self.nodes[&leader].raft;
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
        self.net.heal(id);
    }

    /// Stops node `id`, crashes its disk (losing what was not synced) and starts it again
    /// from that disk.
    pub async fn restart(&mut self, id: u64) {
        self.restart_with(id, Crash::LoseUnsynced).await;
    }

    /// Crashes node `id` as a power loss would (its disk keeping what `crash` says of
    /// what was not synced at that instant), then starts it again from that disk.
    pub async fn restart_with(&mut self, id: u64, crash: Crash) {
        self.restart_all_with(&[id], crash).await;
    }

    /// Crashes nodes `ids` at one instant, as a power loss would, then starts them
    /// again from their disks.
    pub async fn restart_all_with(&mut self, ids: &[u64], crash: Crash) {
        // The disks' images first: what the node does after this instant is lost.
        let images: Vec<MemDisk> = ids
            .iter()
            .map(|id| self.nodes[id].disk.crash(crash))
            .collect();
        for id in ids {
            let node = self.nodes.remove(id).unwrap();
            self.net.remove(*id);
            let _ = node.raft.shutdown().await;
        }
        for (id, image) in ids.iter().zip(images) {
            let restarted = start(&self.net, *id, image).await;
            self.nodes.insert(*id, restarted);
        }
    }
}
