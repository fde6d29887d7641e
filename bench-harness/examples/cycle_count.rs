//! The engine's put → deliver → ack cycle with 100 000 leases outstanding, run a fixed number
//! of times: for instruction counts under `valgrind --tool=callgrind`, which repeat exactly
//! where wall-clock timings do not.
//! `cargo build --release -p leasemq-bench-harness --example cycle_count &&
//!  valgrind --tool=callgrind target/release/examples/cycle_count 200000`

use std::collections::VecDeque;
use std::time::Duration;

use leasemq_engine::{
    Command, ConsumerConfig, DeliveryTag, Effects, Message, QueueConfig, Reply, Settle, Shard,
};

fn main() {
    let cycles: u64 = std::env::args()
        .nth(1)
        .map_or(200_000, |a| a.parse().expect("cycles"));
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let mut out = Effects::new();
    let config = Box::new(QueueConfig::default());
    shard.handle(
        1,
        Command::Declare {
            name: "cycle".into(),
            config,
        },
        &mut out,
    );
    let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
        panic!("declare failed")
    };
    for name in ["a", "b"] {
        let config = ConsumerConfig { prefetch: 65_535 };
        shard.handle(
            1,
            Command::Consume {
                queue,
                name: name.into(),
                config,
            },
            &mut out,
        );
        out.reply.take();
    }
    let mut outstanding = VecDeque::new();
    let body = bytes::Bytes::from_static(b"0123456789abcdef");
    let put = |shard: &mut Shard, out: &mut Effects, outstanding: &mut VecDeque<DeliveryTag>| {
        let message = Message::new(body.clone());
        shard.handle(1, Command::Put { queue, message }, out);
        out.reply.take();
        for (_, d) in out.deliveries.drain(..) {
            outstanding.push_back(d.tag);
        }
    };
    for _ in 0..100_000 {
        put(&mut shard, &mut out, &mut outstanding);
    }
    for _ in 0..cycles {
        put(&mut shard, &mut out, &mut outstanding);
        let tag = outstanding.pop_front().expect("outstanding");
        shard.handle(
            1,
            Command::Settle {
                queue,
                tag,
                op: Settle::Ack,
            },
            &mut out,
        );
        assert_eq!(out.reply.take(), Some(Reply::Settled(true)));
    }
    println!(
        "{} cycles, {} leases outstanding",
        cycles,
        shard.stats(queue).map_or(0, |s| s.leased)
    );
}
