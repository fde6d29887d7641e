//! The tokio driver: accepts connections and moves bytes between sockets and
//! [`Connection`]s. It makes no protocol decision.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use leasemq::Broker;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::live::Control;
use crate::metrics::Metrics;
use crate::tls::Tls;
use crate::vhost::VHosts;
use crate::{Connection, ConsumerSlot, Settings, TimedOut, VHost};

/// How long a thread waiting on the broker yields before it parks (see
/// `BrokerBuilder::yield_budget`). The broker's callers here are connection tasks that
/// make blocking calls from the runtime's workers: yields past a few microseconds, by the
/// shard and by the waiting worker, take cores the other workers and the clients need.
pub const YIELD_BUDGET: Duration = Duration::from_micros(20);

/// Above this many bytes waiting for a socket, a connection stops reading and stops taking
/// deliveries until the peer has read some: what one connection buffers stays bounded.
const HIGH_WATER: usize = 1 << 20;

/// How long a closed connection keeps reading, and dropping, what its peer still sends.
const LINGER: Duration = Duration::from_secs(1);

/// Feeds `input` to `conn` and drops what it used; whether it left whole frames for
/// later (it stops once its output passes `OUTPUT_PER_FEED`, at a publish the memory
/// alarm blocks, or at a frame that waits for an awaited call's answer).
fn feed(conn: &mut Connection, input: &mut Vec<u8>, channels: &mut Channels<'_>) -> bool {
    // What waits for the disk the connection awaits (`poll_answers`); its other broker
    // calls are round trips to a shard thread, which never waits on a connection.
    let used = conn.handle_input(input);
    input.drain(..used);
    channels.set(conn.channel_count());
    let full = used > 0 && conn.output_len() >= crate::connection::OUTPUT_PER_FEED;
    !input.is_empty() && (full || !conn.wants_input())
}

/// Where a server takes its connections: plain TCP, TLS, or both.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The plain listener (`--listen`).
    pub plain: Option<TcpListener>,
    /// The TLS listener (`--tls-listen`), with the config it accepts with.
    pub tls: Option<(TcpListener, Arc<Tls>)>,
}

/// Accepts connections on `listener` into a fresh virtual host (in memory) until the
/// future ends (it never does on its own); each runs in its own task.
pub async fn accept_loop(listener: TcpListener, broker: Broker, settings: Arc<Settings>) {
    let vhosts = VHosts::one(Arc::new(VHost::new(&settings)));
    let listeners = Listeners {
        plain: Some(listener),
        tls: None,
    };
    serve(listeners, broker, settings, vhosts).await;
}

/// Accepts connections on `listeners` into `vhosts` until the future ends (it never does
/// on its own); each runs in its own task, and the virtual hosts' own tasks run alongside.
pub async fn serve(
    listeners: Listeners,
    broker: Broker,
    settings: Arc<Settings>,
    vhosts: Arc<VHosts>,
) {
    // Each virtual host's own tasks, for as long as the server accepts connections.
    let all = vhosts.all();
    for vhost in &all {
        vhost.start(&broker);
    }
    let _stop = StopOnDrop(Arc::clone(&vhosts));
    let accepting = Arc::new(Accepting {
        broker,
        settings,
        vhosts,
        ids: AtomicU64::new(0),
    });
    let plain = async {
        match listeners.plain {
            Some(listener) => Arc::clone(&accepting).accept(listener, None).await,
            None => std::future::pending().await,
        }
    };
    let tls = async {
        match listeners.tls {
            Some((listener, tls)) => Arc::clone(&accepting).accept(listener, Some(tls)).await,
            None => std::future::pending().await,
        }
    };
    tokio::join!(plain, tls);
}

/// What every accepted connection is made with.
struct Accepting {
    broker: Broker,
    settings: Arc<Settings>,
    vhosts: Arc<VHosts>,
    /// The last connection id given, over all listeners.
    ids: AtomicU64,
}

