//! The engine's put → deliver → ack cycle with 100 000 leases outstanding, run a fixed number
//! of times: for instruction counts under `valgrind --tool=callgrind`, which repeat exactly
//! where wall-clock timings do not.
//! `cargo build --release -p leasemq-bench-harness --example cycle_count &&
//!  valgrind --tool=callgrind target/release/examples/cycle_count 200000`

use std::collections::VecDeque;
use std::time::Duration;

use leasemq_bench_harness::engine;
use leasemq_engine::{Command, DeliveryTag, Effects, Reply, Settle, Shard};

fn main() {
    let cycles: u64 = std::env::args()
        .nth(1)
        .map_or(200_000, |a| a.parse().expect("cycles"));
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let mut out = Effects::new();
    let queue = engine::declare(&mut shard, &mut out, "cycle");
    for name in ["a", "b"] {
        engine::consume(&mut shard, &mut out, queue, name, 65_535);
    }
    let mut outstanding = VecDeque::new();
    let put = |shard: &mut Shard, out: &mut Effects, outstanding: &mut VecDeque<DeliveryTag>| {
        engine::put(shard, out, queue);
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
