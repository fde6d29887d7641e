//! The connection's clocks, without IO: when the handshake must be done (RabbitMQ's
//! `handshake_timeout`), when a heartbeat is due and when the peer's are overdue, and how
//! long a `connection.close` waits for its `close-ok`.
//!
//! The driver says when it read and when the socket took bytes, asks when to wake next
//! ([`Connection::poll_timeout`]) and calls [`Connection::handle_timeout`] then; every
//! decision is made here, as quinn-proto's `Connection` makes its own.

use std::time::{Duration, Instant};

use super::Connection;

/// How long a connection we closed waits for the peer's `close-ok`.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The same at a server shutdown, which should not wait long on an idle client.
const SHUTDOWN_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// When things last happened on the connection, and the deadlines that follow.
#[derive(Debug)]
pub(super) struct Timers {
    /// A client not through the handshake by then is dropped.
    handshake_by: Instant,
    /// Set once the handshake is done: its deadline no longer counts.
    shaken: bool,
    /// When the peer was last heard, or reading last paused (a peer is not late with
    /// heartbeats we do not read).
    last_read: Instant,
    /// When the socket last took bytes, or a heartbeat was last due.
    last_write: Instant,
    /// When the socket last took bytes: a heartbeat is not written while output waits.
    last_taken: Instant,
    /// When a close we sent stops waiting for its `close-ok`.
    close_by: Option<Instant>,
    /// The server shuts down: a close waits less.
    forced: bool,
}

impl Timers {
    /// The clocks of a connection accepted at `now`, with `handshake_timeout` to log in.
    pub(super) fn new(now: Instant, handshake_timeout: Duration) -> Timers {
        Timers {
            handshake_by: now + handshake_timeout,
            shaken: false,
            last_read: now,
            last_write: now,
            last_taken: now,
            close_by: None,
            forced: false,
        }
    }

    /// The server shuts down: a close from now on waits [`SHUTDOWN_CLOSE_GRACE`].
    pub(super) fn force(&mut self) {
        self.forced = true;
    }
}

/// Why a connection's time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimedOut {
    /// The client did not finish its handshake in time.
    Handshake,
    /// Nothing came from the peer for two heartbeat intervals.
    MissedHeartbeats,
    /// The peer took nothing of what waits for it for two heartbeat intervals.
    PeerTookNothing,
    /// No `close-ok` came in time for a close the server sent: the connection just ends.
    CloseGrace,
}

impl TimedOut {
    /// What the driver's log says of it.
    pub fn text(self) -> &'static str {
        match self {
            TimedOut::Handshake => "no handshake in time",
            TimedOut::MissedHeartbeats => "missed heartbeats",
            TimedOut::PeerTookNothing => "the peer took nothing sent to it",
            TimedOut::CloseGrace => "no close-ok in time",
        }
    }
}

impl Connection {
    /// Bytes came from the peer at `now`.
    pub fn on_read(&mut self, now: Instant) {
        self.timers.last_read = now;
    }

    /// The socket took bytes at `now`.
    pub fn on_written(&mut self, now: Instant) {
        self.timers.last_write = now;
        self.timers.last_taken = now;
    }

    /// The driver does not read for now (output waits, or the connection takes no
    /// input): the peer's heartbeats go unread, so it is not late with them.
    pub fn reading_paused(&mut self, now: Instant) {
        self.timers.last_read = now;
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due, asked at `now`: the
    /// handshake's deadline, the next heartbeat, or the end of a close's grace (which
    /// starts when a close is first seen here); `None` for none.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        let heartbeat = self.heartbeat();
        let t = &mut self.timers;
        t.shaken |= self.phase == super::Phase::Open;
        if self.phase == super::Phase::Closing && t.close_by.is_none() {
            let grace = if t.forced {
                SHUTDOWN_CLOSE_GRACE
            } else {
                CLOSE_GRACE
            };
            t.close_by = Some(now + grace);
        }
        let beat_at = (!heartbeat.is_zero()).then(|| t.last_write + heartbeat / 2);
        let handshake_by = (!t.shaken).then_some(t.handshake_by);
        [beat_at, handshake_by, t.close_by]
            .into_iter()
            .flatten()
            .min()
    }

    /// What is due at `now`, with `pending` bytes waiting for the socket: the connection
    /// ends with the reason, or a heartbeat goes into the output when the socket is quiet.
    ///
    /// # Errors
    ///
    /// [`TimedOut`]: the handshake took too long, the peer's heartbeats stopped, the peer
    /// took nothing for as long, or a close's grace ran out.
    pub fn handle_timeout(&mut self, now: Instant, pending: usize) -> Result<(), TimedOut> {
        let heartbeat = self.heartbeat();
        let t = &mut self.timers;
        t.shaken |= self.phase == super::Phase::Open;
        if !t.shaken && now >= t.handshake_by {
            return Err(TimedOut::Handshake);
        }
        if t.close_by.is_some_and(|by| now >= by) {
            return Err(TimedOut::CloseGrace);
        }
        if heartbeat.is_zero() || now < t.last_write + heartbeat / 2 {
            return Ok(());
        }
        if now.saturating_duration_since(t.last_read) > heartbeat * 2 {
            return Err(TimedOut::MissedHeartbeats);
        }
        // A peer that takes nothing of what waits for it for as long as missed heartbeats
        // take is gone too, though its own heartbeats go unread (reading pauses while
        // output waits): what the connection holds is freed.
        if pending > 0 && now.saturating_duration_since(t.last_taken) > heartbeat * 2 {
            return Err(TimedOut::PeerTookNothing);
        }
        t.last_write = now;
        // Output waiting to be sent tells the peer we are here once it moves; a heartbeat
        // behind it would only add to it.
        if pending == 0 {
            self.send_heartbeat();
        }
        Ok(())
    }
}
