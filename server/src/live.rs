//! The server's live connections, for the management API: each registered as it is
//! accepted, with a way to ask it what it is doing ([`Control::Inspect`]) and to close it
//! ([`Control::Close`]). The connection's task answers between frames, so an answer is as
//! exact as its state, and nothing is kept or counted per message for it.
//!
//! What it must not know: frames and channels' insides. The views are plain data the
//! connection fills in (`connection/view.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// How many requests may wait for one connection's task.
const CONTROL_QUEUE: usize = 16;

/// How long the API waits for a connection to answer.
pub const INSPECT_TIME: Duration = Duration::from_secs(2);

/// What the API asks of a connection's task.
#[derive(Debug)]
pub enum Control {
    /// Its state, now.
    Inspect(oneshot::Sender<ConnectionView>),
    /// Close it with 320 CONNECTION_FORCED and this reason (RabbitMQ's words for one
    /// closed from the management API).
    Close(String),
}

/// A connection as the API shows it.
#[derive(Debug, Clone, Default)]
pub struct ConnectionView {
    /// The user it logged in as (empty before).
    pub user: String,
    /// Its virtual host (empty before `connection.open`).
    pub vhost: String,
    /// `starting`, `tuning`, `opening`, `running`, `blocked`, `closing`.
    pub state: &'static str,
    /// What the client said of itself in `start-ok`.
    pub client_properties: Value,
    /// The heartbeat interval agreed, in seconds.
    pub timeout: u16,
    /// The largest frame agreed.
    pub frame_max: u32,
    /// The most channels agreed.
    pub channel_max: u16,
    /// Its open channels.
    pub channels: Vec<ChannelView>,
}

/// A channel as the API shows it.
#[derive(Debug, Clone, Default)]
pub struct ChannelView {
    /// Its number on the connection.
    pub number: u16,
    /// `basic.qos` prefetch for its consumers (0: none).
    pub prefetch_count: u16,
    /// `basic.qos global=true`: the channel's own limit (0: none).
    pub global_prefetch_count: u16,
    /// Deliveries not yet settled.
    pub messages_unacknowledged: usize,
    /// Publisher confirms are on.
    pub confirm: bool,
    /// It is transactional.
    pub transactional: bool,
    /// Its consumers.
    pub consumers: Vec<ConsumerView>,
}

/// A consumer as the API shows it.
#[derive(Debug, Clone, Default)]
pub struct ConsumerView {
    /// Its tag.
    pub tag: String,
    /// Its queue's broker name.
    pub queue: String,
    /// Deliveries wait for an ack (`no_ack` false).
    pub ack_required: bool,
    /// Whether it takes deliveries now (else it waits its turn on a queue with a single
    /// active consumer).
    pub active: bool,
}

/// One registered connection: what is known from its accept, and its control channel.
#[derive(Debug)]
pub struct LiveConnection {
    /// The server's number for it.
    pub id: u64,
    /// Its peer.
    pub peer: SocketAddr,
    /// The server's end.
    pub local: SocketAddr,
    /// It came over TLS.
    pub tls: bool,
    /// When it was accepted, in milliseconds since the Unix epoch.
    pub connected_at: u64,
    control: mpsc::Sender<Control>,
}

impl LiveConnection {
    /// RabbitMQ's name for it: `peer -> local`.
    pub fn name(&self) -> String {
        format!("{} -> {}", self.peer, self.local)
    }

    /// Asks its state; `None` where it ended or did not answer within [`INSPECT_TIME`].
    pub async fn inspect(&self) -> Option<ConnectionView> {
        let (tx, rx) = oneshot::channel();
        self.control.try_send(Control::Inspect(tx)).ok()?;
        tokio::time::timeout(INSPECT_TIME, rx).await.ok()?.ok()
    }

    /// Asks it to close with `reason`; false where it had ended.
    pub fn close(&self, reason: String) -> bool {
        self.control.try_send(Control::Close(reason)).is_ok()
    }
}

/// The live connections, by id.
#[derive(Debug, Default)]
pub struct LiveConnections {
    by_id: Mutex<BTreeMap<u64, Arc<LiveConnection>>>,
}

/// A registration, which ends when dropped (as its connection ends).
#[derive(Debug)]
pub struct Registered {
    live: Arc<LiveConnections>,
    id: u64,
    /// What the API asks of the connection.
    pub controls: mpsc::Receiver<Control>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        (self.live.by_id.lock().expect("never poisoned")).remove(&self.id);
    }
}

impl LiveConnections {
    /// Registers connection `id` until the returned registration is dropped.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        peer: SocketAddr,
        local: SocketAddr,
        tls: bool,
        connected_at: u64,
    ) -> Registered {
        let (control, controls) = mpsc::channel(CONTROL_QUEUE);
        let connection = LiveConnection {
            id,
            peer,
            local,
            tls,
            connected_at,
            control,
        };
        (self.by_id.lock().expect("never poisoned")).insert(id, Arc::new(connection));
        Registered {
            live: Arc::clone(self),
            id,
            controls,
        }
    }

    /// Every live connection, oldest first.
    pub fn all(&self) -> Vec<Arc<LiveConnection>> {
        (self.by_id.lock().expect("never poisoned").values())
            .cloned()
            .collect()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.by_id.lock().expect("never poisoned").len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_is_listed_while_registered_and_answers_what_it_is_asked() {
        let live = Arc::new(LiveConnections::default());
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:5672".parse().unwrap();
        let mut registered = live.register(7, peer, local, false, 0);
        let found = live.all();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name(), "127.0.0.1:5000 -> 127.0.0.1:5672");
        let asking = tokio::spawn({
            let found = Arc::clone(&found[0]);
            async move { found.inspect().await }
        });
        match registered.controls.recv().await {
            Some(Control::Inspect(answer)) => {
                let view = ConnectionView {
                    user: "app".into(),
                    ..ConnectionView::default()
                };
                answer.send(view).unwrap();
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(asking.await.unwrap().unwrap().user, "app");
        assert!(found[0].close("bye".into()));
        assert!(matches!(registered.controls.recv().await, Some(Control::Close(r)) if r == "bye"));
        drop(registered);
        assert!(live.is_empty());
        assert!(
            found[0].inspect().await.is_none(),
            "an ended connection answers nothing"
        );
    }
}
