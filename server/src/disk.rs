//! The free-disk alarm, as RabbitMQ's `disk_free_limit`: while the file system that holds
//! the data dir has less free space than the limit, publishing connections are blocked
//! (`alarms.rs`), so that durable queues stop growing before their logs meet a full disk.
//! One task per server ([`watch`]) reads the free space every [`CHECK_EVERY`]: the blocks
//! an unprivileged process may still use (`statvfs`'s `f_bavail`), as RabbitMQ reads it.
//! Without a data dir nothing is written to disk and there is no disk alarm.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::alarms::{Alarms, Resource};
use crate::memory;
use crate::metrics::Metrics;

/// How often [`watch`] reads the free space.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A free-disk limit as given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskLimit {
    /// A number of bytes (RabbitMQ's `disk_free_limit.absolute`; its default is 50MB).
    Bytes(u64),
    /// A multiple of the machine's memory (RabbitMQ's `disk_free_limit.relative`).
    MemoryMultiple(f64),
}

impl DiskLimit {
    /// The limit in bytes; a multiple of a machine whose memory cannot be read is no
    /// limit.
    pub fn bytes(self) -> Option<u64> {
        match self {
            DiskLimit::Bytes(b) => Some(b),
            DiskLimit::MemoryMultiple(m) => memory::machine_bytes().map(|b| (b as f64 * m) as u64),
        }
    }
}

/// Reads a `--disk-free-limit` value: a size (`50MB`, `2GiB`, `1000000000`), or a multiple
/// of the machine's memory written with a decimal point (`1.5`).
///
/// # Errors
///
/// A value that is neither, or a negative multiple.
pub fn parse_limit(text: &str) -> Result<DiskLimit, String> {
    let text = text.trim();
    if text.contains('.') {
        let multiple: f64 = text
            .parse()
            .map_err(|_| format!("{text:?} is neither a multiple such as 1.5 nor a size"))?;
        if !(multiple.is_finite() && multiple >= 0.0) {
            return Err(format!(
                "a multiple of memory must be 0 or more, got {text}"
            ));
        }
        return Ok(DiskLimit::MemoryMultiple(multiple));
    }
    memory::parse_size(text).map(DiskLimit::Bytes)
}

/// The free space of the file system holding `path`, in bytes: what an unprivileged
/// process may still write there.
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(path).ok()?;
    stat.f_bavail.checked_mul(stat.f_frsize)
}

/// Keeps the server's disk alarm raised while the file system holding `dir` has under
/// `limit` bytes free, reading it every [`CHECK_EVERY`] (and showing it in the metrics);
/// runs until dropped. Where the free space cannot be read, the alarm is not raised.
pub async fn watch(alarms: Arc<Alarms>, metrics: Arc<Metrics>, dir: PathBuf, limit: u64) {
    metrics
        .disk_free_limit
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
    loop {
        let free = free_bytes(&dir);
        if let Some(free) = free {
            metrics
                .disk_free
                .set(i64::try_from(free).unwrap_or(i64::MAX));
        }
        let low = free.is_some_and(|free| free < limit);
        if alarms.set(Resource::Disk, low) {
            if low {
                tracing::warn!(
                    "disk alarm: under {limit} bytes free on the file system of {}; \
                     publishing connections are blocked",
                    dir.display()
                );
            } else {
                tracing::info!("disk alarm cleared: publishing connections go on");
            }
        }
        metrics.disk_alarm.set(i64::from(low));
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_rabbitmq_writes_them() {
        assert_eq!(parse_limit("50MB"), Ok(DiskLimit::Bytes(50_000_000)));
        assert_eq!(parse_limit("2GiB"), Ok(DiskLimit::Bytes(2 << 30)));
        assert_eq!(parse_limit("0"), Ok(DiskLimit::Bytes(0)));
        assert_eq!(parse_limit("1.5"), Ok(DiskLimit::MemoryMultiple(1.5)));
        assert!(parse_limit("-1.0").is_err());
        assert!(parse_limit("lots").is_err());
        assert!(parse_limit("5 furlongs").is_err());
    }

    #[test]
    fn the_free_space_of_a_real_directory_is_read() {
        let dir = std::env::temp_dir();
        let free = free_bytes(&dir).expect("statvfs of the temp dir");
        assert!(free > 0, "{free}");
        assert_eq!(free_bytes(std::path::Path::new("/no/such/dir/here")), None);
    }
}
