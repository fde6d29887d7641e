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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep_until, Instant};

use crate::connection::may_block_in_place;
use crate::metrics::Metrics;
use crate::{Connection, Settings};

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

/// How long a connection we closed waits for the peer's `close-ok`.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The same at a server shutdown, which should not wait long on an idle client.
const SHUTDOWN_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Feeds `input` to `conn` and drops what it used; whether it left whole frames for
/// later (it stops once its output passes `OUTPUT_PER_FEED`, or at a publish the memory
/// alarm blocks).
fn feed(conn: &mut Connection, input: &mut Vec<u8>, channels: &mut Channels<'_>) -> bool {
    // The broker calls block; with durable queues some wait for an fsync, a fraction of a
    // millisecond or more: the runtime then moves this worker's other tasks away (which
    // costs a thread hand-off, so only then).
    let used = if conn.may_wait_for_disk(input) && may_block_in_place() {
        tokio::task::block_in_place(|| conn.handle_input(input))
    } else {
        conn.handle_input(input)
    };
    input.drain(..used);
    channels.set(conn.channel_count());
    let full = used > 0 && conn.output_len() >= crate::connection::OUTPUT_PER_FEED;
    !input.is_empty() && (full || conn.is_blocked())
}

/// Accepts connections on `listener` until the future ends (it never does on its own);
/// each runs in its own task.
pub async fn accept_loop(listener: TcpListener, broker: Broker, settings: Arc<Settings>) {
    // The server's `x-expires` deletions, for as long as it accepts connections.
    let expiry = tokio::spawn(crate::expiry::run(settings.clone()));
    let _expiry = AbortOnDrop(expiry);
    // The tasks that send dead letters on through exchanges, as long as it accepts too.
    let dead_letters = tokio::spawn(crate::dead_letter::run(settings.clone(), broker.clone()));
    let _dead_letters = AbortOnDrop(dead_letters);
    // Message TTL at the heads of queues, and expired messages dead-lettered.
    let expiry = tokio::spawn(crate::message_expiry::run(settings.clone(), broker.clone()));
    let _message_expiry = AbortOnDrop(expiry);
    let ids = AtomicU64::new(0);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait a moment, as a busy server must.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        let conn = Connection::new(
            broker.clone(),
            settings.clone(),
            id,
            peer.ip().is_loopback(),
        );
        let metrics = settings.metrics.clone();
        metrics.connections_opened.inc();
        metrics.connections.inc();
        tracing::debug!(connection = id, %peer, "accepted");
        tokio::spawn(async move {
            match run_connection(stream, peer, conn).await {
                Ok(()) => tracing::debug!(connection = id, %peer, "closed"),
                Err(e) => tracing::info!(connection = id, %peer, error = %e, "connection ended"),
            }
            metrics.connections.dec();
            metrics.connections_closed.inc();
        });
    }
}

