//! Benchmarks of leasemq, each beside a naive baseline measured in the same run.
//!
//! The benchmarks live in `benches/`; `README.md` lists each with what it measures, its
//! baseline and the command that runs it. `cycle`, `depth` and `wheel` drive the engine
//! ([`leasemq_engine::Shard`], its timer wheel) directly, with no threads and no clock;
//! `broker`, `roundtrip`, `deadletter` and `handoff` drive the threaded broker
//! ([`leasemq::Broker`]). Where the work is a queue's, the baseline is
//! [`baseline::MutexQueue`]: the same operations behind one `Mutex`, with no threads of
//! its own, so that the numbers say what the sharded design buys (or costs) against the
//! obvious implementation. Where the work is a hand-off between threads, the baseline is
//! the plain crossbeam channel that does the same hand-off.
//!
//! Run one with `cargo bench -p leasemq-bench-harness --bench <name>`.

/// Whether this bench binary was started by `cargo bench` (which passes `--bench`) rather
/// than by `cargo test --benches`, which runs each benchmark once as a test: a bench skips
/// its slowest setups then. The rule is criterion's own.
pub fn is_bench_run() -> bool {
    let mut bench = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => bench = true,
            "--test" => return false,
            _ => {}
        }
    }
    bench
}

/// Runs `produce` and `consume` on two named threads; returns the time from their start
/// until both are done, and what `consume` returned.
pub fn two_threads<R: Send>(
    produce: impl FnOnce() + Send,
    consume: impl FnOnce() -> R + Send,
) -> (std::time::Duration, R) {
    let start = std::time::Instant::now();
    let consumed = std::thread::scope(|s| {
        let producer = std::thread::Builder::new()
            .name("bench-producer".into())
            .spawn_scoped(s, produce)
            .expect("producer thread");
        let consumer = std::thread::Builder::new()
            .name("bench-consumer".into())
            .spawn_scoped(s, consume)
            .expect("consumer thread");
        producer.join().expect("producer ran");
        consumer.join().expect("consumer ran")
    });
    (start.elapsed(), consumed)
}

/// Threads that keep cores busy beside a benchmark, as a service's own work does: a hand-off
/// between threads can be fast on an idle machine and slow beside them.
pub struct BusyThreads {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyThreads {
    /// Starts `n` threads that spin on integer work until dropped.
    pub fn start(n: usize) -> BusyThreads {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("bench-busy-{i}"))
                    .spawn(move || {
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 + i as u64;
                        while !stop.load(Relaxed) {
                            for _ in 0..1024 {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                            }
                            std::hint::black_box(x);
                        }
                    })
                    .expect("busy thread")
            })
            .collect();
        BusyThreads { stop, threads }
    }
}

impl Drop for BusyThreads {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Setting up a bare engine shard for the benchmarks that drive it directly.
pub mod engine {
    use bytes::Bytes;
    use leasemq_engine::{
        Command, ConsumerConfig, ConsumerKey, Effects, Message, PutOutcome, QueueConfig, QueueKey,
        Reply, Shard, Tick,
    };

    /// The engine's time in these benchmarks, which never moves.
    pub const NOW: Tick = 1;

    /// A 16-byte body that costs no allocation to clone.
    pub fn body() -> Bytes {
        Bytes::from_static(b"0123456789abcdef")
    }

    /// Declares `name` with the default config; panics if the engine refuses.
    pub fn declare(shard: &mut Shard, out: &mut Effects, name: &str) -> QueueKey {
        let declare = Command::Declare {
            name: name.into(),
            config: Box::new(QueueConfig::default()),
        };
        shard.handle(NOW, declare, out);
        let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
            panic!("declaring {name} failed");
        };
        queue
    }

    /// Puts one message with [`body`] into `queue`; panics unless it is enqueued. The
    /// deliveries it caused are left in `out`.
    pub fn put(shard: &mut Shard, out: &mut Effects, queue: QueueKey) {
        let put = Command::Put {
            queue,
            message: Message::new(body()),
        };
        shard.handle(NOW, put, out);
        let reply = out.reply.take();
        assert!(
            matches!(reply, Some(Reply::Put(Ok(PutOutcome::Enqueued)))),
            "put answered {reply:?}"
        );
    }

