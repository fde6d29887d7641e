//! The task that expires messages at the heads of a virtual host's queues and
//! dead-letters those consumers met past their time (`message_expiry.rs` says how, and
//! keeps which queues to look at when).

use std::sync::Arc;
use std::time::Duration;

use leasemq::{Broker, ConsumerConfig, Delivery, Queue, Settle};

use super::VHost;
use crate::content::{self, PropertiesSeen};
use crate::dead_letter;
use crate::message_expiry::{Look, Next, AT_MOST_PER_LOOK, CONSUMER, MOST_TAKEN_AT_ONCE, RECHECK};

/// The holding queue of `queue`'s dead letters, if it dead-letters through an exchange
/// (`dead_letter.rs`).
fn holding_queue(broker: &Broker, queue: &Queue) -> Option<Queue> {
    let name = queue.config().dead_letter.as_deref()?;
    broker.queue(name).filter(|_| dead_letter::is_holding(name))
}

/// Hands back unseen what a look took and did not expire, `first` then `rest`, to the
/// front of `queue` in the order they were taken: released last one first.
fn hand_back(queue: &Queue, first: &[Delivery], rest: &[Delivery]) {
    let releases: Vec<_> = (first.iter().chain(rest).rev())
        .map(|d| (d.tag(), Settle::Release))
        .collect();
    queue.settle_batch(&releases);
}

impl VHost {
    /// Expires `delivery`, a message of `queue` past its time: put in the queue's holding
    /// queue if it has one, then acked. `false` if the holding queue refused it; the caller
    /// hands the delivery back.
    pub fn expire(&self, broker: &Broker, queue: &Queue, delivery: &Delivery) -> bool {
        self.expire_all(broker, queue, std::slice::from_ref(delivery))
    }

    /// [`VHost::expire`] for deliveries of one queue, each past its time, with one put batch to the
    /// holding queue and one settle batch: on a durable queue put first and acked after (see
    /// the module's introduction), on one in memory acked first.
    fn expire_all(&self, broker: &Broker, queue: &Queue, expired: &[Delivery]) -> bool {
        // No death record: that is how the holding queue's task tells an expiry.
        let mut seen = PropertiesSeen::default();
        let mut letter = |d: &Delivery| content::message(d.envelope().body.clone(), &mut seen);
        let holding = holding_queue(broker, queue);
        let durable = queue.is_durable();
        if let Some(holding) = holding.as_ref().filter(|_| durable) {
            if let Err(e) = holding.put_batch(expired.iter().map(&mut letter).collect()) {
                tracing::warn!(queue = queue.name(), error = %e, "expired messages cannot be dead-lettered; they stay");
                return false;
            }
        }
        let acks: Vec<_> = expired.iter().map(|d| (d.tag(), Settle::Ack)).collect();
        let took = queue.settle_batch(&acks);
        if let Some(holding) = holding.filter(|_| !durable) {
            let letters: Vec<_> = (expired.iter().zip(&took))
                .filter(|(_, &ok)| ok)
                .map(|(d, _)| letter(d))
                .collect();
            if !letters.is_empty() {
                if let Err(e) = holding.put_batch(letters) {
                    // Gone with its queue, or the broker stops: as when a dead letter is
                    // routed nowhere.
                    tracing::warn!(queue = queue.name(), error = %e, "expired messages were not dead-lettered");
                }
            }
        }
        let acked = took.iter().filter(|&&ok| ok).count();
        self.metrics.ttl_expired.inc_by(acked as u64);
        true
    }

