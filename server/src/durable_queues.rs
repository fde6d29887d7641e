//! What a durable queue was declared with beyond its broker config, kept across restarts.
//!
//! The broker keeps a durable queue's [`leasemq::QueueConfig`] and messages in its data
//! dir. What else RabbitMQ keeps of a durable queue, the server holds: its `auto_delete`
//! flag, `x-queue-type`, `x-expires`, `x-message-ttl`, `x-queue-mode`, `x-queue-version`,
//! the locators (`x-queue-master-locator`, `x-queue-leader-locator`),
//! `x-single-active-consumer`, `x-max-priority` (which the broker's config keeps too) and
//! where its dead letters go (`x-dead-letter-exchange`, `x-dead-letter-routing-key`).
//! With a data dir, those of every durable queue are kept in [`FILE`] there, written (to a
//! temporary file, fsynced, renamed over the old one, the directory fsynced) each time a
//! durable queue is declared anew or deleted, before the declare is answered. A restart
//! reads the file back ([`VHost::restore`](crate::vhost::VHost::restore)) for the queues
//! the broker brought back, so that each is as it was declared before any client
//! declares it again: a redeclare is checked against it, its
//! dead letters go on through their exchange, its messages expire, and it expires itself.
//!
//! A crash between a durable queue's declare and the write of the file brings the queue
//! back without these, as before a build kept them: they come back with its next declare.
//! So does a write that fails, which is logged: the declare is answered all the same.
//! An entry whose queue did not come back (a crash between its delete and the write) is
//! dropped at the start.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::arguments::StorageHints;
use crate::dead_letter::Route;
use crate::declared::Declared;
use crate::exchange::write_atomically;
use crate::names;

/// The file, in the data dir, that keeps what durable queues were declared with.
pub const FILE: &str = "leasemqd-queues.json";

/// The version of [`Stored`] this build writes and reads.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    version: u32,
    queues: Vec<StoredQueue>,
}

/// One durable queue's declared flags and arguments, by its broker name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StoredQueue {
    name: String,
    auto_delete: bool,
    quorum: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_ttl: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dead_letter_exchange: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dead_letter_routing_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queue_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queue_version: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queue_master_locator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queue_leader_locator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    single_active_consumer: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_priority: Option<u8>,
    /// Every argument of the declare, as the management API shows them (absent in files
    /// of earlier builds).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    arguments: serde_json::Map<String, serde_json::Value>,
}

impl StoredQueue {
    fn of(name: &str, d: &Declared) -> StoredQueue {
        StoredQueue {
            name: name.to_string(),
            auto_delete: d.auto_delete,
            quorum: d.quorum,
            expires: d.expires,
            message_ttl: d.message_ttl,
            dead_letter_exchange: d.dead_letter.as_ref().map(|r| r.exchange.clone()),
            dead_letter_routing_key: d.dead_letter.as_ref().and_then(|r| r.routing_key.clone()),
            queue_mode: d.hints.mode.clone(),
            queue_version: d.hints.version,
            queue_master_locator: d.hints.master_locator.clone(),
            queue_leader_locator: d.hints.leader_locator.clone(),
            single_active_consumer: d.single_active,
            max_priority: d.max_priority,
            arguments: (*d.arguments).clone(),
        }
    }

    fn declared(&self) -> Declared {
        Declared {
            durable: true,
            exclusive: false,
            auto_delete: self.auto_delete,
            quorum: self.quorum,
            expires: self.expires,
            dead_letter: self.dead_letter_exchange.as_ref().map(|exchange| Route {
                exchange: exchange.clone(),
                routing_key: self.dead_letter_routing_key.clone(),
            }),
            message_ttl: self.message_ttl,
            hints: StorageHints {
                mode: self.queue_mode.clone(),
                version: self.queue_version,
                master_locator: self.queue_master_locator.clone(),
                leader_locator: self.queue_leader_locator.clone(),
            },
            single_active: self.single_active_consumer,
            max_priority: self.max_priority,
            arguments: std::sync::Arc::new(self.arguments.clone()),
        }
    }
}

/// Where the durable queues' declarations are kept.
#[derive(Debug)]
pub struct QueueFile {
    file: PathBuf,
    /// Numbers the snapshots ([`QueueFile::snapshot`]) in the order of the changes they
    /// follow.
    taken: AtomicU64,
    /// The number of the last snapshot written; held while one is written.
    written: Mutex<u64>,
}

/// The durable queues' declarations at one change, to be written by [`QueueFile::write`].
pub(crate) struct Snapshot {
    number: u64,
    text: String,
}

impl QueueFile {
    fn new(file: PathBuf) -> QueueFile {
        QueueFile {
            file,
            taken: AtomicU64::new(0),
            written: Mutex::new(0),
        }
    }

    /// The declarations of the durable queues among `declared` (the server's table of
    /// every queue's, by broker name), in name order. Taken under the table's lock, so that
    /// snapshots are numbered in the order of its changes.
    pub(crate) fn snapshot(&self, declared: &HashMap<String, Declared>) -> Snapshot {
        let mut queues: Vec<StoredQueue> = (declared.iter())
            .filter(|(_, d)| d.durable)
            .map(|(name, d)| StoredQueue::of(name, d))
            .collect();
        queues.sort_by(|a, b| a.name.cmp(&b.name));
        let stored = Stored {
            version: VERSION,
            queues,
        };
        Snapshot {
            number: self.taken.fetch_add(1, Ordering::Relaxed) + 1,
            text: serde_json::to_string_pretty(&stored).expect("plain data serialises"),
        }
    }

