//! `--background-load N`: N CPU-bound threads beside the broker for the whole run.
//!
//! A service that embeds leasemq keeps its cores busy with its own work, and a broker
//! sized on an idle machine can be far slower there: every hand-off between threads then
//! competes with threads that never sleep. This makes that condition a standard,
//! repeatable run. The threads live in a child process (this same binary, run with a
//! hidden subcommand), so the run's own CPU figures count only the broker and its
//! workers; the child exits when this process closes its standard input, which also
//! happens if this process dies.

use std::hint::black_box;
use std::io::Read;
use std::process::{Child, Command, Stdio};

/// The name of the hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "__background-load";

/// A running child process of CPU-bound threads; stopped when dropped.
pub struct BackgroundLoad {
    child: Child,
}

impl BackgroundLoad {
    /// Starts `threads` CPU-bound threads in a child process; `None` for zero.
    pub fn start(threads: u32) -> Result<Option<BackgroundLoad>, String> {
        if threads == 0 {
            return Ok(None);
        }
        let exe = std::env::current_exe()
            .map_err(|e| format!("--background-load: cannot find this program: {e}"))?;
        let child = Command::new(exe)
            .arg(SUBCOMMAND)
            .arg(threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("--background-load: cannot start the load: {e}"))?;
        Ok(Some(BackgroundLoad { child }))
    }
}

impl Drop for BackgroundLoad {
    fn drop(&mut self) {
        // Closing its standard input ends the child; kill it too, in case it is stuck.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side: spins `threads` threads until standard input closes.
pub fn serve(threads: &str) -> std::process::ExitCode {
    let Ok(n) = threads.parse::<u32>() else {
        eprintln!("{SUBCOMMAND}: expected a thread count, got {threads:?}");
        return std::process::ExitCode::from(2);
    };
    for _ in 0..n {
        std::thread::spawn(burn);
    }
    // Blocks until the parent closes the pipe (or dies).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::ExitCode::SUCCESS
}

/// Keeps one core busy with integer work that the optimiser cannot remove.
fn burn() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    loop {
        for _ in 0..1024 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        black_box(x);
    }
}
