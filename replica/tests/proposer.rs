//! A leader's proposals over three replicas: outcomes come in proposal order, committed
//! ones are applied everywhere, and proposals of a leader cut off come back unknown (and
//! here applied nowhere).

mod common;

use std::time::Duration;

use common::group::{Group, WAIT};
use common::Recorder;
use leasemq_replica::{Batch, Outcome, Proposer};
use openraft::async_runtime::WatchReceiver;
use tokio::sync::mpsc;

fn batch(inc: u32, p: u64) -> Batch {
    Batch {
        inc,
        p,
        changes: format!("{inc}/{p}").into_bytes(),
    }
}

/// A proposer on `leader`'s replica, as the leader it is now, and where its outcomes go.
fn proposer(group: &Group<Recorder>, leader: u64) -> (Proposer, mpsc::UnboundedReceiver<Outcome>) {
    let raft = group.nodes[&leader].raft.clone();
    let vote = raft.metrics().borrow_watched().vote;
    let leader_id = (vote.leader_id.term, vote.leader_id.node_id);
    let (tx, rx) = mpsc::unbounded_channel();
    let report = move |outcome| {
        let _ = tx.send(outcome);
    };
    let runtime = tokio::runtime::Handle::current();
    (Proposer::start(raft, leader_id, report, &runtime), rx)
}

async fn next(outcomes: &mut mpsc::UnboundedReceiver<Outcome>) -> Outcome {
    let wait = WAIT.unwrap_or(Duration::from_secs(30));
    tokio::time::timeout(wait, outcomes.recv())
        .await
        .expect("an outcome in time")
        .expect("the proposer runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_commit_in_order_and_every_replica_applies_them() {
    let group = Group::<Recorder>::new().await;
    let leader = group.leader(&[1, 2, 3]).await;
    let (proposer, mut outcomes) = proposer(&group, leader);
    for p in 1..=50 {
        assert!(proposer.propose(batch(0, p)));
    }
    let mut last = None;
    for p in 1..=50 {
        match next(&mut outcomes).await {
            Outcome::Committed { p: got, log_id } => {
                assert_eq!(got, p);
                assert!(last < Some(log_id.index), "log ids grow");
                last = Some(log_id.index);
            }
            other => panic!("batch {p}: {other:?}"),
        }
    }
    group.converged(leader, &[1, 2, 3]).await;
    let applied: Vec<u64> = group.nodes[&leader]
        .applier
        .batches()
        .iter()
        .map(|(_, b)| b.p)
        .collect();
    assert_eq!(applied, (1..=50).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_of_a_leader_cut_off_come_back_unknown_and_are_applied_nowhere() {
    let group = Group::<Recorder>::new().await;
    let old = group.leader(&[1, 2, 3]).await;
    let (proposer, mut outcomes) = proposer(&group, old);
    proposer.propose(batch(0, 1));
    assert!(matches!(
        next(&mut outcomes).await,
        Outcome::Committed { p: 1, .. }
    ));
    group.net.cut_off(old);
    for p in 2..=6 {
        proposer.propose(batch(0, p));
    }
    let rest: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
    let new = group.leader(&rest).await;
    group.write(new, [batch(5, 1)]).await;
    // Cut off, the old leader cannot commit: what it appended waits (the shard's answers
    // time out meanwhile) until it learns of its successor, whose log replaces its own;
    // openraft gives up on them then, and their fate is unknown to the proposer.
    assert!(
        outcomes.try_recv().is_err(),
        "nothing resolved while cut off"
    );
    group.net.heal(old);
    for p in 2..=6 {
        assert_eq!(next(&mut outcomes).await, Outcome::Unknown { p });
    }
    group.converged(new, &[1, 2, 3]).await;
    for id in 1..=3 {
        let applied: Vec<(u32, u64)> = group.nodes[&id]
            .applier
            .batches()
            .iter()
            .map(|(_, b)| (b.inc, b.p))
            .collect();
        assert_eq!(applied, [(0, 1), (5, 1)], "node {id}");
    }
}
