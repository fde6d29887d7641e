//! `--client raw`: the AMQP run through the loadgen's own pipelined client.
//!
//! lapin hands each publish and each ack to its connection's IO thread and answers once
//! that thread has written it: per message the client pays a wake-up, a future and a
//! channel hop, 50-90 µs of CPU in all, which on a small machine leaves the run measuring
//! the client. This client keeps lapin's topology (one connection with one channel per
//! producer and per consumer, tasks on the run's tokio runtime) and its accounting, but
//! owns the socket: a producer puts as many publishes as its window allows into one
//! buffer and writes it with one call; a consumer parses every whole frame of one read and
//! writes the acks they call for with one call. Frames are made and parsed by
//! `amq-protocol`'s codec (`wire`), never by hand.
//!
//! Queues are declared and counted over lapin's setup connection, as for `--client lapin`.

use std::collections::VecDeque;
use std::io::ErrorKind::WouldBlock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::auth::{Credentials, SASLMechanism};
use amq_protocol::frame::{AMQPFrame, ProtocolVersion};
use amq_protocol::protocol::{basic, channel, confirm, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};
use amq_protocol::uri::{AMQPScheme, AMQPUri, AMQPUserInfo};
use tokio::net::TcpStream;
use transport::Transport;

use super::targets::{Target, Targets};
use super::workers::{ConsumerResult, ProducerResult, Shared, DRAIN_LIMIT, FULL_PAUSE, IDLE_WAIT};
use super::{masked, Plan, CONNECT_LIMIT};
use crate::cli::{format_duration, AckMode};
use crate::common::{nanos, read_header, seq_of, BodyWriter, Clock};
use wire::{Event, Inbox, CHANNEL};

mod transport;
mod wire;

/// Most publishes a producer puts into one write. Larger batches save little more (one
/// syscall per 256 publishes is already a small share of their cost) and make the window's
/// bound coarser.
const BATCH: u64 = 256;
/// How long a blocked write waits for the socket before it looks at the abort flag again
/// and reads what the server sent meanwhile.
const WRITE_WAIT: Duration = Duration::from_millis(5);

/// One raw connection with its channel open, and the bytes on their way in and out.
pub(super) struct Conn {
    stream: Transport,
    inbox: Inbox,
    /// Frames waiting for the next write.
    out: Vec<u8>,
    /// The server's `frame_max` (0: no limit).
    frame_max: u32,
    role: &'static str,
}

impl Conn {
    /// Connects to `target` and opens channel 1: the protocol header; `start` → `start-ok`
    /// (PLAIN, the URI's user and password, guest/guest without them); `tune` → `tune-ok`
    /// (the server's `channel_max` and `frame_max`, no heartbeats); `open` (the URI's vhost)
    /// → `open-ok`; `channel.open` → `open-ok`.
    async fn open(target: Target<'_>, role: &'static str) -> Result<Conn, String> {
        match tokio::time::timeout(CONNECT_LIMIT, Conn::handshake(target, role)).await {
            Ok(opened) => opened,
            Err(_) => Err(format!(
                "{role}: no connection to {} within {}",
                masked(target.uri),
                format_duration(CONNECT_LIMIT)
            )),
        }
    }