impl Accepting {
    /// Accepts connections on `listener`, over TLS with `tls`, each in a task of its own.
    async fn accept(self: Arc<Self>, listener: TcpListener, tls: Option<Arc<Tls>>) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment, as a busy server
                    // must.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::debug!(connection = id, %peer, "accepted");
            let accepting = Arc::clone(&self);
            let local = stream.local_addr().unwrap_or(peer);
            let ends = Ends { peer, local };
            match &tls {
                None => tokio::spawn(async move { accepting.run(stream, ends, id, None).await }),
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    tokio::spawn(async move {
                        let handshake = accepting.tls_handshake(acceptor, stream, peer, id);
                        if let Some(stream) = handshake.await {
                            // A client certificate was verified if there is one: EXTERNAL.
                            let certificate = (stream.get_ref().1.peer_certificates())
                                .and_then(|certs| certs.first())
                                .and_then(|cert| crate::tls::common_name(cert));
                            accepting.run(stream, ends, id, certificate).await;
                        }
                    })
                }
            };
        }
    }

    /// The TLS handshake of connection `id`, within the AMQP handshake's time: `None`, logged
    /// and counted, when it failed (a client speaking plain AMQP to this port, a certificate
    /// refused) or did not finish in time. Only this connection ends.
    async fn tls_handshake(
        &self,
        acceptor: tokio_rustls::TlsAcceptor,
        stream: TcpStream,
        peer: SocketAddr,
        id: u64,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        // The handshake's few small records go out at once.
        let _ = stream.set_nodelay(true);
        let limit = self.settings.handshake_timeout;
        let why = match tokio::time::timeout(limit, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not finished within {limit:?}"),
        };
        self.settings.metrics.tls_handshake_failures.inc();
        tracing::info!(connection = id, %peer, error = why, "TLS handshake failed");
        None
    }

    /// Serves connection `id` on `stream` until it ends, counted in the metrics; with the
    /// subject CN of the client certificate its TLS handshake verified, if any.
    async fn run<S: Transport>(&self, stream: S, ends: Ends, id: u64, certificate: Option<String>) {
        let peer = ends.peer;
        // Listed for the management API while it lives.
        let connected_at = self.settings.clock.now_ms();
        let mut registered =
            (self.settings.live).register(id, peer, ends.local, S::HOLDS_BACK, connected_at);
        let mut conn = Connection::new(
            self.broker.clone(),
            self.settings.clone(),
            Arc::clone(&self.vhosts),
            id,
            peer.ip().is_loopback(),
        );
        if let Some(name) = certificate {
            conn.set_certificate_name(name);
        }
        let metrics = self.settings.metrics.clone();
        metrics.connections_opened.inc();
        metrics.connections.inc();
        match run_connection(stream, peer, conn, Some(&mut registered.controls)).await {
            Ok(()) => tracing::debug!(connection = id, %peer, "closed"),
            Err(e) => tracing::info!(connection = id, %peer, error = %e, "connection ended"),
        }
        metrics.connections.dec();
        metrics.connections_closed.inc();
    }
}

/// A connection's two ends.
#[derive(Debug, Clone, Copy)]
struct Ends {
    peer: SocketAddr,
    local: SocketAddr,
}

/// A connection's byte stream as [`run_connection`] drives it: plain TCP or TLS over it.
pub trait Transport: Send + 'static {
    /// The half it is read through.
    type Reader: AsyncRead + Unpin + Send;
    /// The half it is written through.
    type Writer: AsyncWrite + Unpin + Send;
    /// Whether the writer may keep written bytes back until it is flushed (TLS records
    /// waiting for a socket that was full), so that output that is all written must still
    /// be flushed.
    const HOLDS_BACK: bool;
    /// The two halves, the socket set up for frames (no Nagle delay).
    fn halves(self) -> io::Result<(Self::Reader, Self::Writer)>;
}

impl Transport for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;
    const HOLDS_BACK: bool = false;
    fn halves(self) -> io::Result<(Self::Reader, Self::Writer)> {
        self.set_nodelay(true)?;
        Ok(self.into_split())
    }
}

impl Transport for tokio_rustls::server::TlsStream<TcpStream> {
    type Reader = ReadHalf<Self>;
    type Writer = WriteHalf<Self>;
    const HOLDS_BACK: bool = true;
    fn halves(self) -> io::Result<(Self::Reader, Self::Writer)> {
        self.get_ref().0.set_nodelay(true)?;
        Ok(tokio::io::split(self))
    }
}

