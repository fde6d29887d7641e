//! The lending library: a lease is a loan and `ack_timeout` its due date.
//!
//! Sam borrows the Dragon Book and forgets it; when the loan runs out the library lends it
//! to Kim, and Sam's late return is refused. The manual clock makes the 12 seconds pass at
//! once. Run with `cargo run --example library`; it prints:
//!
//! ```text
//! sam holds: ['Dragon Book'] attempt 1
//! kim holds: ['Dragon Book'] attempt 2
//! sam's late ack accepted? False
//! kim's ack accepted? True
//! ```

use std::time::Duration;

use leasemq::{Broker, Consumer, ConsumerConfig, Delivery, Error, Message, QueueConfig};

fn main() -> Result<(), Error> {
    let broker = Broker::builder().shards(2).manual_clock().build()?;
    let queue = broker.declare_queue(
        "library",
        QueueConfig {
            ack_timeout: Duration::from_secs(10),
            ..QueueConfig::default()
        },
    )?;
    let sam = queue.consume("sam", ConsumerConfig::default())?;
    let kim = queue.consume("kim", ConsumerConfig::default())?;
    queue.put(Message::new("Dragon Book").with_id("book-1"))?;

    let sam_holds = holdings(&sam)?;
    println!(
        "sam holds: {} attempt {}",
        titles(&sam_holds),
        sam_holds[0].envelope().attempt
    );
    broker.advance(Duration::from_secs(12))?; // Sam forgets to hand the book back
    let kim_holds = holdings(&kim)?;
    println!(
        "kim holds: {} attempt {}",
        titles(&kim_holds),
        kim_holds[0].envelope().attempt
    );
    println!(
        "sam's late ack accepted? {}",
        python_bool(queue.ack(sam_holds[0].tag()))
    );
    println!(
        "kim's ack accepted? {}",
        python_bool(queue.ack(kim_holds[0].tag()))
    );
    broker.shutdown();
    Ok(())
}

/// Everything already handed to this borrower (calls are barriers: no waiting needed).
fn holdings(consumer: &Consumer) -> Result<Vec<Delivery>, Error> {
    let mut held = Vec::new();
    while let Some(delivery) = consumer.try_recv()? {
        held.push(delivery);
    }
    Ok(held)
}

/// The titles as the Python original prints a list of strings: `['Dragon Book']`.
fn titles(held: &[Delivery]) -> String {
    let quoted: Vec<String> = held
        .iter()
        .map(|d| format!("'{}'", String::from_utf8_lossy(&d.envelope().body)))
        .collect();
    format!("[{}]", quoted.join(", "))
}

fn python_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}
