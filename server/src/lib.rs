//! leasemqd: leasemq queues served over AMQP 0-9-1.
//!
//! [`wire`] cuts frames and writes them with `amq-protocol`'s codec; [`content`] keeps an
//! AMQP message's properties inside the leasemq message body.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod content;
pub mod wire;
