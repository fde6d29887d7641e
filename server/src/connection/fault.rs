//! The faults a connection answers with, as RabbitMQ words them: a channel error closes
//! the channel, a connection error the connection (`Connection::fail`). Each names the
//! method it answers, and its text leads with the reply code's name.

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, AMQPClass};
use amq_protocol::types::ShortString;
use leasemq::Error;

use crate::arguments::Refused;
use crate::code;
use crate::exchange::Refusal;
use crate::names;
use crate::vhost::declare;

/// An AMQP reply code and the method it answers, for `channel.close`/`connection.close`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fault {
    /// `Some(channel)` for a channel error, `None` for a connection error.
    pub(crate) channel: Option<u16>,
    /// The reply code.
    pub(crate) code: u16,
    /// The reply text, before [`reply_text`] leads it with the code's name.
    pub(crate) text: String,
    /// The method it answers: its class.
    pub(crate) class_id: u16,
    /// And its method id.
    pub(crate) method_id: u16,
}

impl Fault {
    pub(crate) fn channel(
        channel: u16,
        code: u16,
        text: impl Into<String>,
        m: &AMQPClass,
    ) -> Fault {
        Fault {
            channel: Some(channel),
            code,
            text: text.into(),
            class_id: m.get_amqp_class_id(),
            method_id: m.get_amqp_method_id(),
        }
    }

    pub(crate) fn connection(code: u16, text: impl Into<String>) -> Fault {
        Fault {
            channel: None,
            code,
            text: text.into(),
            class_id: 0,
            method_id: 0,
        }
    }

    pub(crate) fn for_method(mut self, m: &AMQPClass) -> Fault {
        self.class_id = m.get_amqp_class_id();
        self.method_id = m.get_amqp_method_id();
        self
    }
}

/// `exchange.declare` for `Exchange(Declare(Declare { .. }))`.
pub(crate) fn method_name(m: &AMQPClass) -> String {
    let debug = format!("{m:?}");
    let mut parts = debug.split('(');
    let class = parts.next().unwrap_or_default().to_lowercase();
    let method = parts.next().unwrap_or_default().to_lowercase();
    format!("{class}.{method}")
}

/// The reply text of a `channel.close` or `connection.close`: led by the reply code's
/// name, as RabbitMQ's are (`NOT_FOUND - no queue 'jobs' in vhost '/'`), and cut to the
/// 255 bytes a short string holds.
pub(crate) fn reply_text(code: u16, text: String) -> ShortString {
    let name = match code {
        200 => "",
        311 => "CONTENT_TOO_LARGE",
        312 => "NO_ROUTE",
        313 => "NO_CONSUMERS",
        320 => "CONNECTION_FORCED",
        402 => "INVALID_PATH",
        403 => "ACCESS_REFUSED",
        404 => "NOT_FOUND",
        405 => "RESOURCE_LOCKED",
        406 => "PRECONDITION_FAILED",
        501 => "FRAME_ERROR",
        502 => "SYNTAX_ERROR",
        503 => "COMMAND_INVALID",
        504 => "CHANNEL_ERROR",
        505 => "UNEXPECTED_FRAME",
        506 => "RESOURCE_ERROR",
        530 => "NOT_ALLOWED",
        540 => "NOT_IMPLEMENTED",
        541 => "INTERNAL_ERROR",
        _ => "",
    };
    if name.is_empty() || text.starts_with(name) {
        short(text)
    } else {
        short(format!("{name} - {text}"))
    }
}

