//! Three replicas of a group in one process, over the in-memory network, each on a fake
//! disk of its own: what a leader commits reaches every replica's applier, a new leader
//! takes over from one cut off, a replica left behind a snapshot catches up from it, and
//! one that restarts from its disk catches up from its log.

mod common;

use common::group::Group;
use common::Recorder;
use leasemq_replica::Batch;

fn batches(p: std::ops::Range<u64>) -> Vec<Batch> {
    p.map(|p| Batch {
        inc: 1,
        p,
        changes: format!("change {p}").into_bytes(),
    })
    .collect()
}

/// What `node` applied: the batches' numbers.
fn applied(group: &Group<Recorder>, node: u64) -> Vec<u64> {
    let batches = group.nodes[&node].applier.batches();
    batches.iter().map(|(_, b)| b.p).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_applies_what_the_leader_commits_in_order() {
    let group = Group::<Recorder>::new().await;
    let leader = group.leader(&[1, 2, 3]).await;
    group.write(leader, batches(1..41)).await;
    group.converged(leader, &[1, 2, 3]).await;
    assert_eq!(applied(&group, leader), (1..41).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_is_replaced_and_nothing_it_committed_is_lost() {
    let mut group = Group::<Recorder>::new().await;
    let old = group.leader(&[1, 2, 3]).await;
    group.write(old, batches(1..21)).await;
    group.net.cut_off(old);
    let rest: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
    let new = group.leader(&rest).await;
    assert_ne!(new, old);
    group.write(new, batches(21..31)).await;
    group.net.heal(old);
    group.converged(new, &[1, 2, 3]).await;
    assert_eq!(applied(&group, old), (1..31).collect::<Vec<_>>());
    // The old leader's disk holds the same log: restarted from it, it applies the same.
    group.restart(old).await;
    group.write(new, batches(31..33)).await;
    group.converged(new, &[1, 2, 3]).await;
    assert_eq!(applied(&group, old), (1..33).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_the_leader_s_snapshot_catches_up_from_it() {
    let group = Group::<Recorder>::new().await;
    let leader = group.leader(&[1, 2, 3]).await;
    let behind = (1..=3).find(|&id| id != leader).unwrap();
    group.write(leader, batches(1..11)).await;
    group.converged(leader, &[1, 2, 3]).await;
    group
        .snapshot_while_cut_off(leader, behind, batches(11..211))
        .await;
    group.converged(leader, &[1, 2, 3]).await;
    assert_eq!(applied(&group, behind), (1..211).collect::<Vec<_>>());
    // It got there by the snapshot: its own log starts after it.
    let metrics = group.nodes[&behind].raft.metrics();
    let snapshot = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics).snapshot;
    assert!(snapshot.is_some_and(|s| s.index >= 200), "{snapshot:?}");
}