/// Reads and drops what the peer still sends after the connection closed (our last
/// frame written and our side shut), until it closes its side or [`LINGER`] passes. A
/// client can close a connection in the middle of writing a large body (amqplib writes
/// `connection.close` ahead of the rest of a publish): were the socket closed at once,
/// its writes would fail before it read our `close-ok`, and it could not finish its close.
async fn linger(reader: &mut (impl AsyncRead + Unpin), buffer: &mut Vec<u8>) {
    let deadline = Instant::now() + LINGER;
    loop {
        buffer.clear();
        match tokio::time::timeout_at(deadline, reader.read_buf(buffer)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// Stops every virtual host's tasks when dropped (as the server stops serving).
struct StopOnDrop(Arc<VHosts>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        for vhost in self.0.all() {
            vhost.stop();
        }
    }
}

/// Drives one connection until it closes or its socket fails, counting its bytes and
/// channels in the server's metrics; answering what the management API asks of it on
/// `controls`, if given.
pub async fn run_connection(
    stream: impl Transport,
    peer: SocketAddr,
    mut conn: Connection,
    controls: Option<&mut mpsc::Receiver<Control>>,
) -> io::Result<()> {
    let metrics = conn.metrics();
    let shutdown = conn.settings().shutdown.subscribe();
    let mut channels = Channels {
        gauge: &metrics.channels,
        counted: 0,
    };
    let result = drive(
        stream,
        &mut conn,
        &metrics,
        &mut channels,
        shutdown,
        controls,
    )
    .await;
    channels.set(0);
    if let Some((user, mechanism)) = conn.refused_login() {
        tracing::warn!(connection = conn.id(), %peer, user, mechanism, "login refused");
    }
    // A connection error the server answered (a shutdown's 320 is logged once, apart).
    if let Some((code, text)) = conn.closed_with().filter(|(code, _)| *code != 320) {
        tracing::info!(connection = conn.id(), %peer, code, reason = text, "closed by the server");
    }
    result
}

/// The channels gauge's share of one connection.
struct Channels<'a> {
    gauge: &'a prometheus_client::metrics::gauge::Gauge,
    counted: usize,
}

impl Channels<'_> {
    fn set(&mut self, open: usize) {
        if open != self.counted {
            let delta = open as i64 - self.counted as i64;
            self.gauge.inc_by(delta);
            self.counted = open;
        }
    }
}

async fn drive<S: Transport>(
    stream: S,
    conn: &mut Connection,
    metrics: &Metrics,
    channels: &mut Channels<'_>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    mut controls: Option<&mut mpsc::Receiver<Control>>,
) -> io::Result<()> {
    let mut forced = *shutdown.borrow_and_update();
    if forced {
        conn.force_close();
    }
    let (mut reader, mut writer) = stream.halves()?;
    let mut input = Vec::with_capacity(64 * 1024);
    let mut out = Outgoing::default();
    // Whole frames of the input the connection left for later (see `handle_input`).
    let mut input_left = false;
    let mut alarms = conn.settings().alarms.subscribe();
    loop {
        // A connection an alarm blocked goes on once every alarm has cleared.
        conn.unblock();
        gather(conn, &mut out);
        let pending = out.pending();
        if conn.is_closed() && pending == 0 {
            return end(&mut writer, &mut reader, &mut input, forced).await;
        }
        // Deliveries wait while the output holds HIGH_WATER; reading goes on up to twice
        // that (what one read makes the output grow by is small), so a client's acks,
        // publishes and heartbeats are still heard while a backlog of deliveries drains.
        // Reading also pauses while the puts awaiting answers hold too much (a slow disk):
        // a publisher is read no faster than its puts are answered.
        let room = pending < HIGH_WATER;
        let read_room = pending < 2 * HIGH_WATER && conn.wants_input();
        if !read_room {
            conn.reading_paused(std::time::Instant::now());
        }
        if input_left && room && conn.wants_input() && !conn.is_closed() {
            // The socket has taken what those frames' forerunners wrote: the rest now.
            input_left = feed(conn, &mut input, channels);
            continue;
        }
        let wake_at = conn.poll_timeout(std::time::Instant::now());
        tokio::select! {
            read = reader.read_buf(&mut input), if read_room && !conn.is_closed() => {
                let read = read?;
                if read == 0 {
                    return Ok(()); // the peer went away; dropping `conn` returns its leases
                }
                metrics.incoming_bytes.inc_by(read as u64);
                conn.on_read(std::time::Instant::now());
                input_left = feed(conn, &mut input, channels);
            }
            n = write_or_flush(&mut writer, out.unwritten()), if pending > 0 || out.unflushed => {
                let n = n?;
                if pending > 0 {
                    metrics.outgoing_bytes.inc_by(n as u64);
                    conn.on_written(std::time::Instant::now());
                }
                out.wrote(n, S::HOLDS_BACK);
            }
            delivery = answers_or_delivery(conn, room), if (room && !conn.is_closed()) || conn.awaits_answers() => {
                if let Some((i, d)) = delivery {
                    conn.handle_delivery(i, d);
                }
            }
            () = sleep_until(wake_at.map_or_else(Instant::now, Instant::from_std)), if wake_at.is_some() => {
                match conn.handle_timeout(std::time::Instant::now(), pending) {
                    Ok(()) => {}
                    Err(TimedOut::CloseGrace) => return Ok(()),
                    Err(why) => return Err(io::Error::new(io::ErrorKind::TimedOut, why.text())),
                }
            }
            _ = alarms.changed(), if conn.is_blocked() => {}
            _ = shutdown.changed(), if !forced => {
                forced = true;
                conn.force_close();
            }
            Some(control) = next_control(&mut controls), if controls.is_some() => on_control(conn, control),
        }
    }
}

