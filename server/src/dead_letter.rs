//! Dead-lettering through an exchange: RabbitMQ's `x-dead-letter-exchange`.
//!
//! The broker dead-letters a queue's messages to one queue (`QueueConfig::dead_letter`),
//! fixed when the queue is declared; an exchange routes by bindings that change after (and
//! a dead letter gains an `x-death` record each time it dies, which the broker's one
//! [`leasemq::DeathRecord`] per message cannot keep). So a queue declared with a
//! dead-letter exchange (the default one `""` too) gets a holding queue of its own,
//! [`holding_name`] (`amq.dead-letters.<queue>`), as its dead-letter queue, and one task
//! per holding queue ([`run`] starts them) takes each dead letter from it, adds its
//! `x-death` record, routes it through the exchange with the dead-letter routing key (or
//! its own keys) as a publish would be routed, puts a copy to each queue that reaches, and
//! only then acks it. A crash in between puts it through again: dead letters go on at
//! least once (RabbitMQ's classic queues dead-letter at most once). One the exchange
//! routes nowhere, or that a queue refuses (full), is dropped and logged, as RabbitMQ
//! drops it.
//!
//! The broker's dead letters are rejects and delivery limits (`DeathReason`). A message
//! whose TTL runs out is put in the holding queue by the server itself
//! (`message_expiry.rs`), with no death record: that is how its task tells an expiry.
//!
//! Holding queues are the server's: no client reaches one by name (`Connection::queue`).
//! When its queue is deleted, its task sends on what it still holds, then deletes it (a
//! queue of the name declared again meanwhile keeps it, and the task). One is durable
//! when its queue is, so that dead letters wait in it across a restart; they go on after
//! it, as the server keeps where a durable queue's dead letters go (`durable_queues.rs`
//! starts its task again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use leasemq::{Broker, ConsumerConfig, Delivery, Error, Message, Queue, Settle};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::{content, names, Settings};

/// The start of every holding queue's name.
pub const PREFIX: &str = "amq.dead-letters.";

/// The longest name of a queue that dead-letters through an exchange: a queue name is at
/// most 255 bytes (contract §3 Limits), its holding queue's too.
pub const MAX_QUEUE_NAME_BYTES: usize = 255 - PREFIX.len();

/// How many dead letters a holding queue's task holds leased at once.
const PREFETCH: u32 = 64;

/// The name of the holding queue of `queue`.
pub fn holding_name(queue: &str) -> String {
    format!("{PREFIX}{queue}")
}

/// Whether `name` is a holding queue's.
pub fn is_holding(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// Where a queue's dead letters go: `x-dead-letter-exchange`, and
/// `x-dead-letter-routing-key` if the declare gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The exchange they are routed through.
    pub exchange: String,
    /// The routing key they are routed with; without one, their own.
    pub routing_key: Option<String>,
}

/// The queues that dead-letter through an exchange, shared by every connection of a
/// server.
#[derive(Debug, Default)]
pub struct DeadLetters {
    state: Mutex<State>,
    /// Wakes [`run`] when a task is to start.
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// By the name of the queue whose dead letters they are.
    by_queue: HashMap<String, Entry>,
    /// Tasks to start: the queue's name, its holding queue, its drain signal and its
    /// number.
    starting: Vec<(String, Queue, Arc<Notify>, u64)>,
    /// Numbers the tasks, so that one that ends forgets only its own entry.
    tasks: u64,
}

#[derive(Debug)]
struct Entry {
    /// The queue whose dead letters they are: once it is closed (deleted), the task sends
    /// on what the holding queue still has, then closes it.
    source: Queue,
    holding: Queue,
    route: Route,
    /// Wakes the task when its queue is deleted.
    drain: Arc<Notify>,
    task: u64,
}

