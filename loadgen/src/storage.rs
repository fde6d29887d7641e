//! Durable runs (`--durable`, `--data-dir`, `--sync`): where the broker keeps its data dir,
//! and how the run reports it.
//!
//! A run with a data dir has a *base* directory: the `--data-dir` given, which is left in
//! place, or a fresh temporary directory, removed at the end of the run. Each step (the one
//! of `throughput`, every one of a sweep) builds its broker on a fresh, empty directory made
//! inside the base and removed when the step ends, so no step replays what an earlier one
//! logged, and a sweep can change its shard count (a data dir keeps the count it was made
//! with).

use std::fs;
use std::path::{Path, PathBuf};

use leasemq::{Broker, SyncPolicy};
use serde_json::json;
use tempfile::TempDir;

use crate::cli::{sync_text, StorageArgs};
use crate::common::broker_error;

/// Filesystems whose fsync does not wait for a disk.
const MEMORY_FILESYSTEMS: [&str; 2] = ["tmpfs", "ramfs"];

/// The base directory of a run's data dirs.
enum Base {
    /// A fresh directory, removed when the run ends.
    Temporary(TempDir),
    /// `--data-dir`: left in place.
    Given(PathBuf),
}

impl Base {
    fn path(&self) -> &Path {
        match self {
            Base::Temporary(dir) => dir.path(),
            Base::Given(path) => path,
        }
    }
}

/// A run's storage settings, and its base directory when it has a data dir.
pub struct Storage {
    durable: bool,
    sync: SyncPolicy,
    base: Option<Base>,
    /// The filesystem the base lies on (`/proc/self/mounts`), when known.
    filesystem: Option<String>,
}

impl Storage {
    /// Makes the base directory, if the run has a data dir.
    pub fn new(args: &StorageArgs) -> Result<Storage, String> {
        let base = match (&args.data_dir, args.durable) {
            (Some(path), _) => {
                fs::create_dir_all(path)
                    .map_err(|e| format!("--data-dir {}: {e}", path.display()))?;
                Some(Base::Given(path.clone()))
            }
            (None, true) => Some(Base::Temporary(
                tempfile::Builder::new()
                    .prefix("leasemq-loadgen-")
                    .tempdir()
                    .map_err(|e| format!("making a temporary data dir: {e}"))?,
            )),
            (None, false) => None,
        };
        let filesystem = base.as_ref().and_then(|b| filesystem_of(b.path()));
        Ok(Storage {
            durable: args.durable,
            sync: args.sync_policy(),
            base,
            filesystem,
        })
    }

    /// A fresh, empty data dir for one step, named after `label`, inside the base; none
    /// without a data dir.
    pub fn for_step(&self, label: &str) -> Result<StepStorage, String> {
        let dir = match &self.base {
            Some(base) => Some(
                tempfile::Builder::new()
                    .prefix(&format!("{label}-"))
                    .tempdir_in(base.path())
                    .map_err(|e| format!("making a data dir in {}: {e}", base.path().display()))?,
            ),
            None => None,
        };
        Ok(StepStorage {
            durable: self.durable,
            sync: self.sync,
            dir,
        })
    }

    /// What the title says: `None` for in-memory queues on a broker without a data dir.
    pub fn text(&self) -> Option<String> {
        let base = self.base.as_ref()?;
        let place = match base {
            Base::Temporary(_) => "a temporary data dir".to_string(),
            Base::Given(path) => format!("a data dir in {}", path.display()),
        };
        let fs = self
            .filesystem
            .as_ref()
            .map_or(String::new(), |fs| format!(" on {fs}"));
        Some(if self.durable {
            format!(
                "durable queues (sync {}) in {place}{fs}",
                sync_text(self.sync)
            )
        } else {
            format!("in-memory queues on a broker with {place}{fs}")
        })
    }

    /// Adds `durable`, `sync` and `data_dir` to a run's `config`: `sync` and `data_dir` are
    /// null without a data dir.
    pub fn add_to(&self, config: &mut serde_json::Value) {
        config["durable"] = json!(self.durable);
        config["sync"] = json!(self.base.as_ref().map(|_| sync_text(self.sync)));
        config["data_dir"] = match &self.base {
            Some(base) => json!({
                "path": base.path().display().to_string(),
                "temporary": matches!(base, Base::Temporary(_)),
                "filesystem": self.filesystem,
            }),
            None => serde_json::Value::Null,
        };
    }

    /// A note when the data dir lies in memory, where an fsync waits for nothing.
    pub fn notes(&self) -> Vec<String> {
        match &self.filesystem {
            Some(fs) if self.durable && MEMORY_FILESYSTEMS.contains(&fs.as_str()) => vec![format!(
                "the data dir is on {fs}: its fsyncs wait for no disk, so the durable \
                 figures leave the disk out (give --data-dir on a disk, or set TMPDIR)"
            )],
            _ => Vec::new(),
        }
    }
}

