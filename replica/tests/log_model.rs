//! The log store against a model, through random appends, truncations, purges, votes
//! and crashes of the fake disk (losing, keeping or tearing what was not synced): after
//! every crash the store holds the entries the model expects: every acknowledged one,
//! perhaps some of those appended after it, never one truncated or purged; and the vote
//! and purge point it was last given.

use std::path::Path;
use std::sync::Arc;

use leasemq_replica::{log_id, Batch, Entry, GroupDir, LogId, LogStore, ShardRaft, Vote};
use leasemq_wal::{Crash, MemDisk, Options};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use openraft::RaftLogReader;

fn open(disk: &MemDisk) -> LogStore {
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let options = Options {
        segment_bytes: 8 << 10,
        ..Options::default()
    };
    LogStore::open(&group, options).unwrap()
}

/// What the store was told, and which appends it acknowledged.
#[derive(Default)]
struct Model {
    /// Every entry after the purge point, in order: what the store holds without a crash.
    entries: Vec<Entry>,
    /// Of those, the last one whose append was acknowledged (its fsync returned).
    acked: Option<u64>,
    purged: Option<LogId>,
    vote: Option<Vote>,
    term: u64,
}

impl Model {
    fn last(&self) -> Option<LogId> {
        self.entries.last().map(|e| e.log_id).or(self.purged)
    }

    fn next_index(&self) -> u64 {
        self.last().map_or(0, |id| id.index + 1)
    }
}

fn entry(term: u64, index: u64, rng: &mut fastrand::Rng) -> Entry {
    let changes = vec![(index % 251) as u8; rng.usize(0..600)];
    Entry::new_normal(
        log_id(term, 1, index),
        Batch {
            inc: 0,
            p: index,
            changes,
        },
    )
}

async fn step(store: &mut LogStore, model: &mut Model, rng: &mut fastrand::Rng) {
    match rng.u32(0..20) {
        0..=11 => {
            if rng.u32(0..4) == 0 {
                model.term += 1;
            }
            let first = model.next_index();
            let n = rng.u64(1..5);
            let batch: Vec<Entry> = (first..first + n)
                .map(|i| entry(model.term, i, rng))
                .collect();
            model.entries.extend(batch.iter().cloned());
            let (tx, rx) = ShardRaft::oneshot();
            store
                .append(batch, IOFlushed::<ShardRaft>::signal(tx))
                .await
                .unwrap();
            if rng.bool() {
                // An append never acknowledged is a hang: give up on it, saying so.
                let waited = tokio::time::timeout(std::time::Duration::from_secs(10), rx).await;
                let flushed =
                    waited.unwrap_or_else(|_| panic!("entries {first}.. never acknowledged"));
                flushed.unwrap().unwrap();
                model.acked = Some(first + n - 1);
            }
        }
        12..=13 if !model.entries.is_empty() => {
            let keep = rng.usize(0..model.entries.len());
            let kept = model.entries[keep].log_id;
            store.truncate_after(Some(kept)).await.unwrap();
            model.entries.truncate(keep + 1);
            // A truncation makes what it keeps durable first.
            model.acked = Some(kept.index);
        }
        14..=15 => {
            // Up to the end, or (rarely) past it, as after installing a leader's snapshot.
            let last = model.next_index() + if rng.u32(0..5) == 0 { 3 } else { 0 };
            let from = model.purged.map_or(0, |p| p.index + 1);
            if last <= from {
                return;
            }
            let index = rng.u64(from..last);
            let purged = match model.entries.iter().find(|e| e.log_id.index == index) {
                Some(e) => e.log_id,
                None => log_id(model.term, 2, index),
            };
            store.purge(purged).await.unwrap();
            model.entries.retain(|e| e.log_id.index > index);
            model.purged = Some(purged);
            // What the log held up to the purge point is durable too.
            model.acked = model
                .acked
                .max(model.entries.first().map(|e| e.log_id.index - 1));
        }
        16 => {
            let vote = Vote::new(rng.u64(1..100), rng.u64(1..4));
            store.save_vote(&vote).await.unwrap();
            model.vote = Some(vote);
            // Appends before a vote are made durable first.
            model.acked = model.entries.last().map(|e| e.log_id.index).or(model.acked);
        }
        _ => {}
    }
}

/// Checks the reopened store against the model, and makes the model what survived.
async fn check(store: &mut LogStore, model: &mut Model, seed: u64) {
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        state.last_purged_log_id, model.purged,
        "seed {seed}: purge point"
    );
    assert_eq!(
        store.get_log_reader().await.read_vote().await.unwrap(),
        model.vote,
        "seed {seed}: vote"
    );
    let held = store
        .get_log_reader()
        .await
        .try_get_log_entries(..)
        .await
        .unwrap();
    assert!(
        held.len() <= model.entries.len(),
        "seed {seed}: more than was appended"
    );
    assert_eq!(
        held[..],
        model.entries[..held.len()],
        "seed {seed}: not what was appended"
    );
    if let Some(acked) = model.acked {
        let lost = model
            .entries
            .iter()
            .take_while(|e| e.log_id.index <= acked)
            .count();
        assert!(held.len() >= lost, "seed {seed}: acknowledged entries lost");
    }
    assert_eq!(
        state.last_log_id,
        held.last().map(|e| e.log_id).or(model.purged),
        "seed {seed}"
    );
    model.entries.truncate(held.len());
    model.acked = held.last().map(|e| e.log_id.index);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_what_it_acknowledged_through_random_crashes() {
    // LOG_MODEL_SEED=n runs seed n alone.
    let only: Option<u64> = std::env::var("LOG_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in (0..300).filter(|s| only.is_none_or(|o| o == *s)) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut disk = MemDisk::new();
        if rng.bool() {
            disk.garble_torn_sectors();
        }
        let mut store = open(&disk);
        let mut model = Model::default();
        for _ in 0..8 {
            for _ in 0..rng.usize(1..40) {
                step(&mut store, &mut model, &mut rng).await;
            }
            drop(store);
            let mode = match rng.u32(0..3) {
                0 => Crash::LoseUnsynced,
                1 => Crash::KeepUnsynced,
                _ => Crash::Tear { seed: rng.u64(..) },
            };
            disk = disk.crash(mode);
            store = open(&disk);
            check(&mut store, &mut model, seed).await;
        }
    }
}
