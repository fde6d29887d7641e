//! The engine's hot path allocates nothing per message once warm: a put, its delivery and
//! its ack reuse slab slots, hash-table capacity, wheel entries and the effect vectors.
//! Counted with a global allocator that tallies every allocation made on this thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use leasemq_engine::{
    Command, ConsumerConfig, DeliveryTag, Effects, Message, QueueConfig, Reply, Settle, Shard,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

/// Runs `cycles` put → deliver → settle rounds, each settle picked by `settle`, and returns
/// the allocations they made.
fn cycles(settle: Settle, outstanding: u64, cycles: u64) -> u64 {
    let mut shard = Shard::new(0, Duration::from_millis(1));
    let mut out = Effects::new();
    let config = QueueConfig {
        ack_timeout: Duration::from_secs(60),
        retry: leasemq_engine::RetryPolicy::immediate(),
        ..QueueConfig::default()
    };
    shard.handle(
        0,
        Command::Declare {
            name: "hot".into(),
            config: Box::new(config),
        },
        &mut out,
    );
    let Some(Reply::Declared(Ok(queue))) = out.reply.take() else {
        panic!("declare failed")
    };
    let consumer = ConsumerConfig { prefetch: 65_535 };
    shard.handle(
        0,
        Command::Consume {
            queue,
            name: "c".into(),
            config: consumer,
            priority: 0,
            ack_timeout: None,
        },
        &mut out,
    );
    assert!(matches!(out.reply.take(), Some(Reply::Consumed(Ok(_)))));

    // Each round: put, take its delivery, settle it; a nack (immediate retry) redelivers at
    // once under a fresh tag, which is then acked. The `outstanding` leases stay throughout.
    let run = |shard: &mut Shard, out: &mut Effects, now: u64| {
        shard.handle(
            now,
            Command::Put {
                queue,
                message: Message::new("0123456789abcdef"),
            },
            out,
        );
        assert_eq!(
            out.reply.take(),
            Some(Reply::Put(Ok(leasemq_engine::PutOutcome::Enqueued)))
        );
        let tag = delivered_tag(out);
        shard.handle(
            now,
            Command::Settle {
                queue,
                tag,
                op: settle,
            },
            out,
        );
        assert_eq!(out.reply.take(), Some(Reply::Settled(true)));
        if settle == Settle::Nack {
            let again = delivered_tag(out);
            assert!(again > tag, "a redelivery has a fresh tag");
            shard.handle(
                now,
                Command::Settle {
                    queue,
                    tag: again,
                    op: Settle::Ack,
                },
                out,
            );
            assert_eq!(out.reply.take(), Some(Reply::Settled(true)));
        }
        assert!(out.deliveries.is_empty());
    };
    let cold = allocations();
    // Warm up: fill `outstanding` leases, then cycle until every structure has its capacity.
    for _ in 0..outstanding {
        shard.handle(
            0,
            Command::Put {
                queue,
                message: Message::new("warm"),
            },
            &mut out,
        );
        out.reply.take();
    }
    out.deliveries.clear();
    for now in 0..20_000 {
        run(&mut shard, &mut out, now / 8);
    }
    assert!(
        allocations() > cold,
        "the counter sees the warm-up's allocations"
    );
    let before = allocations();
    for now in 0..cycles {
        run(&mut shard, &mut out, 2_500 + now / 8);
    }
    allocations() - before
}

fn delivered_tag(out: &mut Effects) -> DeliveryTag {
    assert_eq!(out.deliveries.len(), 1, "exactly one delivery");
    out.deliveries.pop().expect("checked").1.tag
}

#[test]
fn put_deliver_ack_allocates_nothing_once_warm() {
    assert_eq!(cycles(Settle::Ack, 1_000, 50_000), 0);
}

#[test]
fn put_deliver_nack_redeliver_allocates_nothing_once_warm() {
    assert_eq!(cycles(Settle::Nack, 1_000, 50_000), 0);
}
