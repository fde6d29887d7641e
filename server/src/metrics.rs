//! `--metrics ADDR`: Prometheus text at `/metrics`.
//!
//! The names follow RabbitMQ's Prometheus plugin where it has one, under the `leasemq_`
//! prefix: `leasemq_connections`, `leasemq_connections_opened_total`,
//! `leasemq_channels`, `leasemq_connection_incoming_bytes_total`,
//! `leasemq_queue_messages_ready{vhost,queue}`, `leasemq_queue_messages_unacked{vhost,queue}`,
//! `leasemq_queue_consumers{vhost,queue}`, `leasemq_auth_attempts_failed_total`, `leasemq_alarms_memory_used_watermark`, `leasemq_alarms_free_disk_space_watermark`, … Per-queue figures are read from the broker
//! (`Queue::stats`) at each scrape, so a deleted queue drops out of the next one. With a
//! data dir, each shard's log says what it owes the disk (`leasemq_log_unsynced_bytes`,
//! `leasemq_log_fsync_running_seconds`) and raises `leasemq_log_stalled` while it refuses
//! changes because the disk does not keep up or is full, `leasemq_log_failed` once a write
//! or fsync failed.
//!
//! The HTTP side answers `GET /metrics` and nothing else, one request per connection; a
//! general HTTP server would be more code than it replaces here.

use std::fmt::Write as _;
use std::time::Duration;

use leasemq::{Broker, LogLag, QueueStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the connections count as they go; shared by every connection of a server.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Open connections.
    pub connections: Gauge,
    /// Connections accepted.
    pub connections_opened: Counter,
    /// Connections ended, cleanly or not.
    pub connections_closed: Counter,
    /// Open channels.
    pub channels: Gauge,
    /// Bytes read from clients.
    pub incoming_bytes: Counter,
    /// Bytes written to clients.
    pub outgoing_bytes: Counter,
    /// Logins refused (RabbitMQ's `auth_attempts_failed`).
    pub auth_attempts_failed: Counter,
    /// TLS handshakes that failed or did not finish in time (`--tls-listen`).
    pub tls_handshake_failures: Counter,
    /// Messages dropped as a consumer or `basic.get` reached them, their TTL run out.
    pub ttl_expired: Counter,
    /// Dead letters dropped: their dead-letter exchange routed them nowhere, or a queue
    /// refused them (full).
    pub dead_letters_dropped: Counter,
    /// The process's resident memory at the memory alarm's last look (`memory.rs`).
    pub resident_memory: Gauge,
    /// The memory limit (`--memory-high-watermark`) in bytes.
    pub memory_limit: Gauge,
    /// 1 while the memory alarm is raised.
    pub memory_alarm: Gauge,
    /// The data dir's free disk space at the disk alarm's last look (`disk.rs`).
    pub disk_free: Gauge,
    /// The free-disk limit (`--disk-free-limit`) in bytes.
    pub disk_free_limit: Gauge,
    /// 1 while the disk alarm is raised.
    pub disk_alarm: Gauge,
}

impl Metrics {
    /// A registry with these metrics and the broker's queues.
    pub fn registry(&self, broker: Broker) -> Registry {
        let mut registry = Registry::with_prefix("leasemq");
        registry.register(
            "connections",
            "Open AMQP connections",
            self.connections.clone(),
        );
        registry.register(
            "connections_opened",
            "AMQP connections accepted",
            self.connections_opened.clone(),
        );
        registry.register(
            "connections_closed",
            "AMQP connections ended",
            self.connections_closed.clone(),
        );
        registry.register("channels", "Open AMQP channels", self.channels.clone());
        registry.register(
            "connection_incoming_bytes",
            "Bytes read from AMQP clients",
            self.incoming_bytes.clone(),
        );
        registry.register(
            "connection_outgoing_bytes",
            "Bytes written to AMQP clients",
            self.outgoing_bytes.clone(),
        );
        registry.register(
            "auth_attempts_failed",
            "Logins refused: unknown user, wrong password, or a user not allowed from there",
            self.auth_attempts_failed.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or did not finish in time",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "ttl_expired_messages",
            "Messages dropped at delivery because their TTL ran out",
            self.ttl_expired.clone(),
        );
        registry.register(
            "dead_letters_dropped",
            "Dead letters routed nowhere or refused by a full queue",
            self.dead_letters_dropped.clone(),
        );
        self.register_resources(&mut registry);
        if !broker.log_lag().is_empty() {
            registry.register_collector(Box::new(Logs {
                broker: broker.clone(),
            }));
        }
        registry.register_collector(Box::new(Queues { broker }));
        registry
    }