    async fn handshake(target: Target<'_>, role: &'static str) -> Result<Conn, String> {
        let uri: AMQPUri = target
            .uri
            .parse()
            .map_err(|e| format!("{role}: {}: {e}", masked(target.uri)))?;
        let mut conn = Conn::connect(&uri, target, role).await?;
        let header = AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1());
        wire::append(&mut conn.out, &header)?;
        conn.send(&AtomicBool::new(false)).await?;
        let AMQPClass::Connection(connection::AMQPMethod::Start(start)) = conn.method().await?
        else {
            return Err(format!(
                "{role}: the server did not start with connection.start"
            ));
        };
        let tune = conn.log_in(&start, &uri.authority.userinfo).await?;
        conn.frame_max = tune.frame_max;
        let tune_ok = connection::TuneOk {
            channel_max: tune.channel_max,
            frame_max: tune.frame_max,
            heartbeat: 0,
        };
        wire::append_method(
            &mut conn.out,
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(tune_ok)),
        )?;
        let open = connection::Open {
            virtual_host: uri.vhost.as_str().into(),
        };
        conn.call_expecting(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(open)),
            &format!("{role}: connection.open"),
            |a| matches!(a, AMQPClass::Connection(connection::AMQPMethod::OpenOk(_))),
        )
        .await?;
        conn.call_expecting(
            CHANNEL,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
            &format!("{role}: channel.open"),
            |a| matches!(a, AMQPClass::Channel(channel::AMQPMethod::OpenOk(_))),
        )
        .await?;
        Ok(conn)
    }

    /// Opens the connection to the host and port of `uri` (`target`, as the user gave it,
    /// names it in errors), with its TLS handshake done for an `amqps://` target and nothing
    /// of AMQP sent or read yet.
    async fn connect(
        uri: &AMQPUri,
        target: Target<'_>,
        role: &'static str,
    ) -> Result<Conn, String> {
        let authority = &uri.authority;
        let failed =
            |e: std::io::Error| format!("{role}: connecting to {}: {e}", masked(target.uri));
        let socket = TcpStream::connect((authority.host.as_str(), authority.port))
            .await
            .map_err(failed)?;
        // Batches are written whole, each with one call: nothing to gain from Nagle.
        socket
            .set_nodelay(true)
            .map_err(|e| format!("{role}: TCP_NODELAY: {e}"))?;
        let tls = target.tls.filter(|_| uri.scheme == AMQPScheme::AMQPS);
        let stream = Transport::new(socket, &authority.host, tls)
            .await
            .map_err(failed)?;
        Ok(Conn {
            stream,
            inbox: Inbox::default(),
            out: Vec::new(),
            frame_max: 0,
            role,
        })
    }

    /// Answers the server's `connection.start` with `start-ok`, logging in as `user` with
    /// PLAIN, and returns the `connection.tune` the server answers with.
    async fn log_in(
        &mut self,
        start: &connection::Start,
        user: &AMQPUserInfo,
    ) -> Result<connection::Tune, String> {
        let role = self.role;
        if !start
            .mechanisms
            .to_string()
            .split(' ')
            .any(|m| m == "PLAIN")
        {
            return Err(format!(
                "{role}: the server does not offer PLAIN authentication (it offers {})",
                start.mechanisms
            ));
        }
        let credentials =
            Credentials::new(user.username.as_str().into(), user.password.as_str().into());
        let mut properties = FieldTable::default();
        properties.insert(
            "product".into(),
            AMQPValue::LongString("leasemq-loadgen".into()),
        );
        let start_ok = connection::StartOk {
            client_properties: properties,
            mechanism: "PLAIN".into(),
            response: credentials.sasl_auth_string(SASLMechanism::Plain),
            locale: "en_US".into(),
        };
        let answer = self
            .call(
                0,
                AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok)),
            )
            .await?;
        let AMQPClass::Connection(connection::AMQPMethod::Tune(tune)) = answer else {
            return Err(format!(
                "{role}: connection.start-ok answered with {answer:?}"
            ));
        };
        Ok(tune)
    }

    /// Sends `m` (after whatever else waits to be sent) and waits for the next method.
    async fn call(&mut self, channel: u16, m: AMQPClass) -> Result<AMQPClass, String> {
        wire::append_method(&mut self.out, channel, m)?;
        self.send(&AtomicBool::new(false)).await?;
        self.method().await
    }

    /// [`call`](Self::call), for a method with one right answer: `is_expected` tells it,
    /// and anything else is an error naming `what` was called.
    async fn call_expecting(
        &mut self,
        channel: u16,
        m: AMQPClass,
        what: &str,
        is_expected: fn(&AMQPClass) -> bool,
    ) -> Result<(), String> {
        let answer = self.call(channel, m).await?;
        if is_expected(&answer) {
            Ok(())
        } else {
            Err(format!("{what} answered with {answer:?}"))
        }
    }

    /// The next method from the server, outside the run (no delivery is expected).
    async fn method(&mut self) -> Result<AMQPClass, String> {
        loop {
            match self.inbox.next().map_err(|e| self.failed(e))? {
                Some(Event::Method(_, m)) => return refused(&m).map_or(Ok(*m), Err),
                Some(Event::Delivery(_)) => {
                    return Err(format!(
                        "{}: a delivery before the setup was done",
                        self.role
                    ))
                }
                None => self.fill().await?,
            }
        }
    }

    fn failed(&self, problem: impl std::fmt::Display) -> String {
        format!("{}: {problem}", self.role)
    }

    /// Reads whatever the socket holds into the inbox, waiting for something.
    async fn fill(&mut self) -> Result<(), String> {
        loop {
            self.stream
                .readable()
                .await
                .map_err(|e| self.failed(format!("reading: {e}")))?;
            if self.try_fill()? {
                return Ok(());
            }
        }
    }

    /// Reads whatever the socket holds into the inbox, without waiting: false when it held
    /// nothing.
    fn try_fill(&mut self) -> Result<bool, String> {
        match self.stream.try_read(self.inbox.room()) {
            Ok(0) => Err(self.failed("the server closed the connection")),
            Ok(n) => {
                self.inbox.filled(n);
                Ok(true)
            }
            Err(e) if e.kind() == WouldBlock => Ok(false),
            Err(e) => Err(self.failed(format!("reading: {e}"))),
        }
    }

    /// Waits up to `limit` for the socket to have something to read.
    async fn wait_readable(&self, limit: Duration) -> Result<(), String> {
        match tokio::time::timeout(limit, self.stream.readable()).await {
            Ok(Err(e)) => Err(self.failed(format!("reading: {e}"))),
            _ => Ok(()),
        }
    }

    /// Writes every frame waiting. While the socket is full it keeps reading what the
    /// server sends (into the inbox, parsed later): a server blocked on writing to a client
    /// that does not read would stop reading too. Gives up when the run is aborted.
    async fn send(&mut self, abort: &AtomicBool) -> Result<(), String> {
        let mut at = 0;
        // Over TLS, until the socket has taken every record too.
        while at < self.out.len() || self.stream.holds_back() {
            match self.stream.try_write(&self.out[at..]) {
                Ok(0) if at < self.out.len() => {
                    return Err(self.failed("the connection took no bytes"))
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == WouldBlock => {
                    if abort.load(Relaxed) {
                        return Err(self.failed("the run was aborted while writing"));
                    }
                    self.try_fill()?;
                    let _ = tokio::time::timeout(WRITE_WAIT, self.stream.writable()).await;
                }
                Err(e) => return Err(self.failed(format!("writing: {e}"))),
            }
        }
        self.out.clear();
        Ok(())
    }

    /// Closes the connection (`connection.close` → `close-ok`), so the server has taken
    /// everything sent before the socket goes. Whatever else arrives meanwhile is dropped.
    async fn close(mut self) {
        self.out.clear();
        let close = connection::Close {
            reply_code: 200,
            reply_text: "run over".into(),
            class_id: 0,
            method_id: 0,
        };
        let closing = async {
            wire::append_method(
                &mut self.out,
                0,
                AMQPClass::Connection(connection::AMQPMethod::Close(close)),
            )?;
            self.send(&AtomicBool::new(false)).await?;
            loop {
                while let Some(event) = self.inbox.next()? {
                    if let Event::Method(_, m) = event {
                        let AMQPClass::Connection(m) = *m else {
                            continue;
                        };
                        if matches!(
                            m,
                            connection::AMQPMethod::CloseOk(_) | connection::AMQPMethod::Close(_)
                        ) {
                            return Ok::<(), String>(());
                        }
                    }
                }
                self.fill().await?;
            }
        };
        let _ = tokio::time::timeout(CONNECT_LIMIT, closing).await;
    }
}

