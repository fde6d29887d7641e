//! A consumer loop with manual acknowledgements, after RabbitMQ's consumer-ack guide.
//!
//! The queue `emails` dead-letters into `emails.dead`. The mailer takes up to 10 messages
//! at a time (prefetch 10) and, for each one:
//!
//! - rejects a message it cannot parse (a poison message): it goes to the dead-letter queue
//!   and is never retried;
//! - acks a message only after the email was sent;
//! - nacks a message whose sending failed for a transient reason: it comes back after the
//!   retry delay and is tried again.
//!
//! The manual clock stands in for real time, so the retry delay passes at once. Run with
//! `cargo run --example emails`.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use leasemq::{
    Broker, ConsumerConfig, DeathReason, Delivery, Error, Message, QueueConfig, RetryPolicy,
};

const INBOX: [(&str, &str); 4] = [
    ("email-1", r#"{"to": "ann@example.com"}"#),
    ("email-2", r#"{"to": "bob@example.com"}"#), // the mail server is down the first time
    ("email-3", "<<this is not json>>"),         // poison
    ("email-4", r#"{"to": "cy@example.com"}"#),
];

fn main() -> Result<(), Error> {
    let broker = Broker::builder().shards(2).manual_clock().build()?;
    let dead = broker.declare_queue("emails.dead", QueueConfig::default())?;
    let emails = broker.declare_queue(
        "emails",
        QueueConfig {
            ack_timeout: Duration::from_secs(30 * 60), // RabbitMQ's default consumer timeout
            retry: RetryPolicy {
                initial: Duration::from_secs(5),
                multiplier: 2.0,
                max: Duration::from_secs(60),
                jitter: 0.0,
            },
            max_deliveries: Some(5), // a message that always fails does not loop for ever
            dead_letter: Some("emails.dead".to_string()),
            ..QueueConfig::default()
        },
    )?;
    let mailer = emails.consume("mailer", ConsumerConfig { prefetch: 10 })?;
    let inbox = INBOX
        .iter()
        .map(|(id, body)| Message::new(*body).with_id(*id))
        .collect();
    emails.put_batch(inbox)?;

    let mut smtp = FlakySmtp::failing_once_for(&["bob@example.com"]);
    loop {
        while let Some(delivery) = mailer.try_recv()? {
            on_message(&delivery, &mut smtp);
        }
        let s = emails.stats();
        if s.ready + s.delayed + s.leased == 0 {
            break;
        }
        broker.advance(Duration::from_secs(1))?; // time passes until the retries are due
    }

    let inspector = dead.consume("inspector", ConsumerConfig { prefetch: 10 })?;
    while let Some(letter) = inspector.try_recv()? {
        let death = letter.envelope().death.clone().expect("a death record");
        println!(
            "dead letter {}: {:?} after {} attempt(s) on {}",
            letter.envelope().id,
            death.reason,
            death.attempts,
            death.queue
        );
        assert_eq!(death.reason, DeathReason::Rejected);
    }

    let (s, d) = (emails.stats(), dead.stats());
    println!("emails:      {s:?}");
    println!("emails.dead: {d:?}");
    // Nothing was lost: every message was sent or dead-lettered, and the dead letter arrived.
    assert_eq!(s.enqueued, s.acked + s.dead_lettered + s.dropped);
    assert_eq!((s.acked, s.dead_lettered, s.dropped), (3, 1, 0));
    assert_eq!(s.nacked, 1);
    assert_eq!(d.enqueued, s.dead_lettered);
    broker.shutdown();
    Ok(())
}

/// What the handler does with one delivery, as in the guide's `on_message`.
fn on_message(delivery: &Delivery, smtp: &mut FlakySmtp) {
    let envelope = delivery.envelope();
    let email = match parse(&envelope.body) {
        Ok(email) => email,
        Err(why) => {
            println!("{}: {why}: rejected to the dead-letter queue", envelope.id);
            delivery.reject(); // poison: never requeue it
            return;
        }
    };
    match smtp.send(&email) {
        Ok(()) => {
            delivery.ack(); // only after success
        }
        Err(err) => {
            println!("{}: {err}: will retry", envelope.id);
            delivery.nack(); // transient: try again after the retry delay
        }
    }
    if envelope.redelivered() {
        println!(
            "{}: this message was delivered before (attempt {})",
            envelope.id, envelope.attempt
        );
    }
}

struct Email {
    to: String,
}

/// Reads `{"to": "<address>"}`: just enough JSON for the example.
fn parse(body: &[u8]) -> Result<Email, String> {
    let text = std::str::from_utf8(body).map_err(|_| "not UTF-8".to_string())?;
    let inner = text
        .trim()
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .ok_or_else(|| format!("not a JSON object: {text:?}"))?;
    let (key, value) = inner
        .split_once(':')
        .ok_or_else(|| format!("no field in {text:?}"))?;
    if key.trim() != "\"to\"" {
        return Err(format!("no \"to\" field in {text:?}"));
    }
    let to = value
        .trim()
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|address| address.contains('@'))
        .ok_or_else(|| format!("bad address in {text:?}"))?;
    Ok(Email { to: to.to_string() })
}

/// A mail server that is unreachable the first time for some addresses.
struct FlakySmtp {
    fail_next: HashSet<String>,
}

#[derive(Debug)]
struct ConnectionError;

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection to the mail server failed")
    }
}

impl FlakySmtp {
    fn failing_once_for(addresses: &[&str]) -> FlakySmtp {
        FlakySmtp {
            fail_next: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    fn send(&mut self, email: &Email) -> Result<(), ConnectionError> {
        if self.fail_next.remove(&email.to) {
            return Err(ConnectionError);
        }
        println!("sending to {}", email.to);
        Ok(())
    }
}