    /// Registers consumer `name` on `queue`; panics if the engine refuses.
    pub fn consume(
        shard: &mut Shard,
        out: &mut Effects,
        queue: QueueKey,
        name: &str,
        prefetch: u32,
    ) -> ConsumerKey {
        consume_with_priority(shard, out, queue, name, prefetch, 0)
    }

    /// [`consume`] with a consumer priority.
    pub fn consume_with_priority(
        shard: &mut Shard,
        out: &mut Effects,
        queue: QueueKey,
        name: &str,
        prefetch: u32,
        priority: i64,
    ) -> ConsumerKey {
        let consume = Command::Consume {
            queue,
            name: name.into(),
            config: ConsumerConfig { prefetch },
            priority,
            ack_timeout: None,
        };
        shard.handle(NOW, consume, out);
        let Some(Reply::Consumed(Ok(key))) = out.reply.take() else {
            panic!("consuming as {name} failed");
        };
        key
    }
}

pub mod baseline {
    //! A straightforward work queue behind one `Mutex`: the baseline of the benchmarks.
    //!
    //! Ready messages wait in a `VecDeque`; a lease is an entry of a `HashMap` from tag to
    //! leased message, with a deadline. Nothing runs on its own: expired leases are found
    //! by whichever call takes the lock next, through a list of tags in delivery order
    //! (which is deadline order, every lease being `ack_timeout` long). Each consumer keeps
    //! its tags in order too, for `ack_up_to`.
    //!
    //! The meaning is leasemq's (contract §3) for what it offers: `put`, `put_batch`,
    //! `try_recv` (a pull within the consumer's prefetch), `ack`, `ack_up_to`, and cancel on
    //! drop. Messages carry no id, delay or retry policy: every message gets a fresh
    //! number as its id and is never a duplicate.

    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use ahash::RandomState;
    use bytes::Bytes;
    use leasemq::{DeliveryTag, Envelope, PutOutcome};

    /// A queue behind one lock. Cheap to clone; every clone reaches the same queue.
    #[derive(Clone)]
    pub struct MutexQueue {
        inner: Arc<Inner>,
    }

    struct Inner {
        ack_timeout: Duration,
        state: Mutex<State>,
    }

    struct Msg {
        id: u64,
        body: Bytes,
        /// Deliveries so far.
        attempt: u32,
    }

    struct Lease {
        msg: Msg,
        deadline: Instant,
        consumer: usize,
    }

    struct ConsumerState {
        prefetch: usize,
        /// Live leases held.
        held: usize,
        /// Its tags in delivery order; the front one is always live, later ones may be
        /// settled already.
        tags: VecDeque<u64>,
    }

    struct State {
        /// Messages that came back (expiry, cancel), delivered before fresh ones.
        returned: VecDeque<Msg>,
        fresh: VecDeque<Msg>,
        leases: HashMap<u64, Lease, RandomState>,
        /// Tags in delivery order, which is deadline order; a settled tag is dropped when
        /// it reaches the front.
        by_deadline: VecDeque<u64>,
        consumers: Vec<Option<ConsumerState>>,
        next_tag: u64,
        next_id: u64,
    }

    impl State {
        fn new() -> State {
            State {
                returned: VecDeque::new(),
                fresh: VecDeque::new(),
                // The hasher leasemq uses, so that the comparison is not about hashing.
                leases: HashMap::with_hasher(RandomState::with_seeds(1, 2, 3, 4)),
                by_deadline: VecDeque::new(),
                consumers: Vec::new(),
                next_tag: 0,
                next_id: 0,
            }
        }

        fn enqueue(&mut self, body: Bytes) -> PutOutcome {
            self.next_id += 1;
            self.fresh.push_back(Msg {
                id: self.next_id,
                body,
                attempt: 0,
            });
            PutOutcome::Enqueued
        }

        /// Ends every lease whose deadline is at or before `now`: its message comes back.
        fn expire(&mut self, now: Instant) {
            while let Some(&tag) = self.by_deadline.front() {
                match self.leases.get(&tag) {
                    Some(lease) if lease.deadline > now => return,
                    Some(_) => {
                        let lease = self.end_lease(tag).expect("checked live");
                        self.returned.push_back(lease.msg);
                    }
                    None => {}
                }
                self.by_deadline.pop_front();
            }
        }