/// The problem a method from the server stands for, if it ends the run: the server
/// closing the connection or the channel, or cancelling the consumer.
fn refused(m: &AMQPClass) -> Option<String> {
    match m {
        AMQPClass::Connection(connection::AMQPMethod::Close(c)) => Some(format!(
            "the server closed the connection: {} {}",
            c.reply_code, c.reply_text
        )),
        AMQPClass::Channel(channel::AMQPMethod::Close(c)) => Some(format!(
            "the server closed the channel: {} {}",
            c.reply_code, c.reply_text
        )),
        AMQPClass::Basic(basic::AMQPMethod::Cancel(_)) => {
            Some("the server cancelled a consumer".into())
        }
        _ => None,
    }
}

/// Opens `count` consumers, consumer i on queue i mod Q, each on its own connection (to
/// its target, see [`Targets`]) with `basic.qos` set to the prefetch and `basic.consume`
/// (`no_ack` with `--no-ack`).
pub(super) async fn open_consumers(
    targets: Targets<'_>,
    queues: &[String],
    plan: &Plan,
    count: u32,
) -> Result<Vec<Conn>, String> {
    let mut consumers = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let mut conn = Conn::open(targets.consumer(i), "consumer").await?;
        let qos = basic::Qos {
            prefetch_count: plan.prefetch,
            global: false,
        };
        conn.call_expecting(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Qos(qos)),
            "consumer: basic.qos",
            |a| matches!(a, AMQPClass::Basic(basic::AMQPMethod::QosOk(_))),
        )
        .await?;
        let consume = basic::Consume {
            queue: queues[i % queues.len()].as_str().into(),
            consumer_tag: format!("consumer-{i}").into(),
            no_local: false,
            no_ack: plan.ack == AckMode::NoAck,
            exclusive: false,
            nowait: false,
            arguments: FieldTable::default(),
        };
        conn.call_expecting(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Consume(consume)),
            "consumer: basic.consume",
            |a| matches!(a, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))),
        )
        .await?;
        consumers.push(conn);
    }
    Ok(consumers)
}

