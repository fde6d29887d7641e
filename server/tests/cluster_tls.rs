//! A cluster whose node link runs TLS (contract §10): three `leasemqd` nodes with
//! certificates one CA signed for 127.0.0.1, each verifying the others' on the link. The
//! cluster forms and serves through any node, and an admin tool or a node that does not
//! speak TLS with a certificate of that CA gets nowhere.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);
const BIN: &str = env!("CARGO_BIN_EXE_leasemqd");

mod common;
use common::{ports, Ca, Node};

/// Starts node `id` of three with TLS on its link and an AMQPS listener.
fn start(dir: &Path, id: usize, raft: &[u16], secret: &Path, pki: &Ca) -> Node {
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
        .args(["--tls-listen", "127.0.0.1:0"])
        .args(pki.flags(&format!("node-{id}")))
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
    Node::ready(child, "")
}

/// `leasemqd cluster ACTION` on the link at `port` with `tls` flags: whether it worked,
/// and what it printed.
fn cluster(action: &str, port: u16, secret: &Path, tls: &[String]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["cluster", action, "--raft", &format!("127.0.0.1:{port}")])
        .arg("--cluster-secret-file")
        .arg(secret)
        .args(tls)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_forms_and_serves_over_a_tls_node_link() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a secret the nodes share\n").unwrap();
    let pki = Ca::new(dir.path(), "cluster-ca");
    let raft = ports(3);
    let nodes: Vec<Node> = (1..=3)
        .map(|id| start(dir.path(), id, &raft, &secret, &pki))
        .collect();

    // Without TLS, or with a certificate of another CA, an admin tool is not let in.
    assert!(!cluster("init", raft[0], &secret, &[]).0);
    let stranger = Ca::new(dir.path(), "other-ca");
    assert!(!cluster("init", raft[0], &secret, &stranger.flags("admin")).0);
    let (ok, text) = cluster("init", raft[0], &secret, &pki.flags("admin"));
    assert!(ok && text.contains("formed"), "{text}");

    // Every node reaches the others over TLS: each shard gets a leader, every peer is
    // reachable from node 3.
    let deadline = Instant::now() + WAIT;
    loop {
        let (ok, table) = cluster("status", raft[2], &secret, &pki.flags("admin"));
        let led = ok
            && table
                .lines()
                .filter(|l| l.starts_with(['0', '1']))
                .all(|l| l.split_whitespace().nth(1) != Some("-"));
        if led && table.matches(": reachable").count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{table}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A client on each node publishes with confirms, which a shard's leader answers once
    // its group holds them: calls forwarded over the link.
    for (i, node) in nodes.iter().enumerate() {
        let uri = format!("amqp://guest:guest@{}/%2f", node.amqp);
        let conn = timeout(
            WAIT,
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await
        .unwrap()
        .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare("jobs".into(), durable, FieldTable::default())
            .await
            .unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let body = format!("from node {}", i + 1);
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
        assert!(timeout(WAIT, confirm).await.unwrap().unwrap().is_ack());
    }
    let uri = format!("amqp://guest:guest@{}/%2f", nodes[1].amqp);
    let conn = timeout(
        WAIT,
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .unwrap()
    .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "jobs".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let delivery = timeout(WAIT, consumer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        got.push(String::from_utf8(delivery.data.clone()).unwrap());
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    got.sort();
    assert_eq!(got, ["from node 1", "from node 2", "from node 3"]);
}