    /// The resources the alarms watch (`alarms.rs`): memory and disk, their limits, and
    /// whether each alarm is raised.
    fn register_resources(&self, registry: &mut Registry) {
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the server process",
            self.resident_memory.clone(),
        );
        registry.register(
            "resident_memory_limit_bytes",
            "The memory limit: publishers are blocked at or over it",
            self.memory_limit.clone(),
        );
        registry.register(
            "alarms_memory_used_watermark",
            "1 while the memory alarm blocks publishers",
            self.memory_alarm.clone(),
        );
        registry.register(
            "disk_space_available_bytes",
            "Free space of the data dir's file system",
            self.disk_free.clone(),
        );
        registry.register(
            "disk_space_available_limit_bytes",
            "The free-disk limit: publishers are blocked under it",
            self.disk_free_limit.clone(),
        );
        registry.register(
            "alarms_free_disk_space_watermark",
            "1 while the disk alarm blocks publishers",
            self.disk_alarm.clone(),
        );
    }
}

/// Per-queue gauges and counters, read from the broker at each scrape.
#[derive(Debug)]
struct Queues {
    broker: Broker,
}

type Field = fn(&QueueStats) -> u64;

/// Gauges: (name after `leasemq_queue_`, help, value).
const GAUGES: [(&str, &str, Field); 5] = [
    ("messages_ready", "Messages ready to deliver", |s| {
        s.ready as u64
    }),
    (
        "messages_delayed",
        "Messages waiting for a delay or a retry",
        |s| s.delayed as u64,
    ),
    (
        "messages_unacked",
        "Messages delivered and not yet settled (live leases)",
        |s| s.leased as u64,
    ),
    ("messages", "Messages ready, delayed and unacked", |s| {
        (s.ready + s.delayed + s.leased) as u64
    }),
    ("consumers", "Consumers taking deliveries", |s| {
        s.consumers as u64
    }),
];

/// Counters since the queue was declared: (name after `leasemq_queue_`, help, value).
const COUNTERS: [(&str, &str, Field); 11] = [
    (
        "messages_published",
        "Messages enqueued (dead letters taken in too)",
        |s| s.enqueued,
    ),
    ("messages_duplicate", "Puts answered Duplicate", |s| {
        s.duplicates
    }),
    ("messages_delivered", "Deliveries under a lease", |s| {
        s.delivered
    }),
    ("messages_acked", "Messages acked", |s| s.acked),
    (
        "messages_nacked",
        "Messages nacked (back after a retry delay)",
        |s| s.nacked,
    ),
    (
        "messages_rejected",
        "Messages rejected (dead-lettered)",
        |s| s.rejected,
    ),
    ("messages_released", "Messages handed back unseen", |s| {
        s.released
    }),
    ("messages_expired", "Leases that ran out", |s| s.expired),
    (
        "messages_dead_lettered",
        "Dead letters taken by the dead-letter queue",
        |s| s.dead_lettered,
    ),
    (
        "messages_dropped",
        "Dead letters dropped (no dead-letter queue took them), and messages dropped from the head of a full queue (x-max-length)",
        |s| s.dropped,
    ),
    ("stale_settles", "Settles of a lease that had ended", |s| {
        s.stale
    }),
];

