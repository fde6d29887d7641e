//! What every connection of the server is configured with, and the server-wide services
//! they share (clocks, the resource alarms, metrics, the shutdown signal). The queues,
//! exchanges and other registries a client's methods change are the virtual host's
//! (`vhost.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::access::Access;
use crate::alarms::Alarms;
use crate::clock::{LeaseClock, WallClock};
use crate::metrics::Metrics;

/// What a connection needs to know that is the same for all of them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Who may log in, and what each user may do in each virtual host.
    pub access: Arc<Access>,
    /// The largest frame the server proposes and accepts, overhead included.
    pub frame_max: u32,
    /// The most channels the server proposes.
    pub channel_max: u16,
    /// Lease length of the queues AMQP declares (RabbitMQ's `consumer_timeout`,
    /// `--consumer-timeout`), where their `x-consumer-timeout` does not say.
    pub ack_timeout: Duration,
    /// The largest message body a publish may carry (RabbitMQ's `max_message_size`).
    pub max_message_bytes: usize,
    /// The heartbeat interval the server proposes in `connection.tune`, in seconds (60,
    /// as RabbitMQ): a client that leaves the choice to the server then beats, and a peer
    /// that vanished without closing its socket is noticed and its leases come back.
    pub heartbeat: u16,
    /// How long a client may take from its connect to `connection.open` (RabbitMQ's
    /// `handshake_timeout`, 10 s): one that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// The broker has a data dir: `queue.declare` with `durable` makes a durable queue.
    pub durable: bool,
    /// Where the server keeps its files (durable queues, exchanges, users), if anywhere:
    /// a virtual host added at run time keeps its own there.
    pub data_dir: Option<std::path::PathBuf>,
    /// The broker is a node of a cluster (contract §9): exchanges and bindings are not
    /// served, and every queue is durable.
    pub cluster: bool,
    /// When messages arrive and expire (message TTL).
    pub clock: WallClock,
    /// Raised while the server's memory is over its limit or its disk under its free
    /// limit: publishing connections wait.
    pub alarms: Arc<Alarms>,
    /// How old a delivery is: a channel forgets the deliveries whose lease has certainly
    /// run out (`Channel::forget_expired`). The broker's own leases run on the system's
    /// monotonic clock, as this does by default.
    pub lease_clock: LeaseClock,
    /// What the connections count for `--metrics`.
    pub metrics: Arc<Metrics>,
    /// The live connections, for the management API.
    pub live: Arc<crate::live::LiveConnections>,
    /// Set to `true` when the server shuts down: every connection is then closed with
    /// 320 CONNECTION_FORCED, as RabbitMQ closes them.
    pub shutdown: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            access: Arc::default(),
            frame_max: 131_072,
            channel_max: 2047,
            ack_timeout: Duration::from_secs(30 * 60),
            max_message_bytes: 16 << 20,
            durable: false,
            data_dir: None,
            cluster: false,
            heartbeat: 60,
            handshake_timeout: Duration::from_secs(10),
            clock: WallClock::default(),
            alarms: Arc::default(),
            lease_clock: LeaseClock::default(),
            metrics: Arc::default(),
            live: Arc::default(),
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}