        /// Takes a live lease out of the table and its consumer's list.
        fn end_lease(&mut self, tag: u64) -> Option<Lease> {
            let lease = self.leases.remove(&tag)?;
            let consumer = self.consumers[lease.consumer]
                .as_mut()
                .expect("a lease's consumer is live");
            consumer.held -= 1;
            while consumer
                .tags
                .front()
                .is_some_and(|t| !self.leases.contains_key(t))
            {
                consumer.tags.pop_front();
            }
            Some(lease)
        }

        fn poll(&mut self, slot: usize, now: Instant, ack_timeout: Duration) -> Option<Delivery> {
            self.expire(now);
            let consumer = self.consumers[slot].as_mut()?;
            if consumer.held >= consumer.prefetch {
                return None;
            }
            let mut msg = self
                .returned
                .pop_front()
                .or_else(|| self.fresh.pop_front())?;
            self.next_tag += 1;
            let tag = self.next_tag;
            msg.attempt += 1;
            let delivery = Delivery {
                tag: DeliveryTag(tag),
                id: msg.id,
                body: msg.body.clone(),
                attempt: msg.attempt,
            };
            consumer.held += 1;
            consumer.tags.push_back(tag);
            self.by_deadline.push_back(tag);
            let deadline = now + ack_timeout;
            let lease = Lease {
                msg,
                deadline,
                consumer: slot,
            };
            self.leases.insert(tag, lease);
            Some(delivery)
        }

        fn ack_up_to(&mut self, slot: usize, tag: u64) -> usize {
            let mut acked = 0;
            while let Some(&front) = self.consumers[slot].as_ref().and_then(|c| c.tags.front()) {
                if front > tag {
                    break;
                }
                self.end_lease(front)
                    .expect("a consumer's front tag is live");
                acked += 1;
            }
            acked
        }

        /// The consumer goes away: every live lease of it comes back, in tag order.
        fn cancel(&mut self, slot: usize) {
            let Some(consumer) = self.consumers[slot].take() else {
                return;
            };
            for tag in consumer.tags {
                if let Some(lease) = self.leases.remove(&tag) {
                    self.returned.push_back(lease.msg);
                }
            }
        }
    }

    impl MutexQueue {
        /// An empty queue whose leases last `ack_timeout`.
        pub fn new(ack_timeout: Duration) -> MutexQueue {
            MutexQueue {
                inner: Arc::new(Inner {
                    ack_timeout,
                    state: Mutex::new(State::new()),
                }),
            }
        }

        fn lock(&self) -> MutexGuard<'_, State> {
            self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub fn put(&self, body: impl Into<Bytes>) -> PutOutcome {
            self.lock().enqueue(body.into())
        }

        /// Puts every body under one lock.
        pub fn put_batch(&self, bodies: Vec<Bytes>) -> Vec<PutOutcome> {
            let mut state = self.lock();
            bodies.into_iter().map(|b| state.enqueue(b)).collect()
        }