impl Collector for Queues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats: Vec<(String, String, QueueStats)> = (self.broker.queue_names().into_iter())
            .filter_map(|name| {
                let stats = self.broker.queue(&name)?.stats();
                // Labelled with its virtual host and the name clients know it by there.
                let vhost = crate::names::vhost_of(&name).into_owned();
                Some((vhost, crate::names::amqp(&name).into_owned(), stats))
            })
            .collect();
        let queues = ConstGauge::new(stats.len() as i64);
        let family =
            encoder.encode_descriptor("queues", "Live queues", None, queues.metric_type())?;
        queues.encode(family)?;
        for (name, help, field) in GAUGES {
            let name = format!("queue_{name}");
            let metric = ConstGauge::new(0i64).metric_type();
            let mut family = encoder.encode_descriptor(&name, help, None, metric)?;
            for (vhost, queue, s) in &stats {
                let labels = [("vhost", vhost.as_str()), ("queue", queue.as_str())];
                let value = i64::try_from(field(s)).unwrap_or(i64::MAX);
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, field) in COUNTERS {
            let name = format!("queue_{name}");
            let metric = ConstCounter::new(0u64).metric_type();
            let mut family = encoder.encode_descriptor(&name, help, None, metric)?;
            for (vhost, queue, s) in &stats {
                let labels = [("vhost", vhost.as_str()), ("queue", queue.as_str())];
                ConstCounter::new(field(s)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Each shard's log with a data dir: what it owes the disk, and whether it takes changes.
#[derive(Debug)]
struct Logs {
    broker: Broker,
}

/// Per-shard log gauges: (name after `leasemq_log_`, help, value).
type LogField = fn(&LogLag) -> f64;

const LOG_GAUGES: [(&str, &str, LogField); 4] = [
    (
        "unsynced_bytes",
        "Bytes of a shard's log written or queued and not yet fsynced",
        |l| l.unsynced_bytes as f64,
    ),
    (
        "fsync_running_seconds",
        "How long the fsync in flight on a shard's log has run (0 with none)",
        |l| l.fsync_running.map_or(0.0, |d| d.as_secs_f64()),
    ),
    (
        "stalled",
        "1 while a shard's log refuses changes as its disk does not keep up or has no room",
        |l| f64::from(u8::from(l.stalled || l.waits_for_room)),
    ),
    (
        "failed",
        "1 once a write or fsync of a shard's log failed: its durable queues refuse changes until a restart",
        |l| f64::from(u8::from(l.failed)),
    ),
];

impl Collector for Logs {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let lags = self.broker.log_lag();
        for (name, help, field) in LOG_GAUGES {
            let name = format!("log_{name}");
            let metric = ConstGauge::new(0.0).metric_type();
            let mut family = encoder.encode_descriptor(&name, help, None, metric)?;
            for (shard, lag) in lags.iter().enumerate() {
                let shard = shard.to_string();
                let labels = [("shard", shard.as_str())];
                ConstGauge::new(field(lag)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The text a scrape gets.
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    if prometheus_client::encoding::prometheus_text::encode(&mut text, registry).is_err() {
        let _ = writeln!(text, "# leasemqd could not encode its metrics");
    }
    text
}

/// Binds `addr` and serves `GET /metrics` there (over TLS with `tls`); the ready line's
/// words for it.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn start(
    addr: std::net::SocketAddr,
    registry: std::sync::Arc<Registry>,
    tls: Option<std::sync::Arc<crate::tls::Tls>>,
) -> Result<String, String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for --metrics: {e}"))?;
    let at = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tokio::spawn(serve(listener, registry, tls));
    Ok(format!("; metrics on {scheme}://{at}/metrics"))
}

/// Serves `GET /metrics` on `listener` until the future is dropped. The registry is read
/// on a blocking thread, since reading queue stats makes broker calls.
pub async fn serve(
    listener: TcpListener,
    registry: std::sync::Arc<Registry>,
    tls: Option<std::sync::Arc<crate::tls::Tls>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let registry = registry.clone();
        let acceptor = tls.as_ref().map(|tls| tls.acceptor());
        tokio::spawn(async move {
            let _ = match acceptor {
                None => answer(stream, registry).await,
                // `--management-tls`: HTTPS with the AMQP listener's certificate.
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(Duration::from_secs(10), handshake).await {
                        Ok(Ok(stream)) => answer(stream, registry).await,
                        _ => Ok(()),
                    }
                }
            };
        });
    }
}

/// Reads one request head (at most 8 KiB, within 10 s) and answers it.
async fn answer(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    registry: std::sync::Arc<Registry>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let read_head = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read_head)
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let response = if method == b"GET" && (path == b"/metrics" || path.starts_with(b"/metrics?")) {
        let body = tokio::task::spawn_blocking(move || render(&registry))
            .await
            .unwrap_or_default();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        let body = "leasemqd serves GET /metrics only\n";
        format!(
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasemq::{ConsumerConfig, Message, QueueConfig};

    #[test]
    fn a_scrape_names_each_queue_with_its_figures() {
        let broker = Broker::builder().shards(2).manual_clock().build().unwrap();
        let jobs = broker
            .declare_queue("jobs", QueueConfig::default())
            .unwrap();
        broker
            .declare_queue("idle", QueueConfig::default())
            .unwrap();
        jobs.put_batch((0..3).map(|i| Message::new(format!("{i}"))).collect())
            .unwrap();
        let worker = jobs.consume("w", ConsumerConfig { prefetch: 1 }).unwrap();
        let metrics = Metrics::default();
        metrics.connections.inc();
        metrics.incoming_bytes.inc_by(1234);
        let text = render(&metrics.registry(broker.clone()));
        for line in [
            "leasemq_connections 1",
            "leasemq_connection_incoming_bytes_total 1234",
            "leasemq_queues 2",
            "leasemq_queue_messages_ready{vhost=\"/\",queue=\"jobs\"} 2",
            "leasemq_queue_messages_unacked{vhost=\"/\",queue=\"jobs\"} 1",
            "leasemq_queue_consumers{vhost=\"/\",queue=\"jobs\"} 1",
            "leasemq_queue_messages_published_total{vhost=\"/\",queue=\"jobs\"} 3",
            "leasemq_queue_messages_ready{vhost=\"/\",queue=\"idle\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("leasemq_log_"),
            "no data dir, no log:\n{text}"
        );
        drop(worker);
        jobs.close();
        let text = render(&metrics.registry(broker));
        assert!(
            !text.contains("queue=\"jobs\""),
            "a closed queue drops out:\n{text}"
        );
    }

    #[test]
    fn a_scrape_says_what_each_shards_log_owes_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let broker = (Broker::builder().shards(2).manual_clock())
            .data_dir(dir.path())
            .build()
            .unwrap();
        let config = QueueConfig {
            durable: true,
            ..QueueConfig::default()
        };
        let jobs = broker.declare_queue("jobs", config).unwrap();
        jobs.put(Message::new("one")).unwrap();
        let text = render(&Metrics::default().registry(broker.clone()));
        for line in [
            "leasemq_log_unsynced_bytes{shard=\"0\"} 0.0",
            "leasemq_log_unsynced_bytes{shard=\"1\"} 0.0",
            "leasemq_log_stalled{shard=\"0\"} 0.0",
            "leasemq_log_failed{shard=\"1\"} 0.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        let lag = broker.log_lag();
        assert_eq!(lag.len(), 2);
        assert!(
            lag.iter().any(|l| l.durable.0 > 0),
            "the put is durable: {lag:?}"
        );
        broker.shutdown();
    }
}
