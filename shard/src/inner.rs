//! What every handle of one broker shares: the shards' inboxes, the shutdown flag, the
//! manual clock's time, and the data dir held while the shards run. A `Broker`, a `Queue`
//! and a `Consumer` each hold it; the shards stop when the last of them is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::cluster::ClusterInner;
use crate::protocol::{Inbox, Request};
use crate::store::DataDir;

/// The state behind every handle of one broker.
pub(crate) struct BrokerInner {
    pub shards: Vec<Inbox>,
    pub manual: bool,
    pub manual_nanos: AtomicU64,
    shut_down: AtomicBool,
    /// Taken once, by the shutdown that joins them; never touched on the message path.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the broker has a data dir, so durable queues can be declared.
    pub durable: bool,
    /// The data dir's lock, let go once the shards have stopped.
    data_dir: Mutex<Option<DataDir>>,
    /// The dead-letter queue of each live durable queue that has one, by the durable
    /// queue's name: such a queue may not be declared again without `durable`, or the
    /// dead letters it takes would not survive a crash.
    pub durable_dead_letters: Mutex<HashMap<String, String>>,
    /// What each shard's log owes the disk, read by `Broker::log_lag`.
    pub logs: Vec<leasemq_wal::Probe>,
    /// The node, when the broker is one of a cluster's.
    pub cluster: Option<Arc<ClusterInner>>,
}

impl BrokerInner {
    /// A running broker's shared state: its shards' inboxes and threads, and the data dir
    /// it holds, if any.
    pub fn new(
        shards: Vec<Inbox>,
        manual: bool,
        threads: Vec<JoinHandle<()>>,
        data_dir: Option<DataDir>,
        logs: Vec<leasemq_wal::Probe>,
        cluster: Option<Arc<ClusterInner>>,
    ) -> BrokerInner {
        BrokerInner {
            shards,
            manual,
            manual_nanos: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
            threads: Mutex::new(threads),
            durable: data_dir.is_some(),
            data_dir: Mutex::new(data_dir),
            durable_dead_letters: Mutex::default(),
            logs,
            cluster,
        }
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub fn inbox(&self, shard: usize) -> &Inbox {
        &self.shards[shard]
    }

    /// Stops every shard thread and waits for it; lets go of the data dir after.
    pub fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads.is_empty() {
            return;
        }
        for inbox in &self.shards {
            let _ = inbox.send(Request::Shutdown);
        }
        for thread in threads.drain(..) {
            let _ = thread.join();
        }
        // The node's groups stop once no shard thread proposes to them.
        if let Some(cluster) = &self.cluster {
            cluster.shutdown();
        }
        // Every shard has synced and closed its log: another broker may open the dir.
        drop(
            self.data_dir
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
