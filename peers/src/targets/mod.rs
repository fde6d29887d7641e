//! One module per broker, each behind the same three traits: a [`Target`] hands out one
//! [`Producer`] per producer thread and one [`Consumer`] per consumer thread, each with its
//! own connection (leasemq: its own handle), made before the clock starts.

use std::time::Duration;

use anyhow::Result;

use crate::harness::Body;

pub mod beanstalkd;
pub mod leasemq;
pub mod rabbitmq;
pub mod redis;

/// A message's lease or reservation lasts this long, far beyond any run, so nothing is
/// redelivered because a lease ran out.
pub const LEASE: Duration = Duration::from_secs(120);
/// Credit per consumer where the broker pushes (leasemq, RabbitMQ).
pub const PREFETCH: u16 = 100;

pub trait Target {
    fn name(&self) -> &'static str;
    /// Whether the broker is a separate server process reached over loopback TCP.
    fn is_remote(&self) -> bool;
    /// The server processes whose CPU time is counted (empty when in-process).
    fn server_pids(&self) -> Vec<u32>;
    fn producer(&self) -> Result<Box<dyn Producer>>;
    fn consumer(&self, index: usize) -> Result<Box<dyn Consumer>>;
    /// Removes the queue (stream, tube) this run used.
    fn finish(&self) -> Result<()>;
}

pub trait Producer: Send {
    /// Returns once the broker has accepted the message.
    fn put(&mut self, body: &Body) -> Result<()>;
}

pub trait Consumer: Send {
    /// The next message, leased to this consumer, or `None` after waiting `wait`.
    fn next(&mut self, wait: Duration) -> Result<Option<Body>>;
    /// Acks the message `next` returned last; an ack the broker refuses is an error.
    fn ack(&mut self) -> Result<()>;
}

/// The body as the workload's fixed-size array; any other length is an error.
pub fn body_from(bytes: &[u8]) -> Result<Body> {
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("received a {}-byte body", bytes.len()))
}

/// A name no earlier run used, so a run never sees another run's leftovers.
pub fn fresh_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}
