//! What a connection tells the management API of itself (`live.rs`): who it is, its
//! channels and their consumers; and its close from the API.

use super::fault::Fault;
use super::{code, Connection, Phase};
use crate::live::{ChannelView, ConnectionView, ConsumerView};

impl Connection {
    /// Its state now, as the management API shows it.
    pub fn view(&self) -> ConnectionView {
        let state = match self.phase {
            Phase::AwaitHeader | Phase::AwaitStartOk => "starting",
            Phase::AwaitTuneOk => "tuning",
            Phase::AwaitOpen => "opening",
            Phase::Open if self.blocked => "blocked",
            Phase::Open => "running",
            Phase::Closing | Phase::Closed => "closing",
        };
        let mut channels: Vec<ChannelView> = (self.channels.iter())
            .map(|(&number, ch)| ChannelView {
                number,
                prefetch_count: ch.prefetch,
                global_prefetch_count: ch.global_prefetch,
                messages_unacknowledged: ch.unacked.len(),
                confirm: ch.confirm,
                transactional: ch.tx.is_some(),
                consumers: (ch.consumers.iter())
                    .map(|s| ConsumerView {
                        tag: s.tag.to_string(),
                        queue: s.queue.name().to_string(),
                        ack_required: !s.no_ack,
                        active: s.consumer.is_some(),
                    })
                    .collect(),
            })
            .collect();
        channels.sort_by_key(|c| c.number);
        ConnectionView {
            user: self.login.user_name().to_string(),
            vhost: self.login.vhost.clone(),
            state,
            client_properties: self.login.client_properties.clone(),
            timeout: self.heartbeat,
            frame_max: self.frame_max as u32,
            channel_max: self.channel_max,
            channels,
        }
    }

    /// Closes the connection with 320 CONNECTION_FORCED and `reason`, as RabbitMQ closes
    /// one from its management API.
    pub fn close_forced(&mut self, reason: &str) {
        if matches!(self.phase, Phase::Closing | Phase::Closed) {
            return;
        }
        if self.phase != Phase::Open {
            self.phase = Phase::Closed;
            return;
        }
        self.fail(Fault::connection(
            code::CONNECTION_FORCED,
            format!("CONNECTION_FORCED - {reason}"),
        ));
    }
}
