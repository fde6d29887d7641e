//! CPU time: this process from `getrusage(RUSAGE_SELF)`, the broker servers from
//! `/proc/<pid>/stat` (utime + stime, in clock ticks).

use std::fs;

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

fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_cpu_ticks(&stat)? as f64 / clock_ticks_per_s())
}

/// utime + stime, in clock ticks, from a `/proc/<pid>/stat` line. The command name (field
/// 2) may hold spaces and parentheses: fields are counted after its last ')'.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, so 11 and 12 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(ticks > 0, "sysconf(_SC_CLK_TCK) failed");
    ticks as f64
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_after_the_command_name() {
        let stat = "77 (redis (x) y) S 1 77 77 0 -1 4194304 900 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(stat_cpu_ticks(stat), Some(325));
        assert_eq!(stat_cpu_ticks("77 (cut short) S 1 2"), None);
        assert!(process_cpu_s(std::process::id()).is_some());
    }
}
