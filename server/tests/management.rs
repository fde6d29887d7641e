//! leasemqd's management API over HTTP (contract §11) and `leasemqctl` against it: logins
//! and tags as RabbitMQ reads them, queue figures as AMQP clients left them, RabbitMQ's
//! pagination, its refusals, and `/metrics` on the same port.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use leasemq_server::access::{Algorithm, PasswordHash};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_leasemqd");
const CTL: &str = env!("CARGO_BIN_EXE_leasemqctl");
const WAIT: Duration = Duration::from_secs(10);

mod common;
use common::Node;

/// Users of every kind the API tells apart, each with the password "pw-" and its name.
fn definitions() -> String {
    let user = |name: &str, tags: &str| {
        let hash = PasswordHash::new(Algorithm::Sha256, format!("pw-{name}").as_bytes());
        json!({"name": name, "password_hash": hash.to_base64(), "tags": tags})
    };
    let all = |user: &str, vhost: &str| json!({"user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"});
    json!({
        "users": [
            user("admin", "administrator"),
            user("watcher", "monitoring"),
            user("manager", "management"),
            user("plain", ""),
        ],
        "vhosts": [{"name": "/"}, {"name": "orders"}],
        "permissions": [
            all("admin", "/"), all("admin", "orders"),
            {"user": "watcher", "vhost": "/", "configure": "", "write": "", "read": ".*"},
            all("manager", "orders"), all("plain", "/"),
        ],
    })
    .to_string()
}

/// leasemqd with those users and the management API on free ports.
fn start(dir: &std::path::Path) -> Node {
    let file = dir.join("definitions.json");
    std::fs::write(&file, definitions()).unwrap();
    let child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--management", "127.0.0.1:0"])
        .args(["--shards", "2", "--log-level", "warn", "--definitions"])
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    Node::ready(child, "management API on http://")
}

/// One request as `user` (with its password), or with no credentials; its status and
/// body (JSON, or the text as a string).
fn http(node: &Node, method: &str, path: &str, user: Option<&str>) -> (u16, Value) {
    let password = user.map(|name| format!("pw-{name}"));
    request(node, method, path, user.zip(password.as_deref()))
}

/// One request as `user` with `password`.
fn http_as(node: &Node, method: &str, path: &str, user: &str, password: &str) -> (u16, Value) {
    request(node, method, path, Some((user, password)))
}

fn request(node: &Node, method: &str, path: &str, login: Option<(&str, &str)>) -> (u16, Value) {
    let mut stream = TcpStream::connect(node.management()).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let auth = login.map_or(String::new(), |(name, password)| {
        let pair = format!("{name}:{password}");
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        format!("Authorization: Basic {encoded}\r\n")
    });
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8(answer).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    (status, body)
}

async fn connect(node: &Node, user: &str, vhost: &str) -> Connection {
    let vhost = vhost.replace('/', "%2f");
    let uri = format!("amqp://{user}:pw-{user}@{}/{vhost}", node.amqp);
    let connecting = Connection::connect(&uri, ConnectionProperties::default());
    tokio::time::timeout(WAIT, connecting)
        .await
        .unwrap()
        .unwrap()
}

