//! openraft's state machine: what was applied, the membership, the snapshots; the
//! shard's state itself behind an [`Applier`].
//!
//! A snapshot is a file in the group's `state` directory, written atomically as the log
//! writes its snapshots, named for the lsn of the last entry it covers (its index + 1;
//! 0 for a snapshot of nothing): the snapshot's metadata (JSON, after its length)
//! and the applier's image. The newest is the current one; the older ones go once it is
//! durable. Taking an image and applying entries take turns, so an image always matches
//! the log id it is filed under.

use std::future::Future;
use std::io;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::TryStreamExt;
use leasemq_wal::{Lsn, Storage};
use openraft::alias::SnapshotOf;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::Mutex;

use crate::{
    invalid, io as wal_io, Batch, GroupDir, LogId, ShardRaft, SnapshotMeta, StoredMembership,
};

/// A committed batch, with the log id it was committed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The entry's log id: the leader that proposed it (term, node) and its index.
    pub log_id: LogId,
    /// The batch.
    pub batch: Batch,
}

/// The shard's state, as the state machine sees it.
pub trait Applier: Send + Sync + 'static {
    /// Applies committed batches, in log order (entries without a batch, blank or
    /// membership, are not passed on). Done when the future is.
    fn apply(&self, batches: Vec<Applied>) -> impl Future<Output = io::Result<()>> + Send;

    /// The state after every batch applied so far, as bytes [`install`](Applier::install)
    /// takes back.
    fn image(&self) -> impl Future<Output = io::Result<Vec<u8>>> + Send;

    /// Replaces the state with an image: this node's newest snapshot at a start, or one
    /// its leader sent.
    fn install(&self, image: Vec<u8>) -> impl Future<Output = io::Result<()>> + Send;
}

/// A shard's Raft state machine over an [`Applier`].
pub struct StateMachine<A> {
    shared: Arc<Shared<A>>,
}

/// Builds a snapshot of a [`StateMachine`]'s applier.
pub struct SnapshotBuilder<A> {
    shared: Arc<Shared<A>>,
}

struct Shared<A> {
    applier: A,
    /// The size of the newest snapshot's image.
    snapshot_bytes: Arc<AtomicU64>,
    storage: Arc<dyn Storage>,
    dir: std::path::PathBuf,
    state: Mutex<Applying>,
}

struct Applying {
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl<A: Applier> StateMachine<A> {
    /// Opens the state machine of the group in `group`: the newest snapshot there, if
    /// any, is installed into `applier`, and applying goes on after it.
    ///
    /// # Errors
    ///
    /// The disk's error, a snapshot that does not decode, or the applier's refusal of
    /// the image.
    pub async fn open(group: &GroupDir, applier: A) -> io::Result<StateMachine<A>> {
        let (storage, dir) = (Arc::clone(&group.storage), group.state());
        leasemq_wal::create_dir_durable(&*storage, &dir)?;
        let mut applying = Applying {
            applied: None,
            membership: StoredMembership::default(),
        };
        let snapshot_bytes = Arc::new(AtomicU64::new(0));
        if let Some((meta, image)) = read_snapshot(&*storage, &dir)? {
            snapshot_bytes.store(image.len() as u64, Ordering::Relaxed);
            applier.install(image).await?;
            applying.applied = meta.last_log_id;
            applying.membership = meta.last_membership;
        }
        let shared = Arc::new(Shared {
            applier,
            snapshot_bytes,
            storage,
            dir,
            state: Mutex::new(applying),
        });
        Ok(StateMachine { shared })
    }

    /// The size of the newest snapshot's image, read from any thread.
    pub fn snapshot_bytes(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shared.snapshot_bytes)
    }
}

