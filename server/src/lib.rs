//! leasemqd: leasemq queues served over AMQP 0-9-1, so that unmodified AMQP clients
//! (pika, lapin, amqplib) publish to and consume from a leasemq broker.
//!
//! The pieces, from the wire inwards:
//!
//! - [`serve`] is the tokio side: it accepts sockets and runs one task per connection,
//!   which only reads, writes and waits. It is the connection's one writer.
//! - [`Connection`] is the protocol, with no IO: bytes in, broker calls and frames out.
//!   It is unit-tested by feeding it frames and reading the frames it answers with.
//! - [`VHost`] is what the connections share and their methods change: queues,
//!   exchanges and bindings, the rules of declaring them, and the tasks that expire and
//!   dead-letter on their own.
//! - [`wire`] cuts frames and writes them with `amq-protocol`'s codec; [`content`] keeps an
//!   AMQP message's properties inside the leasemq message body; [`exchange`] routes
//!   publishes through the default, direct, fanout, topic and headers exchanges, and
//!   through exchanges bound to exchanges and alternate exchanges.
//!
//! How AMQP's unacked deliveries map onto leases is in `connection/channel.rs`; what is
//! served and what is not yet is in `docs/amqp.md`, and how it differs from RabbitMQ in
//! `server/README.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod alarms;
pub mod arguments;
pub mod clock;
mod code;
mod connection;
pub mod consumers;
pub mod content;
pub mod dead_letter;
pub mod declared;
pub mod disk;
pub mod durable_queues;
pub mod exchange;
pub mod expiry;
pub mod field;
pub mod imports;
pub mod internal;
pub mod live;
pub mod management;
pub mod memory;
pub mod message_expiry;
pub mod metrics;
pub mod names;
pub mod offload;
pub mod resources;
pub mod serve;
pub mod settings;
pub mod tls;
pub mod vhost;
pub mod wire;

pub use clock::{LeaseClock, WallClock};
pub use connection::{Connection, ConsumerSlot, TimedOut};
pub use consumers::QueueConsumers;
pub use settings::Settings;
pub use vhost::VHost;
