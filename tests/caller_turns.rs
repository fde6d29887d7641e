//! Turns run by callers (`BrokerBuilder::caller_turns`): a blocking caller that finds the
//! shard thread asleep handles the shard's inbox on its own thread. The guarantees are the
//! same as when the shard thread handles everything: every request answered, requests
//! handled in the order they were sent, timers that a caller's turn set still firing, and
//! a shutdown that leaves no caller waiting.
//!
//! These run under the system clock (a manual clock keeps every turn on the shard thread),
//! with `CallerTurns::Always`, so that callers run turns on an idle machine too; waits for
//! a lease to run out are `recv_timeout`s, not sleeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use leasemq::{Broker, CallerTurns, Error, Message};

mod common;
use common::*;

fn broker_with(turns: CallerTurns, shards: usize) -> Broker {
    Broker::builder()
        .shards(shards)
        .caller_turns(turns)
        .build()
        .expect("broker")
}

/// Puts, receives and acks `n` messages one at a time on one thread.
fn round_trips(broker: &Broker, name: &str, n: usize) {
    let q = plain(broker, name);
    let c = q.consume("c", prefetch(1)).unwrap();
    for i in 0..n {
        put(&q, &format!("m{i}"));
        let d = c.recv_timeout(secs(10)).unwrap().expect("the delivery");
        assert_eq!(d.envelope().id, format!("m{i}"));
        assert!(d.ack(), "a live lease's ack is accepted");
    }
    let s = q.stats();
    assert_eq!(
        (count(s.acked), count(s.ready), count(s.leased)),
        (n as u64, 0, 0)
    );
}

#[test]
fn callers_run_the_turns_of_a_sleeping_shard_only_when_allowed() {
    let always = broker_with(CallerTurns::Always, 1);
    round_trips(&always, "turns.always", 500);
    let seen = always.turn_stats();
    assert!(seen.callers > 0, "no caller ran a turn: {seen:?}");
    always.shutdown();

    let never = broker_with(CallerTurns::Never, 1);
    round_trips(&never, "turns.never", 500);
    let seen = never.turn_stats();
    assert_eq!(seen.callers, 0, "{seen:?}");
    // Declare, consume, and a put and an ack per message, at the least.
    assert!(seen.shard_threads >= 2 + 2 * 500, "{seen:?}");
    never.shutdown();
}

/// The shard thread sleeps until the engine's next timer as it last saw it; a lease made
/// in a caller's turn, with no timer before it, must wake it to wait for the new one.
#[test]
fn leases_and_delays_set_in_callers_turns_still_run_out() {
    let broker = broker_with(CallerTurns::Always, 2);
    let q = timeout_queue(&broker, "turns.expiry", ms(20));
    let a = q.consume("a", prefetch(1)).unwrap();
    for i in 0..10 {
        let id = format!("job-{i}");
        put(&q, &id);
        let first = a.recv_timeout(secs(10)).unwrap().expect("a gets it");
        assert_eq!(first.envelope().attempt, 1);
        // a never answers: after 20 ms the lease runs out and the message comes back.
        let again = a
            .recv_timeout(secs(10))
            .unwrap()
            .expect("redelivered after expiry");
        assert_eq!(
            (again.envelope().id.as_str(), again.envelope().attempt),
            (id.as_str(), 2)
        );
        assert!(!first.ack(), "the late ack is refused");
        // A nack with a delay: the retry timer is set in the turn of the nack's caller.
        assert!(again.nack_with_delay(ms(20)));
        let third = a
            .recv_timeout(secs(10))
            .unwrap()
            .expect("back after the delay");
        assert_eq!(third.envelope().attempt, 3);
        assert!(third.ack());
    }
    let s = q.stats();
    assert_eq!(
        (count(s.acked), count(s.ready), count(s.leased)),
        (10, 0, 0)
    );
    assert!(count(s.expired) >= 10);
    assert!(broker.turn_stats().callers > 0, "{:?}", broker.turn_stats());
    broker.shutdown();
}

/// Requests are taken from the inbox only by whoever holds the shard's state, so what one
/// thread sends without waiting and what it sends next and waits for are handled in that
/// order, whoever runs the turn.
#[test]
fn what_one_thread_sends_is_handled_in_order_whoever_runs_the_turn() {
    let broker = broker_with(CallerTurns::Always, 1);
    let q = plain(&broker, "turns.order");
    let n = 2_000;
    for i in 0..n {
        let id = format!("m{i:05}");
        if i % 2 == 0 {
            q.put_batch_nowait(vec![msg(&id)]);
        } else {
            put(&q, &id);
        }
    }
    let c = q.consume("c", prefetch(64)).unwrap();
    for i in 0..n {
        let d = c.recv_timeout(secs(10)).unwrap().expect("every message");
        assert_eq!(d.envelope().id, format!("m{i:05}"));
        assert!(d.ack());
    }
    broker.shutdown();
}

/// Many threads putting and acking while callers run the turns: every message acked once,
/// and a shutdown in the middle of it answers every caller.
#[test]
fn many_callers_lose_nothing_and_a_shutdown_answers_them_all() {
    let broker = broker_with(CallerTurns::Always, 2);
    let threads = 6;
    let per_thread = 3_000;
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let q = plain(&broker, &format!("turns.many.{t}"));
            thread::spawn(move || {
                let c = q.consume("c", prefetch(4)).unwrap();
                for i in 0..per_thread {
                    put(&q, &format!("{t}-{i}"));
                    let d = c.recv_timeout(secs(10)).unwrap().expect("the delivery");
                    assert_eq!(d.envelope().id, format!("{t}-{i}"));
                    assert!(d.ack());
                }
                let s = q.stats();
                assert_eq!(count(s.acked), per_thread as u64);
                assert_eq!((count(s.ready), count(s.leased)), (0, 0));
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }

    // Callers that keep putting while the broker shuts down each get an answer.
    let (done, finished) = mpsc::channel();
    let puts = Arc::new(AtomicU64::new(0));
    for t in 0..threads {
        let q = plain(&broker, &format!("turns.stop.{t}"));
        let (done, puts) = (done.clone(), puts.clone());
        thread::spawn(move || {
            let end = loop {
                match q.put(Message::new("x")) {
                    Ok(_) => puts.fetch_add(1, Ordering::Relaxed),
                    Err(e) => break e,
                };
            };
            let _ = done.send(end);
        });
    }
    drop(done);
    // The shutdown must meet the putters mid-flight.
    while puts.load(Ordering::Relaxed) < 1_000 {
        thread::yield_now();
    }
    broker.shutdown();
    for _ in 0..threads {
        let end = finished
            .recv_timeout(secs(30))
            .expect("every putter is answered once the broker shuts down");
        assert!(matches!(end, Error::ShutDown), "{end:?}");
    }
}