impl<A: Applier> RaftStateMachine<ShardRaft> for StateMachine<A> {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = SnapshotBuilder<A>;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let state = self.shared.state.lock().await;
        Ok((state.applied, state.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: futures_util::Stream<Item = io::Result<EntryResponder<ShardRaft>>>
            + Unpin
            + OptionalSend,
    {
        let mut state = self.shared.state.lock().await;
        let mut batches = Vec::new();
        let mut responders = Vec::new();
        let mut last = state.applied;
        let mut membership = None;
        while let Some((entry, responder)) = entries.try_next().await? {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => batches.push(Applied {
                    log_id: entry.log_id,
                    batch,
                }),
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), m));
                }
            }
            last = Some(entry.log_id);
            responders.extend(responder);
        }
        if !batches.is_empty() {
            self.shared.applier.apply(batches).await?;
        }
        state.applied = last;
        if let Some(membership) = membership {
            state.membership = membership;
        }
        for responder in responders {
            responder.send(());
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder<A> {
        SnapshotBuilder {
            shared: Arc::clone(&self.shared),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let mut state = self.shared.state.lock().await;
        let image = snapshot.into_inner();
        write_snapshot(&*self.shared.storage, &self.shared.dir, meta, &image)?;
        let size = image.len() as u64;
        self.shared.applier.install(image).await?;
        self.shared.snapshot_bytes.store(size, Ordering::Relaxed);
        state.applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<ShardRaft, Cursor<Vec<u8>>>>> {
        let snapshot = read_snapshot(&*self.shared.storage, &self.shared.dir)?;
        Ok(snapshot.map(|(meta, image)| SnapshotOf::<ShardRaft, _> {
            meta,
            snapshot: Cursor::new(image),
        }))
    }
}

impl<A: Applier> RaftSnapshotBuilder<ShardRaft> for SnapshotBuilder<A> {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<ShardRaft, Cursor<Vec<u8>>>> {
        // Held while the image is taken: no entry is applied meanwhile, so the image is
        // the state as of `applied`.
        let state = self.shared.state.lock().await;
        let image = self.shared.applier.image().await?;
        let meta = SnapshotMeta {
            last_log_id: state.applied,
            last_membership: state.membership.clone(),
        };
        write_snapshot(&*self.shared.storage, &self.shared.dir, &meta, &image)?;
        let size = image.len() as u64;
        self.shared.snapshot_bytes.store(size, Ordering::Relaxed);
        Ok(SnapshotOf::<ShardRaft, _> {
            meta,
            snapshot: Cursor::new(image),
        })
    }
}

/// Writes a snapshot durably; the older ones go.
fn write_snapshot(
    storage: &dyn Storage,
    dir: &std::path::Path,
    meta: &SnapshotMeta,
    image: &[u8],
) -> io::Result<()> {
    let meta_bytes = serde_json::to_vec(meta).map_err(io::Error::other)?;
    let mut data = Vec::with_capacity(4 + meta_bytes.len() + image.len());
    data.extend_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
    data.extend_from_slice(&meta_bytes);
    data.extend_from_slice(image);
    let lsn = Lsn(meta.last_log_id.map_or(0, |id| id.index + 1));
    leasemq_wal::write_snapshot(storage, dir, lsn, &data).map_err(wal_io)?;
    Ok(())
}

/// The newest snapshot in `dir`: its metadata and the image.
fn read_snapshot(
    storage: &dyn Storage,
    dir: &std::path::Path,
) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
    let Some(file) = leasemq_wal::latest_snapshot(storage, dir).map_err(wal_io)? else {
        return Ok(None);
    };
    let mut data = file.data;
    let Some(len) = data.get(..4) else {
        return Err(invalid(format!("{}: no metadata", file.path.display())));
    };
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    let Some(meta_bytes) = data.get(4..4 + len) else {
        return Err(invalid(format!(
            "{}: metadata cut short",
            file.path.display()
        )));
    };
    let meta: SnapshotMeta = serde_json::from_slice(meta_bytes)
        .map_err(|e| invalid(format!("{}: metadata: {e}", file.path.display())))?;
    data.drain(..4 + len);
    Ok(Some((meta, data)))
}