    /// Looks at the head of `queue`, whose `x-message-ttl` is `ttl`, as the module's
    /// introduction says, and returns when to look next. Blocking: broker calls, and a put to
    /// a durable holding queue waits for the disk.
    ///
    /// The head is taken through a consumer of prefetch 1; while every message taken has
    /// expired, the next consumer takes four times as many at once (up to
    /// `MOST_TAKEN_AT_ONCE`), so that a long run of expired messages goes in batches and a
    /// look at a head with time left hands back one message, or a few.
    pub fn look_at_head(&self, broker: &Broker, look: &Look) -> Next {
        let Look {
            ref queue,
            ttl,
            own_ttl,
        } = *look;
        if self.consumers.is_consumed(queue.name()) {
            return Next::At(self.clock.now_ms() + RECHECK);
        }
        let mut seen = PropertiesSeen::default();
        let (mut prefetch, mut expired) = (1, 0);
        loop {
            // The consume call is a barrier: the first `prefetch` ready messages, if any, are
            // in the consumer now.
            let consumer = match queue.consume(CONSUMER, ConsumerConfig { prefetch }) {
                Ok(consumer) => consumer,
                Err(_) if queue.is_closed() => return Next::Poked,
                Err(e) => {
                    tracing::warn!(queue = queue.name(), error = %e, "message TTL: the head cannot be taken");
                    return Next::At(self.clock.now_ms() + RECHECK);
                }
            };
            let mut taken = Vec::new();
            while let Ok(Some(delivery)) = consumer.try_recv() {
                taken.push(delivery);
            }
            if taken.is_empty() {
                consumer.cancel();
                return self.nothing_ready(look);
            }
            // No more for it: the credit each settle below gives back would bring the next
            // message in, and a message handed back straight in again.
            consumer.stop();
            let now = self.clock.now_ms();
            let due = |d: &Delivery, seen: &mut PropertiesSeen| {
                content::expires_at(&d.envelope().body, ttl, seen)
            };
            let past = (taken.iter())
                .take_while(|d| due(d, &mut seen).is_some_and(|at| now > at))
                .count();
            let rest = taken.split_off(past);
            if !taken.is_empty() && !self.expire_all(broker, queue, &taken) {
                hand_back(queue, &taken, &rest);
                consumer.cancel();
                return Next::At(now + RECHECK);
            }
            expired += taken.len();
            if let Some(head) = rest.first() {
                let next = match due(head, &mut seen) {
                    // It expires once the clock is past that time (never past `u64::MAX`).
                    Some(at) => Next::At(at.saturating_add(1)),
                    // Only a queue with no `x-message-ttl` has such messages: the head stays
                    // until a consumer takes it.
                    None if own_ttl => Next::At(now + RECHECK),
                    // Nothing behind it can expire; a publish with an `expiration` arms the
                    // queue again (disarmed before the head is back, so that none is missed).
                    None => {
                        self.message_expiry.disarm(queue);
                        Next::Poked
                    }
                };
                hand_back(queue, &[], &rest);
                consumer.cancel();
                return next;
            }
            consumer.cancel();
            if expired >= AT_MOST_PER_LOOK {
                return Next::At(now);
            }
            if taken.len() == prefetch as usize {
                prefetch = (prefetch * 4).min(MOST_TAKEN_AT_ONCE);
            }
        }
    }

    /// What a look that found nothing ready says: looked at again soon if messages were put
    /// meanwhile; where messages may expire, after [`RECHECK`] while some are out that may come
    /// back with no publish (a requeue, a lease that ran out); else when a publish pokes it.
    fn nothing_ready(&self, look: &Look) -> Next {
        let queue = &look.queue;
        // Disarmed first, so that a publish from now on pokes it; what was put before is in
        // the counts.
        self.message_expiry.disarm(queue);
        let stats = queue.stats();
        let now = self.clock.now_ms();
        if stats.ready > 0 {
            // A moment later, so that a queue whose ready messages a look cannot take is no
            // busy loop.
            Next::At(now + 1)
        } else if stats.leased + stats.delayed > 0 && (look.ttl.is_some() || look.own_ttl) {
            Next::At(now + RECHECK)
        } else {
            Next::Poked
        }
    }

    /// Expires the server's messages at the heads of their queues, and dead-letters those
    /// that consumers met past their time; runs until dropped.
    pub async fn expire_messages(self: Arc<VHost>, broker: Broker) {
        loop {
            // Listening before looking, so that a poke made meanwhile is not missed.
            let woken = self.message_expiry.wake.notified();
            let now = self.clock.now_ms();
            let (due, next) = self.message_expiry.due(now);
            if !due.queues.is_empty() || !due.handed.is_empty() {
                let (vhost, broker) = (Arc::clone(&self), broker.clone());
                // Broker calls that may wait for the disk: off the runtime's workers.
                let looked = tokio::task::spawn_blocking(move || {
                    let expiry = &vhost.message_expiry;
                    for (queue, delivery) in due.handed {
                        if !vhost.expire(&broker, &queue, &delivery) {
                            expiry.retry_at(now + RECHECK, queue, delivery);
                        }
                    }
                    for look in due.queues {
                        let looking = expiry.begin_look(&look.queue);
                        let next = vhost.look_at_head(&broker, &look);
                        drop(looking);
                        expiry.looked(&look.queue, next);
                    }
                });
                if let Err(e) = looked.await {
                    tracing::error!(error = %e, "message TTL: a look failed; every queue is looked at again");
                    self.message_expiry.poke_all();
                }
                continue;
            }
            match next {
                Some(at) => {
                    let wait = Duration::from_millis(at.saturating_sub(now));
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = woken => {}
                    }
                }
                None => woken.await,
            }
        }
    }
}
