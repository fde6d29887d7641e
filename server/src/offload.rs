//! Work that may wait for the disk, run off the thread that drives a connection.
//!
//! A connection never blocks on the disk: what would (a durable queue's declaration,
//! deletion, `basic.get` or `basic.consume`, a rewrite of the exchanges' file) it hands to
//! [`run`], and awaits the answer as it awaits a put's (`connection/answers.rs`). Inside a
//! tokio runtime the work runs on the runtime's blocking threads; outside one (a test that
//! drives a connection by hand) it runs at once, on the caller's thread.

use std::future::Future;
use std::pin::Pin;

/// What [`run`] answers: the work's result, or `None` if it panicked.
pub type Offloaded<R> = Pin<Box<dyn Future<Output = Option<R>> + Send>>;

/// Runs `work` where it may block, and answers with its result.
pub fn run<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> Offloaded<R> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn_blocking(work);
            Box::pin(async move { task.await.ok() })
        }
        Err(_) => Box::pin(std::future::ready(Some(work()))),
    }
}