/// A reply text, cut to the 255 bytes a short string holds.
pub(crate) fn short(mut text: String) -> ShortString {
    if text.len() > 255 {
        let mut end = 255;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    ShortString::from(text)
}

pub(crate) fn no_queue(ch: u16, name: &str, m: &AMQPClass) -> Fault {
    let (vhost, name) = (names::vhost_of(name), names::amqp(name));
    let text = format!("NOT_FOUND - no queue '{name}' in vhost '{vhost}'");
    Fault::channel(ch, code::NOT_FOUND, text, m)
}

/// RabbitMQ's 405 for a queue another connection holds exclusively, or one redeclared
/// with another `exclusive`.
pub(crate) fn locked(ch: u16, name: &str, m: &AMQPClass) -> Fault {
    refused_fault(ch, declare::locked(name), m)
}

/// The fault a refusal of the virtual host's makes: 540 (an argument not served) closes
/// the connection, as RabbitMQ's does; any other code the channel.
pub(crate) fn refused_fault(ch: u16, refused: Refused, m: &AMQPClass) -> Fault {
    if refused.code == code::NOT_IMPLEMENTED {
        Fault::connection(refused.code, refused.text).for_method(m)
    } else {
        Fault::channel(ch, refused.code, refused.text, m)
    }
}

/// The answer to an `exchange.declare` of a type not served: a plugin's (`x-…`) is a
/// 540; one no broker knows, RabbitMQ's 503.
pub(crate) fn unserved_exchange_type(kind: &str, m: &AMQPClass) -> Fault {
    if kind.starts_with("x-") {
        let text = format!(
            "exchange type '{kind}' is not supported by leasemqd yet (direct, fanout, topic and headers are)"
        );
        Fault::connection(code::NOT_IMPLEMENTED, text).for_method(m)
    } else {
        let text = format!("COMMAND_INVALID - unknown exchange type '{kind}'");
        Fault::connection(code::COMMAND_INVALID, text).for_method(m)
    }
}

/// The AMQP error for a refused exchange call on channel `ch`.
/// RabbitMQ's answer to what an exchange method on `name`, in virtual host `vhost`, met.
pub(crate) fn exchange_fault(
    ch: u16,
    refusal: Refusal,
    name: &str,
    vhost: &str,
    m: &AMQPClass,
) -> Fault {
    let (code, text) = match refusal {
        // A hard error, as RabbitMQ's 541: the server could not keep what it is asked to.
        Refusal::Storage(why) => {
            return Fault::connection(code::INTERNAL_ERROR, format!("INTERNAL_ERROR - {why}"))
                .for_method(m);
        }
        Refusal::Reserved if name.is_empty() => (
            code::ACCESS_REFUSED,
            "ACCESS_REFUSED - operation not permitted on the default exchange".to_string(),
        ),
        Refusal::Reserved => (
            code::ACCESS_REFUSED,
            format!("ACCESS_REFUSED - operation not permitted on exchange '{name}'"),
        ),
        Refusal::NotFound => (
            code::NOT_FOUND,
            format!("NOT_FOUND - no exchange '{name}' in vhost '{vhost}'"),
        ),
        Refusal::Inequivalent(what) => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - inequivalent arg '{what}' for exchange '{name}' in vhost '{vhost}'"),
        ),
        Refusal::InUse => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - exchange '{name}' in vhost '{vhost}' in use"),
        ),
    };
    Fault::channel(ch, code, text, m)
}

/// The AMQP error for a broker error on channel `ch`.
pub(crate) fn broker_fault(ch: u16, e: &Error, m: &AMQPClass) -> Fault {
    let (code, text) = match e {
        Error::ShutDown => {
            return Fault::connection(code::CONNECTION_FORCED, "broker is shutting down")
                .for_method(m)
        }
        Error::QueueClosed | Error::UnknownQueue(_) => {
            (code::NOT_FOUND, format!("NOT_FOUND - {e}"))
        }
        Error::InvalidName => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - {e} (a queue name is 1 to 255 bytes; one with bytes outside A-Z a-z 0-9 . _ : - is kept escaped, each such byte as 3 and each _ as 2, plus 9, and must fit too)"),
        ),
        _ => (
            code::PRECONDITION_FAILED,
            format!("PRECONDITION_FAILED - {e}"),
        ),
    };
    Fault::channel(ch, code, text, m)
}

/// `basic.publish`, as the method a channel error names: only its class and method ids
/// are read, so the publish's own fields need not be copied on every message.
pub(crate) fn publish_method() -> AMQPClass {
    AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish::default()))
}

/// What kind of frame, for error texts.
pub(crate) fn frame_kind(frame: &AMQPFrame) -> String {
    match frame {
        AMQPFrame::ProtocolHeader(_) => "protocol header".into(),
        AMQPFrame::Method(_, m) => method_name(m),
        AMQPFrame::Header(..) => "content header".into(),
        AMQPFrame::Body(..) => "content body".into(),
        AMQPFrame::Heartbeat | AMQPFrame::InvalidHeartbeat(_) => "heartbeat".into(),
    }
}
