//! Contract §3 Limits and §3 `declare_queue`, and the defaults and trait bounds of contract §5.

use std::time::Duration;

use leasemq::{
    Broker, Consumer, ConsumerConfig, Delivery, Error, Message, PutOutcome, Queue, QueueConfig,
    RetryPolicy,
};

mod common;
use common::*;

const MIB: usize = 1024 * 1024;

/// Declares `name` with `config` and expects `InvalidConfig`, leaving no queue behind.
fn assert_invalid_config(broker: &Broker, name: &str, config: QueueConfig) {
    assert_err!(broker.declare_queue(name, config), Error::InvalidConfig(_));
    assert!(broker.queue(name).is_none(), "{name} must not exist");
}

fn declares(broker: &Broker, name: &str, config: QueueConfig) -> Queue {
    broker
        .declare_queue(name, config)
        .unwrap_or_else(|e| panic!("{name} should be declared: {e}"))
}

fn with_retry(initial: Duration, multiplier: f64, max: Duration, jitter: f64) -> QueueConfig {
    QueueConfig {
        retry: RetryPolicy {
            initial,
            multiplier,
            max,
            jitter,
        },
        ..QueueConfig::default()
    }
}

// --- queue config limits -----------------------------------------------------------------

#[test]
fn ack_timeout_must_be_between_one_millisecond_and_seven_days() {
    let broker = broker();
    let timeout = |ack_timeout| QueueConfig {
        ack_timeout,
        ..QueueConfig::default()
    };
    assert_invalid_config(&broker, "lim.t0", timeout(Duration::ZERO));
    assert_invalid_config(&broker, "lim.t1", timeout(Duration::from_micros(999)));
    assert_invalid_config(&broker, "lim.t2", timeout(SEVEN_DAYS + ms(1)));
    declares(&broker, "lim.t3", timeout(ms(1)));
    declares(&broker, "lim.t4", timeout(SEVEN_DAYS));
}

