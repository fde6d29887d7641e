//! The handshake, as RabbitMQ walks it: the protocol header, `connection.start` and
//! `start-ok` with PLAIN, `tune` and `tune-ok`, `open` and `open-ok`; then the connection's
//! own methods (`close`, `close-ok`, `blocked`).

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};

use super::fault::{frame_kind, method_name, Fault};
use super::{code, Connection, Phase, FRAME_MIN_SIZE};

impl Connection {
    pub(super) fn send_start(&mut self) {
        let mut capabilities = FieldTable::default();
        for name in [
            "basic.nack",
            "per_consumer_qos",
            "authentication_failure_close",
            "publisher_confirms",
            "consumer_cancel_notify",
            "direct_reply_to",
            "exchange_exchange_bindings",
            "connection.blocked",
        ] {
            capabilities.insert(name.into(), AMQPValue::Boolean(true));
        }
        let mut properties = FieldTable::default();
        properties.insert("product".into(), AMQPValue::LongString("leasemqd".into()));
        let version = env!("CARGO_PKG_VERSION");
        properties.insert("version".into(), AMQPValue::LongString(version.into()));
        properties.insert("platform".into(), AMQPValue::LongString("Rust".into()));
        properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
        let start = connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: properties,
            mechanisms: self.login.mechanisms().into(),
            locales: "en_US".into(),
        };
        self.phase = Phase::AwaitStartOk;
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Start(start)),
        );
    }

    pub(super) fn handle_handshake(&mut self, frame: AMQPFrame) -> Result<(), Fault> {
        use connection::AMQPMethod as M;
        let method = match frame {
            AMQPFrame::Method(0, AMQPClass::Connection(method)) => method,
            AMQPFrame::Heartbeat => return Ok(()),
            other => {
                let text = format!("unexpected {} during the handshake", frame_kind(&other));
                return Err(Fault::connection(code::UNEXPECTED_FRAME, text));
            }
        };
        match (self.phase, method) {
            (Phase::AwaitStartOk, M::StartOk(start_ok)) => self.handle_start_ok(start_ok),
            (Phase::AwaitTuneOk, M::TuneOk(tune_ok)) => self.handle_tune_ok(tune_ok),
            (Phase::AwaitOpen, M::Open(open)) => {
                self.open_vhost(&open)?;
                self.phase = Phase::Open;
                self.send(0, AMQPClass::Connection(M::OpenOk(connection::OpenOk {})));
                Ok(())
            }
            (_, M::Close(_)) => {
                self.send(0, AMQPClass::Connection(M::CloseOk(connection::CloseOk {})));
                self.phase = Phase::Closed;
                Ok(())
            }
            (_, other) => {
                let m = AMQPClass::Connection(other);
                let text = format!("unexpected {} during the handshake", method_name(&m));
                Err(Fault::connection(code::COMMAND_INVALID, text).for_method(&m))
            }
        }
    }

    pub(super) fn handle_start_ok(&mut self, start_ok: connection::StartOk) -> Result<(), Fault> {
        self.log_in(&start_ok)?;
        let settings = &self.settings;
        // RabbitMQ's blocked connection notifications, for a client that asks for them.
        let capabilities = start_ok.client_properties.inner().get("capabilities");
        self.hears_blocked = matches!(capabilities, Some(AMQPValue::FieldTable(c))
            if matches!(c.inner().get("connection.blocked"), Some(AMQPValue::Boolean(true))));
        let tune = connection::Tune {
            channel_max: settings.channel_max,
            frame_max: settings.frame_max,
            heartbeat: settings.heartbeat,
        };
        self.phase = Phase::AwaitTuneOk;
        self.send(0, AMQPClass::Connection(connection::AMQPMethod::Tune(tune)));
        Ok(())
    }

    pub(super) fn handle_tune_ok(&mut self, tune_ok: connection::TuneOk) -> Result<(), Fault> {
        let ours = self.settings.frame_max;
        let frame_max = if tune_ok.frame_max == 0 {
            ours
        } else {
            tune_ok.frame_max
        };
        if frame_max > ours || frame_max < FRAME_MIN_SIZE {
            let m = AMQPClass::Connection(connection::AMQPMethod::TuneOk(tune_ok));
            let text = format!("frame_max {frame_max} is outside {FRAME_MIN_SIZE}..={ours}");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m));
        }
        self.frame_max = frame_max as usize;
        let channel_max = self.settings.channel_max;
        self.channel_max = match tune_ok.channel_max {
            0 => channel_max,
            n => n.min(channel_max),
        };
        self.heartbeat = tune_ok.heartbeat;
        self.phase = Phase::AwaitOpen;
        Ok(())
    }

    pub(super) fn handle_open(&mut self, frame: AMQPFrame) -> Result<(), Fault> {
        match frame {
            AMQPFrame::Heartbeat => Ok(()),
            AMQPFrame::Method(0, AMQPClass::Connection(method)) => {
                self.handle_connection_method(method)
            }
            AMQPFrame::Method(channel, method) if channel != 0 => {
                self.handle_channel_method(channel, method)
            }
            // A channel's method on channel 0, which only carries the connection's: as
            // RabbitMQ, a channel error that closes the connection.
            AMQPFrame::Method(0, method) => {
                let text = format!("CHANNEL_ERROR - {} on channel 0", method_name(&method));
                Err(Fault::connection(code::CHANNEL_ERROR, text).for_method(&method))
            }
            other => {
                let text = format!(
                    "unexpected {} on channel {}",
                    frame_kind(&other),
                    other.channel_id()
                );
                Err(Fault::connection(code::UNEXPECTED_FRAME, text))
            }
        }
    }

    pub(super) fn handle_connection_method(
        &mut self,
        method: connection::AMQPMethod,
    ) -> Result<(), Fault> {
        use connection::AMQPMethod as M;
        match method {
            M::Close(_) => {
                self.flush_pending();
                self.end_subscriptions(None);
                // Stopped consumers return what they still hold as the channels go.
                self.channels.clear();
                self.drop_exclusive_queues();
                self.send(0, AMQPClass::Connection(M::CloseOk(connection::CloseOk {})));
                self.phase = Phase::Closed;
                Ok(())
            }
            other => {
                let m = AMQPClass::Connection(other);
                let text = format!("{} is not supported by leasemqd", method_name(&m));
                Err(Fault::connection(code::NOT_IMPLEMENTED, text).for_method(&m))
            }
        }
    }
}
