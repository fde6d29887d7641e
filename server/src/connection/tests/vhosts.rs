//! Virtual hosts apart: the same names in two are two queues and two exchanges, and
//! nothing one's clients do reaches the other's.

use super::*;
use crate::access::{Access, Definitions};
use crate::names;

/// Settings where guest (password test12, see `access/hash.rs`) has every permission on
/// `/` and on `orders`.
fn settings() -> Settings {
    let text = r#"{"users": [{"name": "guest", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR", "tags": []}],
                   "vhosts": [{"name": "/"}, {"name": "orders"}],
                   "permissions": [
                     {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
                     {"user": "guest", "vhost": "orders", "configure": ".*", "write": ".*", "read": ".*"}]}"#;
    let access = Access::from_definitions(&Definitions::parse(text).unwrap()).unwrap();
    Settings {
        access: Arc::new(access),
        ack_timeout: Duration::from_secs(10),
        ..Settings::default()
    }
}

/// Two connections to one broker, one on `/` and one on `orders`, channel 1 open on each.
fn two_vhosts() -> (Client, Client) {
    let broker = Broker::builder().shards(2).manual_clock().build().unwrap();
    let settings = Arc::new(settings());
    let vhosts = Arc::new(VHosts::new([
        VHost::new(&settings),
        VHost::named(&settings, "orders"),
    ]));
    let open = |vhost: &str, id: u64| {
        let conn = Connection::new(broker.clone(), settings.clone(), vhosts.clone(), id, true);
        let mut c = Client {
            broker: broker.clone(),
            conn,
        };
        c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
        c.feed(&[start_ok("guest", "test12")]);
        let mut frames = open_frames();
        frames[1] = conn_method(connection::AMQPMethod::Open(connection::Open {
            virtual_host: vhost.into(),
        }));
        assert_eq!(c.feed(&frames).len(), 2, "{vhost} opened");
        c
    };
    (open("/", 1), open("orders", 2))
}

#[test]
fn the_same_queue_name_in_two_vhosts_is_two_queues() {
    let (mut root, mut orders) = two_vhosts();
    root.declare("jobs");
    orders.declare("jobs");
    root.feed(&Client::publish_frames(
        "jobs",
        BasicProperties::default(),
        b"root job",
    ));
    orders.feed(&Client::publish_frames(
        "jobs",
        BasicProperties::default(),
        b"orders 1",
    ));
    orders.feed(&Client::publish_frames(
        "jobs",
        BasicProperties::default(),
        b"orders 2",
    ));

    let out = root.feed(&[get("jobs", true)]);
    assert_eq!(delivered_bodies(&out), [b"root job".to_vec()]);
    assert!(matches!(
        root.feed(&[get("jobs", true)])[..],
        [AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::GetEmpty(_))
        )]
    ));
    let out = orders.feed(&[get("jobs", true)]);
    assert_eq!(delivered_bodies(&out), [b"orders 1".to_vec()]);
    // Deleting one leaves the other.
    root.feed(&[queue_method(queue::AMQPMethod::Delete(queue::Delete {
        queue: "jobs".into(),
        ..queue::Delete::default()
    }))]);
    let out = orders.feed(&[get("jobs", true)]);
    assert_eq!(delivered_bodies(&out), [b"orders 2".to_vec()]);
}

#[test]
fn a_queue_or_exchange_of_one_vhost_is_not_found_from_the_other() {
    let (mut root, mut orders) = two_vhosts();
    orders.declare("only-in-orders");
    let out = root.feed(&[get("only-in-orders", true)]);
    assert_eq!(channel_close_code(&out), Some(404));
    // Nor by its broker name.
    let (mut root, mut orders) = two_vhosts();
    orders.declare("q");
    let out = root.feed(&[get(
        &names::engine_in(&names::vhost_prefix("orders"), "q"),
        true,
    )]);
    assert_eq!(channel_close_code(&out), Some(404));

    let (mut root, mut orders) = two_vhosts();
    let declare = exchange::Declare {
        exchange: "events".into(),
        kind: "fanout".into(),
        ..exchange::Declare::default()
    };
    let out = orders.feed(&[method(
        1,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare)),
    )]);
    assert_eq!(out.len(), 1, "declare-ok: {out:?}");
    let publish = basic::Publish {
        exchange: "events".into(),
        ..basic::Publish::default()
    };
    let out = root.feed(&[basic_method(1, basic::AMQPMethod::Publish(publish))]);
    let header = AMQPFrame::Header(
        1,
        AMQPContentHeader {
            class_id: 60,
            body_size: 1,
            properties: BasicProperties::default(),
        },
    );
    let out = [out, root.feed(&[header, AMQPFrame::Body(1, b"x".to_vec())])].concat();
    assert_eq!(
        channel_close(&out),
        Some((404, "NOT_FOUND - no exchange 'events' in vhost '/'".into()))
    );
    // And a refusal in `orders` names `orders`.
    let out = orders.feed(&[get("nothing-here", true)]);
    assert_eq!(
        channel_close(&out),
        Some((
            404,
            "NOT_FOUND - no queue 'nothing-here' in vhost 'orders'".into()
        ))
    );
}

#[test]
fn a_server_named_queue_is_found_by_its_name_in_its_own_vhost_only() {
    let (mut root, mut orders) = two_vhosts();
    let out = orders.feed(&[queue_method(queue::AMQPMethod::Declare(
        queue::Declare::default(),
    ))]);
    let [AMQPFrame::Method(1, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))] = &out[..]
    else {
        panic!("{out:?}");
    };
    let name = ok.queue.to_string();
    assert!(name.starts_with("amq.gen-"), "{name}");
    orders.feed(&Client::publish_frames(
        &name,
        BasicProperties::default(),
        b"mine",
    ));
    let out = orders.feed(&[get(&name, true)]);
    assert_eq!(delivered_bodies(&out), [b"mine".to_vec()]);
    let out = root.feed(&[get(&name, true)]);
    assert_eq!(channel_close_code(&out), Some(404));
}
