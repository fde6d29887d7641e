//! AMQP over TLS (contract §10): a listener served with certificates a test CA made for
//! each test, and lapin (with rustls) as the client. What a client that fails its
//! handshake costs (only its own connection), certificates read again, client
//! certificates required, and files that do not make a config.
//!
//! Nothing here sleeps to wait for state; a stalled handshake runs into a short
//! handshake limit set for the test, and every wait has a timeout that fails the test.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use leasemq::Broker;
use leasemq_server::serve::{self, Listeners};
use leasemq_server::tls::{Tls, TlsFiles};
use leasemq_server::vhost::VHosts;
use leasemq_server::{Settings, VHost};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// How long a test waits for what it expects before it fails.
const WAIT: Duration = Duration::from_secs(10);

mod common;
use common::Ca;

/// A broker served over TLS only, with `files`, on a free loopback port.
async fn serve_tls(files: TlsFiles, settings: Settings) -> (Broker, SocketAddr, Arc<Tls>) {
    let broker = Broker::builder()
        .shards(1)
        .yield_budget(serve::YIELD_BUDGET)
        .build()
        .unwrap();
    let tls = Arc::new(Tls::new(files).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = Arc::new(settings);
    let vhosts = VHosts::one(Arc::new(VHost::new(&settings)));
    let listeners = Listeners {
        plain: None,
        tls: Some((listener, Arc::clone(&tls))),
    };
    tokio::spawn(serve::serve(listeners, broker.clone(), settings, vhosts));
    (broker, addr, tls)
}

/// Connects with lapin over TLS, trusting `ca` (PEM), showing `identity` if given.
async fn connect(
    addr: SocketAddr,
    ca: String,
    identity: Option<OwnedIdentity>,
) -> lapin::Result<Connection> {
    let uri = format!("amqps://guest:guest@localhost:{}/%2f", addr.port());
    let config = OwnedTLSConfig {
        identity,
        cert_chain: Some(ca),
    };
    let runtime = lapin::runtime::default_runtime()?;
    let connecting =
        Connection::connect_with_config(&uri, ConnectionProperties::default(), config, runtime);
    timeout(WAIT, connecting).await.expect("connect timed out")
}

/// Publishes `body` to `queue` and takes it back, acked, on a channel of `conn`.
async fn round_trip(conn: &Connection, queue: &str, body: &[u8]) {
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.into(), Default::default(), FieldTable::default())
        .await
        .unwrap();
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body,
        BasicProperties::default(),
    )
    .await
    .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
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
    assert_eq!(delivery.data, body);
    delivery.ack(BasicAckOptions::default()).await.unwrap();
    ch.close(200, "done".into()).await.unwrap();
}

/// Reads from `stream` until the server closes it (or resets it); fails after `WAIT`.
async fn read_until_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    loop {
        match timeout(WAIT, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server kept the connection open"),
        }
    }
}

