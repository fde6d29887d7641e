//! leasemqd started with a RabbitMQ definitions file and a data dir (contract §10): its
//! users log in with their passwords, into the virtual hosts they have permissions in;
//! the file's queues, exchanges and bindings are there; a durable queue of a virtual host
//! other than `/` comes back after a restart with its messages, apart from the queue of
//! the same name in `/`; and the users survive the restart with the file gone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::time::timeout;

const BIN: &str = env!("CARGO_BIN_EXE_leasemqd");
const WAIT: Duration = Duration::from_secs(10);

mod common;
use common::Node;

/// The password "test12" (RabbitMQ's worked example, salt 0x908DC60A).
const TEST12: &str = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR";

fn definitions() -> String {
    format!(
        r#"{{
  "rabbit_version": "3.10.8",
  "users": [
    {{"name": "app", "password_hash": "{TEST12}", "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["monitoring"], "limits": {{}}}}
  ],
  "vhosts": [{{"name": "/"}}, {{"name": "orders", "limits": [], "metadata": {{"description": ""}}}}],
  "permissions": [
    {{"user": "app", "vhost": "orders", "configure": "^app-", "write": ".*", "read": ".*"}},
    {{"user": "app", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}}
  ],
  "policies": [{{"vhost": "orders", "name": "ttl", "pattern": ".*", "apply-to": "queues", "definition": {{}}, "priority": 0}}],
  "queues": [{{"name": "app-jobs", "vhost": "orders", "durable": true, "auto_delete": false, "arguments": {{}}}}],
  "exchanges": [{{"name": "app-events", "vhost": "orders", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {{}}}}],
  "bindings": [{{"source": "app-events", "vhost": "orders", "destination": "app-jobs", "destination_type": "queue", "routing_key": "job.#", "arguments": {{}}}}]
}}"#
    )
}

/// leasemqd on a free port with `args`, once it says it is ready.
fn start(args: &[&str], data_dir: &Path) -> Node {
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
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    Node::ready(child, "")
}

async fn connect(addr: &str, user: &str, password: &str, vhost: &str) -> lapin::Result<Connection> {
    let vhost = vhost.replace('/', "%2f");
    let uri = format!("amqp://{user}:{password}@{addr}/{vhost}");
    timeout(
        WAIT,
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .expect("connect timed out")
}

async fn publish(conn: &Connection, exchange: &str, key: &str, body: &[u8]) {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let persistent = BasicProperties::default().with_delivery_mode(2);
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            persistent,
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack());
}

async fn get(conn: &Connection, queue: &str) -> Option<Vec<u8>> {
    let ch = conn.create_channel().await.unwrap();
    let got = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap();
    got.map(|m| m.delivery.data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definitions_file_gives_users_vhosts_and_queues_that_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = (dir.path().join("definitions.json"), dir.path().join("data"));
    std::fs::write(&file, definitions()).unwrap();
    let server = start(&["--definitions", file.to_str().unwrap()], &data);
    let addr = server.amqp.clone();

    // guest is not in the file; app's password is its hash's.
    assert!(connect(&addr, "guest", "guest", "/").await.is_err());
    assert!(connect(&addr, "app", "wrong", "orders").await.is_err());
    let orders = connect(&addr, "app", "test12", "orders").await.unwrap();
    let root = connect(&addr, "app", "test12", "/").await.unwrap();

    // The file's binding routes to the file's queue.
    publish(&orders, "app-events", "job.1", b"routed").await;
    // The same queue name in `/` is another queue.
    let ch = root.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare("app-jobs".into(), durable, FieldTable::default())
        .await
        .unwrap();
    publish(&root, "", "app-jobs", b"in root").await;
    // app may not configure other queues in `orders`.
    let ch = orders.create_channel().await.unwrap();
    let err = ch
        .queue_declare("other".into(), durable, FieldTable::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ACCESS_REFUSED"), "{err}");

    drop(server);
    // The file is gone: the data dir keeps the users, vhosts and permissions.
    std::fs::remove_file(&file).unwrap();
    let server = start(&[], &data);
    let addr = server.amqp.clone();
    let orders = connect(&addr, "app", "test12", "orders").await.unwrap();
    let root = connect(&addr, "app", "test12", "/").await.unwrap();
    assert_eq!(
        get(&orders, "app-jobs").await.as_deref(),
        Some(&b"routed"[..])
    );
    assert_eq!(get(&orders, "app-jobs").await, None);
    assert_eq!(
        get(&root, "app-jobs").await.as_deref(),
        Some(&b"in root"[..])
    );
    // The binding came back too.
    publish(&orders, "app-events", "job.2", b"again").await;
    let ch = orders.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "app-jobs".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let delivery = timeout(WAIT, consumer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(delivery.data, b"again");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
    drop(server);
}

#[test]
fn a_definitions_file_that_does_not_hold_together_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.json");
    let text = definitions().replace("\"^app-\"", "\"(unclosed\"");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--definitions",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("broken.json") && stderr.contains("(unclosed"),
        "{stderr}"
    );
    // A queue the server refuses (an argument it does not take) is named too.
    let text = definitions().replace(
        r#""arguments": {}}],
  "exchanges""#,
        r#""arguments": {"x-queue-type": "stream"}}],
  "exchanges""#,
    );
    std::fs::write(&file, text).unwrap();
    let out = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--definitions",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("queue \"app-jobs\" in vhost \"orders\""),
        "{stderr}"
    );
}
