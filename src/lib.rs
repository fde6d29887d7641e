//! leasemq: an embeddable, sharded, lease-based work queue.
//!
//! placeholder: the tutorial is written below.

pub use leasemq_engine::{
    ConsumerConfig, DeathReason, DeathRecord, DeliveryTag, Envelope, Error, Message, PutOutcome,
    QueueConfig, QueueStats, RetryPolicy, Settle,
};
pub use leasemq_shard::{shard_for, Broker, BrokerBuilder, Consumer, Delivery, Queue};