/// Does what the management API asked of the connection.
fn on_control(conn: &mut Connection, control: Control) {
    match control {
        Control::Inspect(answer) => {
            let _ = answer.send(conn.view());
        }
        Control::Close(reason) => conn.close_forced(&reason),
    }
}

/// The next request of the management API, if the connection takes them.
async fn next_control(controls: &mut Option<&mut mpsc::Receiver<Control>>) -> Option<Control> {
    match controls {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Ends a closed connection's socket: shuts down its writing half, then lingers on what
/// the peer still sends, unless the server shuts down (`forced`): a server that shuts
/// down does not wait on its clients' last writes.
async fn end(
    writer: &mut (impl AsyncWrite + Unpin),
    reader: &mut (impl AsyncRead + Unpin),
    input: &mut Vec<u8>,
    forced: bool,
) -> io::Result<()> {
    writer.shutdown().await.ok();
    if !forced {
        linger(reader, input).await;
    }
    Ok(())
}

/// Writes what it can of `output`, or with nothing left to write flushes what the writer
/// held back (and returns 0).
async fn write_or_flush(
    writer: &mut (impl AsyncWrite + Unpin),
    output: &[u8],
) -> io::Result<usize> {
    if output.is_empty() {
        writer.flush().await.map(|()| 0)
    } else {
        writer.write(output).await
    }
}

/// The bytes on their way to the socket.
#[derive(Default)]
struct Outgoing {
    bytes: Vec<u8>,
    /// How many of `bytes` the socket took.
    written: usize,
    /// All written to a transport that may hold bytes back, not flushed since.
    unflushed: bool,
}

impl Outgoing {
    fn pending(&self) -> usize {
        self.bytes.len() - self.written
    }

    fn unwritten(&self) -> &[u8] {
        &self.bytes[self.written..]
    }

    /// `n` more bytes written, or with none pending a flush done; a transport that
    /// `holds_back` is flushed once all is written.
    fn wrote(&mut self, n: usize, holds_back: bool) {
        if self.pending() == 0 {
            self.unflushed = false;
            return;
        }
        self.written += n;
        if self.written == self.bytes.len() {
            self.bytes.clear();
            self.written = 0;
            self.unflushed = holds_back;
        }
    }
}

/// Lets the deliveries that are already waiting out with what is being written, up to
/// [`HIGH_WATER`], and appends the connection's output to `out`.
fn gather(conn: &mut Connection, out: &mut Outgoing) {
    while out.pending() + conn.output_len() < HIGH_WATER {
        match conn.try_delivery() {
            Some((i, d)) => conn.handle_delivery(i, d),
            None => break,
        }
    }
    conn.take_output(&mut out.bytes);
}

/// The answers to awaited puts, taken as they come (then `None`), or what a consumer's
/// channel gave while there is `room` for it: a delivery, or its end.
async fn answers_or_delivery(
    conn: &mut Connection,
    room: bool,
) -> Option<(ConsumerSlot, Option<leasemq::Delivery>)> {
    poll_fn(|cx| {
        if conn.awaits_answers() && conn.poll_answers(cx).is_ready() {
            return Poll::Ready(None);
        }
        match room && !conn.is_closed() {
            true => conn.poll_delivery(cx).map(Some),
            false => Poll::Pending,
        }
    })
    .await
}