/// Contract §7: a durable queue needs a broker with a data dir. The answer says so, names
/// the field, and leaves nothing behind; the same config with `durable: false` is declared.
#[test]
fn a_durable_queue_without_a_data_dir_is_invalid_config() {
    let broker = broker();
    let durable = QueueConfig {
        durable: true,
        ..QueueConfig::default()
    };
    match broker.declare_queue("lim.durable", durable) {
        Err(Error::InvalidConfig(why)) => {
            assert!(why.contains("durable") && why.contains("data dir"), "{why}");
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert!(broker.queue("lim.durable").is_none());
    assert!(
        !QueueConfig::default().durable,
        "queues are in memory by default"
    );
    declares(&broker, "lim.durable", QueueConfig::default());
    let storage = Error::Storage("wal/0/00000001.wal: fsync failed".into());
    assert!(storage.to_string().contains("fsync failed"), "{storage}");
}

#[test]
fn max_lease_must_not_be_shorter_than_ack_timeout() {
    let broker = broker();
    let lease = |max_lease| QueueConfig {
        ack_timeout: secs(10),
        max_lease: Some(max_lease),
        ..QueueConfig::default()
    };
    assert_invalid_config(&broker, "lim.l0", lease(secs(10) - ms(1)));
    assert_invalid_config(&broker, "lim.l1", lease(Duration::ZERO));
    declares(&broker, "lim.l2", lease(secs(10)));
    declares(&broker, "lim.l3", lease(SEVEN_DAYS * 4));
}

#[test]
fn retry_multiplier_below_one_or_jitter_outside_zero_to_one_is_invalid() {
    let broker = broker();
    let (s1, s60) = (secs(1), secs(60));
    assert_invalid_config(&broker, "lim.r0", with_retry(s1, 0.99, s60, 0.0));
    assert_invalid_config(&broker, "lim.r1", with_retry(s1, 0.0, s60, 0.0));
    assert_invalid_config(&broker, "lim.r2", with_retry(s1, f64::NAN, s60, 0.0));
    assert_invalid_config(&broker, "lim.r3", with_retry(s1, 2.0, s60, -0.01));
    assert_invalid_config(&broker, "lim.r4", with_retry(s1, 2.0, s60, 1.01));
    assert_invalid_config(&broker, "lim.r5", with_retry(s1, 2.0, s60, f64::NAN));
    declares(&broker, "lim.r6", with_retry(s1, 1.0, s60, 0.0));
    declares(&broker, "lim.r7", with_retry(s1, 2.0, s60, 1.0));
    declares(&broker, "lim.r8", with_retry(s1, 3.5, s60, 0.25));
}

#[test]
fn counts_and_sizes_must_be_at_least_one_and_bodies_at_most_64_mib() {
    let broker = broker();
    let d = QueueConfig::default;
    let configs_that_fail = [
        QueueConfig {
            max_deliveries: Some(0),
            ..d()
        },
        QueueConfig {
            max_length: Some(0),
            ..d()
        },
        QueueConfig {
            max_body_bytes: 0,
            ..d()
        },
        QueueConfig {
            max_body_bytes: 64 * MIB + 1,
            ..d()
        },
    ];
    for (i, config) in configs_that_fail.into_iter().enumerate() {
        assert_invalid_config(&broker, &format!("lim.c{i}"), config);
    }
    let configs_that_work = [
        QueueConfig {
            max_deliveries: Some(1),
            ..d()
        },
        QueueConfig {
            max_length: Some(1),
            ..d()
        },
        QueueConfig {
            max_body_bytes: 1,
            ..d()
        },
        QueueConfig {
            max_body_bytes: 64 * MIB,
            ..d()
        },
    ];
    for (i, config) in configs_that_work.into_iter().enumerate() {
        declares(&broker, &format!("lim.ok{i}"), config);
    }
}

#[test]
fn prefetch_must_be_between_1_and_65535() {
    let broker = broker();
    let q = declares(&broker, "lim.prefetch", QueueConfig::default());
    assert_err!(q.consume("zero", prefetch(0)), Error::InvalidConfig(_));
    assert_err!(q.consume("big", prefetch(65_536)), Error::InvalidConfig(_));
    assert_stats!(q, { consumers: 0 });
    let _one = q.consume("one", prefetch(1)).unwrap();
    let _max = q.consume("max", prefetch(65_535)).unwrap();
    assert_stats!(q, { consumers: 2 });
}

// --- message and name limits -------------------------------------------------------------

#[test]
fn message_id_must_be_1_to_1024_bytes() {
    let broker = broker();
    let q = declares(&broker, "lim.id", QueueConfig::default());
    assert_err!(
        q.put(Message::new("x").with_id("")),
        Error::InvalidMessage(_)
    );
    assert_err!(
        q.put(Message::new("x").with_id("i".repeat(1025))),
        Error::InvalidMessage(_)
    );
    // 1 024 bytes, counted in bytes: 512 two-byte characters.
    assert_eq!(
        q.put(Message::new("x").with_id("i".repeat(1024))).unwrap(),
        PutOutcome::Enqueued
    );
    assert_eq!(
        q.put(Message::new("x").with_id("é".repeat(512))).unwrap(),
        PutOutcome::Enqueued
    );
    assert_err!(
        q.put(Message::new("x").with_id(format!("{}i", "é".repeat(512)))),
        Error::InvalidMessage(_)
    );
    assert_eq!(
        q.put(Message::new("x").with_id("1")).unwrap(),
        PutOutcome::Enqueued
    );
    assert_err!(
        q.put(
            Message::new("x")
                .with_id("d")
                .with_delay(SEVEN_DAYS + ms(1))
        ),
        Error::InvalidMessage(_)
    );
    assert_stats!(q, { enqueued: 3 });
}

#[test]
fn consumer_names_are_1_to_255_bytes_of_utf8() {
    let broker = broker();
    let q = declares(&broker, "lim.cname", QueueConfig::default());
    assert_err!(q.consume("", prefetch(1)), Error::InvalidName);
    assert_err!(q.consume(&"n".repeat(256), prefetch(1)), Error::InvalidName);
    assert_err!(q.consume(&"é".repeat(128), prefetch(1)), Error::InvalidName);
    let long = q.consume(&"n".repeat(255), prefetch(1)).unwrap();
    assert_eq!(long.name(), "n".repeat(255));
    let _wide = q.consume(&"é".repeat(127), prefetch(1)).unwrap();
    let free_form = q.consume("worker #1 / ✓", prefetch(1)).unwrap();
    assert_eq!(free_form.name(), "worker #1 / ✓");
    assert_stats!(q, { consumers: 3 });
}

#[test]
fn queue_names_are_1_to_255_bytes_of_letters_digits_and_dot_underscore_colon_dash() {
    let broker = broker();
    for bad in [
        String::new(),
        "with space".into(),
        "slash/name".into(),
        "star*".into(),
        "é".into(),
        "q".repeat(256),
    ] {
        assert_err!(
            broker.declare_queue(&bad, QueueConfig::default()),
            Error::InvalidName
        );
    }
    for good in [
        "AZaz09._:-".to_string(),
        "q".repeat(255),
        "x".into(),
        "tenant-1:orders.v2_dlq".into(),
    ] {
        let q = declares(&broker, &good, QueueConfig::default());
        assert_eq!(q.name(), good);
        assert_eq!(broker.queue(&good).unwrap().name(), good);
    }
}

// --- declare_queue ----------------------------------------------------------------------

#[test]
fn declare_queue_is_idempotent_for_an_equal_config() {
    let broker = broker();
    let config = QueueConfig {
        ack_timeout: secs(12),
        max_length: Some(10),
        dedup_window: secs(5),
        ..QueueConfig::default()
    };
    let first = declares(&broker, "decl.same", config.clone());
    let second = declares(&broker, "decl.same", config.clone());
    first.put(Message::new("x").with_id("x")).unwrap();
    assert_eq!(
        second.put(Message::new("x").with_id("x")).unwrap(),
        PutOutcome::Duplicate
    );
    assert_stats!(second, { enqueued: 1, duplicates: 1, ready: 1 });
    assert_eq!(first.stats(), broker.queue("decl.same").unwrap().stats());
}

#[test]
fn declare_queue_with_a_different_config_is_a_config_mismatch() {
    let broker = broker();
    let q = declares(&broker, "decl.diff", QueueConfig::default());
    q.put(Message::new("x").with_id("x")).unwrap();
    assert_err!(
        broker.declare_queue(
            "decl.diff",
            QueueConfig {
                ack_timeout: secs(31),
                ..QueueConfig::default()
            }
        ),
        Error::ConfigMismatch
    );
    assert_err!(
        broker.declare_queue(
            "decl.diff",
            QueueConfig {
                retry: RetryPolicy::immediate(),
                ..QueueConfig::default()
            }
        ),
        Error::ConfigMismatch
    );
    // The existing queue is untouched.
    assert_stats!(q, { ready: 1, enqueued: 1 });
}

#[test]
fn dead_letter_queue_must_already_exist() {
    let broker = broker();
    let config = QueueConfig {
        dead_letter: Some("decl.nowhere".into()),
        ..QueueConfig::default()
    };
    match broker.declare_queue("decl.src", config.clone()) {
        Err(Error::UnknownQueue(name)) => assert_eq!(name, "decl.nowhere"),
        Err(other) => panic!("expected UnknownQueue, got {other:?}"),
        Ok(_) => panic!("expected UnknownQueue, got Ok"),
    }
    assert!(broker.queue("decl.src").is_none());
    declares(&broker, "decl.nowhere", QueueConfig::default());
    declares(&broker, "decl.src", config);
}

#[test]
fn dead_letter_queue_must_be_another_queue() {
    let broker = broker();
    assert_invalid_config(
        &broker,
        "decl.self",
        QueueConfig {
            dead_letter: Some("decl.self".into()),
            ..QueueConfig::default()
        },
    );
}

#[test]
fn unknown_queue_lookup_is_none() {
    let broker = broker();
    assert!(broker.queue("decl.never").is_none());
}

#[test]
fn errors_are_std_errors_with_a_message() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    let broker = broker();
    let err = match broker.declare_queue(
        "err.src",
        QueueConfig {
            dead_letter: Some("err.missing".into()),
            ..QueueConfig::default()
        },
    ) {
        Err(e) => e,
        Ok(_) => panic!("the dead-letter queue does not exist"),
    };
    is_error(&err);
    assert!(err.to_string().contains("err.missing"), "{err}");
    let err = match broker.declare_queue(
        "err.timeout",
        QueueConfig {
            ack_timeout: Duration::ZERO,
            ..QueueConfig::default()
        },
    ) {
        Err(e) => e,
        Ok(_) => panic!("ack_timeout zero is invalid"),
    };
    assert!(!err.to_string().is_empty());
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert!(!boxed.to_string().is_empty());
}

// --- defaults and trait bounds -----------------------------------------------------------

#[test]
fn defaults_are_the_documented_ones() {
    let config = QueueConfig::default();
    assert_eq!(config.ack_timeout, secs(30));
    assert_eq!(config.max_lease, None);
    assert_eq!(config.max_deliveries, None);
    assert_eq!(config.dead_letter, None);
    assert_eq!(config.dedup_window, Duration::ZERO);
    assert_eq!(config.max_length, None);
    assert_eq!(config.max_body_bytes, MIB);
    assert_eq!(
        config.retry,
        RetryPolicy {
            initial: secs(1),
            multiplier: 2.0,
            max: secs(60),
            jitter: 0.0
        }
    );
    assert_eq!(RetryPolicy::default(), config.retry);
    assert_eq!(
        RetryPolicy::immediate(),
        RetryPolicy {
            initial: Duration::ZERO,
            multiplier: 1.0,
            max: Duration::ZERO,
            jitter: 0.0
        }
    );
    assert_eq!(ConsumerConfig::default().prefetch, 100);
}

#[test]
fn default_prefetch_is_one_hundred_and_default_ack_timeout_thirty_seconds() {
    let broker = broker();
    let q = declares(&broker, "def.queue", QueueConfig::default());
    let _a = q.consume("a", ConsumerConfig::default()).unwrap();
    let msgs = (0..101)
        .map(|i| Message::new("x").with_id(format!("m{i}")))
        .collect();
    q.put_batch(msgs).unwrap();
    assert_stats!(q, { leased: 100, ready: 1 });
    broker.advance(secs(30) - ms(1)).unwrap();
    assert_stats!(q, { expired: 0 });
    broker.advance(ms(1)).unwrap();
    // All hundred came back, and returned messages go before the fresh one.
    assert_stats!(q, { expired: 100, leased: 100, ready: 1, delivered: 200 });
}

#[test]
fn handles_have_the_documented_thread_bounds() {
    fn clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    clone_send_sync::<Broker>();
    clone_send_sync::<Queue>();
    send::<Consumer>();
    send::<Delivery>();
    let system = Broker::new().unwrap();
    system.shutdown();
}
