//! `leasemqd`'s limits on the resources the alarms watch (`alarms.rs`), as its flags give
//! them, and the tasks that watch them: the process's memory (`memory.rs`) and the data
//! dir's free disk space (`disk.rs`).

use std::path::Path;

use crate::disk::{self, DiskLimit};
use crate::memory::{self, Watermark};
use crate::settings::Settings;

/// The limits the alarms hold the server to, as `leasemqd`'s flags give them.
#[derive(clap::Args, Debug, Clone)]
pub struct Limits {
    /// Memory limit (RabbitMQ's `vm_memory_high_watermark`): while the server's resident
    /// memory is at or over it, connections that publish are blocked (and told so with
    /// `connection.blocked`) and consumers go on. A share of the machine's memory (or of
    /// its cgroup's limit) written with a decimal point, or a size: `512MiB`, `2GB`. `0`
    /// blocks every publish.
    #[arg(long, value_name = "LIMIT", default_value = "0.4", value_parser = memory::parse_watermark)]
    pub memory_high_watermark: Watermark,
    /// Free disk space limit (RabbitMQ's `disk_free_limit`): while the file system of
    /// --data-dir has less free space than this, connections that publish are blocked as
    /// by the memory limit. A size (`50MB`, `2GiB`), or a multiple of the machine's memory
    /// written with a decimal point (`1.5`).
    #[arg(long, value_name = "LIMIT", default_value = "50MB", value_parser = disk::parse_limit)]
    pub disk_free_limit: DiskLimit,
}

/// Starts the tasks that watch the resources of `limits` for `settings`' alarms, on the
/// runtime this is called in: memory always, the disk where there is a data dir (`dir`).
/// The ready line's words for them.
pub fn start(limits: &Limits, dir: Option<&Path>, settings: &Settings) -> String {
    let (alarms, metrics) = (&settings.alarms, &settings.metrics);
    let memory = match limits.memory_high_watermark.bytes() {
        Some(limit) => {
            let watch = memory::watch(alarms.clone(), metrics.clone(), limit);
            tokio::spawn(watch);
            format!("memory limit {} MiB", limit >> 20)
        }
        None => "no memory limit (the machine's memory cannot be read)".to_string(),
    };
    let disk = match (dir, limits.disk_free_limit.bytes()) {
        (Some(dir), Some(limit)) => {
            let watch = disk::watch(alarms.clone(), metrics.clone(), dir.to_path_buf(), limit);
            tokio::spawn(watch);
            format!("free disk limit {} MiB", limit >> 20)
        }
        (Some(_), None) => "no free disk limit (the machine's memory cannot be read)".into(),
        (None, _) => "no free disk limit (no --data-dir)".into(),
    };
    format!("{memory}, {disk}")
}