/// Declares `queue` with a priority argument, publishes `n` messages to it, and leaves a
/// consumer holding `held` of them unacked; the connection, to keep them held.
async fn fill(
    node: &Node,
    user: &str,
    vhost: &str,
    queue: &str,
    n: usize,
    held: u16,
) -> Connection {
    let conn = connect(node, user, vhost).await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-max-priority".into(), lapin::types::AMQPValue::LongInt(5));
    ch.queue_declare(queue.into(), QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    for i in 0..n {
        let body = format!("job {i}");
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            BasicProperties::default(),
        )
        .await
        .unwrap();
    }
    if held > 0 {
        ch.basic_qos(held, BasicQosOptions::default())
            .await
            .unwrap();
        let consumer = ch
            .basic_consume(
                queue.into(),
                "held".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        std::mem::forget(consumer);
    }
    conn
}

/// Polls `path` as admin until `done` holds of its body (what a publish or a consume
/// just did may still be on its way), or fails after [`WAIT`].
fn until(node: &Node, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (status, body) = http(node, "GET", path, Some("admin"));
        if status == 200 && done(&body) {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn logins_and_tags_are_checked_as_rabbitmq_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    // No credentials: the header alone; wrong ones: RabbitMQ's words (with a z).
    let (status, body) = http(&node, "GET", "/api/overview", None);
    assert_eq!((status, body), (401, Value::String(String::new())));
    let wrong = http_as(&node, "GET", "/api/overview", "admin", "nope");
    assert_eq!(
        wrong,
        (
            401,
            json!({"error": "not_authorized", "reason": "Login failed"})
        )
    );
    // A user with no management tag may use AMQP, not the API.
    let (status, body) = http(&node, "GET", "/api/overview", Some("plain"));
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "not_authorised");
    let (status, body) = http(&node, "GET", "/api/whoami", Some("watcher"));
    assert_eq!(status, 200);
    assert_eq!(body, json!({"name": "watcher", "tags": ["monitoring"]}));
    // A monitor lists every vhost; a management user only those it has permissions in.
    let names = |body: &Value| {
        let mut names: Vec<String> = (body.as_array().unwrap().iter())
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names(&http(&node, "GET", "/api/vhosts", Some("watcher")).1),
        ["/", "orders"]
    );
    assert_eq!(
        names(&http(&node, "GET", "/api/vhosts", Some("manager")).1),
        ["orders"]
    );
    let (status, _) = http(&node, "GET", "/api/queues/%2F", Some("manager"));
    assert_eq!(status, 401, "no permissions in /");
    let (status, body) = http(&node, "GET", "/api/no/such/thing", Some("admin"));
    assert_eq!((status, &body["error"]), (404, &json!("Object Not Found")));
    let (status, _) = http(&node, "GET", "/api/queues/nowhere", Some("admin"));
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_queue_shows_what_its_clients_did_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let _held = fill(&node, "admin", "/", "jobs", 10, 3).await;
    let _other = fill(&node, "manager", "orders", "jobs", 2, 0).await;
    let queue = until(&node, "/api/queues/%2F/jobs", |q| {
        q["messages_unacknowledged"] == 3
    });
    assert_eq!(queue["name"], "jobs");
    assert_eq!(queue["vhost"], "/");
    assert_eq!(queue["messages"], 10);
    assert_eq!(queue["messages_ready"], 7);
    assert_eq!(queue["consumers"], 1);
    assert_eq!(queue["durable"], false);
    assert_eq!(queue["arguments"], json!({"x-max-priority": 5}));
    assert_eq!(queue["message_stats"]["publish"], 10);
    assert!(queue["message_stats"]["publish_details"]["rate"].is_number());
    // The same name in another vhost is another queue.
    let orders = until(&node, "/api/queues/orders/jobs", |q| q["messages"] == 2);
    assert_eq!(orders["vhost"], "orders");
    // Every queue for the administrator; those of its vhosts for a management user.
    let (_, all) = http(&node, "GET", "/api/queues", Some("admin"));
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    let (_, mine) = http(&node, "GET", "/api/queues", Some("manager"));
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine[0]["vhost"], "orders");
    let (status, _) = http(&node, "GET", "/api/queues/%2F/nothing", Some("admin"));
    assert_eq!(status, 404);
    let (_, overview) = http(&node, "GET", "/api/overview", Some("admin"));
    assert_eq!(overview["queue_totals"]["messages"], 12);
    assert_eq!(overview["object_totals"]["queues"], 2);
    assert_eq!(overview["object_totals"]["connections"], 2);
}

#[tokio::test]
async fn lists_page_filter_and_sort_as_rabbitmqs() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let mut conns = Vec::new();
    for (name, n) in [("a-1", 1), ("a-2", 4), ("b-1", 2), ("a-3", 3)] {
        conns.push(fill(&node, "admin", "/", name, n, 0).await);
    }
    let path = "/api/queues?page=1&page_size=2&name=a-&sort=messages&sort_reverse=true";
    let page = until(&node, path, |p| p["filtered_count"] == 3);
    assert_eq!(page["page_count"], 2);
    assert_eq!(page["item_count"], 2);
    let names: Vec<&str> = (page["items"].as_array().unwrap().iter())
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a-2", "a-3"]);
    let (_, second) = http(
        &node,
        "GET",
        "/api/queues?page=2&page_size=2&name=a-&sort=messages&sort_reverse=true",
        Some("admin"),
    );
    assert_eq!(second["items"][0]["name"], "a-1");
    let (status, body) = http(&node, "GET", "/api/queues?page=0", Some("admin"));
    assert_eq!((status, &body["error"]), (400, &json!("bad_request")));
    let (_, regex) = http(
        &node,
        "GET",
        "/api/queues?name=%5Eb&use_regex=true",
        Some("admin"),
    );
    assert_eq!(regex.as_array().unwrap().len(), 1, "{regex}");
}

