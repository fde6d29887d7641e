//! RabbitMQ through `lapin`, driven by a tokio runtime the worker threads block on:
//! a non-durable queue, basic.publish on a confirm-mode channel waiting for each message's
//! confirm, basic.consume with basic.qos prefetch, basic.ack per delivery. One connection
//! (and channel) per producer and per consumer thread, like the other brokers.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::runtime::Runtime;

use super::{body_from, fresh_name, Consumer, Producer, Target, PREFETCH};
use crate::cpu;
use crate::harness::Body;

/// Runtime threads that run lapin's connection I/O.
const RUNTIME_THREADS: usize = 2;

pub struct Rabbitmq {
    runtime: Arc<Runtime>,
    uri: String,
    queue: String,
    admin: Link,
}

impl Rabbitmq {
    pub fn connect(uri: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .enable_all()
            .build()?;
        let queue = fresh_name("leasemq-peers");
        let admin = runtime
            .block_on(async {
                let link = open_channel(uri).await?;
                let options = QueueDeclareOptions {
                    durable: false,
                    ..QueueDeclareOptions::default()
                };
                let name = queue.as_str().into();
                let declare = link
                    .channel
                    .queue_declare(name, options, FieldTable::default());
                declare.await?;
                anyhow::Ok(link)
            })
            .context("connecting to RabbitMQ")?;
        Ok(Rabbitmq {
            runtime: Arc::new(runtime),
            uri: uri.to_string(),
            queue,
            admin,
        })
    }
}

/// A connection and its one channel; the connection is kept so it stays open.
struct Link {
    _connection: Connection,
    channel: Channel,
}

async fn open_channel(uri: &str) -> Result<Link> {
    let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    Ok(Link {
        _connection: connection,
        channel,
    })
}

impl Target for Rabbitmq {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn server_pids(&self) -> Vec<u32> {
        cpu::pids_named("beam.smp")
    }

    fn producer(&self) -> Result<Box<dyn Producer>> {
        let link = self.runtime.block_on(async {
            let link = open_channel(&self.uri).await?;
            let select = link.channel.confirm_select(ConfirmSelectOptions::default());
            select.await?;
            anyhow::Ok(link)
        })?;
        Ok(Box::new(RabbitmqProducer {
            runtime: self.runtime.clone(),
            link,
            queue: self.queue.clone(),
        }))
    }

    fn consumer(&self, index: usize) -> Result<Box<dyn Consumer>> {
        let (link, consumer) = self.runtime.block_on(async {
            let link = open_channel(&self.uri).await?;
            let channel = &link.channel;
            channel
                .basic_qos(PREFETCH, BasicQosOptions::default())
                .await?;
            let consume = channel.basic_consume(
                self.queue.as_str().into(),
                format!("c{index}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            );
            let consumer = consume.await?;
            anyhow::Ok((link, consumer))
        })?;
        Ok(Box::new(RabbitmqConsumer {
            runtime: self.runtime.clone(),
            _link: link,
            consumer,
            held: None,
        }))
    }

    fn finish(&self) -> Result<()> {
        let delete = self
            .admin
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default());
        self.runtime.block_on(delete)?;
        Ok(())
    }
}

struct RabbitmqProducer {
    runtime: Arc<Runtime>,
    link: Link,
    queue: String,
}

impl Producer for RabbitmqProducer {
    fn put(&mut self, body: &Body) -> Result<()> {
        let confirmation = self.runtime.block_on(async {
            let confirm = self
                .link
                .channel
                .basic_publish(
                    "".into(),
                    self.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await?;
            anyhow::Ok(confirm.await?)
        })?;
        if !confirmation.is_ack() {
            bail!("RabbitMQ nacked a publish: {confirmation:?}");
        }
        Ok(())
    }
}

struct RabbitmqConsumer {
    runtime: Arc<Runtime>,
    _link: Link,
    consumer: lapin::Consumer,
    held: Option<lapin::message::Delivery>,
}

impl Consumer for RabbitmqConsumer {
    fn next(&mut self, wait: Duration) -> Result<Option<Body>> {
        // The timer must be made inside the runtime, so inside the block_on.
        let next = async { tokio::time::timeout(wait, self.consumer.next()).await };
        let delivery = match self.runtime.block_on(next) {
            Err(_elapsed) => return Ok(None),
            Ok(None) => bail!("RabbitMQ cancelled the consumer"),
            Ok(Some(delivery)) => delivery?,
        };
        let body = body_from(&delivery.data)?;
        self.held = Some(delivery);
        Ok(Some(body))
    }

    fn ack(&mut self) -> Result<()> {
        let Some(delivery) = self.held.take() else {
            bail!("ack without a delivery");
        };
        let acked = self
            .runtime
            .block_on(delivery.ack(BasicAckOptions::default()))?;
        if !acked {
            bail!(
                "lapin refused the ack of delivery {}",
                delivery.delivery_tag
            );
        }
        Ok(())
    }
}