    /// Writes `snapshot`, unless a later one was written already (it holds this one's
    /// change too). Apart from the table's lock: a write, with its fsyncs, holds up no
    /// other use of the table.
    ///
    /// # Errors
    ///
    /// The write failed, with the file named; the file before it is still in place
    /// unless only the directory's fsync failed.
    pub(crate) fn write(&self, snapshot: Snapshot) -> Result<(), String> {
        // Nothing panics while holding the lock; take the number as it is if it did.
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if snapshot.number <= *written {
            return Ok(());
        }
        write_atomically(&self.file, snapshot.text.as_bytes())
            .map_err(|(e, _)| format!("cannot write {}: {e}", self.file.display()))?;
        *written = snapshot.number;
        Ok(())
    }

    fn save(&self, declared: &HashMap<String, Declared>) -> Result<(), String> {
        self.write(self.snapshot(declared))
    }
}

/// The declarations kept in `dir` of the queues `queue_exists` says came back, and the
/// file that keeps later ones (rewritten at once if it named a queue that did not).
///
/// # Errors
///
/// A file that cannot be read, parsed or rewritten, named in the message: the server must
/// not start and treat its queues otherwise than they were declared.
pub(crate) fn open(
    dir: &Path,
    queue_exists: impl Fn(&str) -> bool,
) -> Result<(QueueFile, HashMap<String, Declared>), String> {
    let file = QueueFile::new(dir.join(FILE));
    let text = match fs::read_to_string(&file.file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((file, HashMap::new())),
        Err(e) => return Err(format!("cannot read {}: {e}", file.file.display())),
    };
    let stored: Stored = serde_json::from_str(&text)
        .map_err(|e| format!("{} is damaged: {e}", file.file.display()))?;
    if stored.version != VERSION {
        return Err(format!(
            "{} has version {}; this leasemqd reads version {VERSION}",
            file.file.display(),
            stored.version
        ));
    }
    // A value no declare could give, which the server would act on: an `x-expires` of 0
    // would delete the queue, its messages with it, as the server starts.
    for q in &stored.queues {
        if q.expires == Some(0) {
            let (shown, file) = (names::amqp(&q.name), file.file.display());
            return Err(format!(
                "{file} is damaged: queue '{shown}' has x-expires 0 (a declare takes 1 ms and more)"
            ));
        }
    }
    let total = stored.queues.len();
    let kept: HashMap<String, Declared> = (stored.queues.iter())
        .filter(|q| queue_exists(&q.name))
        .map(|q| (q.name.clone(), q.declared()))
        .collect();
    if kept.len() < total {
        file.save(&kept)?;
    }
    Ok((file, kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(ttl: Option<u64>, route: Option<Route>) -> Declared {
        Declared {
            durable: true,
            exclusive: false,
            auto_delete: false,
            quorum: true,
            expires: Some(60_000),
            dead_letter: route,
            message_ttl: ttl,
            hints: StorageHints {
                mode: Some("lazy".into()),
                version: Some(2),
                master_locator: None,
                leader_locator: Some("balanced".into()),
            },
            single_active: Some(true),
            max_priority: Some(9),
            arguments: std::sync::Arc::new(
                serde_json::json!({"x-max-priority": 9, "x-queue-type": "quorum"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        }
    }

    #[test]
    fn the_file_keeps_durable_queues_only_and_drops_those_that_did_not_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let (file, none) = open(dir.path(), |_| true).unwrap();
        assert!(none.is_empty(), "no file yet");
        let route = Route {
            exchange: "dlx".into(),
            routing_key: Some("failed".into()),
        };
        let mut table = HashMap::new();
        table.insert("jobs".to_string(), declared(Some(500), Some(route)));
        table.insert("gone".to_string(), declared(None, None));
        let in_memory = Declared {
            durable: false,
            ..declared(None, None)
        };
        table.insert("scratch".to_string(), in_memory);
        file.save(&table).unwrap();
        let (_, back) = open(dir.path(), |name| name != "gone").unwrap();
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(back["jobs"], table["jobs"]);
        // The queue that did not come back is out of the file for good.
        let (_, again) = open(dir.path(), |_| true).unwrap();
        assert_eq!(again.keys().collect::<Vec<_>>(), ["jobs"]);
    }

    #[test]
    fn a_damaged_or_newer_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), "{ not json").unwrap();
        assert!(open(dir.path(), |_| true).unwrap_err().contains("damaged"));
        let newer = r#"{"version": 2, "queues": []}"#;
        fs::write(dir.path().join(FILE), newer).unwrap();
        assert!(open(dir.path(), |_| true)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn an_expiry_no_declare_could_give_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"version": 1, "queues": [
            {"name": "jobs", "auto_delete": false, "quorum": false, "expires": 0}
        ]}"#;
        fs::write(dir.path().join(FILE), text).unwrap();
        let refused = open(dir.path(), |_| true).unwrap_err();
        let said = "is damaged: queue 'jobs' has x-expires 0";
        assert!(refused.contains(said), "{refused}");
    }

    #[test]
    fn a_file_from_before_an_argument_was_kept_reads_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let older = r#"{"version": 1, "queues": [
            {"name": "jobs", "auto_delete": false, "quorum": false, "message_ttl": 500}
        ]}"#;
        fs::write(dir.path().join(FILE), older).unwrap();
        let (_, back) = open(dir.path(), |_| true).unwrap();
        let jobs = &back["jobs"];
        assert_eq!(jobs.message_ttl, Some(500));
        assert_eq!((jobs.max_priority, jobs.single_active), (None, None));
        assert_eq!(jobs.hints, StorageHints::default());
    }
}