/// Opens one connection per producer (to its target, see [`Targets`]), its channel in
/// confirm mode with `--confirms`.
pub(super) async fn open_producers(targets: Targets<'_>, plan: &Plan) -> Result<Vec<Conn>, String> {
    let mut producers = Vec::with_capacity(plan.producers as usize);
    for j in 0..plan.producers as usize {
        let mut conn = Conn::open(targets.producer(j), "producer").await?;
        if plan.confirms {
            let select = confirm::Select { nowait: false };
            conn.call_expecting(
                CHANNEL,
                AMQPClass::Confirm(confirm::AMQPMethod::Select(select)),
                "producer: confirm.select",
                |a| matches!(a, AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_))),
            )
            .await?;
        }
        producers.push(conn);
    }
    Ok(producers)
}

/// A producer's publishes that wait for their confirm, by delivery tag (the channel's
/// publishes counted from 1).
#[derive(Default)]
struct Unconfirmed {
    /// The tag of `sent[0]`.
    first: u64,
    /// Each publish's send time from `first` on; `None` once confirmed.
    sent: VecDeque<Option<u64>>,
    waiting: u64,
}

impl Unconfirmed {
    fn new() -> Unconfirmed {
        Unconfirmed {
            first: 1,
            ..Unconfirmed::default()
        }
    }

    fn published(&mut self, sent: u64) {
        self.sent.push_back(Some(sent));
        self.waiting += 1;
    }

    /// A `basic.ack` (`ack`) or `basic.nack` of `tag`, or of every tag up to it with
    /// `multiple`, arrived at `now`.
    fn confirmed(
        &mut self,
        tag: u64,
        multiple: bool,
        ack: bool,
        r: &mut ProducerResult,
        plan: &Plan,
        now: u64,
    ) -> Result<(), String> {
        let Some(at) = tag
            .checked_sub(self.first)
            .filter(|&at| at < self.sent.len() as u64)
        else {
            return Err(format!("a confirm of delivery tag {tag}, not waiting"));
        };
        let from = if multiple { 0 } else { at as usize };
        for slot in self.sent.range_mut(from..=at as usize) {
            let Some(sent) = slot.take() else { continue };
            self.waiting -= 1;
            if !ack {
                r.nacked += 1;
            } else if let (Some(rec), true) = (&mut r.confirm, plan.in_window(sent)) {
                rec.record(now, now.saturating_sub(sent));
            }
        }
        while let Some(None) = self.sent.front() {
            self.sent.pop_front();
            self.first += 1;
        }
        Ok(())
    }

    /// Takes every confirm in the inbox; any other method but one that ends the run is
    /// ignored.
    fn take(
        &mut self,
        conn: &mut Conn,
        r: &mut ProducerResult,
        plan: &Plan,
        clock: Clock,
    ) -> Result<(), String> {
        while let Some(event) = conn.inbox.next().map_err(|e| conn.failed(e))? {
            let Event::Method(_, m) = event else {
                return Err(conn.failed("a delivery on a producer's connection"));
            };
            if let Some(problem) = refused(&m) {
                return Err(conn.failed(problem));
            }
            let now = clock.now_ns();
            match *m {
                AMQPClass::Basic(basic::AMQPMethod::Ack(a)) => {
                    self.confirmed(a.delivery_tag, a.multiple, true, r, plan, now)
                }
                AMQPClass::Basic(basic::AMQPMethod::Nack(n)) => {
                    self.confirmed(n.delivery_tag, n.multiple, false, r, plan, now)
                }
                _ => Ok(()),
            }
            .map_err(|e| conn.failed(e))?;
        }
        Ok(())
    }
}

