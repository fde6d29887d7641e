use leasemq::*;
use std::time::Duration;

#[test]
fn spec_snippet() -> Result<(), Error> {
    let broker = Broker::builder().shards(2).manual_clock().build()?;
    let q = broker.declare_queue(
        "library",
        QueueConfig {
            ack_timeout: Duration::from_secs(10),
            ..QueueConfig::default()
        },
    )?;
    let sam = q.consume("sam", ConsumerConfig::default())?;
    assert_eq!(
        q.put(Message::new("Dragon Book").with_id("book-1"))?,
        PutOutcome::Enqueued
    );
    let d: Delivery = sam.try_recv()?.unwrap();
    assert_eq!((d.tag(), d.envelope().attempt), (DeliveryTag(1), 1));
    broker.advance(Duration::from_secs(12))?;
    assert!(!q.ack(d.tag()));
    let d2 = sam.try_recv()?.unwrap();
    assert_eq!(d2.envelope().attempt, 2);
    assert!(d2.ack());
    broker.shutdown();
    Ok(())
}
