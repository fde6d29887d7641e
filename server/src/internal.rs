//! A connection of the server's own: AMQP methods fed to a [`Connection`] with no socket,
//! so that what the server does for a definitions file (`imports.rs`) or the management
//! API goes through the same checks, and is kept the same way, as what a client does.
//! Opened for the server (every permission) or as a user (that user's permissions in
//! the virtual host, checked as a client's methods are).
//!
//! Its calls block while the connection waits on the broker (a durable queue's log):
//! callers on the runtime make them from a blocking thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::frame::{gen_frame, parse_frame, AMQPFrame, WriteContext};
use amq_protocol::protocol::{channel, connection, AMQPClass};
use leasemq::Broker;

use crate::access::User;
use crate::vhost::VHosts;
use crate::{Connection, Settings};

/// The one channel an internal connection uses.
pub const CHANNEL: u16 = 1;

/// How long a call may wait for the disk.
const ANSWER_LIMIT: Duration = Duration::from_secs(30);

/// A connection with no socket, its channel [`CHANNEL`] open; see the module docs.
pub struct Internal {
    conn: Connection,
}

impl Internal {
    /// A connection for the server's own use in `vhost`, with every permission; `None`
    /// where there is no such virtual host.
    pub fn for_server(
        broker: &Broker,
        settings: &Arc<Settings>,
        vhosts: &Arc<VHosts>,
        vhost: &str,
    ) -> Option<Internal> {
        let mut conn = Connection::new(
            broker.clone(),
            Arc::clone(settings),
            Arc::clone(vhosts),
            0,
            true,
        );
        conn.open_for_server(vhost).then(|| Internal::open(conn))?
    }

    /// A connection as `user` in `vhost`, with the permissions it has there.
    ///
    /// # Errors
    ///
    /// No such virtual host, or the user has no permissions there: RabbitMQ's words.
    pub fn for_user(
        broker: &Broker,
        settings: &Arc<Settings>,
        vhosts: &Arc<VHosts>,
        vhost: &str,
        user: Arc<User>,
    ) -> Result<Internal, String> {
        let mut conn = Connection::new(
            broker.clone(),
            Arc::clone(settings),
            Arc::clone(vhosts),
            0,
            true,
        );
        conn.open_as(user, vhost)?;
        Internal::open(conn).ok_or_else(|| "the channel did not open".to_string())
    }

    fn open(conn: Connection) -> Option<Internal> {
        let mut internal = Internal { conn };
        let open = AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}));
        let answers = internal.call(&[AMQPFrame::Method(CHANNEL, open)]).ok()?;
        answers
            .iter()
            .all(|a| refusal(a).is_none())
            .then_some(internal)
    }

    /// Feeds `frames` to the connection and returns what it answered, once it has
    /// answered what it awaited.
    ///
    /// # Errors
    ///
    /// No answer within [`ANSWER_LIMIT`].
    pub fn call(&mut self, frames: &[AMQPFrame]) -> Result<Vec<AMQPFrame>, String> {
        let mut bytes = Vec::new();
        for frame in frames {
            bytes = gen_frame(frame)(WriteContext::from(bytes))
                .map_err(|e| format!("a frame does not encode: {e:?}"))?
                .into_inner()
                .0;
        }
        let conn = &mut self.conn;
        let deadline = Instant::now() + ANSWER_LIMIT;
        let mut used = conn.handle_input(&bytes);
        while (used < bytes.len() || conn.awaits_answers()) && !conn.is_closed() {
            if Instant::now() > deadline {
                return Err(format!("no answer within {ANSWER_LIMIT:?}"));
            }
            let waker = std::task::Waker::noop();
            if conn
                .poll_answers(&mut std::task::Context::from_waker(waker))
                .is_pending()
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            used += conn.handle_input(&bytes[used..]);
        }
        let mut out = Vec::new();
        conn.take_output(&mut out);
        let mut answers = Vec::new();
        let mut rest = &out[..];
        while let Ok((next, frame)) = parse_frame(rest) {
            answers.push(frame);
            rest = next;
        }
        Ok(answers)
    }

    /// Sends `method` on the channel: its answers, or the refusal that closed the channel
    /// or the connection (its code and text).
    pub fn method(&mut self, method: AMQPClass) -> Result<Vec<AMQPFrame>, (u16, String)> {
        let answers = self
            .call(&[AMQPFrame::Method(CHANNEL, method)])
            .map_err(|e| (541, e))?;
        match answers.iter().find_map(refusal) {
            Some(refused) => Err(refused),
            None => Ok(answers),
        }
    }
}

/// The code and text of a `channel.close` or `connection.close` among answers.
pub fn refusal(frame: &AMQPFrame) -> Option<(u16, String)> {
    match frame {
        AMQPFrame::Method(_, AMQPClass::Channel(channel::AMQPMethod::Close(c))) => {
            Some((c.reply_code, c.reply_text.to_string()))
        }
        AMQPFrame::Method(_, AMQPClass::Connection(connection::AMQPMethod::Close(c))) => {
            Some((c.reply_code, c.reply_text.to_string()))
        }
        _ => None,
    }
}
