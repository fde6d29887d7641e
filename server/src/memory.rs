//! The memory alarm, as RabbitMQ's `vm_memory_high_watermark`: while the server's resident
//! memory is at or over its limit, publishing connections are blocked (`alarms.rs`). One
//! task per server ([`watch`]) reads the process's resident memory every [`CHECK_EVERY`] and
//! raises or clears the alarm. A limit of 0 blocks every publish, as RabbitMQ's watermark of
//! 0 does.

use std::sync::Arc;
use std::time::Duration;

use crate::alarms::{Alarms, Resource};
use crate::metrics::Metrics;

/// How often [`watch`] reads the process's memory (RabbitMQ: every 2.5 s).
pub const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The limit's share of the machine's memory when none is given (RabbitMQ's default
/// relative watermark).
pub const DEFAULT_SHARE: f64 = 0.4;

/// Keeps the server's memory alarm raised while the process's resident memory is at or
/// over `limit` bytes, reading it every [`CHECK_EVERY`] (and showing it in the metrics);
/// runs until dropped. Where the memory cannot be read (no `/proc`), only a limit of 0
/// raises it.
pub async fn watch(alarms: Arc<Alarms>, metrics: Arc<Metrics>, limit: u64) {
    metrics
        .memory_limit
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
    loop {
        let used = resident_bytes();
        if let Some(used) = used {
            metrics
                .resident_memory
                .set(i64::try_from(used).unwrap_or(i64::MAX));
        }
        let over = limit == 0 || used.is_some_and(|used| used >= limit);
        if alarms.set(Resource::Memory, over) {
            if over {
                tracing::warn!(
                    "memory alarm: resident memory at or over the limit of {limit} bytes; \
                     publishing connections are blocked"
                );
            } else {
                tracing::info!("memory alarm cleared: publishing connections go on");
            }
        }
        metrics.memory_alarm.set(i64::from(over));
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// The process's resident memory (`VmRSS` in `/proc/self/status`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmRSS:")
}

/// The machine's memory: `MemTotal` of `/proc/meminfo`, or the cgroup's `memory.max`
/// where that is lower (a container's limit), in bytes.
pub fn machine_bytes() -> Option<u64> {
    let total = kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:")?;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// The value of a `NAME: N kB` line of a `/proc` file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Reads a `--memory-high-watermark` value: a share of the machine's memory written with
/// a decimal point (`0.4`, as RabbitMQ's relative watermark), or a size in bytes with an
/// optional unit (`512MiB`, `2GB`, `1073741824`, as its absolute one). `0` blocks every
/// publish.
///
/// # Errors
///
/// A value that is neither, or a share over 1.
pub fn parse_watermark(text: &str) -> Result<Watermark, String> {
    let text = text.trim();
    if text.contains('.') {
        let share: f64 = text
            .parse()
            .map_err(|_| format!("{text:?} is neither a share such as 0.4 nor a size"))?;
        if !(0.0..=1.0).contains(&share) {
            return Err(format!("a share of memory must be from 0 to 1, got {text}"));
        }
        return Ok(Watermark::Share(share));
    }
    parse_size(text).map(Watermark::Bytes)
}

/// Reads a size in bytes with an optional unit, as RabbitMQ writes its absolute limits:
/// `1073741824`, `512MiB`, `2GB` (B, kB/KB, MB, GB, KiB, MiB, GiB).
///
/// # Errors
///
/// Anything else, or a size that does not fit in 64 bits.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| {
        format!("{text:?} is neither a fraction such as 0.4 nor a size such as 512MiB")
    })?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} (B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text} is too large"))
}

/// A memory limit as given: a share of the machine's memory, or bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Watermark {
    /// A share of the machine's memory, from 0 to 1.
    Share(f64),
    /// A number of bytes.
    Bytes(u64),
}

impl Watermark {
    /// The limit in bytes; a share of a machine whose memory cannot be read is no limit.
    pub fn bytes(self) -> Option<u64> {
        match self {
            Watermark::Bytes(b) => Some(b),
            Watermark::Share(share) => machine_bytes().map(|m| (m as f64 * share) as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_read_as_rabbitmq_writes_them() {
        assert_eq!(parse_watermark("0.4"), Ok(Watermark::Share(0.4)));
        assert_eq!(parse_watermark("0"), Ok(Watermark::Bytes(0)));
        assert_eq!(parse_watermark("1073741824"), Ok(Watermark::Bytes(1 << 30)));
        assert_eq!(parse_watermark("512MiB"), Ok(Watermark::Bytes(512 << 20)));
        assert_eq!(parse_watermark("2GB"), Ok(Watermark::Bytes(2_000_000_000)));
        assert!(parse_watermark("1.5").is_err());
        assert!(parse_watermark("12 parsecs").is_err());
        assert!(parse_watermark("lots").is_err());
        assert!(parse_watermark("99999999999999GiB").is_err());
    }

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let status = "Name:\tleasemqd\nVmRSS:\t   2048 kB\nThreads:\t4\n";
        assert_eq!(kib_field(status, "VmRSS:"), Some(2 * 1024 * 1024));
        assert_eq!(kib_field(status, "VmSwap:"), None);
        if cfg!(target_os = "linux") {
            let rss = resident_bytes().expect("linux has /proc/self/status");
            let machine = machine_bytes().expect("linux has /proc/meminfo");
            assert!(0 < rss && rss < machine, "{rss} of {machine}");
        }
    }
}
