//! A virtual host's durable queues brought back after a restart, as they were declared.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use leasemq::Broker;

use super::VHost;
use crate::{dead_letter, durable_queues, message_expiry};

impl VHost {
    /// Reads the durable queues' file (`durable_queues.rs`) in `dir` and puts each
    /// durable queue the broker brought back as it was declared: its flags in the table,
    /// its dead-letter task started, its message TTL in force and its own expiry counting
    /// from now. Later declarations of durable queues are kept in the file from then on.
    ///
    /// # Errors
    ///
    /// The file cannot be read, parsed or rewritten.
    pub fn restore(&mut self, dir: &Path, broker: &Broker) -> Result<(), String> {
        let (file, kept) = durable_queues::open(dir, |name| broker.queue(name).is_some())?;
        for (name, declared) in &kept {
            let Some(queue) = broker.queue(name) else {
                continue;
            };
            if let Some(route) = &declared.dead_letter {
                // A queue from a build that dead-lettered straight to a queue has no holding
                // queue: its broker config still sends its dead letters there.
                let holding = dead_letter::holding_name(name);
                let holds = queue.config().dead_letter.as_deref() == Some(holding.as_str());
                if let Some(holding) = broker.queue(&holding).filter(|_| holds) {
                    let both = || Ok::<_, ()>((queue.clone(), holding));
                    let _ = self.dead_letters.declare(name, route.clone(), both);
                }
            }
            if declared.message_ttl.is_some() {
                self.message_ttl_used.store(true, Ordering::Relaxed);
            }
            if declared.message_ttl.is_some() || message_expiry::dead_letters(&queue) {
                // Its messages that expired while the server was down go first.
                self.message_expiry.watch(&queue, declared.message_ttl);
            }
            if let Some(ms) = declared.expires {
                (self.expiring).set(&queue, Duration::from_millis(ms.into()));
            }
        }
        if !kept.is_empty() {
            tracing::debug!(
                queues = kept.len(),
                "durable queues back as they were declared"
            );
        }
        *self.declared.lock().expect("never poisoned") = kept;
        self.queue_file = Some(file);
        Ok(())
    }
}
