//! Consumers on a node that does not lead their queue's shard (contract §9 R6).
//!
//! A `consume` made on node A for a shard that node B leads registers the consumer on B,
//! as a local one with its own channel there; a pump task on B streams what that channel
//! receives to A, in order, one batch per call on the node link, and A puts it into the
//! channel its `Consumer` reads. Settles go to the leader by the queue's number like any
//! other call, and `ack_up_to`, `stop` and `cancel` to B by the consumer's key there.
//!
//! The stream ends when B's channel closes (its lead ended, the queue closed, the consumer
//! stopped), when A no longer knows the stream (the consumer was stopped or dropped, and A
//! tells B so), when a push gets no answer (B then cancels the consumer, and its leases
//! come back), or when A learns that another node leads the shard or stops hearing from B. A's consumer then ends as a local one would: with
//! `Unavailable` where the lead ended. Deliveries on their way to A when it cancels count
//! as read: their attempt stays spent.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use leasemq_engine::{ConsumerKey, Delivered};

use leasemq_replica::link::Link;
use leasemq_replica::ReplayApplier;

use crate::protocol::Readers;

/// The most deliveries one push carries.
pub(crate) const PUSH_BATCH: usize = 256;

/// The consumers of this node whose queues another node leads: where the deliveries
/// pushed to each go.
#[derive(Default)]
pub(crate) struct Streams {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Stream>>,
}

/// The local end of a remote consumer.
struct Stream {
    shard: u16,
    /// The node its deliveries come from.
    from: u64,
    tx: Sender<Delivered>,
    readers: Arc<Readers>,
}

impl Streams {
    /// Opens a stream for a consumer of `shard` on node `from`: its number, which the
    /// pushes name.
    pub fn open(&self, shard: u16, from: u64, tx: Sender<Delivered>, readers: Arc<Readers>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let stream = Stream {
            shard,
            from,
            tx,
            readers,
        };
        self.lock().insert(id, stream);
        id
    }

    /// Hands pushed deliveries to stream `id`'s consumer; `false` once the stream is gone.
    pub fn push(&self, id: u64, deliveries: Vec<Delivered>) -> bool {
        let open = self.lock();
        let Some(stream) = open.get(&id) else {
            return false;
        };
        for delivered in deliveries {
            if stream.tx.send(delivered).is_err() {
                return false;
            }
        }
        stream.readers.wake();
        true
    }

    /// Ends stream `id`; `unavailable` where its consumer ended with the lead.
    pub fn end(&self, id: u64, unavailable: bool) {
        let stream = self.lock().remove(&id);
        if let Some(stream) = stream {
            stream.finish(unavailable);
        }
    }

    /// Ends every stream of `shard` that comes from another node than `leader`: the lead
    /// it came with is over.
    pub fn leader_changed(&self, shard: u16, leader: Option<u64>) {
        self.end_where(|s| s.shard == shard && Some(s.from) != leader);
    }

    /// Ends every stream whose node this one no longer hears from (`heard`): the link to
    /// it is cut, and its pushes cannot come.
    pub fn end_unheard(&self, heard: impl Fn(u64) -> bool) {
        self.end_where(|s| !heard(s.from));
    }

    /// Ends, as their lead ended, the streams `gone` picks.
    fn end_where(&self, gone: impl Fn(&Stream) -> bool) {
        let ended: Vec<Stream> = {
            let mut open = self.lock();
            let ids: Vec<u64> = (open.iter())
                .filter(|(_, s)| gone(s))
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| open.remove(id)).collect()
        };
        for stream in ended {
            stream.finish(true);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Stream {
    /// Closes the consumer's channel, then wakes its readers to see it closed.
    fn finish(self, unavailable: bool) {
        if unavailable {
            (self.readers.unavailable).store(true, Ordering::Release);
        }
        drop(self.tx);
        self.readers.wake();
    }
}

/// A consumer registered here for another node, whose channel a pump streams there.
pub(crate) struct Pump {
    pub rx: Receiver<Delivered>,
    pub readers: Arc<Readers>,
    pub consumer: ConsumerKey,
}

impl Pump {
    /// The next deliveries of the channel, up to a batch; `None` once it closed.
    pub async fn next_batch(&self) -> Option<Vec<Delivered>> {
        let first = poll_fn(|cx| {
            for registered in [false, true] {
                match self.rx.try_recv() {
                    Ok(delivered) => return Poll::Ready(Some(delivered)),
                    Err(TryRecvError::Disconnected) => return Poll::Ready(None),
                    Err(TryRecvError::Empty) if registered => return Poll::Pending,
                    // Register, then look again: a delivery sent in between is not missed.
                    Err(TryRecvError::Empty) => self.readers.task.register(cx.waker()),
                }
            }
            Poll::Pending
        })
        .await?;
        let mut batch = vec![first];
        batch.extend(self.rx.try_iter().take(PUSH_BATCH - 1));
        Some(batch)
    }

    /// Whether the channel closed because the shard's lead here ended.
    pub fn lead_ended(&self) -> bool {
        self.readers.unavailable.load(Ordering::Acquire)
    }
}

/// Ends, every `every`, the streams whose node the link has not heard from in two of
/// them (it pings every node twice as often); until the streams are dropped.
pub(crate) async fn end_unheard(
    streams: std::sync::Weak<Streams>,
    link: Link<ReplayApplier>,
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(streams) = streams.upgrade() else {
            return;
        };
        let recent = |at: std::time::Instant| at.elapsed() < 2 * every;
        streams.end_unheard(|node| link.last_heard(node).is_some_and(recent));
    }
}
