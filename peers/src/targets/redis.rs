//! Redis Streams with a consumer group, through the `redis` crate's sync connection:
//! XADD (one entry per call), XREADGROUP GROUP g c COUNT 1 BLOCK ms `>`, XACK per entry.
//! An entry read by a group member stays in the group's pending list until its XACK.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::{Commands, Connection, Value};

use super::{body_from, fresh_name, Consumer, Producer, Target};
use crate::cpu;
use crate::harness::Body;

const GROUP: &str = "workers";
const FIELD: &str = "b";

pub struct Redis {
    client: redis::Client,
    stream: String,
}

impl Redis {
    pub fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let stream = fresh_name("leasemq-peers");
        let mut con = client.get_connection().context("connecting to Redis")?;
        let () = con.xgroup_create_mkstream(&stream, GROUP, "$")?;
        Ok(Redis { client, stream })
    }
}

impl Target for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn server_pids(&self) -> Vec<u32> {
        cpu::pids_named("redis-server")
    }

    fn producer(&self) -> Result<Box<dyn Producer>> {
        Ok(Box::new(RedisProducer {
            con: self.client.get_connection()?,
            stream: self.stream.clone(),
        }))
    }

    fn consumer(&self, index: usize) -> Result<Box<dyn Consumer>> {
        Ok(Box::new(RedisConsumer {
            con: self.client.get_connection()?,
            stream: self.stream.clone(),
            name: format!("c{index}"),
            held: None,
        }))
    }

    fn finish(&self) -> Result<()> {
        let mut con = self.client.get_connection()?;
        let _: usize = con.del(&self.stream)?;
        Ok(())
    }
}

struct RedisProducer {
    con: Connection,
    stream: String,
}

impl Producer for RedisProducer {
    fn put(&mut self, body: &Body) -> Result<()> {
        let id: Option<String> = self.con.xadd(&self.stream, "*", &[(FIELD, &body[..])])?;
        if id.is_none() {
            bail!("XADD returned no id");
        }
        Ok(())
    }
}

struct RedisConsumer {
    con: Connection,
    stream: String,
    name: String,
    held: Option<String>,
}

impl Consumer for RedisConsumer {
    fn next(&mut self, wait: Duration) -> Result<Option<Body>> {
        let options = StreamReadOptions::default()
            .group(GROUP, &self.name)
            .count(1)
            .block(wait.as_millis() as usize);
        let reply: Option<StreamReadReply> =
            self.con.xread_options(&[&self.stream], &[">"], &options)?;
        let Some(entry) = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .next()
        else {
            return Ok(None);
        };
        let body = match entry.map.get(FIELD) {
            Some(Value::BulkString(bytes)) => body_from(bytes)?,
            other => bail!("entry {} has no body: {other:?}", entry.id),
        };
        self.held = Some(entry.id);
        Ok(Some(body))
    }

    fn ack(&mut self) -> Result<()> {
        let Some(id) = self.held.take() else {
            bail!("ack without an entry");
        };
        let acked: usize = self.con.xack(&self.stream, GROUP, &[&id])?;
        if acked != 1 {
            bail!("XACK of {id} acked {acked} entries");
        }
        Ok(())
    }
}
