//! leasemqd through `lapin`, an AMQP 0-9-1 client that shares no code with the server:
//! each test starts `serve::accept_loop` on a loopback port of its own, connects as
//! `guest:guest` and checks one behaviour of docs/amqp.md end to end, down to delivery
//! tags, `redelivered` flags and message properties.
//!
//! Nothing here sleeps to wait for state. A wait for a frame has a timeout (a failure,
//! not a pause); where a test must know the broker has applied what was sent before, it
//! makes a round trip on the same channel (`queue.declare` passive), which the server
//! answers only after the frames that came before it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ErrorKind};
use leasemq::{Broker, QueueStats};
use leasemq_server::{serve, Settings};
use tokio::net::TcpListener;
use tokio::time::timeout;

/// How long a test waits for a frame it expects before it fails.
const WAIT: Duration = Duration::from_secs(10);

/// A broker served on a loopback port, and a lapin connection to it.
struct Server {
    broker: Broker,
    addr: SocketAddr,
    conn: Connection,
}

impl Server {
    async fn start() -> Server {
        let broker = Broker::builder()
            .shards(2)
            .yield_budget(serve::YIELD_BUDGET)
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve::accept_loop(
            listener,
            broker.clone(),
            Arc::new(Settings::default()),
        ));
        let conn = connect(addr).await;
        Server { broker, addr, conn }
    }

    async fn channel(&self) -> Channel {
        self.conn.create_channel().await.unwrap()
    }

    fn stats(&self, queue: &str) -> QueueStats {
        self.broker.queue(queue).unwrap().stats()
    }

    async fn stop(self) {
        self.conn.close(200, "bye".into()).await.unwrap();
        self.broker.shutdown();
    }
}

async fn connect(addr: SocketAddr) -> Connection {
    let uri = format!("amqp://guest:guest@{addr}/%2f");
    let connecting = Connection::connect(&uri, ConnectionProperties::default());
    timeout(WAIT, connecting).await.unwrap().unwrap()
}

async fn declare(ch: &Channel, queue: &str, arguments: FieldTable) {
    ch.queue_declare(queue.into(), QueueDeclareOptions::default(), arguments)
        .await
        .unwrap();
}

/// A passive `queue.declare`: its answer comes after everything sent before it on `ch`
/// was applied, and says how many messages are ready.
async fn ready_after_round_trip(ch: &Channel, queue: &str) -> u32 {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(queue.into(), options, FieldTable::default())
        .await
        .unwrap()
        .message_count()
}

async fn publish(ch: &Channel, queue: &str, body: &[u8]) {
    publish_with(ch, queue, body, BasicProperties::default()).await;
}

async fn publish_with(ch: &Channel, queue: &str, body: &[u8], properties: BasicProperties) {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body,
        properties,
    )
    .await
    .unwrap();
}