/// Reads and drops what the peer still sends after the connection closed (our last
/// frame written and our side shut), until it closes its side or [`LINGER`] passes. A
/// client can close a connection in the middle of writing a large body (amqplib writes
/// `connection.close` ahead of the rest of a publish): were the socket closed at once,
/// its writes would fail before it read our `close-ok`, and it could not finish its close.
async fn linger(reader: &mut tokio::net::tcp::OwnedReadHalf, buffer: &mut Vec<u8>) {
    let deadline = Instant::now() + LINGER;
    loop {
        buffer.clear();
        match tokio::time::timeout_at(deadline, reader.read_buf(buffer)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Drives one connection until it closes or its socket fails, counting its bytes and
/// channels in the server's metrics.
pub async fn run_connection(
    stream: TcpStream,
    peer: SocketAddr,
    mut conn: Connection,
) -> io::Result<()> {
    let metrics = conn.metrics();
    let shutdown = conn.shutdown_signal();
    let mut channels = Channels {
        gauge: &metrics.channels,
        counted: 0,
    };
    let result = drive(stream, &mut conn, &metrics, &mut channels, shutdown).await;
    channels.set(0);
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

async fn drive(
    stream: TcpStream,
    conn: &mut Connection,
    metrics: &Metrics,
    channels: &mut Channels<'_>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> io::Result<()> {
    let mut forced = *shutdown.borrow_and_update();
    if forced {
        conn.force_close();
    }
    stream.set_nodelay(true)?;
    let (mut reader, mut writer) = stream.into_split();
    let mut input = Vec::with_capacity(64 * 1024);
    let mut output: Vec<u8> = Vec::new();
    let mut written = 0;
    let mut close_deadline: Option<Instant> = None;
    let mut last_write = Instant::now();
    let mut last_read = Instant::now();
    // When the socket last took bytes: heartbeats are not written while output waits.
    let mut last_taken = Instant::now();
    // Whole frames of the input the connection left for later (see `handle_input`).
    let mut input_left = false;
    // A client not through the handshake by then is dropped (RabbitMQ's
    // `handshake_timeout`): one that never logs in holds nothing for long.
    let handshake_by = Instant::now() + conn.handshake_timeout();
    let mut shaken = false;
    let mut memory_alarm = conn.memory_alarm();
    loop {
        shaken |= conn.is_open();
        // A connection the memory alarm blocked goes on once it has cleared.
        conn.unblock();
        // Deliveries that are already waiting go out with what is being written.
        while output.len() - written + conn.output_len() < HIGH_WATER {
            match conn.try_delivery() {
                Some((i, d)) => conn.handle_delivery(i, d),
                None => break,
            }
        }
        conn.take_output(&mut output);
        let pending = output.len() - written;
        if conn.is_closed() && pending == 0 {
            writer.shutdown().await.ok();
            // A server that shuts down does not wait on its clients' last writes.
            if !forced {
                linger(&mut reader, &mut input).await;
            }
            return Ok(());
        }
        if conn.is_closing() && close_deadline.is_none() {
            let grace = if forced {
                SHUTDOWN_CLOSE_GRACE
            } else {
                CLOSE_GRACE
            };
            close_deadline = Some(Instant::now() + grace);
        }
        let heartbeat = conn.heartbeat();
        let beat_at = last_write + heartbeat / 2;
        // Deliveries wait while the output holds HIGH_WATER; reading goes on up to twice
        // that (what one read makes the output grow by is small), so a client's acks,
        // publishes and heartbeats are still heard while a backlog of deliveries drains.
        // Reading also pauses while the puts awaiting answers hold too much (a slow disk):
        // a publisher is read no faster than its puts are answered.
        let room = pending < HIGH_WATER;
        let read_room = pending < 2 * HIGH_WATER && conn.wants_input();
        if !read_room {
            // A client is not late with its heartbeats while we do not read them.
            last_read = Instant::now();
        }
        if input_left && room && conn.wants_input() && !conn.is_closed() {
            // The socket has taken what those frames' forerunners wrote: the rest now.
            input_left = feed(conn, &mut input, channels);
            continue;
        }
        tokio::select! {
            read = reader.read_buf(&mut input), if read_room && !conn.is_closed() => {
                let read = read?;
                if read == 0 {
                    return Ok(()); // the peer went away; dropping `conn` returns its leases
                }
                metrics.incoming_bytes.inc_by(read as u64);
                last_read = Instant::now();
                input_left = feed(conn, &mut input, channels);
            }
            n = writer.write(&output[written..]), if pending > 0 => {
                let n = n?;
                metrics.outgoing_bytes.inc_by(n as u64);
                written += n;
                last_write = Instant::now();
                last_taken = last_write;
                if written == output.len() {
                    output.clear();
                    written = 0;
                }
            }
            // The answers to awaited puts (taken as they come), or a delivery.
            delivery = poll_fn(|cx| {
                if conn.awaits_answers() && conn.poll_answers(cx).is_ready() {
                    return Poll::Ready(None);
                }
                match room && !conn.is_closed() {
                    true => conn.poll_delivery(cx).map(Some),
                    false => Poll::Pending,
                }
            }), if (room && !conn.is_closed()) || conn.awaits_answers() => {
                if let Some((i, d)) = delivery {
                    conn.handle_delivery(i, d);
                }
            }
            () = sleep_until(beat_at), if !heartbeat.is_zero() => {
                if last_read.elapsed() > heartbeat * 2 {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "missed heartbeats"));
                }
                // A peer that takes nothing of what waits for it for as long as missed
                // heartbeats take is gone too, though its own heartbeats go unread (reading
                // pauses while output waits): what the connection holds is freed.
                if pending > 0 && last_taken.elapsed() > heartbeat * 2 {
                    let text = "the peer took nothing sent to it";
                    return Err(io::Error::new(io::ErrorKind::TimedOut, text));
                }
                // Output waiting to be sent tells the peer we are here once it moves; a
                // heartbeat behind it would only add to it.
                if pending == 0 {
                    conn.send_heartbeat();
                }
                last_write = Instant::now();
            }
            () = sleep_until(handshake_by), if !shaken => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no handshake in time"));
            }
            _ = memory_alarm.changed(), if conn.is_blocked() => {}
            _ = shutdown.changed(), if !forced => {
                forced = true;
                conn.force_close();
            }
            () = sleep_until(close_deadline.unwrap_or_else(Instant::now)), if close_deadline.is_some() => {
                return Ok(()); // no close-ok in time
            }
        }
    }
}
