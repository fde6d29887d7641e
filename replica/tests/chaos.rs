//! Three replicas under faults: nodes cut off and joined again, crashed (one, or all at
//! once) and restarted from their disks as a power loss leaves them (losing or tearing
//! what was not synced), while a client writes to
//! whichever node leads. At the end every write that was answered is applied, once, in
//! the same order on every replica.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::group::Group;
use common::Recorder;
use leasemq_replica::Batch;
use leasemq_wal::Crash;
use openraft::async_runtime::WatchReceiver;

/// The node that `among` agree leads, if they find one within a few election timeouts.
async fn leader(group: &Group<Recorder>, among: &[u64]) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        let leaders: Vec<Option<u64>> = among
            .iter()
            .map(|id| {
                group.nodes[id]
                    .raft
                    .metrics()
                    .borrow_watched()
                    .current_leader
            })
            .collect();
        if let Some(Some(leader)) = leaders.first() {
            if among.contains(leader) && leaders.iter().all(|l| *l == Some(*leader)) {
                return Some(*leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Waits for the writes under way; notes those answered.
async fn continue_with(writes: &mut tokio::task::JoinSet<Option<u64>>, answered: &mut Vec<u64>) {
    while let Some(done) = writes.join_next().await {
        answered.extend(done.expect("a write task ends"));
    }
}

/// A crash as a power loss leaves a disk: what was not synced lost, or, half the time,
/// some of it kept (a prefix or any subset of its sectors).
fn crash_mode(rng: &mut fastrand::Rng) -> Crash {
    if rng.bool() {
        Crash::Tear { seed: rng.u64(..) }
    } else {
        Crash::LoseUnsynced
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_write_survives_cuts_and_crashes() {
    // CHAOS_SEED=n runs seed n alone.
    let only: Option<u64> = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in (1..=6).filter(|s| only.is_none_or(|o| o == *s)) {
        run(seed).await;
    }
}

async fn run(seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut group = Group::<Recorder>::new().await;
    // Formed for good: a leader whose lease a majority granted holds the membership on a
    // majority's disks (a power loss of every node before that unforms the group).
    group.leader(&[1, 2, 3]).await;
    let mut cut: Option<u64> = None;
    let mut answered = Vec::new();
    let mut writes = tokio::task::JoinSet::new();
    let mut next = 0u64;
    for round in 0..24 {
        match rng.u32(0..4) {
            0 => {
                if let Some(id) = cut.take() {
                    group.net.heal(id);
                }
                let id = rng.u64(1..=3);
                group.net.cut_off(id);
                cut = Some(id);
            }
            1 => {
                let id = rng.u64(1..=3);
                let crash = crash_mode(&mut rng);
                group.restart_with(id, crash).await;
            }
            2 if rng.u32(0..3) == 0 => {
                // Every node loses power at once.
                let crash = crash_mode(&mut rng);
                group.restart_all_with(&[1, 2, 3], crash).await;
            }
            2 => {
                if let Some(id) = cut.take() {
                    group.net.heal(id);
                }
            }
            _ => {}
        }
        let live: Vec<u64> = (1..=3).filter(|id| Some(*id) != cut).collect();
        let Some(leader) = leader(&group, &live).await else {
            continue;
        };
        // Writes in flight together, so that crashes find some appended and not synced.
        let raft = group.nodes[&leader].raft.clone();
        for _ in 0..rng.u32(1..40) {
            next += 1;
            let batch = Batch {
                inc: 0,
                p: next,
                changes: format!("write {next} in round {round}").into_bytes(),
            };
            let raft = raft.clone();
            writes.spawn(async move {
                let write = raft.client_write(batch);
                // An error leaves the write's fate unknown: it may be applied or not.
                let answer = tokio::time::timeout(Duration::from_secs(2), write).await;
                matches!(answer, Ok(Ok(_))).then_some(next)
            });
        }
        // Half the time the next fault strikes while some are still on their way.
        if rng.bool() {
            tokio::time::sleep(Duration::from_millis(rng.u64(0..5))).await;
        } else {
            continue_with(&mut writes, &mut answered).await;
        }
    }
    continue_with(&mut writes, &mut answered).await;
    if let Some(id) = cut.take() {
        group.net.heal(id);
    }
    let Some(leader) = leader(&group, &[1, 2, 3]).await else {
        let metrics: Vec<_> = (1..=3)
            .map(|id| group.nodes[&id].raft.metrics().borrow_watched().clone())
            .collect();
        panic!("seed {seed}: no leader once healed: {metrics:#?}");
    };
    // One more write, so that the new leader commits everything before it.
    let last = Batch {
        inc: 0,
        p: next + 1,
        changes: b"last".to_vec(),
    };
    group.nodes[&leader].raft.client_write(last).await.unwrap();
    group.converged(leader, &[1, 2, 3]).await;
    let applied = group.nodes[&leader].applier.batches();
    let mut times: HashMap<u64, usize> = HashMap::new();
    for (_, batch) in &applied {
        *times.entry(batch.p).or_default() += 1;
    }
    assert!(
        times.values().all(|&n| n == 1),
        "seed {seed}: a write applied twice"
    );
    for p in &answered {
        assert!(
            times.contains_key(p),
            "seed {seed}: answered write {p} lost"
        );
    }
    assert!(
        answered.len() > 20,
        "seed {seed}: only {} writes answered",
        answered.len()
    );
}
