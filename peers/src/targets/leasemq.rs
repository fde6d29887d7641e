//! leasemq embedded in this process: `Queue::put`, `Consumer::recv_timeout`,
//! `Delivery::ack`, one queue on a broker with `shards` shard threads.

use std::time::Duration;

use anyhow::{bail, Result};
use bytes::Bytes;
use leasemq::{Broker, ConsumerConfig, Delivery, Message, Queue, QueueConfig};

use super::{body_from, Consumer, Producer, Target, LEASE, PREFETCH};
use crate::harness::Body;

pub struct Leasemq {
    broker: Broker,
    queue: Queue,
}

impl Leasemq {
    pub fn start(shards: usize) -> Result<Self> {
        let broker = Broker::builder().shards(shards).build()?;
        let config = QueueConfig {
            ack_timeout: LEASE,
            ..QueueConfig::default()
        };
        let queue = broker.declare_queue("peers", config)?;
        Ok(Leasemq { broker, queue })
    }
}

impl Target for Leasemq {
    fn name(&self) -> &'static str {
        "leasemq"
    }

    fn is_remote(&self) -> bool {
        false
    }

    fn server_pids(&self) -> Vec<u32> {
        Vec::new()
    }

    fn producer(&self) -> Result<Box<dyn Producer>> {
        Ok(Box::new(LeasemqProducer {
            queue: self.queue.clone(),
        }))
    }

    fn consumer(&self, index: usize) -> Result<Box<dyn Consumer>> {
        let config = ConsumerConfig {
            prefetch: u32::from(PREFETCH),
        };
        let consumer = self.queue.consume(&format!("c{index}"), config)?;
        Ok(Box::new(LeasemqConsumer {
            consumer,
            held: None,
        }))
    }

    fn finish(&self) -> Result<()> {
        self.broker.shutdown();
        Ok(())
    }
}

struct LeasemqProducer {
    queue: Queue,
}

impl Producer for LeasemqProducer {
    fn put(&mut self, body: &Body) -> Result<()> {
        self.queue.put(Message::new(Bytes::copy_from_slice(body)))?;
        Ok(())
    }
}

struct LeasemqConsumer {
    consumer: leasemq::Consumer,
    held: Option<Delivery>,
}

impl Consumer for LeasemqConsumer {
    fn next(&mut self, wait: Duration) -> Result<Option<Body>> {
        let Some(delivery) = self.consumer.recv_timeout(wait)? else {
            return Ok(None);
        };
        let body = body_from(&delivery.envelope().body)?;
        self.held = Some(delivery);
        Ok(Some(body))
    }

    fn ack(&mut self) -> Result<()> {
        let Some(delivery) = self.held.take() else {
            bail!("ack without a delivery");
        };
        if !delivery.ack() {
            bail!("leasemq refused the ack of tag {:?}", delivery.tag());
        }
        Ok(())
    }
}
