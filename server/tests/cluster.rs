//! Three `leasemqd` processes as a cluster (contract §9), driven through `lapin`: formed
//! with `leasemqd cluster init`, watched with `cluster status --json`, a client on any
//! node publishes with confirms and consumes, and after a `kill -9` of the leader of its
//! queue's shard, a client on another node finds every confirmed message that was not
//! acked. Exchanges, and what a cluster does not serve of queues and publishes, are
//! refused as the contract says.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);
const BIN: &str = env!("CARGO_BIN_EXE_leasemqd");

mod common;
use common::{ports, Node};

/// Starts node `id` of three, whose node links listen on `raft`, and waits for its ready
/// line.
fn start(dir: &Path, id: usize, raft: &[u16], secret: &Path) -> Node {
    let peers: Vec<String> = (raft.iter().enumerate())
        .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
        .collect();
    let child = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "2",
            "--log-level",
            "warn",
        ])
        .arg("--data-dir")
        .arg(dir.join(format!("node-{id}")))
        .args(["--cluster", "test", "--node-id", &id.to_string()])
        .args(["--raft-listen", &format!("127.0.0.1:{}", raft[id - 1])])
        .args(["--peers", &peers.join(",")])
        .arg("--cluster-secret-file")
        .arg(secret)
        .args(["--raft-election-timeout-ms", "300"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    Node::ready(child, &format!("node {id} of cluster \"test\""))
}

/// `leasemqd cluster ARGS` against the node link on `port`: its stdout.
fn cluster(action: &str, port: u16, secret: &Path, more: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["cluster", action, "--raft", &format!("127.0.0.1:{port}")])
        .arg("--cluster-secret-file")
        .arg(secret)
        .args(more)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cluster {action}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The leader of `shard` once the node on `port` knows one other than `not`.
fn leader(port: u16, secret: &Path, shard: usize, not: Option<u64>) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = cluster("status", port, secret, &["--json"]);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        if let Some(leader) = status["shards"][shard]["leader"].as_u64() {
            if Some(leader) != not {
                return leader;
            }
        }
        assert!(Instant::now() < deadline, "no leader: {status}");
        // An election takes a few hundred milliseconds: look again shortly.
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn connect(addr: &str) -> Connection {
    let uri = format!("amqp://guest:guest@{addr}/%2f");
    let connecting = Connection::connect(&uri, ConnectionProperties::default());
    timeout(WAIT, connecting).await.unwrap().unwrap()
}

async fn declare_jobs(ch: &Channel) {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare("jobs".into(), durable, FieldTable::default())
        .await
        .unwrap();
}

async fn publish(ch: &Channel, bodies: impl Iterator<Item = String>) {
    let mut confirms = Vec::new();
    for body in bodies {
        let confirm = ch
            .basic_publish(
                "".into(),
                "jobs".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        confirms.push(confirm);
    }
    for confirm in confirms {
        let confirmation = timeout(WAIT, confirm).await.unwrap().unwrap();
        assert!(confirmation.is_ack(), "a publish was not confirmed");
    }
}

/// Each of a queue's flags and arguments, and what a publish asks, that a cluster does not
/// serve is refused with a 406 that names it and the contract's section; the channel
/// closes and the connection goes on.
async fn refusals(conn: &Connection) {
    let expect = |e: lapin::Error, what: &str| {
        let e = e.to_string();
        assert!(
            e.contains("PRECONDITION_FAILED") && e.contains(what) && e.contains("§9"),
            "{what}: {e}"
        );
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let flags = [
        (QueueDeclareOptions::default(), "durable=false"),
        (
            QueueDeclareOptions {
                exclusive: true,
                ..durable
            },
            "exclusive",
        ),
        (
            QueueDeclareOptions {
                auto_delete: true,
                ..durable
            },
            "auto_delete",
        ),
    ];
    for (options, what) in flags {
        let ch = conn.create_channel().await.unwrap();
        let declared = ch.queue_declare("q".into(), options, FieldTable::default());
        expect(declared.await.unwrap_err(), what);
    }
    let ch = conn.create_channel().await.unwrap();
    let declared = ch.queue_declare("".into(), durable, FieldTable::default());
    expect(declared.await.unwrap_err(), "server-named");
    let arguments = [
        ("x-message-ttl", AMQPValue::LongInt(1000)),
        ("x-expires", AMQPValue::LongInt(60_000)),
        (
            "x-dead-letter-exchange",
            AMQPValue::LongString("dlx".into()),
        ),
        (
            "x-dead-letter-routing-key",
            AMQPValue::LongString("dead".into()),
        ),
        ("x-single-active-consumer", AMQPValue::Boolean(true)),
    ];
    for (key, value) in arguments {
        let ch = conn.create_channel().await.unwrap();
        let mut table = FieldTable::default();
        table.insert(key.into(), value);
        expect(
            ch.queue_declare("q".into(), durable, table)
                .await
                .unwrap_err(),
            key,
        );
    }
    // Asked for as a default, a single active consumer is what every queue has.
    let ch = conn.create_channel().await.unwrap();
    let mut table = FieldTable::default();
    table.insert("x-single-active-consumer".into(), AMQPValue::Boolean(false));
    ch.queue_declare("plain".into(), durable, table)
        .await
        .unwrap();
    let reply = ch.basic_consume(
        "amq.rabbitmq.reply-to".into(),
        "r".into(),
        BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        },
        FieldTable::default(),
    );
    expect(reply.await.unwrap_err(), "direct reply-to");
    let published = [
        (
            BasicProperties::default().with_expiration("1000".into()),
            "expiration",
        ),
        (
            BasicProperties::default().with_reply_to("amq.rabbitmq.reply-to".into()),
            "reply-to",
        ),
    ];
    for (properties, what) in published {
        // Under confirms, the refusal answers the publish's own confirm.
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let options = BasicPublishOptions::default();
        let confirm = ch
            .basic_publish("".into(), "plain".into(), options, b"x", properties)
            .await
            .unwrap();
        expect(timeout(WAIT, confirm).await.unwrap().unwrap_err(), what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_leasemqd_nodes_keep_every_confirmed_message_past_a_leader_s_kill() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a secret the nodes share\n").unwrap();
    let raft = ports(3);
    let mut nodes: Vec<Option<Node>> = (1..=3)
        .map(|id| Some(start(dir.path(), id, &raft, &secret)))
        .collect();
    assert!(cluster("init", raft[0], &secret, &[]).contains("formed"));
    let shard = leasemq::shard_for("jobs", 2);
    let first = leader(raft[1], &secret, shard, None);
    let table = cluster("status", raft[2], &secret, &[]);
    assert!(table.contains("peer 1: reachable"), "{table}");

    // A client on a node that does not lead the queue's shard: forwarded and streamed.
    let other = (1..=3).find(|&id| id != first as usize).unwrap();
    let conn = connect(&nodes[other - 1].as_ref().unwrap().amqp).await;
    let ch = conn.create_channel().await.unwrap();
    declare_jobs(&ch).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish(&ch, (0..20).map(|i| format!("job {i}"))).await;
    // Acked in a transaction on a channel of its own (confirms and transactions do not
    // mix): the commit is answered once the acks are committed by the queue's group.
    let tch = conn.create_channel().await.unwrap();
    tch.basic_qos(5, BasicQosOptions::default()).await.unwrap();
    tch.tx_select().await.unwrap();
    let mut consumer = tch
        .basic_consume(
            "jobs".into(),
            "w".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for i in 0..5 {
        let delivery = timeout(WAIT, consumer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(delivery.data, format!("job {i}").as_bytes());
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    timeout(WAIT, tch.tx_commit()).await.unwrap().unwrap();
    drop(conn);

    // Exchanges are not served by a cluster yet: 540, naming the contract's section.
    let refused = connect(&nodes[0].as_ref().unwrap().amqp).await;
    let rch = refused.create_channel().await.unwrap();
    let declared = rch
        .exchange_declare(
            "events".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
    let e = declared.unwrap_err().to_string();
    assert!(e.contains("NOT_IMPLEMENTED") && e.contains("§9"), "{e}");
    refusals(&connect(&nodes[1].as_ref().unwrap().amqp).await).await;

    // kill -9 of the leader of the queue's shard.
    nodes[first as usize - 1] = None;
    let survivor = (1..=3).find(|&id| id != first as usize).unwrap();
    let second = leader(raft[survivor - 1], &secret, shard, Some(first));
    assert_ne!(second, first);
    let conn = connect(&nodes[survivor - 1].as_ref().unwrap().amqp).await;
    let ch = conn.create_channel().await.unwrap();
    declare_jobs(&ch).await;
    let mut consumer = ch
        .basic_consume(
            "jobs".into(),
            "w2".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 15 {
        let delivery = timeout(WAIT, consumer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let body = String::from_utf8(delivery.data.clone()).unwrap();
        seen.push(body[4..].parse::<u32>().unwrap());
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (5..20).collect::<Vec<_>>(),
        "every confirmed, unacked message"
    );
    drop(conn);
}
