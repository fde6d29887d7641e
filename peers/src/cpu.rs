//! CPU time: this process from `getrusage(RUSAGE_SELF)`, the broker servers from
//! `/proc/<pid>/stat` (utime + stime), read by the loadgen's own reader.

use std::fs;

// The same file as `leasemq-loadgen`'s `cpu` module. The loadgen is a binary crate with
// plotting and progress-bar dependencies, so this takes its one dependency-free file
// rather than the whole crate.
#[path = "../../loadgen/src/cpu.rs"]
mod proc_stat;

use proc_stat::CpuTime;

#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    /// User + system seconds of this process, all threads.
    pub own_s: f64,
    /// User + system seconds of the server processes, summed.
    pub servers_s: f64,
}

pub fn sample(server_pids: &[u32]) -> CpuSample {
    CpuSample {
        own_s: own_cpu_s(),
        servers_s: server_pids
            .iter()
            .filter_map(|&pid| process_cpu_s(pid))
            .sum(),
    }
}

fn own_cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass; all-zero is a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// User + system seconds of process `pid`; `None` once it has gone.
fn process_cpu_s(pid: u32) -> Option<f64> {
    let cpu = CpuTime::of_process(pid)?;
    Some(cpu.user_s + cpu.sys_s)
}

/// Pids of every process whose command name (`/proc/<pid>/comm`) is `comm`.
pub fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|name| name.trim() == comm)
        })
        .collect()
}