async fn consume(ch: &Channel, queue: &str, tag: &str, prefetch: u16) -> Consumer {
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    ch.basic_consume(
        queue.into(),
        tag.into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap()
}

/// The consumer's next delivery, within [`WAIT`].
async fn next(consumer: &mut Consumer) -> Delivery {
    timeout(WAIT, consumer.next())
        .await
        .expect("a delivery in time")
        .expect("the consumer is open")
        .expect("a delivery, not an error")
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn dead_letter_to(queue: &str) -> FieldTable {
    table(&[
        ("x-dead-letter-exchange", long("")),
        ("x-dead-letter-routing-key", long(queue)),
    ])
}

/// Every property a publisher can set, with a headers table of several value types.
fn full_properties() -> BasicProperties {
    let nested = table(&[("depth", AMQPValue::LongInt(2))]);
    let headers = table(&[
        ("tenant", long("acme")),
        ("attempt", AMQPValue::LongLongInt(-3)),
        ("urgent", AMQPValue::Boolean(true)),
        ("ratio", AMQPValue::Double(0.25)),
        ("nested", AMQPValue::FieldTable(nested)),
    ]);
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("gzip".into())
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_priority(5)
        .with_correlation_id("req-42".into())
        .with_reply_to("replies".into())
        .with_expiration("60000".into())
        .with_message_id("msg-7".into())
        .with_timestamp(1_700_000_000)
        .with_type("email.send".into())
        .with_app_id("billing".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_and_body_come_back_whole() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "props", FieldTable::default()).await;
    let body = b"{\"to\": \"sam\"}\x00\xff binary tail";
    publish_with(&ch, "props", body, full_properties()).await;

    let mut consumer = consume(&ch, "props", "reader", 10).await;
    let d = next(&mut consumer).await;
    assert_eq!(d.data, body);
    assert_eq!(d.properties, full_properties());
    assert_eq!((d.delivery_tag, d.redelivered), (1, false));
    assert_eq!(d.routing_key.as_str(), "props");
    assert_eq!(d.exchange.as_str(), "");
    assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_the_unacked_deliveries_and_each_ack_lets_one_more_through() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "bounded", FieldTable::default()).await;
    for i in 0..10 {
        publish(&ch, "bounded", format!("job {i}").as_bytes()).await;
    }
    let mut consumer = consume(&ch, "bounded", "worker", 3).await;
    let mut held = Vec::new();
    for i in 0..3 {
        let d = next(&mut consumer).await;
        assert_eq!(d.data, format!("job {i}").into_bytes());
        held.push(d);
    }
    // Three are out and none can follow until one is acked.
    assert_eq!(ready_after_round_trip(&ch, "bounded").await, 7);
    let stats = s.stats("bounded");
    assert_eq!((stats.leased, stats.ready, stats.delivered), (3, 7, 3));

    for i in 3..10u64 {
        let oldest = held.remove(0);
        assert!(oldest.ack(BasicAckOptions::default()).await.unwrap());
        let d = next(&mut consumer).await;
        assert_eq!(d.data, format!("job {i}").into_bytes());
        assert_eq!((d.delivery_tag, d.redelivered), (i + 1, false));
        held.push(d);
    }
    for d in held {
        assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    }
    assert_eq!(ready_after_round_trip(&ch, "bounded").await, 0);
    let stats = s.stats("bounded");
    assert_eq!((stats.acked, stats.leased, stats.ready), (10, 0, 0));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_with_multiple_settles_every_delivery_up_to_its_tag() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "batch", FieldTable::default()).await;
    for i in 0..5 {
        publish(&ch, "batch", format!("m{i}").as_bytes()).await;
    }
    let mut consumer = consume(&ch, "batch", "worker", 10).await;
    let mut deliveries = Vec::new();
    for _ in 0..5 {
        deliveries.push(next(&mut consumer).await);
    }
    let tags: Vec<u64> = deliveries.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, [1, 2, 3, 4, 5]);

    let multiple = BasicAckOptions { multiple: true };
    assert!(deliveries[3].ack(multiple).await.unwrap());
    ready_after_round_trip(&ch, "batch").await;
    let stats = s.stats("batch");
    assert_eq!((stats.acked, stats.leased), (4, 1));

    // Only the fifth is still unacked: closing the channel brings back that one alone.
    ch.close(200, "done".into()).await.unwrap();
    let other = s.channel().await;
    let mut consumer = consume(&other, "batch", "second", 10).await;
    let d = next(&mut consumer).await;
    assert_eq!((d.data.as_slice(), d.redelivered), (&b"m4"[..], true));
    assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    assert_eq!(ready_after_round_trip(&other, "batch").await, 0);
    let stats = s.stats("batch");
    assert_eq!((stats.acked, stats.leased, stats.ready), (5, 0, 0));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_requeue_comes_back_flagged_redelivered() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "retry", FieldTable::default()).await;
    publish(&ch, "retry", b"flaky").await;
    let mut consumer = consume(&ch, "retry", "worker", 1).await;
    let first = next(&mut consumer).await;
    assert_eq!((first.delivery_tag, first.redelivered), (1, false));
    let requeue = BasicNackOptions {
        requeue: true,
        multiple: false,
    };
    assert!(first.nack(requeue).await.unwrap());

    let again = next(&mut consumer).await;
    assert_eq!(again.data, b"flaky");
    assert_eq!((again.delivery_tag, again.redelivered), (2, true));
    assert!(again.ack(BasicAckOptions::default()).await.unwrap());
    ready_after_round_trip(&ch, "retry").await;
    let stats = s.stats("retry");
    assert_eq!((stats.nacked, stats.acked, stats.delivered), (1, 1, 2));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_goes_to_the_dead_letter_queue_with_its_properties() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "parked", FieldTable::default()).await;
    declare(&ch, "orders", dead_letter_to("parked")).await;
    let properties = BasicProperties::default()
        .with_message_id("order-9".into())
        .with_content_type("text/plain".into())
        .with_headers(table(&[("region", long("eu"))]));
    publish_with(&ch, "orders", b"poison", properties).await;

    let mut orders = consume(&ch, "orders", "worker", 1).await;
    let d = next(&mut orders).await;
    let drop_it = BasicRejectOptions { requeue: false };
    assert!(d.reject(drop_it).await.unwrap());

    let mut parked = consume(&ch, "parked", "inspector", 1).await;
    let dead = next(&mut parked).await;
    assert_eq!(dead.data, b"poison");
    assert_eq!(dead.routing_key.as_str(), "parked");
    let p = &dead.properties;
    assert_eq!(p.message_id().as_ref().map(|m| m.as_str()), Some("order-9"));
    assert_eq!(
        p.content_type().as_ref().map(|c| c.as_str()),
        Some("text/plain")
    );
    let headers = p.headers().as_ref().expect("headers kept");
    assert_eq!(headers.inner().get("region"), Some(&long("eu")));
    assert!(dead.ack(BasicAckOptions::default()).await.unwrap());
    ready_after_round_trip(&ch, "parked").await;
    assert_eq!(
        (s.stats("orders").rejected, s.stats("orders").dead_lettered),
        (1, 1)
    );
    assert_eq!(s.stats("parked").acked, 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_is_confirmed_once_confirms_are_selected() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "confirmed", FieldTable::default()).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::new();
    for i in 0..200 {
        let body = format!("c{i}");
        let confirm = ch
            .basic_publish(
                "".into(),
                "confirmed".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap();
        confirms.push(confirm);
    }
    for confirm in confirms {
        let confirmation = timeout(WAIT, confirm).await.unwrap().unwrap();
        assert!(confirmation.is_ack());
        assert_eq!(confirmation.take_message(), None);
    }
    assert!(ch.wait_for_confirms().await.unwrap().is_empty());
    // A confirm means the message is in the queue.
    assert_eq!(s.stats("confirmed").enqueued, 200);
    assert_eq!(ready_after_round_trip(&ch, "confirmed").await, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_channel_returns_its_unacked_deliveries_flagged_redelivered() {
    let s = Server::start().await;
    let first = s.channel().await;
    declare(&first, "handover", FieldTable::default()).await;
    for body in ["a", "b", "c"] {
        publish(&first, "handover", body.as_bytes()).await;
    }
    let mut consumer = consume(&first, "handover", "dies", 10).await;
    let a = next(&mut consumer).await;
    let _b = next(&mut consumer).await;
    let _c = next(&mut consumer).await;
    assert!(a.ack(BasicAckOptions::default()).await.unwrap());
    first.close(200, "crash".into()).await.unwrap();

    let second = s.channel().await;
    let mut consumer = consume(&second, "handover", "takes-over", 10).await;
    for body in ["b", "c"] {
        let d = next(&mut consumer).await;
        assert_eq!(d.data, body.as_bytes());
        assert!(d.redelivered, "{body} is a redelivery");
        assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    }
    assert_eq!(ready_after_round_trip(&second, "handover").await, 0);
    let stats = s.stats("handover");
    assert_eq!((stats.acked, stats.leased, stats.delivered), (3, 0, 5));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_redelivered_and_the_late_ack_is_ignored() {
    let s = Server::start().await;
    let slow = s.channel().await;
    let timeout_200ms = table(&[("x-consumer-timeout", AMQPValue::LongLongInt(200))]);
    declare(&slow, "leased", timeout_200ms).await;
    publish(&slow, "leased", b"long job").await;
    let mut slow_consumer = consume(&slow, "leased", "slow", 1).await;
    let first = next(&mut slow_consumer).await;
    assert!(!first.redelivered);

    // A second consumer on another channel; the lease runs out after 200 ms and the
    // message comes back to one of the two, flagged.
    let fast = s.channel().await;
    let mut fast_consumer = consume(&fast, "leased", "fast", 1).await;
    let again = tokio::select! {
        d = next(&mut slow_consumer) => d,
        d = next(&mut fast_consumer) => d,
    };
    assert_eq!(again.data, b"long job");
    assert!(again.redelivered);

    // The late ack is no channel error: the channel still answers, and the broker counts
    // the ack as stale.
    assert!(first.ack(BasicAckOptions::default()).await.unwrap());
    ready_after_round_trip(&slow, "leased").await;
    assert!(slow.status().connected());
    assert!(again.ack(BasicAckOptions::default()).await.unwrap());
    ready_after_round_trip(&slow, "leased").await;
    ready_after_round_trip(&fast, "leased").await;
    let stats = s.stats("leased");
    assert_eq!(
        (stats.expired, stats.stale, stats.acked, stats.leased),
        (1, 1, 1, 0)
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_of_a_tag_never_issued_closes_the_channel_with_406() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "strict", FieldTable::default()).await;
    // basic.ack has no answer: what the server answers it with, a channel.close, reaches
    // the channel's consumers (a next call on the channel could be refused by lapin
    // before it is sent, if the close came first).
    let mut watch = consume(&ch, "strict", "watch", 1).await;
    ch.basic_ack(99, BasicAckOptions::default()).await.unwrap();
    let err = timeout(WAIT, watch.next())
        .await
        .unwrap()
        .expect("the consumer hears how its channel ended")
        .expect_err("the channel was closed");
    let ErrorKind::ProtocolError(amqp) = err.kind() else {
        panic!("expected a protocol error, got {err:?}");
    };
    assert_eq!(
        amqp.kind(),
        &AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
        "{amqp:?}"
    );
    assert!(!ch.status().connected());

    // Only the channel is closed: the connection and a new channel still work.
    let other = s.channel().await;
    assert_eq!(ready_after_round_trip(&other, "strict").await, 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mandatory_publish_to_no_queue_is_returned() {
    let s = Server::start().await;
    let ch = s.channel().await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let properties = BasicProperties::default().with_message_id("lost-1".into());
    let confirm = ch
        .basic_publish(
            "".into(),
            "nobody-home".into(),
            mandatory,
            b"undeliverable",
            properties,
        )
        .await
        .unwrap();
    let confirmation = timeout(WAIT, confirm).await.unwrap().unwrap();
    // As RabbitMQ does: the return comes first, then the publish is confirmed.
    assert!(confirmation.is_ack());
    let returned = confirmation.take_message().expect("a basic.return");
    assert_eq!(returned.delivery.data, b"undeliverable");
    assert_eq!(returned.reply_code, 312);
    assert_eq!(returned.delivery.routing_key.as_str(), "nobody-home");
    assert_eq!(
        returned
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str()),
        Some("lost-1")
    );

    // Without `mandatory` the same publish is dropped silently and confirmed.
    let confirm = ch
        .basic_publish(
            "".into(),
            "nobody-home".into(),
            BasicPublishOptions::default(),
            b"dropped",
            BasicProperties::default(),
        )
        .await
        .unwrap();
    let confirmation = timeout(WAIT, confirm).await.unwrap().unwrap();
    assert!(confirmation.is_ack());
    assert_eq!(confirmation.take_message(), None);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_ack_consumer_has_each_message_settled_as_it_is_sent() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "fire-and-forget", FieldTable::default()).await;
    for i in 0..5 {
        publish(&ch, "fire-and-forget", format!("n{i}").as_bytes()).await;
    }
    let options = BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    };
    let mut consumer = ch
        .basic_consume(
            "fire-and-forget".into(),
            "auto".into(),
            options,
            FieldTable::default(),
        )
        .await
        .unwrap();
    for i in 0..5u64 {
        let d = next(&mut consumer).await;
        assert_eq!(d.data, format!("n{i}").into_bytes());
        assert_eq!((d.delivery_tag, d.redelivered), (i + 1, false));
    }
    // Nothing is left to ack: closing the channel brings nothing back.
    ch.close(200, "done".into()).await.unwrap();
    let other = s.channel().await;
    assert_eq!(ready_after_round_trip(&other, "fire-and-forget").await, 0);
    let stats = s.stats("fire-and-forget");
    assert_eq!((stats.acked, stats.leased, stats.ready), (5, 0, 0));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_no_bytes_and_of_many_frames_come_back_whole() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "sizes", FieldTable::default()).await;
    // Larger than the negotiated frame_max: lapin sends it as several body frames.
    let frame_max = s.conn.configuration().frame_max() as usize;
    let big: Vec<u8> = (0..3 * frame_max + 17).map(|i| (i % 251) as u8).collect();
    publish(&ch, "sizes", b"").await;
    publish(&ch, "sizes", &big).await;
    let mut consumer = consume(&ch, "sizes", "reader", 10).await;
    let empty = next(&mut consumer).await;
    assert!(empty.data.is_empty());
    let large = next(&mut consumer).await;
    assert_eq!(large.data.len(), big.len());
    assert!(large.data == big, "the large body changed on the way");
    let all = BasicAckOptions { multiple: true };
    assert!(large.ack(all).await.unwrap());
    assert_eq!(ready_after_round_trip(&ch, "sizes").await, 0);
    assert_eq!(s.stats("sizes").acked, 2);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_multiple_requeues_every_delivery_up_to_its_tag() {
    let s = Server::start().await;
    let ch = s.channel().await;
    declare(&ch, "bulk-retry", FieldTable::default()).await;
    for i in 0..4 {
        publish(&ch, "bulk-retry", format!("r{i}").as_bytes()).await;
    }
    let mut consumer = consume(&ch, "bulk-retry", "worker", 4).await;
    let mut first = Vec::new();
    for _ in 0..4 {
        first.push(next(&mut consumer).await);
    }
    // Tags 1..=3 go back; tag 4 stays leased and is acked.
    let requeue_up_to = BasicNackOptions {
        requeue: true,
        multiple: true,
    };
    assert!(first[2].nack(requeue_up_to).await.unwrap());
    assert!(first[3].ack(BasicAckOptions::default()).await.unwrap());
    let mut again = Vec::new();
    for _ in 0..3 {
        let d = next(&mut consumer).await;
        assert!(d.redelivered, "{:?} is a redelivery", d.data);
        again.push(String::from_utf8(d.data.clone()).unwrap());
        assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    }
    again.sort();
    assert_eq!(again, ["r0", "r1", "r2"]);
    assert_eq!(ready_after_round_trip(&ch, "bulk-retry").await, 0);
    let stats = s.stats("bulk-retry");
    assert_eq!((stats.nacked, stats.acked, stats.leased), (3, 4, 0));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_sees_what_the_first_published() {
    let s = Server::start().await;
    let producer = s.channel().await;
    declare(&producer, "shared", FieldTable::default()).await;
    publish(&producer, "shared", b"across connections").await;

    let other = connect(s.addr).await;
    let ch = other.create_channel().await.unwrap();
    let mut consumer = consume(&ch, "shared", "remote", 1).await;
    let d = next(&mut consumer).await;
    assert_eq!(
        (d.data.as_slice(), d.redelivered),
        (&b"across connections"[..], false)
    );
    assert!(d.ack(BasicAckOptions::default()).await.unwrap());
    other.close(200, "bye".into()).await.unwrap();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_basic_cancel_the_deliveries_in_hand_can_still_be_acked() {
    let server = Server::start().await;
    let ch = server.channel().await;
    declare(&ch, "graceful", FieldTable::default()).await;
    for body in [b"a", b"b", b"c"] {
        publish(&ch, "graceful", body).await;
    }
    let mut consumer = consume(&ch, "graceful", "worker", 2).await;
    let first = next(&mut consumer).await;
    let second = next(&mut consumer).await;
    ch.basic_cancel(
        "worker".into(),
        lapin::options::BasicCancelOptions::default(),
    )
    .await
    .unwrap();
    first.ack(BasicAckOptions::default()).await.unwrap();
    second.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(ready_after_round_trip(&ch, "graceful").await, 1);
    let stats = server.stats("graceful");
    assert_eq!((stats.acked, stats.stale, stats.leased), (2, 0, 0));
    // What is left was never delivered: basic.get has it, not redelivered.
    let got = ch
        .basic_get(
            "graceful".into(),
            lapin::options::BasicGetOptions::default(),
        )
        .await
        .unwrap()
        .expect("one message left");
    assert_eq!(
        (&got.delivery.data[..], got.delivery.redelivered),
        (&b"c"[..], false)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_exchange_routes_to_each_queue_bound_with_the_key() {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
    let server = Server::start().await;
    let ch = server.channel().await;
    ch.exchange_declare(
        "events".into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for queue in ["mail", "audit"] {
        declare(&ch, queue, FieldTable::default()).await;
        ch.queue_bind(
            queue.into(),
            "events".into(),
            "signup".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    ch.basic_publish(
        "events".into(),
        "signup".into(),
        BasicPublishOptions::default(),
        b"sam signed up",
        BasicProperties::default(),
    )
    .await
    .unwrap();
    assert_eq!(ready_after_round_trip(&ch, "mail").await, 1);
    assert_eq!(ready_after_round_trip(&ch, "audit").await, 1);
    server.stop().await;
}
