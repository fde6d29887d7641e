//! Transactions: what `tx.select` holds until `tx.commit`, and how it meets confirms, full queues, cancels and recover.

use super::*;

#[test]
fn a_transaction_holds_publishes_and_settles_until_its_commit() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare("tx.jobs");
    c.publish("tx.jobs", b"before");
    let out = c.feed(&[get("tx.jobs", false)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.delivery_tag == 1
    ));
    let out = c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::SelectOk(tx::SelectOk {}))]);
    // Held: nothing is put or acked before the commit.
    c.publish("tx.jobs", b"one");
    c.publish("tx.jobs", b"two");
    assert!(c.feed(&[ack(1, false)]).is_empty());
    assert_eq!(
        (c.stats("tx.jobs").ready, c.stats("tx.jobs").leased),
        (0, 1)
    );
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}))]);
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (2, 0, 1));
    // A rollback drops the publishes and gives the settled deliveries back to the channel,
    // to be settled again; nothing is requeued.
    let out = c.feed(&[get("tx.jobs", false)]);
    assert!(matches!(
        out[0],
        AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetOk(ref ok))) if ok.delivery_tag == 2
    ));
    c.publish("tx.jobs", b"dropped");
    c.feed(&[ack(2, false)]);
    let out = c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(
        out,
        [tx_method(tx::AMQPMethod::RollbackOk(tx::RollbackOk {}))]
    );
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (1, 1, 1));
    c.feed(&[ack(2, false)]);
    // Acking a tag twice in one transaction is RabbitMQ's 406, at the second ack.
    let out = c.feed(&[ack(2, false)]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    // The channel closed with the transaction: its held ack went with it, and the
    // delivery came back to its queue.
    let stats = c.stats("tx.jobs");
    assert_eq!((stats.ready, stats.leased, stats.acked), (2, 0, 1));
}

#[test]
fn tx_and_confirms_do_not_mix_and_a_commit_needs_tx_select() {
    use amq_protocol::protocol::{confirm, tx};
    let mut c = Client::open();
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    let out = c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    let confirm_select = method(
        1,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        })),
    );
    c.feed(std::slice::from_ref(&confirm_select));
    let out = c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    assert_eq!(channel_close_code(&out), Some(406));
    c.reopen();
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    let out = c.feed(&[confirm_select]);
    assert_eq!(channel_close_code(&out), Some(406));
}

#[test]
fn a_commit_to_a_full_queue_drops_what_does_not_fit_and_a_transaction_is_bounded() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare_rejecting_over("tx.small", 1);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.publish("tx.small", b"fits");
    c.publish("tx.small", b"refused");
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(out, [tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}))]);
    assert_eq!(c.stats("tx.small").ready, 1);
    // What transactions hold on a connection is bounded.
    c.declare("tx.big");
    let body = vec![7u8; 4 << 20];
    let mut code = None;
    for _ in 0..(crate::connection::tx::HELD_BYTES / body.len() + 1) {
        // The body in frames that fit frame_max.
        let mut frames = Client::publish_frames("tx.big", BasicProperties::default(), &[]);
        let Some(AMQPFrame::Header(_, header)) = frames.last_mut() else {
            panic!("publish, then its header");
        };
        header.body_size = body.len() as u64;
        frames.extend(
            body.chunks(8000)
                .map(|chunk| AMQPFrame::Body(1, chunk.to_vec())),
        );
        let out = c.feed(&frames);
        assert_eq!(connection_close_code(&out), None);
        code = channel_close_code(&out);
        if code.is_some() {
            break;
        }
    }
    assert_eq!(code, Some(406));
    assert_eq!(c.stats("tx.big").ready, 0, "nothing was committed");
}