#[tokio::test]
async fn the_management_port_serves_the_metrics_and_the_health_checks() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let _held = fill(&node, "admin", "orders", "jobs", 3, 0).await;
    let (status, text) = http(&node, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let text = text.as_str().unwrap();
    assert!(
        text.contains("leasemq_queue_messages_ready{vhost=\"orders\",queue=\"jobs\"} 3"),
        "{text}"
    );
    let (status, body) = http(&node, "GET", "/api/health/checks/alarms", Some("watcher"));
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    let (status, body) = http(&node, "GET", "/api/aliveness-test/%2F", Some("admin"));
    assert_eq!((status, body), (200, json!({"status": "ok"})));
}

/// `leasemqctl` against `node` as admin with `args`: its exit status and output.
fn ctl(node: &Node, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(CTL)
        .args([
            "--url",
            &format!("http://{}", node.management()),
            "--user",
            "admin",
        ])
        .args(args)
        .env("LEASEMQCTL_PASSWORD", "pw-admin")
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (
        out.status.code().unwrap(),
        text(out.stdout),
        text(out.stderr),
    )
}

#[tokio::test]
async fn leasemqctl_pings_and_lists_with_rabbitmqctls_columns() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let _held = fill(&node, "admin", "/", "jobs", 4, 1).await;
    until(&node, "/api/queues/%2F/jobs", |q| {
        q["messages_unacknowledged"] == 1
    });
    let (code, out, _) = ctl(&node, &["ping"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = ctl(&node, &["list_queues"]);
    assert_eq!((code, out.as_str()), (0, "name\tmessages\njobs\t4\n"));
    let (code, out, _) = ctl(
        &node,
        &[
            "list_queues",
            "name",
            "messages_ready",
            "consumers",
            "--formatter",
            "json",
        ],
    );
    assert_eq!(code, 0);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        rows,
        json!([{"name": "jobs", "messages_ready": 3, "consumers": 1}])
    );
    let (_, out, _) = ctl(&node, &["list_queues", "-p", "orders"]);
    assert_eq!(
        out, "",
        "no queues in orders: nothing, as rabbitmqctl prints"
    );
    let (code, _, err) = Command::new(CTL)
        .args([
            "--url",
            &format!("http://{}", node.management()),
            "--user",
            "admin",
            "ping",
        ])
        .env("LEASEMQCTL_PASSWORD", "wrong")
        .output()
        .map(|o| {
            (
                o.status.code().unwrap(),
                o.stdout,
                String::from_utf8(o.stderr).unwrap(),
            )
        })
        .unwrap();
    assert_ne!(code, 0, "a wrong password fails the ping");
    assert!(err.contains("Login failed"), "{err}");
    drop(node);
    let (code, _, _) = ctl(&start(dir.path()), &["ping"]);
    assert_eq!(code, 0);
}

#[test]
fn leasemqctl_ping_fails_where_nothing_serves() {
    let port = common::ports(1)[0];
    let out = Command::new(CTL)
        .args(["--url", &format!("http://127.0.0.1:{port}"), "ping"])
        .env("LEASEMQCTL_PASSWORD", "x")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
}

