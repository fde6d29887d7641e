//! Under a real clock `now` is rounded down to its tick, so a shard built with
//! `for_real_time` gives every deadline one more tick: nothing ends before its full duration
//! has passed in real time.

use std::time::Duration;

use leasemq_engine::{Command, ConsumerConfig, Effects, Message, QueueConfig, Reply, Shard};

/// A queue with a 10-tick lease and one consumer holding one delivery made at tick 5;
/// returns the tick at which the lease ran out.
fn expiry_tick(shard: Shard) -> u64 {
    let mut shard = shard;
    let mut out = Effects::new();
    let config = Box::new(QueueConfig {
        ack_timeout: Duration::from_millis(10),
        ..QueueConfig::default()
    });
    shard.handle(
        5,
        Command::Declare {
            name: "q".into(),
            config,
        },
        &mut out,
    );
    let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
        panic!("declare failed")
    };
    let config = ConsumerConfig::default();
    shard.handle(
        5,
        Command::Consume {
            queue,
            name: "c".into(),
            config,
            priority: 0,
            ack_timeout: None,
        },
        &mut out,
    );
    shard.handle(
        5,
        Command::Put {
            queue,
            message: Message::new("m"),
        },
        &mut out,
    );
    assert_eq!(out.deliveries.len(), 1);
    out.deliveries.clear();
    for now in 6..40 {
        shard.handle_timeout(now, &mut out);
        if shard.stats(queue).expect("live").expired == 1 {
            return now;
        }
    }
    panic!("the lease never ran out")
}

#[test]
fn manual_time_expires_a_lease_exactly_at_its_deadline() {
    assert_eq!(expiry_tick(Shard::new(0, Duration::from_millis(1))), 15);
}

#[test]
fn real_time_expires_a_lease_one_tick_later() {
    let shard = Shard::new(0, Duration::from_millis(1)).for_real_time();
    assert_eq!(expiry_tick(shard), 16);
}