impl DeadLetters {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; take the state as it is if it did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares the queue called `queue` with `declare` (which declares its holding queue,
    /// then the queue, and gives both), to dead-letter through `route`: its task starts
    /// unless one runs. A task draining the holding queue of a queue of that name just
    /// deleted carries on for the new one. `declare` runs under this table's lock, so that
    /// such a task cannot close the holding queue between its declare and the queue's.
    ///
    /// # Errors
    ///
    /// What `declare` fails with.
    pub fn declare<E>(
        &self,
        queue: &str,
        route: Route,
        declare: impl FnOnce() -> Result<(Queue, Queue), E>,
    ) -> Result<Queue, E> {
        let mut state = self.lock();
        let (source, holding) = declare()?;
        if let Some(entry) = state.by_queue.get_mut(queue) {
            if !entry.holding.is_closed() {
                entry.source = source.clone();
                entry.route = route;
                return Ok(source);
            }
        }
        state.tasks += 1;
        let (task, drain) = (state.tasks, Arc::new(Notify::new()));
        let start = (queue.to_string(), holding.clone(), Arc::clone(&drain), task);
        state.starting.push(start);
        let entry = Entry {
            source: source.clone(),
            holding,
            route,
            drain,
            task,
        };
        state.by_queue.insert(queue.to_string(), entry);
        drop(state);
        self.wake.notify_one();
        Ok(source)
    }

    /// Where the dead letters of `queue` go now (the last route of one deleted and still
    /// draining); `None` once its task is not task `task`.
    fn route(&self, queue: &str, task: u64) -> Option<Route> {
        let state = self.lock();
        let entry = state.by_queue.get(queue).filter(|e| e.task == task)?;
        Some(entry.route.clone())
    }

    /// The queue `closed` was deleted: its task sends on what its holding queue still
    /// holds (as RabbitMQ would have sent it on already), then closes it and ends. Whether
    /// a queue of its name has a holding queue here (the deleted one's, or a new one's).
    pub fn forget(&self, closed: &Queue) -> bool {
        let state = self.lock();
        let Some(entry) = state.by_queue.get(closed.name()) else {
            return false;
        };
        if entry.source.is_closed() {
            entry.drain.notify_one();
        }
        true
    }

    /// Task `task`, for `queue`, ends: its entry goes, so that the queue's next declare
    /// starts another.
    fn ended(&self, queue: &str, task: u64) {
        let mut state = self.lock();
        if state.by_queue.get(queue).is_some_and(|e| e.task == task) {
            state.by_queue.remove(queue);
        }
    }

    /// Closes the holding queue of `queue` and forgets it, if `queue` was deleted and the
    /// holding queue holds nothing more; whether the task is to end (it did, or the entry
    /// is no longer task `task`'s). Under the lock: a declare cannot get the holding queue
    /// as it closes.
    fn close_if_drained(&self, queue: &str, holding: &Queue, task: u64) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.by_queue.get(queue).filter(|e| e.task == task) else {
            return true;
        };
        if !entry.source.is_closed() {
            return false;
        }
        let stats = holding.stats();
        if stats.ready + stats.delayed + stats.leased > 0 {
            return false;
        }
        state.by_queue.remove(queue);
        holding.close();
        true
    }
}

