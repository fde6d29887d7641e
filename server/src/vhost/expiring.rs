//! The task that deletes a virtual host's queues as their `x-expires` runs out
//! (`expiry.rs` keeps their deadlines).

use std::sync::Arc;

use super::VHost;

impl VHost {
    /// Deletes the queues whose `x-expires` ran out, as they do; runs until dropped.
    pub async fn expire_queues(self: Arc<VHost>) {
        loop {
            // Listening before looking, so that a touch made meanwhile is not missed.
            let woken = self.expiring.wake.notified();
            let now = tokio::time::Instant::now();
            let consumed = |name: &str| self.consumers.is_consumed(name);
            let (expired, next) = self.expiring.expire(now.into_std(), consumed);
            if !expired.is_empty() {
                let vhost = Arc::clone(&self);
                // A durable queue's close waits for the disk: off the runtime's workers.
                let deleted = tokio::task::spawn_blocking(move || {
                    for queue in &expired {
                        // A use since it was handed out keeps it (a declare, a get, a
                        // consume that came in the meantime).
                        if !vhost.consumers.is_consumed(queue.name())
                            && vhost.expiring.still_due(queue)
                        {
                            tracing::debug!(queue = queue.name(), "deleted by x-expires");
                            vhost.forget_queue(queue);
                        }
                    }
                });
                let _ = deleted.await;
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = woken => {}
                    }
                }
                None => woken.await,
            }
        }
    }
}