#[test]
fn a_cancel_keeps_the_leases_whose_settles_a_transaction_holds() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    let select = tx_method(tx::AMQPMethod::Select(tx::Select {}));
    let commit = tx_method(tx::AMQPMethod::Commit(tx::Commit {}));
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    // One ack held before the cancel and one after; then both held before it.
    let cases = [("tx.cancel.some", 1), ("tx.cancel.all", 2)];
    let mut consumers = Vec::new();
    for (queue, _) in cases {
        c.declare(queue);
        c.publish(queue, b"a");
        c.publish(queue, b"b");
        let out = c.consume(queue, false);
        let tags: Vec<u64> = deliveries(&out).iter().map(|d| d.0).collect();
        assert_eq!(tags.len(), 2);
        consumers.push((consumer_tag(&out), tags));
    }
    c.feed(&[select]);
    for ((queue, acks_before), (consumer, tags)) in cases.into_iter().zip(consumers) {
        for &tag in &tags[..acks_before] {
            assert!(c.feed(&[ack(tag, false)]).is_empty());
        }
        c.feed(&[cancel(&consumer)]);
        for &tag in &tags[acks_before..] {
            assert!(c.feed(&[ack(tag, false)]).is_empty());
        }
        // The leases stayed the channel's: both acks count, nothing comes back.
        assert_eq!(
            c.feed(std::slice::from_ref(&commit)),
            std::slice::from_ref(&commit_ok)
        );
        let stats = c.stats(queue);
        assert_eq!(
            (stats.acked, stats.leased, stats.ready),
            (2, 0, 0),
            "{queue}"
        );
    }
}

#[test]
fn basic_recover_on_a_transactional_channel_requeues_at_once() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare("tx.recover");
    c.publish("tx.recover", b"again");
    c.feed(&[get("tx.recover", false)]);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    let recover = basic::AMQPMethod::Recover(basic::Recover { requeue: true });
    c.feed(&[basic_method(1, recover)]);
    let stats = c.stats("tx.recover");
    assert_eq!((stats.ready, stats.leased), (1, 0), "not held to a commit");
    // A rollback does not take it back.
    c.feed(&[tx_method(tx::AMQPMethod::Rollback(tx::Rollback {}))]);
    assert_eq!(c.stats("tx.recover").ready, 1);
}

#[test]
fn commit_ok_waits_for_the_answers_of_the_committed_puts() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    // A bounded queue: its puts are awaited, as a durable queue's are.
    c.declare_rejecting_over("tx.awaited", 10);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.publish("tx.awaited", b"one");
    let commit = encode(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    c.conn.handle_input(&commit);
    assert!(c.conn.awaits_answers(), "the put went out awaited");
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no commit-ok before the put is answered"
    );
    // The answer comes from the shard's thread.
    while c.conn.awaits_answers() {
        c.conn.try_answers();
        std::thread::yield_now();
    }
    c.conn.take_output(&mut out);
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    assert_eq!(decode(&out), [commit_ok]);
    assert_eq!(c.stats("tx.awaited").ready, 1);
}

#[test]
fn commit_ok_waits_for_the_committed_settles_on_disk() {
    use amq_protocol::protocol::tx;
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::open_durable(dir.path());
    c.declare("tx.durable");
    assert!(c.broker.queue("tx.durable").unwrap().is_durable());
    c.publish("tx.durable", b"one");
    c.feed(&[get("tx.durable", false)]);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.feed(&[ack(1, false)]);
    let commit = encode(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    c.conn.handle_input(&commit);
    assert!(c.conn.awaits_answers(), "the ack went out awaited");
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert!(
        decode(&out).is_empty(),
        "no commit-ok before the ack is answered"
    );
    c.answered();
    c.conn.take_output(&mut out);
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    assert_eq!(decode(&out), [commit_ok]);
    let stats = c.stats("tx.durable");
    assert_eq!((stats.ready, stats.leased, stats.acked), (0, 0, 1));
}

#[test]
fn a_commit_whose_ack_was_not_made_fails_in_place_of_its_commit_ok() {
    use amq_protocol::protocol::tx;
    let mut c = Client::open();
    c.declare("tx.stale");
    c.publish("tx.stale", b"one");
    c.publish("tx.stale", b"two");
    c.feed(&[get("tx.stale", false), get("tx.stale", false)]);
    c.feed(&[tx_method(tx::AMQPMethod::Select(tx::Select {}))]);
    c.feed(&[ack(1, false)]);
    // The first delivery's lease runs out before the commit: its message is delivered again,
    // so a commit-ok would tell the client an ack took effect that did not.
    c.broker.advance(Duration::from_secs(11)).unwrap();
    let out = c.feed(&[tx_method(tx::AMQPMethod::Commit(tx::Commit {}))]);
    assert_eq!(channel_close_code(&out), Some(406), "{out:?}");
    let commit_ok = tx_method(tx::AMQPMethod::CommitOk(tx::CommitOk {}));
    assert!(!out.contains(&commit_ok));
    let stats = c.stats("tx.stale");
    assert_eq!((stats.ready, stats.acked), (2, 0));
}
