//! beanstalkd: `put` with a TTR, `reserve-with-timeout`, `delete` per job, on a tube of
//! its own per run.
//!
//! A minimal client over `std::net::TcpStream` rather than a crate: the sync crates on
//! crates.io are unmaintained (`beanstalkc` 1.0.0, `beanstalkd` 0.4.1) and `beanstalkc`
//! builds each request by passing the body through `String::from_utf8_unchecked`, which is
//! undefined behaviour for this workload's binary 16-byte bodies; `tokio-beanstalkd` is
//! async only. The text protocol needs five commands here, each one line out and one line
//! (plus a body for RESERVED) back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{body_from, fresh_name, Consumer, Producer, Target, LEASE};
use crate::cpu;
use crate::harness::{Body, BODY_BYTES};

const PRIORITY: u32 = 1024;

pub struct Beanstalkd {
    addr: String,
    tube: String,
}

impl Beanstalkd {
    pub fn connect(addr: &str) -> Result<Self> {
        let tube = fresh_name("leasemq-peers");
        Conn::open(addr).context("connecting to beanstalkd")?;
        Ok(Beanstalkd {
            addr: addr.to_string(),
            tube,
        })
    }
}

impl Target for Beanstalkd {
    fn name(&self) -> &'static str {
        "beanstalkd"
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn server_pids(&self) -> Vec<u32> {
        cpu::pids_named("beanstalkd")
    }

    fn producer(&self) -> Result<Box<dyn Producer>> {
        let mut conn = Conn::open(&self.addr)?;
        conn.expect(&format!("use {}", self.tube), "USING")?;
        Ok(Box::new(BeanstalkdProducer { conn }))
    }

    fn consumer(&self, _index: usize) -> Result<Box<dyn Consumer>> {
        let mut conn = Conn::open(&self.addr)?;
        conn.expect(&format!("watch {}", self.tube), "WATCHING")?;
        conn.expect("ignore default", "WATCHING")?;
        Ok(Box::new(BeanstalkdConsumer { conn, held: None }))
    }

    fn finish(&self) -> Result<()> {
        // A tube vanishes once it is empty and no connection uses or watches it.
        Ok(())
    }
}

struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    line: String,
}

impl Conn {
    fn open(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            line: String::new(),
        })
    }

    /// Sends one request and reads the reply's first line into `self.line`.
    fn request(&mut self, request: &[u8]) -> Result<&str> {
        self.writer.write_all(request)?;
        self.line.clear();
        if self.reader.read_line(&mut self.line)? == 0 {
            bail!("beanstalkd closed the connection");
        }
        Ok(self.line.trim_end())
    }

    fn expect(&mut self, command: &str, status: &str) -> Result<()> {
        let reply = self.request(format!("{command}\r\n").as_bytes())?;
        if reply.split(' ').next() != Some(status) {
            bail!("{command}: beanstalkd answered {reply:?}");
        }
        Ok(())
    }
}

struct BeanstalkdProducer {
    conn: Conn,
}

impl Producer for BeanstalkdProducer {
    fn put(&mut self, body: &Body) -> Result<()> {
        let mut request =
            format!("put {PRIORITY} 0 {} {}\r\n", LEASE.as_secs(), body.len()).into_bytes();
        request.extend_from_slice(body);
        request.extend_from_slice(b"\r\n");
        let reply = self.conn.request(&request)?;
        if !reply.starts_with("INSERTED ") {
            bail!("put: beanstalkd answered {reply:?}");
        }
        Ok(())
    }
}

struct BeanstalkdConsumer {
    conn: Conn,
    held: Option<u64>,
}

impl Consumer for BeanstalkdConsumer {
    fn next(&mut self, wait: Duration) -> Result<Option<Body>> {
        // The protocol counts the timeout in whole seconds; 0 would poll.
        let secs = wait.as_secs().max(1);
        let reply = self
            .conn
            .request(format!("reserve-with-timeout {secs}\r\n").as_bytes())?;
        let fields: Vec<&str> = reply.split(' ').collect();
        match fields.as_slice() {
            ["TIMED_OUT"] | ["DEADLINE_SOON"] => Ok(None),
            ["RESERVED", id, bytes] => {
                let id: u64 = id.parse()?;
                let len: usize = bytes.parse()?;
                if len != BODY_BYTES {
                    bail!("job {id} has a {len}-byte body");
                }
                let mut data = [0u8; BODY_BYTES + 2];
                self.conn.reader.read_exact(&mut data)?;
                self.held = Some(id);
                Ok(Some(body_from(&data[..BODY_BYTES])?))
            }
            _ => bail!("reserve: beanstalkd answered {reply:?}"),
        }
    }

    fn ack(&mut self) -> Result<()> {
        let Some(id) = self.held.take() else {
            bail!("delete without a reserved job");
        };
        self.conn.expect(&format!("delete {id}"), "DELETED")
    }
}
