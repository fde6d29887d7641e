//! The CPU time a process has used, read from `/proc/<pid>/stat`.
//!
//! `peers/` (its own cargo workspace) compiles this same file as a module of its own, with
//! `#[path]`, to read the peer brokers' CPU time: so it uses nothing but `std`, and nothing
//! of this crate.

use std::fs;

/// The clock ticks per second of the times in `/proc/<pid>/stat`: `USER_HZ`, what
/// `sysconf(_SC_CLK_TCK)` returns, which Linux fixes at 100 on x86 and ARM whatever the
/// kernel's own tick rate.
const TICKS_PER_S: f64 = 100.0;

/// User and system CPU time of a process, all its threads, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTime {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuTime {
    /// Process `pid`'s CPU time so far; `None` when it cannot be read (the process is gone,
    /// or this is not Linux).
    pub fn of_process(pid: u32) -> Option<CpuTime> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        CpuTime::from_stat(&stat)
    }

    /// Reads utime and stime (fields 14 and 15) from a `/proc/<pid>/stat` line. The command
    /// name (field 2, in parentheses) may hold spaces and parentheses itself, so fields are
    /// counted from the last `)`.
    fn from_stat(stat: &str) -> Option<CpuTime> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3.
        let ticks = |field: usize| fields.get(field - 3)?.parse::<f64>().ok();
        Some(CpuTime {
            user_s: ticks(14)? / TICKS_PER_S,
            sys_s: ticks(15)? / TICKS_PER_S,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_from_fields_14_and_15_after_the_command_name() {
        // A command name with a space and a ')' of its own; utime 250 and stime 75 ticks.
        let stat = "4242 (lg (x) y) S 1 4242 4242 0 -1 4194304 900 0 0 0 250 75 0 0 20 0 9 0";
        let cpu = CpuTime::from_stat(stat).expect("parses");
        assert_eq!(cpu.user_s, 2.5);
        assert_eq!(cpu.sys_s, 0.75);
        assert!(CpuTime::from_stat("4242 (cut short) S 1 2").is_none());
        assert!(CpuTime::from_stat("no parenthesis at all").is_none());
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        assert!(CpuTime::of_process(std::process::id()).is_some());
    }
}
