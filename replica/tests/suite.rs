//! openraft's own test suite for log stores and state machines, on the disk and on the
//! fake disk.

mod common;

use std::sync::Arc;

use common::Recorder;
use leasemq_replica::{GroupDir, LogStore, ShardRaft, StateMachine};
use leasemq_wal::{DiskStorage, MemDisk, Options, Storage};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};

/// Small segments, so that the suite's logs roll over and purges remove segments.
fn options() -> Options {
    Options {
        segment_bytes: 4096,
        ..Options::default()
    }
}

fn error(e: std::io::Error) -> StorageError<ShardRaft> {
    StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Read, e)
}

async fn build(
    storage: Arc<dyn Storage>,
    dir: &std::path::Path,
) -> Result<(LogStore, StateMachine<Recorder>), StorageError<ShardRaft>> {
    let group = GroupDir::new(storage, dir);
    let log = LogStore::open(&group, options()).map_err(error)?;
    let sm = StateMachine::open(&group, Recorder::default())
        .await
        .map_err(error)?;
    Ok((log, sm))
}

struct OnDisk;

impl StoreBuilder<ShardRaft, LogStore, StateMachine<Recorder>, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine<Recorder>), StorageError<ShardRaft>>
    {
        let dir = tempfile::tempdir().map_err(error)?;
        let (log, sm) = build(Arc::new(DiskStorage), &dir.path().join("group")).await?;
        Ok((dir, log, sm))
    }
}

struct OnMemDisk;

impl StoreBuilder<ShardRaft, LogStore, StateMachine<Recorder>, MemDisk> for OnMemDisk {
    async fn build(
        &self,
    ) -> Result<(MemDisk, LogStore, StateMachine<Recorder>), StorageError<ShardRaft>> {
        let disk = MemDisk::new();
        let (log, sm) = build(Arc::new(disk.clone()), std::path::Path::new("/group")).await?;
        Ok((disk, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_store_passes_openraft_s_suite_on_disk() {
    Suite::test_all(OnDisk).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_store_passes_openraft_s_suite_on_the_fake_disk() {
    Suite::test_all(OnMemDisk).await.unwrap();
}