        /// Registers a consumer that may hold at most `prefetch` live leases.
        pub fn consume(&self, prefetch: u32) -> MutexConsumer {
            assert!(prefetch > 0, "prefetch is at least 1");
            let consumer = ConsumerState {
                prefetch: prefetch as usize,
                held: 0,
                tags: VecDeque::new(),
            };
            let mut state = self.lock();
            let slot = match state.consumers.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    state.consumers.push(None);
                    state.consumers.len() - 1
                }
            };
            state.consumers[slot] = Some(consumer);
            drop(state);
            MutexConsumer {
                queue: self.clone(),
                slot,
            }
        }

        /// `true` and the message is gone; `false` if the tag is stale.
        pub fn ack(&self, tag: DeliveryTag) -> bool {
            self.ack_at(tag, Instant::now())
        }

        /// [`ack`](MutexQueue::ack) with the clock read by the caller.
        pub fn ack_at(&self, tag: DeliveryTag, now: Instant) -> bool {
            let mut state = self.lock();
            state.expire(now);
            state.end_lease(tag.0).is_some()
        }

        /// Messages waiting for a consumer.
        pub fn ready(&self) -> usize {
            let state = self.lock();
            state.returned.len() + state.fresh.len()
        }

        /// Live leases.
        pub fn leased(&self) -> usize {
            self.lock().leases.len()
        }
    }

    /// A consumer of a [`MutexQueue`]: pulls deliveries within its prefetch. Dropping it
    /// gives every live lease it holds back to the queue.
    pub struct MutexConsumer {
        queue: MutexQueue,
        slot: usize,
    }

    impl MutexConsumer {
        pub fn queue(&self) -> &MutexQueue {
            &self.queue
        }

        /// A delivery if a message is ready and this consumer has credit, else `None`.
        pub fn try_recv(&self) -> Option<Delivery> {
            self.try_recv_at(Instant::now())
        }

        /// [`try_recv`](MutexConsumer::try_recv) with the clock read by the caller.
        pub fn try_recv_at(&self, now: Instant) -> Option<Delivery> {
            let ack_timeout = self.queue.inner.ack_timeout;
            self.queue.lock().poll(self.slot, now, ack_timeout)
        }

        /// Acks every live lease of this consumer with a tag up to `tag`; returns how many.
        pub fn ack_up_to(&self, tag: DeliveryTag) -> usize {
            self.ack_up_to_at(tag, Instant::now())
        }

        /// [`ack_up_to`](MutexConsumer::ack_up_to) with the clock read by the caller.
        pub fn ack_up_to_at(&self, tag: DeliveryTag, now: Instant) -> usize {
            let mut state = self.queue.lock();
            state.expire(now);
            state.ack_up_to(self.slot, tag.0)
        }
    }

    impl Drop for MutexConsumer {
        fn drop(&mut self) {
            self.queue.lock().cancel(self.slot);
        }
    }

    /// One hand-over of a message, under a lease.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Delivery {
        pub tag: DeliveryTag,
        pub id: u64,
        pub body: Bytes,
        pub attempt: u32,
    }

    impl Delivery {
        /// What a leasemq consumer sees of the same delivery (the id as text).
        pub fn into_envelope(self) -> Envelope {
            Envelope {
                id: self.id.to_string(),
                body: self.body,
                attempt: self.attempt,
                death: None,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const TIMEOUT: Duration = Duration::from_secs(10);

        #[test]
        fn ack_ends_the_lease_and_a_second_ack_is_stale() {
            let q = MutexQueue::new(TIMEOUT);
            let c = q.consume(10);
            q.put("a");
            let d = c.try_recv().expect("a delivery");
            assert_eq!((d.tag, d.attempt), (DeliveryTag(1), 1));
            assert!(q.ack(d.tag));
            assert!(!q.ack(d.tag));
            assert_eq!((q.ready(), q.leased()), (0, 0));
        }

        #[test]
        fn an_expired_lease_comes_back_with_a_fresh_tag() {
            let q = MutexQueue::new(TIMEOUT);
            let c = q.consume(10);
            q.put_batch(vec![Bytes::from("a"), Bytes::from("b")]);
            let start = Instant::now();
            let first = c.try_recv_at(start).expect("a");
            let later = start + TIMEOUT;
            assert!(!q.ack_at(first.tag, later), "expired at its deadline");
            let again = c.try_recv_at(later).expect("a comes back before b");
            assert_eq!((again.tag, again.attempt), (DeliveryTag(2), 2));
            assert_eq!(again.body, first.body);
        }

        #[test]
        fn prefetch_bounds_live_leases() {
            let q = MutexQueue::new(TIMEOUT);
            let c = q.consume(2);
            q.put_batch(vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]);
            let a = c.try_recv().expect("a");
            c.try_recv().expect("b");
            assert!(c.try_recv().is_none(), "no credit left");
            assert!(q.ack(a.tag));
            assert!(c.try_recv().is_some(), "credit back after the ack");
        }

        #[test]
        fn ack_up_to_acks_only_that_consumers_leases() {
            let q = MutexQueue::new(TIMEOUT);
            let (sam, max) = (q.consume(10), q.consume(10));
            for _ in 0..4 {
                q.put("m");
            }
            let s1 = sam.try_recv().expect("1");
            let m2 = max.try_recv().expect("2");
            let s3 = sam.try_recv().expect("3");
            assert!(q.ack(s1.tag));
            assert_eq!(sam.ack_up_to(s3.tag), 1);
            assert_eq!(max.ack_up_to(s3.tag), 1);
            assert!(!q.ack(m2.tag));
            assert_eq!((q.ready(), q.leased()), (1, 0));
        }

        #[test]
        fn dropping_a_consumer_gives_its_leases_back() {
            let q = MutexQueue::new(TIMEOUT);
            let c = q.consume(10);
            q.put("a");
            let d = c.try_recv().expect("a");
            drop(c);
            assert!(!q.ack(d.tag));
            let next = q.consume(10).try_recv().expect("a again");
            assert_eq!(next.attempt, 2);
        }
    }
}