/// Runs a task for each queue that dead-letters through an exchange, for as long as the
/// future runs (dropped, it stops them).
pub async fn run(settings: Arc<Settings>, broker: Broker) {
    let mut tasks = JoinSet::new();
    loop {
        let starting = std::mem::take(&mut settings.dead_letters.lock().starting);
        for (queue, holding, drain, task) in starting {
            let (settings, broker) = (settings.clone(), broker.clone());
            tasks.spawn(async move {
                forward_all(&settings, broker, &queue, holding, drain, task).await;
                settings.dead_letters.ended(&queue, task);
            });
        }
        // Finished tasks are let go as they end; a permit stored by a `notify_one` with no
        // waiter wakes the next wait at once.
        tokio::select! {
            _ = settings.dead_letters.wake.notified() => {}
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// What became of a dead letter taken from its holding queue.
enum Sent {
    /// Put wherever its exchange routed it, or dropped (as RabbitMQ drops it): acked.
    Done,
    /// Not put, as the broker shuts down: left in the holding queue, and the task ends.
    Stopped,
}

/// Takes the dead letters of `queue` from `holding` and sends each on, until the holding
/// queue is closed, or drained once `queue` is deleted (`drain` wakes it then).
async fn forward_all(
    settings: &Settings,
    broker: Broker,
    queue: &str,
    holding: Queue,
    drain: Arc<Notify>,
    task: u64,
) {
    let consumer = {
        let holding = holding.clone();
        let config = ConsumerConfig { prefetch: PREFETCH };
        tokio::task::spawn_blocking(move || holding.consume("leasemqd-dead-letters", config)).await
    };
    let mut consumer = match consumer {
        Ok(Ok(consumer)) => consumer,
        Ok(Err(e)) => {
            tracing::warn!(queue, error = %e, "dead letters cannot be taken from their holding queue");
            return;
        }
        Err(e) => {
            tracing::warn!(queue, error = %e, "dead-letter task failed to start");
            return;
        }
    };
    let mut queues = HashMap::new();
    loop {
        if settings
            .dead_letters
            .close_if_drained(queue, &holding, task)
        {
            break;
        }
        let delivery = tokio::select! {
            delivery = consumer.next() => delivery,
            _ = drain.notified() => continue,
        };
        let Some(delivery) = delivery else {
            break;
        };
        // With those already in hand: sent on together, their puts batched per queue.
        let mut letters = vec![delivery];
        while letters.len() < PREFETCH as usize {
            match consumer.try_recv() {
                Ok(Some(delivery)) => letters.push(delivery),
                _ => break,
            }
        }
        let Some(route) = settings.dead_letters.route(queue, task) else {
            break;
        };
        match send_on(settings, &broker, &mut queues, queue, &letters, &route).await {
            Sent::Done => {
                let acks: Vec<_> = letters.iter().map(|d| (d.tag(), Settle::Ack)).collect();
                holding.settle_batch_async(&acks).await;
            }
            // Their leases end with the consumer: the letters stay in the holding queue.
            Sent::Stopped => break,
        }
    }
}

/// Routes dead letters through `route` and puts a copy of each to each queue it reaches
/// (their handles kept in `queues`): the copies to one queue as one put batch, in order,
/// or one at a time to a queue with `x-max-length`, which may take some and refuse
/// others. As RabbitMQ, a letter is dropped where it would come back to a queue it died in
/// with no reject on the way (a cycle nothing would end), where its exchange routes it
/// nowhere, and where a queue refuses it (full, gone, too large once its `x-death` record
/// is added). Each copy is a new message to the broker, not a duplicate of one its queue
/// holds.
async fn send_on(
    settings: &Settings,
    broker: &Broker,
    queues: &mut HashMap<String, Queue>,
    holding_for: &str,
    letters: &[Delivery],
    route: &Route,
) -> Sent {
    let exchange = route.exchange.as_str();
    let now = settings.clock.now_ms();
    let key = route.routing_key.as_deref();
    // Per queue reached, in the order first reached: its copies, each with its letter's
    // index in `letters`.
    let mut batches: Vec<(Queue, Vec<Message>, Vec<usize>)> = Vec::new();
    // Per letter: queues it reached, and copies taken.
    let mut reached = vec![(0, 0); letters.len()];
    let mut seen = content::PropertiesSeen::default();
    for (i, delivery) in letters.iter().enumerate() {
        let envelope = delivery.envelope();
        let Some(letter) = content::dead_letter(envelope, holding_for, exchange, key, now) else {
            tracing::warn!(
                exchange,
                "a dead letter whose properties cannot be written again is dropped"
            );
            continue;
        };
        // Each copy a new message, with its priority (`x-max-priority`).
        let message = content::message(letter.body.clone(), &mut seen);
        let names = {
            let keys: Vec<&str> = letter.keys.iter().map(String::as_str).collect();
            let exchanges = settings.exchanges.lock().expect("never poisoned");
            exchanges.route_keys(exchange, &keys, || content::stored_headers(&letter.body))
        };
        for name in names.unwrap_or_default() {
            // A holding queue takes only its own queue's dead letters.
            if is_holding(&name) {
                continue;
            }
            if letter.cycles_to(&names::amqp(&name)) {
                tracing::debug!(queue = %name, "a dead letter in a cycle with no reject is dropped");
                continue;
            }
            let cached = queues.get(&name).filter(|q| !q.is_closed()).cloned();
            let Some(target) = cached.or_else(|| broker.queue(&name)) else {
                continue;
            };
            queues.insert(name.clone(), target.clone());
            let copy = message.clone();
            match batches.iter_mut().find(|(q, _, _)| q.name() == name) {
                Some((_, copies, of)) => {
                    copies.push(copy);
                    of.push(i);
                }
                None => batches.push((target, vec![copy], vec![i])),
            }
            reached[i].0 += 1;
        }
    }
    for (target, copies, of) in batches {
        let name = target.name();
        // A batch is taken or refused whole: copies to a queue with `x-max-length`, which
        // may take some and refuse others, and any run with a letter grown too large
        // with its `x-death` record, go one at a time.
        let max = target.config().max_body_bytes;
        let whole = target.config().max_length.is_none()
            && copies.iter().all(|copy| copy.body().len() <= max);
        let taken = if whole {
            let count = copies.len();
            match target.put_batch_async(copies).await {
                Ok(_) => vec![true; count],
                Err(Error::ShutDown) => {
                    tracing::debug!(queue = %name, exchange, "dead letters wait in their holding queue");
                    return Sent::Stopped;
                }
                Err(e) => {
                    tracing::warn!(queue = %name, exchange, error = %e, "dead letters were refused");
                    vec![false; count]
                }
            }
        } else {
            let mut taken = Vec::with_capacity(copies.len());
            for copy in copies {
                match target.put_async(copy).await {
                    Ok(_) => taken.push(true),
                    Err(Error::ShutDown) => return Sent::Stopped,
                    Err(e) => {
                        tracing::warn!(queue = %name, exchange, error = %e, "a dead letter was refused");
                        taken.push(false);
                    }
                }
            }
            taken
        };
        if taken.contains(&true) {
            // Their message TTL counts from now: the queue's head is looked at in time.
            settings.message_expiry.published(&target, false);
        }
        for (&i, ok) in of.iter().zip(taken) {
            reached[i].1 += usize::from(ok);
        }
    }
    for &(_, taken) in &reached {
        if taken == 0 {
            settings.metrics.dead_letters_dropped.inc();
        }
    }
    let nowhere = reached.iter().filter(|(queues, _)| *queues == 0).count();
    if nowhere > 0 {
        tracing::debug!(
            exchange,
            count = nowhere,
            "dead letters that reached no queue are dropped"
        );
    }
    if queues.len() > 64 {
        queues.retain(|_, q| !q.is_closed());
    }
    Sent::Done
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use amq_protocol::protocol::BasicProperties;
    use amq_protocol::types::AMQPValue;
    use leasemq::{Consumer, QueueConfig};

    use super::*;
    use crate::exchange::Kind;

    /// A queue "src" whose dead letters go through its holding queue to the queue
    /// `target` by the default exchange; returns it and its holding queue.
    fn source_into(broker: &Broker, settings: &Settings, target: &str) -> (Queue, Queue) {
        let declare = || {
            let holding = broker.declare_queue(&holding_name("src"), QueueConfig::default());
            let config = QueueConfig {
                dead_letter: Some(holding_name("src")),
                ..QueueConfig::default()
            };
            Ok::<_, leasemq::Error>((broker.declare_queue("src", config)?, holding?))
        };
        let route = Route {
            exchange: String::new(),
            routing_key: Some(target.into()),
        };
        let src = (settings.dead_letters)
            .declare("src", route, declare)
            .unwrap();
        (src, broker.queue(&holding_name("src")).unwrap())
    }

    /// Takes the `n` messages waiting in `src` and rejects them in one batch, so that
    /// they go to its holding queue together.
    fn reject_all(src: &Queue, n: usize) {
        let worker = src.consume("worker", ConsumerConfig::default()).unwrap();
        let mut settles = Vec::new();
        while let Some(d) = worker.try_recv().unwrap() {
            settles.push((d.tag(), leasemq::Settle::Reject));
        }
        assert_eq!(src.settle_batch(&settles), vec![true; n]);
    }

    /// The next delivery of `consumer`, which must come within 10 s.
    async fn next(consumer: &mut Consumer) -> Delivery {
        let next = tokio::time::timeout(Duration::from_secs(10), consumer.next());
        next.await.expect("a delivery within 10 s").expect("open")
    }

    /// Waits (up to 10 s) until `holding` has acked `n` dead letters in all.
    async fn acked(holding: &Queue, n: u64) {
        for _ in 0..10_000 {
            if holding.stats().acked >= n {
                assert_eq!(holding.stats().acked, n);
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("{n} dead letters were not sent on: {:?}", holding.stats());
    }

    /// Puts `n` messages to `queue`, rejects them all at once, then deletes the queue as
    /// a `queue.delete` would: its dead letters are in its holding queue as it goes.
    async fn reject_all_then_delete(settings: &Settings, queue: &Queue, n: usize, tag: &str) {
        for i in 0..n {
            queue.put(Message::new(format!("{tag} {i}"))).unwrap();
        }
        let config = ConsumerConfig { prefetch: 1_000 };
        let mut worker = queue.consume("all-at-once", config).unwrap();
        let mut tags = Vec::new();
        while tags.len() < n {
            tags.push(next(&mut worker).await.tag());
        }
        let settles: Vec<_> = tags.iter().map(|&t| (t, leasemq::Settle::Reject)).collect();
        assert!(queue.settle_batch(&settles).iter().all(|&ok| ok));
        drop(worker);
        assert!(queue.close());
        assert!(settings.dead_letters.forget(queue));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_letter_too_large_for_its_queue_is_dropped_alone_from_the_batch_it_came_in() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let settings = Arc::new(Settings::default());
        let config = QueueConfig {
            max_body_bytes: 600,
            ..QueueConfig::default()
        };
        let small = broker.declare_queue("small", config).unwrap();
        let (src, holding) = source_into(&broker, &settings, "small");
        // All three in the holding queue before its task starts: taken as one batch.
        let payloads: [&[u8]; 3] = [b"a", &[b'x'; 590], b"b"];
        for payload in payloads {
            let body = content::encode(&BasicProperties::default(), payload).unwrap();
            src.put(Message::new(body)).unwrap();
        }
        reject_all(&src, 3);
        assert_eq!(holding.stats().ready, 3);
        let task = tokio::spawn(run(settings.clone(), broker.clone()));
        acked(&holding, 3).await;
        let mut reader = small.consume("reader", ConsumerConfig::default()).unwrap();
        for payload in [b"a", b"b"] {
            let got = next(&mut reader).await;
            let out = content::delivered(got.envelope(), "small");
            assert_eq!(&out.payload[..], payload);
        }
        assert_eq!(
            small.stats().enqueued,
            2,
            "the one too large once its x-death is added"
        );
        assert_eq!(settings.metrics.dead_letters_dropped.get(), 1);
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_letters_go_on_through_the_exchange_and_the_holding_queue_goes_with_its_queue() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let settings = Arc::new(Settings::default());
        let failures = broker
            .declare_queue("failures", QueueConfig::default())
            .unwrap();
        {
            let mut exchanges = settings.exchanges.lock().unwrap();
            exchanges
                .declare("dlx", Kind::Direct, false, false)
                .unwrap();
            exchanges.bind("dlx", "failed", "failures", false).unwrap();
        }
        // As a declare does: the holding queue, then the queue.
        let declare = || {
            let holding = broker.declare_queue(&holding_name("orders"), QueueConfig::default());
            let config = QueueConfig {
                dead_letter: Some(holding_name("orders")),
                ..QueueConfig::default()
            };
            let orders = broker.declare_queue("orders", config);
            Ok::<_, leasemq::Error>((orders?, holding?))
        };
        let route = Route {
            exchange: "dlx".into(),
            routing_key: Some("failed".into()),
        };
        let orders = (settings.dead_letters)
            .declare("orders", route.clone(), declare)
            .unwrap();
        let holding = broker.queue(&holding_name("orders")).unwrap();
        let task = tokio::spawn(run(settings.clone(), broker.clone()));
        let route_now = || {
            let state = settings.dead_letters.lock();
            state.by_queue.get("orders").map(|e| e.route.clone())
        };

        let body = content::encode(&BasicProperties::default(), b"bad").unwrap();
        orders.put(Message::new(body)).unwrap();
        let mut worker = orders.consume("worker", ConsumerConfig::default()).unwrap();
        assert!(next(&mut worker).await.reject());
        let mut reader = failures
            .consume("reader", ConsumerConfig::default())
            .unwrap();
        let got = next(&mut reader).await;
        let out = content::delivered(got.envelope(), "failures");
        assert_eq!(&out.payload[..], b"bad");
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("dlx", "failed")
        );
        let headers = out.properties.headers().clone().unwrap();
        let queue = AMQPValue::LongString("orders".into());
        assert_eq!(headers.inner().get("x-first-death-queue"), Some(&queue));
        acked(&holding, 1).await;

        // Routed nowhere (the binding went): dropped, and taken from the holding queue.
        (settings.exchanges.lock().unwrap())
            .unbind("dlx", "failed", "failures")
            .unwrap();
        orders.put(Message::new(&b"lost"[..])).unwrap();
        assert!(next(&mut worker).await.reject());
        acked(&holding, 2).await;
        assert_eq!(failures.stats().enqueued, 1);

        // A redeclare keeps the task, with the route it names.
        (settings.exchanges.lock().unwrap())
            .bind("dlx", "failed", "failures", false)
            .unwrap();
        let again = (settings.dead_letters).declare("orders", route.clone(), declare);
        assert!(again.is_ok());
        assert_eq!(route_now(), Some(route.clone()));
        assert_eq!(
            settings.dead_letters.lock().starting.len(),
            0,
            "no second task"
        );

        // Letters still in the holding queue when their queue is deleted go on (as
        // RabbitMQ would have sent them on already); then the holding queue goes.
        let n = 300;
        drop(worker);
        reject_all_then_delete(&settings, &orders, n, "late").await;
        for _ in 0..n {
            assert!(next(&mut reader).await.ack());
        }
        for _ in 0..10_000 {
            if holding.is_closed() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(holding.is_closed(), "closed once drained");
        assert_eq!(route_now(), None);
        assert_eq!(failures.stats().enqueued, 1 + n as u64);

        // Declared again while its holding queue drains: the new queue keeps it and its
        // task, and its dead letters go on too.
        let orders = (settings.dead_letters)
            .declare("orders", route.clone(), declare)
            .unwrap();
        let holding = broker.queue(&holding_name("orders")).unwrap();
        reject_all_then_delete(&settings, &orders, n, "again").await;
        let renewed = (settings.dead_letters)
            .declare("orders", route.clone(), declare)
            .unwrap();
        assert!(!holding.is_closed(), "kept by the queue declared again");
        renewed.put(Message::new(&b"last"[..])).unwrap();
        let mut worker = renewed.consume("last", ConsumerConfig::default()).unwrap();
        assert!(next(&mut worker).await.reject());
        for _ in 0..=n {
            assert!(next(&mut reader).await.ack());
        }
        assert!(!holding.is_closed());
        assert_eq!(failures.stats().enqueued, 2 + 2 * n as u64);
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_keeps_its_priority_in_the_queue_it_goes_to() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let settings = Arc::new(Settings::default());
        let config = QueueConfig {
            max_priority: Some(5),
            ..QueueConfig::default()
        };
        let urgent = broker.declare_queue("urgent", config).unwrap();
        let (src, holding) = source_into(&broker, &settings, "urgent");
        for (payload, priority) in [("none", None), ("7", Some(7)), ("2", Some(2))] {
            let mut properties = BasicProperties::default();
            if let Some(p) = priority {
                properties = properties.with_priority(p);
            }
            let body = content::encode(&properties, payload.as_bytes()).unwrap();
            src.put(Message::new(body)).unwrap();
        }
        reject_all(&src, 3);
        let task = tokio::spawn(run(settings.clone(), broker.clone()));
        // All three are in `urgent` before the last is taken from the holding queue.
        acked(&holding, 3).await;
        let mut reader = urgent.consume("reader", ConsumerConfig::default()).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let delivery = next(&mut reader).await;
            let out = content::delivered(delivery.envelope(), "urgent");
            got.push((out.properties.priority().to_owned(), out.payload.to_vec()));
        }
        let expected = [(Some(7), "7"), (Some(2), "2"), (None, "none")];
        let expected = expected.map(|(p, body)| (p, body.as_bytes().to_vec()));
        assert_eq!(got, expected, "highest first, each with its priority");
        task.abort();
    }
}
