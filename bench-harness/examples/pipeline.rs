//! A quick two-thread put→ack pipeline against a 2-shard broker, printing messages/s for the
//! per-message calls and for the batched ones. Run with
//! `cargo run --release -p leasemq-bench-harness --example pipeline -- [messages] [runs] [per-message|batched]`.

use std::time::{Duration, Instant};

use leasemq::{Broker, ConsumerConfig, Message, QueueConfig};

fn run(per_message: bool, messages: u64) -> f64 {
    let broker = Broker::builder().shards(2).build().expect("broker");
    let config = QueueConfig {
        ack_timeout: Duration::from_secs(600),
        ..QueueConfig::default()
    };
    let queue = broker.declare_queue("pipeline", config).expect("declare");
    let consumer = queue
        .consume("c", ConsumerConfig { prefetch: 1000 })
        .expect("consume");
    let producer_queue = queue.clone();
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        if per_message {
            for _ in 0..messages {
                producer_queue
                    .put(Message::new(&b"0123456789abcdef"[..]))
                    .expect("put");
            }
        } else {
            let mut left = messages;
            while left > 0 {
                let n = left.min(256);
                let batch = (0..n)
                    .map(|_| Message::new(&b"0123456789abcdef"[..]))
                    .collect();
                producer_queue.put_batch(batch).expect("put_batch");
                left -= n;
            }
        }
    });
    let mut received = 0;
    while received < messages {
        let d = consumer.recv().expect("recv");
        received += 1;
        if per_message {
            assert!(d.ack());
        } else if received % 256 == 0 || received == messages {
            consumer.ack_up_to(d.tag());
        }
    }
    producer.join().expect("producer");
    let rate = messages as f64 / start.elapsed().as_secs_f64();
    assert_eq!(queue.stats().acked, messages);
    broker.shutdown();
    rate
}

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: u64 = args
        .next()
        .map_or(200_000, |a| a.parse().expect("messages"));
    let runs: usize = args.next().map_or(3, |a| a.parse().expect("runs"));
    let only = args.next();
    for (name, per_message) in [("per-message", true), ("batched", false)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut rates: Vec<f64> = (0..runs).map(|_| run(per_message, messages)).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        println!("{name:12} median {:>10.0} msg/s  runs {rates:.0?}", median);
    }
}
