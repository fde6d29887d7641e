//! The progress bar on stderr: the phase of the run (warm-up, measuring, draining; which step
//! of a sweep) and its elapsed and planned time. Shown only for runs planned to last more
//! than two seconds, never with `--quiet`, and only when stdout is a terminal (a run whose
//! table goes into a file or a pipe is being scripted).

use std::cell::Cell;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs planned to be shorter than this show no bar.
const SHOW_AFTER: Duration = Duration::from_secs(2);
/// The most often the bar is updated (callers may call on every loop turn).
const UPDATE_EVERY: Duration = Duration::from_millis(100);

pub struct Progress {
    bar: Option<ProgressBar>,
    last_update: Cell<Option<Instant>>,
}

impl Progress {
    /// A bar for a run planned to take `planned`, or none (see the module docs).
    pub fn new(planned: Duration, quiet: bool) -> Progress {
        let shown = planned > SHOW_AFTER && !quiet && std::io::stdout().is_terminal();
        let bar = shown.then(|| {
            let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{prefix}[{bar:30}] {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar
        });
        Progress {
            bar,
            last_update: Cell::new(None),
        }
    }

    /// Text before the bar, e.g. which sweep step this is.
    pub fn set_prefix(&self, prefix: String) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(prefix);
        }
    }

    /// Shows `phase`, `elapsed` of `planned` and what `extra` says (e.g. the offered rate), at
    /// most ten times a second; `extra` is called only then.
    pub fn update<F: FnOnce() -> String>(
        &self,
        phase: &str,
        elapsed: Duration,
        planned: Duration,
        extra: F,
    ) {
        let Some(bar) = &self.bar else {
            return;
        };
        let now = Instant::now();
        if self
            .last_update
            .get()
            .is_some_and(|t| now.duration_since(t) < UPDATE_EVERY)
        {
            return;
        }
        self.last_update.set(Some(now));
        let planned_ms = planned.as_millis().max(1) as u64;
        bar.set_length(planned_ms);
        bar.set_position((elapsed.as_millis() as u64).min(planned_ms));
        bar.set_message(format!(
            "{phase} {:.1}/{:.1} s{}",
            elapsed.as_secs_f64(),
            planned.as_secs_f64(),
            extra()
        ));
    }

    /// Removes the bar, before the table is printed.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
