//! The tasks that send a virtual host's dead letters on through exchanges, one per
//! holding queue (`dead_letter.rs` says how, and keeps which queues have one).

use std::collections::HashMap;
use std::sync::Arc;

use leasemq::{Broker, ConsumerConfig, Delivery, Error, Message, Queue, Settle};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::VHost;
use crate::dead_letter::{is_holding, Route, PREFETCH};
use crate::{content, names};

impl VHost {
    /// Runs a task for each queue that dead-letters through an exchange, for as long as the
    /// future runs (dropped, it stops them).
    pub async fn forward_dead_letters(self: Arc<VHost>, broker: Broker) {
        let mut tasks = JoinSet::new();
        loop {
            let starting = std::mem::take(&mut self.dead_letters.take_starting());
            for (queue, holding, drain, task) in starting {
                let (vhost, broker) = (Arc::clone(&self), broker.clone());
                tasks.spawn(async move {
                    forward_all(&vhost, broker, &queue, holding, drain, task).await;
                    vhost.dead_letters.ended(&queue, task);
                });
            }
            // Finished tasks are let go as they end; a permit stored by a `notify_one` with no
            // waiter wakes the next wait at once.
            tokio::select! {
                _ = self.dead_letters.wake.notified() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
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
    vhost: &VHost,
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
        if vhost.dead_letters.close_if_drained(queue, &holding, task) {
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
        let Some(route) = vhost.dead_letters.route(queue, task) else {
            break;
        };
        match send_on(vhost, &broker, &mut queues, queue, &letters, &route).await {
            Sent::Done => {
                let acks: Vec<_> = letters.iter().map(|d| (d.tag(), Settle::Ack)).collect();
                holding.settle_batch_async(&acks).await;
            }
            // Their leases end with the consumer: the letters stay in the holding queue.
            Sent::Stopped => break,
        }
    }
}

/// Copies of dead letters for one queue: the queue, the copies in order, and each copy's
/// letter's index in the letters sent on.
type Batch = (Queue, Vec<Message>, Vec<usize>);

/// Routes dead letters through `route` and puts a copy of each to each queue it reaches
/// (their handles kept in `queues`): the copies to one queue as one put batch, in order,
/// or one at a time to a queue with `x-max-length`, which may take some and refuse
/// others. As RabbitMQ, a letter is dropped where it would come back to a queue it died in
/// with no reject on the way (a cycle nothing would end), where its exchange routes it
/// nowhere, and where a queue refuses it (full, gone, too large once its `x-death` record
/// is added). Each copy is a new message to the broker, not a duplicate of one its queue
/// holds.
async fn send_on(
    vhost: &VHost,
    broker: &Broker,
    queues: &mut HashMap<String, Queue>,
    holding_for: &str,
    letters: &[Delivery],
    route: &Route,
) -> Sent {
    let exchange = route.exchange.as_str();
    // Per letter: queues it reached, and copies taken.
    let mut reached = vec![(0, 0); letters.len()];
    let batches = route_letters(vhost, broker, queues, holding_for, letters, route);
    for (target, copies, of) in batches {
        for &i in &of {
            reached[i].0 += 1;
        }
        let Some(taken) = put_copies(&target, copies, exchange).await else {
            return Sent::Stopped;
        };
        if taken.contains(&true) {
            // Their message TTL counts from now: the queue's head is looked at in time.
            vhost.message_expiry.published(&target, false);
        }
        for (&i, ok) in of.iter().zip(taken) {
            reached[i].1 += usize::from(ok);
        }
    }
    for &(_, taken) in &reached {
        if taken == 0 {
            vhost.metrics.dead_letters_dropped.inc();
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

/// The copies of `letters` routed through `route`, per queue reached, in the order first
/// reached (see [`send_on`]); a letter that reaches no queue is in no batch.
fn route_letters(
    vhost: &VHost,
    broker: &Broker,
    queues: &mut HashMap<String, Queue>,
    holding_for: &str,
    letters: &[Delivery],
    route: &Route,
) -> Vec<Batch> {
    let exchange = route.exchange.as_str();
    let now = vhost.clock.now_ms();
    let key = route.routing_key.as_deref();
    let mut batches: Vec<Batch> = Vec::new();
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
            let exchanges = vhost.exchanges.lock().expect("never poisoned");
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
        }
    }
    batches
}

/// Puts `copies` to `target`, as one batch where it takes or refuses them whole; which
/// were taken, or `None` once the broker shuts down (the letters then wait in their
/// holding queue).
async fn put_copies(target: &Queue, copies: Vec<Message>, exchange: &str) -> Option<Vec<bool>> {
    let name = target.name();
    // A batch is taken or refused whole: copies to a queue with `x-max-length`, which
    // may take some and refuse others, and any run with a letter grown too large
    // with its `x-death` record, go one at a time.
    let max = target.config().max_body_bytes;
    let whole =
        target.config().max_length.is_none() && copies.iter().all(|copy| copy.body().len() <= max);
    let taken = if whole {
        let count = copies.len();
        match target.put_batch_async(copies).await {
            Ok(_) => vec![true; count],
            Err(Error::ShutDown) => {
                tracing::debug!(queue = %name, exchange, "dead letters wait in their holding queue");
                return None;
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
                Err(Error::ShutDown) => return None,
                Err(e) => {
                    tracing::warn!(queue = %name, exchange, error = %e, "a dead letter was refused");
                    taken.push(false);
                }
            }
        }
        taken
    };
    Some(taken)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use amq_protocol::protocol::BasicProperties;
    use amq_protocol::types::AMQPValue;
    use leasemq::{Consumer, QueueConfig};

    use super::*;
    use crate::dead_letter::holding_name;
    use crate::exchange::Kind;

    /// A queue "src" whose dead letters go through its holding queue to the queue
    /// `target` by the default exchange; returns it and its holding queue.
    fn source_into(broker: &Broker, vhost: &VHost, target: &str) -> (Queue, Queue) {
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
        let src = (vhost.dead_letters).declare("src", route, declare).unwrap();
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
    async fn reject_all_then_delete(vhost: &VHost, queue: &Queue, n: usize, tag: &str) {
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
        // The task may have found the queue closed and its holding queue drained first,
        // and forgotten it already: then there is nothing left to wake.
        vhost.dead_letters.forget(queue);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_letter_too_large_for_its_queue_is_dropped_alone_from_the_batch_it_came_in() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let vhost = Arc::new(VHost::default());
        let config = QueueConfig {
            max_body_bytes: 600,
            ..QueueConfig::default()
        };
        let small = broker.declare_queue("small", config).unwrap();
        let (src, holding) = source_into(&broker, &vhost, "small");
        // All three in the holding queue before its task starts: taken as one batch.
        let payloads: [&[u8]; 3] = [b"a", &[b'x'; 590], b"b"];
        for payload in payloads {
            let body = content::encode(&BasicProperties::default(), payload).unwrap();
            src.put(Message::new(body)).unwrap();
        }
        reject_all(&src, 3);
        assert_eq!(holding.stats().ready, 3);
        let task = tokio::spawn(Arc::clone(&vhost).forward_dead_letters(broker.clone()));
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
        assert_eq!(vhost.metrics.dead_letters_dropped.get(), 1);
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_letters_go_on_through_the_exchange_and_the_holding_queue_goes_with_its_queue() {
        let broker = Broker::builder().shards(1).build().unwrap();
        let vhost = Arc::new(VHost::default());
        let failures = broker
            .declare_queue("failures", QueueConfig::default())
            .unwrap();
        {
            let mut exchanges = vhost.exchanges.lock().unwrap();
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
        let orders = (vhost.dead_letters)
            .declare("orders", route.clone(), declare)
            .unwrap();
        let holding = broker.queue(&holding_name("orders")).unwrap();
        let task = tokio::spawn(Arc::clone(&vhost).forward_dead_letters(broker.clone()));
        let route_now = || vhost.dead_letters.route_of("orders");

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
        (vhost.exchanges.lock().unwrap())
            .unbind("dlx", "failed", "failures")
            .unwrap();
        orders.put(Message::new(&b"lost"[..])).unwrap();
        assert!(next(&mut worker).await.reject());
        acked(&holding, 2).await;
        assert_eq!(failures.stats().enqueued, 1);

        // A redeclare keeps the task, with the route it names.
        (vhost.exchanges.lock().unwrap())
            .bind("dlx", "failed", "failures", false)
            .unwrap();
        let again = (vhost.dead_letters).declare("orders", route.clone(), declare);
        assert!(again.is_ok());
        assert_eq!(route_now(), Some(route.clone()));
        assert_eq!(
            vhost.dead_letters.take_starting().len(),
            0,
            "no second task"
        );

        // Letters still in the holding queue when their queue is deleted go on (as
        // RabbitMQ would have sent them on already); then the holding queue goes.
        let n = 300;
        drop(worker);
        reject_all_then_delete(&vhost, &orders, n, "late").await;
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
        let orders = (vhost.dead_letters)
            .declare("orders", route.clone(), declare)
            .unwrap();
        let holding = broker.queue(&holding_name("orders")).unwrap();
        reject_all_then_delete(&vhost, &orders, n, "again").await;
        let renewed = (vhost.dead_letters)
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
        let vhost = Arc::new(VHost::default());
        let config = QueueConfig {
            max_priority: Some(5),
            ..QueueConfig::default()
        };
        let urgent = broker.declare_queue("urgent", config).unwrap();
        let (src, holding) = source_into(&broker, &vhost, "urgent");
        for (payload, priority) in [("none", None), ("7", Some(7)), ("2", Some(2))] {
            let mut properties = BasicProperties::default();
            if let Some(p) = priority {
                properties = properties.with_priority(p);
            }
            let body = content::encode(&properties, payload.as_bytes()).unwrap();
            src.put(Message::new(body)).unwrap();
        }
        reject_all(&src, 3);
        let task = tokio::spawn(Arc::clone(&vhost).forward_dead_letters(broker.clone()));
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
