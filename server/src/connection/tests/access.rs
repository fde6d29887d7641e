//! Logins with users of a definitions file (PLAIN and AMQPLAIN), virtual hosts refused
//! at `connection.open`, and every method checked against the user's permissions.

use super::*;
use crate::access::{Access, Definitions};

/// The password "test12" (RabbitMQ's worked example; see `access/hash.rs`).
const TEST12: &str = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR";

/// Settings with the users `app` (password test12, permissions `configure`, `write`,
/// `read` on `/`) and `nobody` (same password, no permissions anywhere), and the
/// vhost `empty`.
fn settings(configure: &str, write: &str, read: &str) -> Settings {
    let text = format!(
        r#"{{"users": [{{"name": "app", "password_hash": "{TEST12}", "tags": []}},
                       {{"name": "nobody", "password_hash": "{TEST12}", "tags": []}}],
             "vhosts": [{{"name": "/"}}, {{"name": "empty"}}],
             "permissions": [{{"user": "app", "vhost": "/", "configure": "{configure}",
                              "write": "{write}", "read": "{read}"}}]}}"#
    );
    let access = Access::from_definitions(&Definitions::parse(&text).unwrap()).unwrap();
    Settings {
        access: Arc::new(access),
        ack_timeout: Duration::from_secs(10),
        ..Settings::default()
    }
}

fn start_ok_with(mechanism: &str, response: Vec<u8>) -> AMQPFrame {
    conn_method(connection::AMQPMethod::StartOk(connection::StartOk {
        client_properties: FieldTable::default(),
        mechanism: mechanism.into(),
        response: response.into(),
        locale: "en_US".into(),
    }))
}

/// Through `start-ok` with `login`: the frames that answered it.
fn log_in(c: &mut Client, login: AMQPFrame) -> Vec<AMQPFrame> {
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    c.feed(&[login])
}

/// A client logged in as `app` with channel 1 open on `/`.
fn app(settings: Settings) -> Client {
    let mut c = Client::new(settings);
    log_in(&mut c, start_ok("app", "test12"));
    let out = c.feed(&open_frames());
    assert_eq!(out.len(), 2, "open-ok and channel open-ok: {out:?}");
    c
}

fn declare(name: &str) -> AMQPFrame {
    queue_method(queue::AMQPMethod::Declare(queue::Declare {
        queue: name.into(),
        ..queue::Declare::default()
    }))
}

#[test]
fn plain_and_amqplain_log_in_and_a_wrong_password_is_counted() {
    let mut c = Client::new(settings(".*", ".*", ".*"));
    let out = log_in(&mut c, start_ok("app", "test12"));
    assert!(matches!(
        out[..],
        [AMQPFrame::Method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Tune(_))
        )]
    ));

    let mut c = Client::new(settings(".*", ".*", ".*"));
    let response = amq_protocol::auth::Credentials::new("app".into(), "test12".into())
        .sasl_auth_string(amq_protocol::auth::SASLMechanism::AMQPlain);
    let out = log_in(
        &mut c,
        start_ok_with("AMQPLAIN", response.as_bytes().to_vec()),
    );
    assert!(matches!(
        out[..],
        [AMQPFrame::Method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Tune(_))
        )]
    ));

    let s = settings(".*", ".*", ".*");
    let metrics = Arc::clone(&s.metrics);
    let mut c = Client::new(s);
    let out = log_in(&mut c, start_ok("app", "test13"));
    assert_eq!(connection_close_code(&out), Some(403));
    let (_, text) = c.conn.closed_with().unwrap();
    assert_eq!(
        text,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
    );
    assert_eq!(c.conn.refused_login(), Some(("app", "PLAIN")));
    assert_eq!(metrics.auth_attempts_failed.get(), 1);
    // guest is not among the defined users.
    let mut c = Client::new(settings(".*", ".*", ".*"));
    let out = log_in(&mut c, start_ok("guest", "guest"));
    assert_eq!(connection_close_code(&out), Some(403));
}

#[test]
fn a_mechanism_not_offered_is_a_503_naming_it() {
    let mut c = Client::new(settings(".*", ".*", ".*"));
    let out = c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    let [AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Start(start)))] =
        &out[..]
    else {
        panic!("{out:?}");
    };
    assert_eq!(start.mechanisms.to_string(), "PLAIN AMQPLAIN");
    let out = c.feed(&[start_ok_with("EXTERNAL", Vec::new())]);
    assert_eq!(connection_close_code(&out), Some(503));
    assert!(c.conn.closed_with().unwrap().1.contains("'EXTERNAL'"));
}

#[test]
fn a_vhost_that_does_not_exist_or_is_not_permitted_is_a_530() {
    for (vhost, says) in [
        ("nowhere", "NOT_ALLOWED - vhost nowhere not found"),
        (
            "empty",
            "NOT_ALLOWED - access to vhost 'empty' refused for user 'app'",
        ),
    ] {
        let mut c = Client::new(settings(".*", ".*", ".*"));
        log_in(&mut c, start_ok("app", "test12"));
        let open = conn_method(connection::AMQPMethod::Open(connection::Open {
            virtual_host: vhost.into(),
        }));
        let out = c.feed(&[open_frames()[0].clone(), open]);
        assert_eq!(connection_close_code(&out), Some(530), "{vhost}");
        assert_eq!(c.conn.closed_with().unwrap().1, says);
    }
    // A user with no permissions at all may not open even `/`.
    let mut c = Client::new(settings(".*", ".*", ".*"));
    log_in(&mut c, start_ok("nobody", "test12"));
    let out = c.feed(&open_frames()[..2]);
    assert_eq!(connection_close_code(&out), Some(530));
}