/// One producer: publishes until the window ends, round robin over its queues.
pub(super) async fn produce(
    index: u64,
    mut conn: Conn,
    queues: Vec<String>,
    mut r: ProducerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ProducerResult {
    if let Err(problem) =
        publish_until_end(index, &mut conn, &queues, &mut r, &plan, clock, &shared).await
    {
        r.problems.push(problem);
        shared.abort.store(true, Relaxed);
    }
    shared.producers_done.fetch_add(1, Relaxed);
    conn.close().await;
    if r.nacked > 0 {
        r.problems
            .push(format!("producer {index}: {} publishes nacked", r.nacked));
    }
    r
}

async fn publish_until_end(
    index: u64,
    conn: &mut Conn,
    queues: &[String],
    r: &mut ProducerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> Result<(), String> {
    let mut bodies = BodyWriter::new(plan.body_bytes);
    let prefixes = queues
        .iter()
        .map(|q| wire::publish_prefix(q, plan.body_bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let mut body_frame = AMQPFrame::Body(CHANNEL, Vec::with_capacity(plan.body_bytes));
    let mut unconfirmed = Unconfirmed::new();
    let mut local = 0u64;
    // Counted here as each publish is put into the write buffer; `r.put` at the end.
    let result = loop {
        if clock.now_ns() >= plan.end_ns || shared.abort.load(Relaxed) {
            break Ok(());
        }
        // Whatever the server has sent: confirms, or a reason to stop.
        if let Err(e) = conn
            .try_fill()
            .and_then(|_| unconfirmed.take(conn, r, plan, clock))
        {
            break Err(e);
        }
        let room = room(plan, shared, &unconfirmed);
        if room == 0 {
            if plan.confirms && unconfirmed.waiting > 0 {
                if let Err(e) = conn.wait_readable(FULL_PAUSE).await {
                    break Err(e);
                }
            } else {
                tokio::time::sleep(FULL_PAUSE).await;
            }
            continue;
        }
        let (mut made, mut failed) = (0, None);
        for _ in 0..room {
            let now = clock.now_ns();
            let body = bodies.body(now, seq_of(index, local));
            conn.out
                .extend_from_slice(&prefixes[local as usize % prefixes.len()]);
            if let Err(e) = wire::append_body(&mut conn.out, &mut body_frame, &body, conn.frame_max)
            {
                failed = Some(e);
                break;
            }
            made += 1;
            if plan.confirms {
                unconfirmed.published(now);
            }
            if plan.in_window(now) {
                r.put_in_window += 1;
            }
            local += 1;
        }
        // Counted before the write, as the lapin path counts before the call: a consumer
        // may ack a message as soon as it is written.
        shared.put.fetch_add(made, Relaxed);
        if let Some(e) = failed {
            break Err(e);
        }
        if let Err(e) = conn.send(&shared.abort).await {
            break Err(e);
        }
        // One batch per turn: the consumers on this runtime get theirs.
        tokio::task::yield_now().await;
    };
    r.put = local;
    result?;
    // The last confirms.
    take_last_confirms(index, conn, &mut unconfirmed, r, plan, clock, shared).await
}

/// How many publishes a producer may put into its next write, at most `BATCH`.
#[inline]
fn room(plan: &Plan, shared: &Shared, unconfirmed: &Unconfirmed) -> u64 {
    // The same bound as the lapin path: messages put but not yet acked, and with
    // confirms publishes not yet confirmed, each at most `max_in_flight`.
    let in_flight = shared
        .put
        .load(Relaxed)
        .saturating_sub(shared.acked.load(Relaxed));
    let mut room = plan.max_in_flight.saturating_sub(in_flight).min(BATCH);
    if plan.confirms {
        room = room.min(plan.max_in_flight.saturating_sub(unconfirmed.waiting));
    }
    room
}

/// Once the window is over, waits for the confirms of every publish still unconfirmed,
/// giving up when the run is aborted or after `DRAIN_LIMIT`.
async fn take_last_confirms(
    index: u64,
    conn: &mut Conn,
    unconfirmed: &mut Unconfirmed,
    r: &mut ProducerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> Result<(), String> {
    while unconfirmed.waiting > 0 {
        if shared.abort.load(Relaxed) {
            return Ok(());
        }
        if clock.now_ns() > plan.end_ns + nanos(DRAIN_LIMIT) {
            return Err(format!(
                "producer {index}: {} publishes still unconfirmed {} after the run",
                unconfirmed.waiting,
                format_duration(DRAIN_LIMIT)
            ));
        }
        if !conn.try_fill()? {
            conn.wait_readable(IDLE_WAIT).await?;
        }
        unconfirmed.take(conn, r, plan, clock)?;
    }
    Ok(())
}

/// One consumer: receives and acks until every producer is done and everything put is
/// acked (or the run is aborted).
pub(super) async fn consume(
    mut conn: Conn,
    mut r: ConsumerResult,
    plan: Plan,
    clock: Clock,
    shared: Arc<Shared>,
) -> ConsumerResult {
    if let Err(problem) = receive_until_done(&mut conn, &mut r, &plan, clock, &shared).await {
        r.problems.push(problem);
        shared.abort.store(true, Relaxed);
    }
    conn.close().await;
    r
}

/// The acks one read calls for, settled once their write is done.
#[derive(Default)]
struct Acks {
    /// The (send time, sequence number) of every message acked, in order.
    headers: Vec<(u64, u64)>,
    /// Per `basic.ack`: how many of `headers` it covers, and when it was made.
    calls: Vec<(usize, u64)>,
}

async fn receive_until_done(
    conn: &mut Conn,
    r: &mut ConsumerResult,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> Result<(), String> {
    // `--ack multiple:N`: deliveries received and not yet acked, and the last one's tag.
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let mut last_tag = 0;
    let mut acks = Acks::default();
    loop {
        if !conn.try_fill()? {
            // Nothing waiting: ack what is pending at once (as the lapin path does), or
            // see whether the run is over, or wait a little for more.
            if !pending.is_empty() {
                wire::append_method(&mut conn.out, CHANNEL, wire::ack(last_tag, true))?;
                acks.calls.push((pending.len(), clock.now_ns()));
                acks.headers.append(&mut pending);
                send_acks(conn, r, &mut acks, plan, clock, shared).await?;
                continue;
            }
            if r.idle(plan, shared, clock.now_ns()) {
                return Ok(());
            }
            conn.wait_readable(IDLE_WAIT).await?;
            continue;
        }
        // Everything this read brought arrived now: one clock read stamps it all, rather
        // than one per delivery, which would also count the time spent on those before it.
        let now = clock.now_ns();
        while let Some(event) = conn.inbox.next().map_err(|e| conn.failed(e))? {
            let d = match event {
                Event::Delivery(d) => d,
                Event::Method(_, m) => match refused(&m) {
                    Some(problem) => return Err(conn.failed(problem)),
                    None => continue,
                },
            };
            if !r.delivered(&d.body, d.redelivered, plan, now, shared) {
                continue;
            }
            let header = read_header(&d.body).expect("checked by `delivered`");
            match plan.ack {
                AckMode::NoAck => {}
                AckMode::Each => {
                    wire::append_method(&mut conn.out, CHANNEL, wire::ack(d.tag, false))?;
                    acks.headers.push(header);
                    acks.calls.push((1, now));
                }
                AckMode::Multiple(n) => {
                    pending.push(header);
                    last_tag = d.tag;
                    if pending.len() >= n as usize {
                        wire::append_method(&mut conn.out, CHANNEL, wire::ack(last_tag, true))?;
                        acks.calls.push((pending.len(), now));
                        acks.headers.append(&mut pending);
                    }
                }
            }
        }
        send_acks(conn, r, &mut acks, plan, clock, shared).await?;
        // One read per turn: the producers on this runtime get theirs.
        tokio::task::yield_now().await;
    }
}

/// Writes the acks waiting, in one write, and settles them: each `basic.ack` is one settle
/// call, handed over when the write returns.
async fn send_acks(
    conn: &mut Conn,
    r: &mut ConsumerResult,
    acks: &mut Acks,
    plan: &Plan,
    clock: Clock,
    shared: &Shared,
) -> Result<(), String> {
    if acks.calls.is_empty() {
        return Ok(());
    }
    conn.send(&shared.abort).await?;
    let t1 = clock.now_ns();
    let mut from = 0;
    for &(count, t0) in &acks.calls {
        let covered = &acks.headers[from..from + count];
        r.settled(plan, shared, covered, t0, t1, Ok(()));
        from += count;
    }
    acks.headers.clear();
    acks.calls.clear();
    Ok(())
}