fn files(cert: (PathBuf, PathBuf)) -> TlsFiles {
    TlsFiles {
        cert: cert.0,
        key: cert.1,
        client_ca: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trusts_the_ca_publishes_and_consumes_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let (broker, addr, _) = serve_tls(files(ca.issue("server")), Settings::default()).await;

    let conn = connect(addr, ca.pem(), None).await.unwrap();
    round_trip(&conn, "tls-jobs", b"over tls").await;
    let body = vec![7u8; 300_000]; // several TLS records, several frames
    round_trip(&conn, "tls-jobs", &body).await;
    conn.close(200, "bye".into()).await.unwrap();

    // A client that trusts another CA refuses the server's certificate.
    let other = Ca::new(dir.path(), "other");
    assert!(connect(addr, other.pem(), None).await.is_err());
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_amqp_on_the_tls_port_ends_only_that_connection_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let settings = Settings::default();
    let metrics = Arc::clone(&settings.metrics);
    let (broker, addr, _) = serve_tls(files(ca.issue("server")), settings).await;
    let conn = connect(addr, ca.pem(), None).await.unwrap();

    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
    read_until_closed(&mut plain).await;
    // The server counts the failure after the socket it dropped was closed: the count
    // may land a moment after the client saw the close.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while metrics.tls_handshake_failures.get() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metrics.tls_handshake_failures.get(), 1);

    // The connection that was open goes on, and new ones are taken.
    round_trip(&conn, "after-plain", b"still here").await;
    let again = connect(addr, ca.pem(), None).await.unwrap();
    round_trip(&again, "after-plain", b"and a new one").await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_finishes_is_dropped_at_the_handshake_limit() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let settings = Settings {
        handshake_timeout: Duration::from_millis(200),
        ..Settings::default()
    };
    let metrics = Arc::clone(&settings.metrics);
    let (broker, addr, _) = serve_tls(files(ca.issue("server")), settings).await;

    // Connected, then silent: no ClientHello.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    read_until_closed(&mut silent).await;
    assert_eq!(metrics.tls_handshake_failures.get(), 1);
    let conn = connect(addr, ca.pem(), None).await.unwrap();
    round_trip(&conn, "after-silence", b"served").await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_new_connections_with_the_new_certificate_and_keeps_open_ones() {
    let dir = tempfile::tempdir().unwrap();
    let first = Ca::new(dir.path(), "first");
    let tls_files = files(first.issue("server"));
    let (broker, addr, tls) = serve_tls(tls_files.clone(), Settings::default()).await;
    let old = connect(addr, first.pem(), None).await.unwrap();

    // The files now hold a certificate of another CA.
    let second = Ca::new(dir.path(), "second");
    let (cert, key) = second.issue("server-2");
    std::fs::copy(cert, &tls_files.cert).unwrap();
    std::fs::copy(key, &tls_files.key).unwrap();
    tls.reload().unwrap();

    let new = connect(addr, second.pem(), None).await.unwrap();
    round_trip(&new, "reloaded", b"new certificate").await;
    assert!(connect(addr, first.pem(), None).await.is_err());
    round_trip(&old, "reloaded", b"old connection").await;

    // A reload that cannot read what it is given keeps what serves.
    std::fs::write(&tls_files.key, "not a key").unwrap();
    let err = tls.reload().unwrap_err();
    assert!(err.contains(&tls_files.key.display().to_string()), "{err}");
    let newer = connect(addr, second.pem(), None).await.unwrap();
    round_trip(&newer, "reloaded", b"still the second").await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_refuses_clients_without_a_certificate_it_signed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let clients = Ca::new(dir.path(), "clients");
    let mut tls_files = files(ca.issue("server"));
    tls_files.client_ca = Some(clients.cert_file());
    let settings = Settings::default();
    let metrics = Arc::clone(&settings.metrics);
    let (broker, addr, _) = serve_tls(tls_files, settings).await;

    let identity = |ca: &Ca, cn: &str| {
        let (cert, key) = ca.issue(cn);
        OwnedIdentity::PKCS8 {
            pem: std::fs::read(cert).unwrap(),
            key: std::fs::read(key).unwrap(),
        }
    };
    let conn = connect(addr, ca.pem(), Some(identity(&clients, "alice")))
        .await
        .unwrap();
    round_trip(&conn, "mutual", b"with a client certificate").await;
    assert!(connect(addr, ca.pem(), None).await.is_err());
    assert!(connect(addr, ca.pem(), Some(identity(&ca, "mallory")))
        .await
        .is_err());
    assert!(metrics.tls_handshake_failures.get() >= 2);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_logs_in_as_the_user_its_client_certificate_names() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let clients = Ca::new(dir.path(), "clients");
    let mut tls_files = files(ca.issue("server"));
    tls_files.client_ca = Some(clients.cert_file());
    // alice has no password: only her certificate logs her in.
    let text = r#"{"users": [{"name": "alice", "password_hash": "", "tags": []}],
                   "permissions": [{"user": "alice", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}"#;
    let definitions = leasemq_server::access::Definitions::parse(text).unwrap();
    let settings = Settings {
        access: Arc::new(leasemq_server::access::Access::from_definitions(&definitions).unwrap()),
        ..Settings::default()
    };
    let metrics = Arc::clone(&settings.metrics);
    let (broker, addr, _) = serve_tls(tls_files, settings).await;
    let identity = |cn: &str| {
        let (cert, key) = clients.issue(cn);
        OwnedIdentity::PKCS8 {
            pem: std::fs::read(cert).unwrap(),
            key: std::fs::read(key).unwrap(),
        }
    };
    let ca_pem = ca.pem();
    let external = |identity| {
        let ca_pem = ca_pem.clone();
        async move {
            let uri = format!(
                "amqps://localhost:{}/%2f?auth_mechanism=external",
                addr.port()
            );
            let config = OwnedTLSConfig {
                identity: Some(identity),
                cert_chain: Some(ca_pem),
            };
            let runtime = lapin::runtime::default_runtime().unwrap();
            let connecting = Connection::connect_with_config(
                &uri,
                ConnectionProperties::default(),
                config,
                runtime,
            );
            timeout(WAIT, connecting).await.expect("connect timed out")
        }
    };
    let conn = external(identity("alice")).await.unwrap();
    round_trip(&conn, "by-certificate", b"as alice").await;
    // A certificate of the right CA for a user that does not exist: a refused login.
    assert!(external(identity("mallory")).await.is_err());
    assert_eq!(metrics.auth_attempts_failed.get(), 1);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_over_tls_with_the_same_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let tls = Arc::new(Tls::new(files(ca.issue("server"))).unwrap());
    let broker = Broker::builder().shards(1).build().unwrap();
    let settings = Settings::default();
    settings.metrics.tls_handshake_failures.inc();
    let registry = Arc::new(settings.metrics.registry(broker.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(leasemq_server::metrics::serve(
        listener,
        registry,
        Some(tls),
    ));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(
        response.contains("leasemq_tls_handshake_failures_total 1"),
        "{response}"
    );
    // Plain HTTP on that port gets no answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = timeout(WAIT, plain.read_to_end(&mut answer)).await.unwrap();
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"));
    broker.shutdown();
}

#[test]
fn files_that_make_no_config_are_named_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "test");
    let (cert, key) = ca.issue("server");
    let (_, other_key) = ca.issue("other");
    let err = |files: TlsFiles| Tls::new(files).unwrap_err();

    // A key that is not the certificate's.
    let e = err(TlsFiles {
        cert: cert.clone(),
        key: other_key,
        client_ca: None,
    });
    assert!(e.contains("server.pem") && e.contains("other.key"), "{e}");
    assert!(e.to_lowercase().contains("key"), "{e}");
    // Files missing, empty, or holding no PEM of the kind asked for.
    let missing = dir.path().join("missing.pem");
    let e = err(TlsFiles {
        cert: missing.clone(),
        key: key.clone(),
        client_ca: None,
    });
    assert!(e.contains("missing.pem"), "{e}");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let e = err(TlsFiles {
        cert: empty.clone(),
        key: key.clone(),
        client_ca: None,
    });
    assert!(
        e.contains("empty.pem") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = err(TlsFiles {
        cert: cert.clone(),
        key: cert.clone(),
        client_ca: None,
    });
    assert!(
        e.contains("server.pem") && e.contains("no PEM private key"),
        "{e}"
    );
    let e = err(TlsFiles {
        cert,
        key,
        client_ca: Some(empty),
    });
    assert!(e.contains("empty.pem"), "{e}");
}