#[test]
fn each_method_needs_its_permission_and_a_refusal_closes_only_its_channel() {
    // May configure and read `own-*`, write to the default exchange only.
    let mut c = app(settings("^own-", "^amq\\\\.default$", "^own-"));
    let out = c.feed(&[declare("own-jobs")]);
    assert!(matches!(
        out[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::DeclareOk(_))
        )]
    ));
    let out = c.feed(&[declare("other")]);
    assert_eq!(
        channel_close(&out),
        Some((
            403,
            "ACCESS_REFUSED - access to queue 'other' in vhost '/' refused for user 'app'".into()
        ))
    );
    c.feed(&[close_channel_ok()]);

    // Publishing to the default exchange is allowed, to amq.direct not.
    let out = c.feed(&[method(
        2,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    assert_eq!(out.len(), 1);
    let mut frames = Client::publish_frames("own-jobs", BasicProperties::default(), b"job");
    for f in &mut frames {
        renumber(f, 2);
    }
    assert!(c.feed(&frames).is_empty());
    let publish = basic::Publish {
        exchange: "amq.direct".into(),
        routing_key: "own-jobs".into(),
        ..basic::Publish::default()
    };
    let out = c.feed(&[basic_method(2, basic::AMQPMethod::Publish(publish))]);
    assert_eq!(
        channel_close(&out).unwrap().1,
        "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'app'"
    );
    // The connection goes on: channel 1, open again, reads the queue.
    c.feed(&[method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )]);
    let out = c.feed(&[get("own-jobs", true)]);
    assert_eq!(delivered_bodies(&out), [b"job".to_vec()]);
}

#[test]
fn reads_binds_and_deletes_are_checked_with_the_last_queue_for_an_empty_name() {
    let mut c = app(settings("^own-", ".*", "^shared-"));
    c.feed(&[declare("own-1")]);
    // basic.get on "" is the channel's last queue, own-1: not readable.
    let out = c.feed(&[get("", true)]);
    assert_eq!(
        channel_close(&out).unwrap().1,
        "ACCESS_REFUSED - access to queue 'own-1' in vhost '/' refused for user 'app'"
    );
    let mut c = app(settings("^own-", ".*", "^shared-"));
    c.feed(&[declare("own-1")]);
    // queue.bind: write on the queue (granted), read on the exchange (not).
    let bind = queue_method(queue::AMQPMethod::Bind(queue::Bind {
        queue: "own-1".into(),
        exchange: "amq.topic".into(),
        routing_key: "#".into(),
        ..queue::Bind::default()
    }));
    let out = c.feed(&[bind]);
    assert!(channel_close(&out)
        .unwrap()
        .1
        .contains("exchange 'amq.topic'"));
    // queue.delete: configure.
    let mut c = app(settings("^$", ".*", ".*"));
    let out = c.feed(&[queue_method(queue::AMQPMethod::Delete(queue::Delete {
        queue: "anything".into(),
        ..queue::Delete::default()
    }))]);
    assert_eq!(channel_close_code(&out), Some(403));
    // A server-named queue is checked by the name it gets.
    let mut c = app(settings("^own-", ".*", ".*"));
    let out = c.feed(&[declare("")]);
    assert!(
        channel_close(&out).unwrap().1.contains("queue 'amq.gen-"),
        "{out:?}"
    );
}

#[test]
fn a_dead_letter_exchange_needs_write_on_it_and_an_alternate_exchange_too() {
    let mut c = app(settings(".*", "^own-", ".*"));
    let d = queue::Declare {
        queue: "own-q".into(),
        arguments: table(&[(
            "x-dead-letter-exchange",
            AMQPValue::LongString("dlx".into()),
        )]),
        ..queue::Declare::default()
    };
    let out = c.feed(&[queue_method(queue::AMQPMethod::Declare(d))]);
    assert!(channel_close(&out).unwrap().1.contains("exchange 'dlx'"));
    let mut c = app(settings(".*", "^own-", ".*"));
    let d = exchange::Declare {
        exchange: "own-x".into(),
        kind: "direct".into(),
        arguments: table(&[("alternate-exchange", AMQPValue::LongString("ae".into()))]),
        ..exchange::Declare::default()
    };
    let out = c.feed(&[method(
        1,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(d)),
    )]);
    assert!(channel_close(&out).unwrap().1.contains("exchange 'ae'"));
}

fn close_channel_ok() -> AMQPFrame {
    method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
    )
}

/// Moves a frame to channel `ch`.
fn renumber(frame: &mut AMQPFrame, ch: u16) {
    match frame {
        AMQPFrame::Method(c, _) | AMQPFrame::Header(c, _) | AMQPFrame::Body(c, _) => *c = ch,
        _ => {}
    }
}