/// One step's storage: its data dir, removed when this drops (after the broker's shutdown).
pub struct StepStorage {
    durable: bool,
    sync: SyncPolicy,
    dir: Option<TempDir>,
}

impl StepStorage {
    /// Whether the step declares its queues durable.
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// A broker with `shards` shard threads, on the step's data dir if it has one.
    pub fn broker(&self, shards: u32) -> Result<Broker, String> {
        let mut builder = crate::scheduling::broker(Broker::builder().shards(shards as usize));
        if let Some(dir) = &self.dir {
            builder = builder.data_dir(dir.path()).sync(self.sync);
        }
        builder
            .build()
            .map_err(|e| broker_error("starting the broker", e))
    }
}

/// The type of the filesystem `path` lies on: that of the longest mount point above it in
/// `/proc/self/mounts`.
pub fn filesystem_of(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_device, mount, kind) = (fields.next()?, fields.next()?, fields.next()?);
            Some((PathBuf::from(unescape_mount(mount)), kind))
        })
        .filter(|(mount, _)| path.starts_with(mount))
        // The longest wins; of equal ones the last, which is mounted over the others.
        .max_by_key(|(mount, _)| mount.as_os_str().len())
        .map(|(_, kind)| kind.to_string())
}

/// A field of `/proc/self/mounts`, which writes space, tab, newline and backslash as octal
/// escapes (`\040`).
fn unescape_mount(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_sync;

    fn args(durable: bool, data_dir: Option<&Path>, sync: Option<&str>) -> StorageArgs {
        StorageArgs {
            durable,
            data_dir: data_dir.map(Path::to_path_buf),
            sync: sync.map(|s| parse_sync(s).unwrap()),
        }
    }

    #[test]
    fn mount_points_unescape() {
        assert_eq!(unescape_mount("/mnt/my\\040disk"), "/mnt/my disk");
        assert_eq!(unescape_mount("/a\\134b"), "/a\\b");
        assert_eq!(unescape_mount("/plain"), "/plain");
        assert_eq!(unescape_mount("/odd\\9"), "/odd\\9");
    }

    #[test]
    fn the_root_has_a_filesystem() {
        assert!(filesystem_of(Path::new("/")).is_some());
        assert_eq!(filesystem_of(Path::new("/no/such/path/here")), None);
    }

    #[test]
    fn in_memory_runs_have_no_data_dir() {
        let storage = Storage::new(&args(false, None, None)).unwrap();
        assert_eq!(storage.text(), None);
        let mut config = json!({});
        storage.add_to(&mut config);
        assert_eq!(
            config,
            json!({"durable": false, "sync": null, "data_dir": null})
        );
        assert!(storage.for_step("throughput").unwrap().dir.is_none());
    }

    #[test]
    fn a_temporary_base_is_removed_with_the_run_and_steps_start_empty() {
        let storage = Storage::new(&args(true, None, Some("interval:10"))).unwrap();
        let base = storage.base.as_ref().unwrap().path().to_path_buf();
        let text = storage.text().unwrap();
        assert!(
            text.starts_with("durable queues (sync interval:10ms) in a temporary data dir"),
            "{text}"
        );
        let mut config = json!({});
        storage.add_to(&mut config);
        assert_eq!(config["durable"], true);
        assert_eq!(config["sync"], "interval:10ms");
        assert_eq!(config["data_dir"]["temporary"], true);
        let first = storage.for_step("step01").unwrap();
        let path = first.dir.as_ref().unwrap().path().to_path_buf();
        fs::write(path.join("leftover"), b"x").unwrap();
        let second = storage.for_step("step01").unwrap();
        let second_path = second.dir.as_ref().unwrap().path();
        assert_ne!(second_path, path);
        assert_eq!(fs::read_dir(second_path).unwrap().count(), 0);
        drop(first);
        assert!(!path.exists(), "a step's data dir outlived it");
        drop((second, storage));
        assert!(!base.exists(), "the temporary base outlived the run");
    }

    #[test]
    fn a_given_data_dir_is_left_in_place() {
        let given = tempfile::tempdir().unwrap();
        let storage = Storage::new(&args(false, Some(given.path()), None)).unwrap();
        let text = storage.text().unwrap();
        assert!(
            text.starts_with("in-memory queues on a broker with a data dir in"),
            "{text}"
        );
        let mut config = json!({});
        storage.add_to(&mut config);
        assert_eq!(config["durable"], false);
        assert_eq!(config["sync"], "always");
        assert_eq!(config["data_dir"]["temporary"], false);
        let step = storage.for_step("throughput").unwrap();
        assert!(step.dir.as_ref().unwrap().path().starts_with(given.path()));
        drop((step, storage));
        assert!(given.path().exists());
        assert_eq!(fs::read_dir(given.path()).unwrap().count(), 0);
    }
}
