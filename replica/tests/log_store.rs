//! The log store across crashes of the fake disk: what openraft was told is durable is
//! there after the crash, and what it truncated or purged stays gone.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::Recorder;
use leasemq_replica::{log_id, Batch, Entry, GroupDir, LogStore, ShardRaft, StateMachine, Vote};
use leasemq_wal::{Crash, MemDisk, Options};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::{RaftLogReader, RaftSnapshotBuilder};

fn open(disk: &MemDisk) -> LogStore {
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let options = Options {
        segment_bytes: 64 << 10,
        ..Options::default()
    };
    LogStore::open(&group, options).unwrap()
}

fn entry(term: u64, index: u64, bytes: usize) -> Entry {
    let batch = Batch {
        inc: 1,
        p: index,
        changes: vec![(index % 251) as u8; bytes],
    };
    Entry::new_normal(log_id(term, 1, index), batch)
}

/// Appends and waits until the log says the entries are durable.
async fn append(log: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = ShardRaft::oneshot();
    log.append(entries, IOFlushed::<ShardRaft>::signal(tx))
        .await
        .unwrap();
    rx.await.unwrap().unwrap();
}

async fn all(log: &mut LogStore) -> Vec<Entry> {
    log.get_log_reader()
        .await
        .try_get_log_entries(..)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_is_acknowledged_only_after_the_fsync_that_covers_it() {
    let disk = MemDisk::new();
    let mut log = open(&disk);
    append(&mut log, vec![entry(1, 0, 10)]).await;
    disk.hold_syncs();
    let (tx, mut rx) = ShardRaft::oneshot();
    let batch = vec![entry(1, 1, 10), entry(1, 2, 10)];
    log.append(batch, IOFlushed::<ShardRaft>::signal(tx))
        .await
        .unwrap();
    disk.wait_for_held_sync();
    assert!(
        rx.try_recv().is_err(),
        "acknowledged while its fsync was held"
    );
    // Readable already: a leader replicates entries before its own fsync returns.
    assert_eq!(all(&mut log).await.len(), 3);
    disk.release_syncs();
    rx.await.unwrap().unwrap();
    drop(log);
    let mut log = open(&disk.crash(Crash::LoseUnsynced));
    let expected = vec![entry(1, 0, 10), entry(1, 1, 10), entry(1, 2, 10)];
    assert_eq!(all(&mut log).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_truncated_stay_gone_after_a_crash_and_the_new_ones_stay() {
    let disk = MemDisk::new();
    let mut log = open(&disk);
    append(&mut log, (0..20).map(|i| entry(1, i, 3000)).collect()).await;
    log.truncate_after(Some(log_id(1, 1, 9))).await.unwrap();
    append(&mut log, (10..15).map(|i| entry(2, i, 100)).collect()).await;
    let expected: Vec<Entry> = (0..10)
        .map(|i| entry(1, i, 3000))
        .chain((10..15).map(|i| entry(2, i, 100)))
        .collect();
    assert_eq!(all(&mut log).await, expected);
    drop(log);
    for seed in 0..8 {
        let mut log = open(&disk.crash(Crash::Tear { seed }));
        assert_eq!(all(&mut log).await, expected, "seed {seed}");
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(2, 1, 14)));
        assert_eq!(state.last_purged_log_id, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vote_and_the_purge_survive_a_crash() {
    let disk = MemDisk::new();
    let mut log = open(&disk);
    append(&mut log, (0..40).map(|i| entry(1, i, 3000)).collect()).await;
    log.save_vote(&Vote::new(3, 2)).await.unwrap();
    log.save_vote(&Vote::new_committed(4, 1)).await.unwrap();
    log.purge(log_id(1, 1, 29)).await.unwrap();
    drop(log);
    let mut log = open(&disk.crash(Crash::LoseUnsynced));
    assert_eq!(
        log.get_log_reader().await.read_vote().await.unwrap(),
        Some(Vote::new_committed(4, 1))
    );
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 29)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 39)));
    let expected: Vec<Entry> = (30..40).map(|i| entry(1, i, 3000)).collect();
    assert_eq!(all(&mut log).await, expected);
    // The purge let whole segments go.
    let segments = disk.crash(Crash::KeepUnsynced);
    let names = leasemq_wal::Storage::list(&segments, Path::new("/group/log")).unwrap();
    assert!(
        !names.iter().any(|n| n == &format!("{:020}.wal", 1)),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_past_the_end_starts_the_log_after_it() {
    let disk = MemDisk::new();
    let mut log = open(&disk);
    append(&mut log, (0..4).map(|i| entry(1, i, 10)).collect()).await;
    // A follower that installed its leader's snapshot, which covers more than it holds.
    log.purge(log_id(2, 2, 100)).await.unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(2, 2, 100)));
    assert_eq!(all(&mut log).await, vec![]);
    append(&mut log, vec![entry(3, 101, 10)]).await;
    drop(log);
    let mut log = open(&disk.crash(Crash::LoseUnsynced));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 2, 100)));
    assert_eq!(state.last_log_id, Some(log_id(3, 1, 101)));
    assert_eq!(all(&mut log).await, vec![entry(3, 101, 10)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_let_go_from_memory_are_read_back_from_the_log() {
    let disk = MemDisk::new();
    let mut log = open(&disk);
    // 8 MiB in 64 KiB entries: the older half is read from the log, the rest from
    // memory.
    let entries: Vec<Entry> = (0..128).map(|i| entry(1, i, 64 << 10)).collect();
    for chunk in entries.chunks(16) {
        append(&mut log, chunk.to_vec()).await;
    }
    assert_eq!(all(&mut log).await, entries);
    for (from, to) in [(0, 1), (10, 70), (63, 65), (100, 128), (127, 200), (5, 5)] {
        let read = log
            .get_log_reader()
            .await
            .try_get_log_entries(from..to)
            .await
            .unwrap();
        let wanted = &entries[from as usize..(to as usize).min(128).max(from as usize)];
        assert_eq!(read, wanted, "{from}..{to}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_machine_reopens_at_its_snapshot() {
    let disk = MemDisk::new();
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let recorder = Recorder::default();
    let mut sm = StateMachine::open(&group, recorder.clone()).await.unwrap();
    let apply = |entries: Vec<Entry>| {
        futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))))
    };
    sm.apply(apply((0..5).map(|i| entry(1, i, 10)).collect()))
        .await
        .unwrap();
    let mut builder = sm.get_snapshot_builder().await;
    let snapshot = builder.build_snapshot().await.unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 1, 4)));
    sm.apply(apply((5..8).map(|i| entry(1, i, 10)).collect()))
        .await
        .unwrap();
    assert_eq!(recorder.batches().len(), 8);
    drop(sm);
    let disk = disk.crash(Crash::LoseUnsynced);
    let group = GroupDir::new(Arc::new(disk.clone()), Path::new("/group"));
    let reopened = Recorder::default();
    let mut sm = StateMachine::open(&group, reopened.clone()).await.unwrap();
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 1, 4)));
    let expected: Vec<u64> = (0..5).collect();
    let indexes: Vec<u64> = reopened.batches().iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, expected);
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
    assert_eq!(
        current.snapshot.into_inner(),
        snapshot.snapshot.into_inner()
    );
}