/// A request with a JSON body, as admin; its status, `Location` header and body.
fn send(node: &Node, method: &str, path: &str, body: &str) -> (u16, Option<String>, Value) {
    let mut stream = TcpStream::connect(node.management()).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let encoded = base64::engine::general_purpose::STANDARD.encode("admin:pw-admin");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {encoded}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let location = (head.lines())
        .find_map(|l| l.strip_prefix("location: "))
        .map(str::to_string);
    (
        status,
        location,
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn queues_are_declared_fed_peeked_taken_purged_and_deleted_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    // rabbitmqadmin writes booleans as strings.
    let declare =
        r#"{"durable": "false", "auto_delete": "false", "arguments": {"x-max-length": 100}}"#;
    assert_eq!(send(&node, "PUT", "/api/queues/%2F/work", declare).0, 201);
    assert_eq!(
        send(&node, "PUT", "/api/queues/%2F/work", declare).0,
        204,
        "the same again"
    );
    let (status, _, body) = send(
        &node,
        "PUT",
        "/api/queues/%2F/work",
        r#"{"auto_delete": true}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("inequivalent arg 'auto_delete'"),
        "{body}"
    );
    let (status, _, body) = send(&node, "PUT", "/api/queues/%2F/work", r#"{"durable": tru"#);
    assert_eq!((status, &body["error"]), (400, &json!("bad_request")));
    for i in 0..3 {
        let message = format!(
            r#"{{"routing_key": "work", "payload": "job {i}", "payload_encoding": "string", "properties": {{"priority": 1}}}}"#
        );
        let (_, _, routed) = send(
            &node,
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            &message,
        );
        assert_eq!(routed, json!({"routed": true}));
    }
    let nowhere = r#"{"routing_key": "nowhere", "payload": "x", "payload_encoding": "string", "properties": {}}"#;
    assert_eq!(
        send(
            &node,
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            nowhere
        )
        .2,
        json!({"routed": false})
    );
    // A peek leaves the messages where they were, marked redelivered.
    let peek = r#"{"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"}"#;
    let (status, _, got) = send(&node, "POST", "/api/queues/%2F/work/get", peek);
    assert_eq!(status, 200);
    assert_eq!(got.as_array().unwrap().len(), 2);
    assert_eq!(got[0]["payload"], "job 0");
    assert_eq!(got[0]["payload_encoding"], "string");
    assert_eq!(got[0]["properties"]["priority"], 1);
    let queue = until(&node, "/api/queues/%2F/work", |q| q["messages_ready"] == 3);
    assert_eq!(queue["arguments"], json!({"x-max-length": 100}));
    let take = r#"{"count": "1", "ackmode": "ack_requeue_false", "encoding": "base64"}"#;
    let (_, _, got) = send(&node, "POST", "/api/queues/%2F/work/get", take);
    assert_eq!(got[0]["redelivered"], true);
    assert_eq!(got[0]["payload_encoding"], "base64");
    until(&node, "/api/queues/%2F/work", |q| q["messages"] == 2);
    assert_eq!(
        send(&node, "DELETE", "/api/queues/%2F/work/contents", "").0,
        204
    );
    until(&node, "/api/queues/%2F/work", |q| q["messages"] == 0);
    assert_eq!(send(&node, "DELETE", "/api/queues/%2F/work", "").0, 204);
    assert_eq!(send(&node, "DELETE", "/api/queues/%2F/work", "").0, 404);
    assert_eq!(send(&node, "POST", "/api/queues/%2F/work/get", peek).0, 404);
}

#[tokio::test]
async fn exchanges_and_bindings_route_as_declared_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    assert_eq!(send(&node, "PUT", "/api/queues/orders/paid", "{}").0, 201);
    assert_eq!(
        send(
            &node,
            "PUT",
            "/api/exchanges/orders/events",
            r#"{"type": "topic", "durable": true}"#
        )
        .0,
        201
    );
    let (status, location, _) = send(
        &node,
        "POST",
        "/api/bindings/orders/e/events/q/paid",
        r#"{"routing_key": "order.paid.#"}"#,
    );
    assert_eq!(
        (status, location.as_deref()),
        (201, Some("paid/order.paid.%23"))
    );
    let (_, _, bindings) = send(&node, "GET", "/api/bindings/orders", "");
    let sources: Vec<&str> = (bindings.as_array().unwrap().iter())
        .map(|b| b["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        ["", "events"],
        "the default exchange's binding, then ours: {bindings}"
    );
    let publish = |key: &str| {
        format!(
            r#"{{"routing_key": "{key}", "payload": "p", "payload_encoding": "string", "properties": {{}}}}"#
        )
    };
    assert_eq!(
        send(
            &node,
            "POST",
            "/api/exchanges/orders/events/publish",
            &publish("order.paid.eu")
        )
        .2["routed"],
        true
    );
    assert_eq!(
        send(
            &node,
            "POST",
            "/api/exchanges/orders/events/publish",
            &publish("order.new")
        )
        .2["routed"],
        false
    );
    let (_, _, exchange) = send(&node, "GET", "/api/exchanges/orders/events", "");
    assert_eq!(
        (exchange["type"].as_str(), exchange["durable"].as_bool()),
        (Some("topic"), Some(true))
    );
    // The properties_key is the key percent-encoded (order.paid.%23), encoded once more
    // in a path.
    let path = "/api/bindings/orders/e/events/q/paid/order.paid.%2523";
    assert_eq!(send(&node, "DELETE", path, "").0, 204);
    assert_eq!(send(&node, "DELETE", path, "").0, 404);
    assert_eq!(
        send(
            &node,
            "POST",
            "/api/exchanges/orders/events/publish",
            &publish("order.paid.eu")
        )
        .2["routed"],
        false
    );
    assert_eq!(
        send(&node, "DELETE", "/api/exchanges/orders/events", "").0,
        204
    );
    assert_eq!(
        send(&node, "GET", "/api/exchanges/orders/events", "").0,
        404
    );
    // The export holds what was declared, in the format --definitions loads.
    let (_, _, export) = send(&node, "GET", "/api/definitions", "");
    assert!(
        export["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "paid" && q["vhost"] == "orders"),
        "{export}"
    );
    assert!(export["users"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["name"] == "watcher"));
    assert_eq!(
        http(&node, "GET", "/api/definitions", Some("watcher")).0,
        401,
        "administrators only"
    );
}

#[tokio::test]
async fn connections_channels_and_consumers_are_listed_and_a_connection_is_closed_with_320() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let conn = fill(&node, "manager", "orders", "jobs", 3, 2).await;
    let _admin = connect(&node, "admin", "/").await;
    let connections = until(&node, "/api/connections", |c| {
        c.as_array().is_some_and(|a| a.len() == 2)
    });
    let mine = (connections.as_array().unwrap().iter())
        .find(|c| c["user"] == "manager")
        .unwrap()
        .clone();
    assert_eq!(mine["vhost"], "orders");
    assert_eq!(mine["channels"], 1);
    assert_eq!(mine["state"], "running");
    assert!(mine["client_properties"]["product"].is_string(), "{mine}");
    // A management user sees its own connection only.
    let (_, own) = http(&node, "GET", "/api/connections", Some("manager"));
    assert_eq!(own.as_array().unwrap().len(), 1, "{own}");
    let channels = until(&node, "/api/channels", |c| {
        c.as_array()
            .unwrap()
            .iter()
            .any(|ch| ch["messages_unacknowledged"] == 2)
    });
    let channel = (channels.as_array().unwrap().iter())
        .find(|ch| ch["user"] == "manager")
        .unwrap();
    assert_eq!(
        (
            channel["prefetch_count"].as_u64(),
            channel["consumer_count"].as_u64()
        ),
        (Some(2), Some(1))
    );
    let (_, consumers) = http(&node, "GET", "/api/consumers/orders", Some("admin"));
    assert_eq!(consumers[0]["queue"]["name"], "jobs");
    assert_eq!(consumers[0]["consumer_tag"], "held");
    assert_eq!(consumers[0]["ack_required"], true);
    let name = mine["name"]
        .as_str()
        .unwrap()
        .replace(' ', "%20")
        .replace('>', "%3E");
    let (status, _, _) = send(&node, "DELETE", &format!("/api/connections/{name}"), "");
    assert_eq!(status, 204);
    let closed = tokio::time::timeout(WAIT, async {
        while conn.status().connected() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    closed.await.expect("the connection closes");
    // Its unacked messages went back to the queue.
    until(&node, "/api/queues/orders/jobs", |q| {
        q["messages_ready"] == 3 && q["consumers"] == 0
    });
    until(&node, "/api/connections", |c| {
        c.as_array().is_some_and(|a| a.len() == 1)
    });
}

#[tokio::test]
async fn users_permissions_and_vhosts_change_at_run_time_and_take_effect_over_amqp() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    // A vhost made through the API serves at once; its maker may use it.
    assert_eq!(send(&node, "PUT", "/api/vhosts/billing", "{}").0, 201);
    assert_eq!(send(&node, "PUT", "/api/vhosts/billing", "{}").0, 204);
    let _admin = connect(&node, "admin", "billing").await;
    // A user made with a password logs in over AMQP with it, once it has permissions.
    let user = r#"{"password": "s3cret", "tags": "management"}"#;
    assert_eq!(send(&node, "PUT", "/api/users/clerk", user).0, 201);
    let uri = format!("amqp://clerk:s3cret@{}/billing", node.amqp);
    let refused = Connection::connect(&uri, ConnectionProperties::default()).await;
    assert!(refused.is_err(), "no permissions in billing yet");
    let perms = r#"{"configure": "^clerk-", "write": ".*", "read": ".*"}"#;
    assert_eq!(
        send(&node, "PUT", "/api/permissions/billing/clerk", perms).0,
        201
    );
    let clerk = Connection::connect(&uri, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = clerk.create_channel().await.unwrap();
    let declared = ch
        .queue_declare(
            "clerk-jobs".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert!(declared.is_ok(), "configure matches ^clerk-");
    let ch = clerk.create_channel().await.unwrap();
    let other = ch
        .queue_declare(
            "payroll".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert!(other.is_err(), "configure does not match payroll");
    let (status, _, body) = send(
        &node,
        "PUT",
        "/api/permissions/billing/clerk",
        r#"{"configure": ".*"}"#,
    );
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("[{key_missing,write},{key_missing,read}]"))
    );
    let (status, _, _) = send(&node, "PUT", "/api/permissions/nowhere/clerk", perms);
    assert_eq!(status, 400, "an unknown vhost");
    // Deleting the vhost closes its connections and deletes its queues.
    assert_eq!(send(&node, "DELETE", "/api/vhosts/billing", "").0, 204);
    let closed = tokio::time::timeout(WAIT, async {
        while clerk.status().connected() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    closed.await.expect("the vhost's connections close");
    let (_, queues) = http(&node, "GET", "/api/queues", Some("admin"));
    assert!(
        queues
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["vhost"] != "billing"),
        "{queues}"
    );
    assert_eq!(send(&node, "DELETE", "/api/vhosts/billing", "").0, 404);
    assert_eq!(send(&node, "DELETE", "/api/users/clerk", "").0, 204);
    assert_eq!(send(&node, "DELETE", "/api/users/clerk", "").0, 404);
    // Only an administrator changes users.
    let (status, body) = http(&node, "DELETE", "/api/users/plain", Some("watcher"));
    assert_eq!(
        (status, &body["reason"]),
        (401, &json!("Not administrator user"))
    );
}

#[tokio::test]
async fn an_import_adds_users_vhosts_and_queues_and_the_console_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let hash = PasswordHash::new(Algorithm::Sha256, b"imported").to_base64();
    let import = json!({
        "users": [{"name": "importer", "password_hash": hash, "tags": ["monitoring"]}],
        "vhosts": [{"name": "imports"}],
        "permissions": [{"user": "importer", "vhost": "imports", "configure": ".*", "write": ".*", "read": ".*"}],
        "queues": [{"name": "from-file", "vhost": "imports", "durable": true, "auto_delete": false, "arguments": {"x-max-length": 5}}],
    });
    assert_eq!(
        send(&node, "POST", "/api/definitions", &import.to_string()).0,
        204
    );
    let queue = until(&node, "/api/queues/imports/from-file", |q| {
        q["name"] == "from-file"
    });
    assert_eq!(queue["arguments"], json!({"x-max-length": 5}));
    let (status, me) = http_as(&node, "GET", "/api/whoami", "importer", "imported");
    assert_eq!((status, &me["tags"]), (200, &json!(["monitoring"])));
    let (status, _, body) = send(&node, "POST", "/api/definitions", "{not json");
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("failed_to_parse_json"))
    );
    // The console: one page with its script and style, no login needed to load it.
    let (status, page) = http(&node, "GET", "/", None);
    assert_eq!(status, 200);
    assert!(page
        .as_str()
        .unwrap()
        .contains("<script src=\"console.js\">"));
    let (status, script) = http(&node, "GET", "/console.js", None);
    assert_eq!(status, 200);
    assert!(script.as_str().unwrap().contains("/api/overview"));
}
