"""leasemqd against an unmodified pika client.

Run by run.sh, which starts leasemqd and passes its address in LEASEMQD_PORT. With
AMQP_URL set instead (run.sh passes it on), the same tests run against that broker, a
RabbitMQ for instance: the tests marked `leasemq_only` are skipped there, each saying why
the two differ on purpose. Each test uses its own queue, so the tests do not depend on one
another.
"""

import datetime
import os
import uuid

import pika
import pytest

URL = os.environ.get("AMQP_URL")
if URL:
    PARAMS = pika.URLParameters(URL)
else:
    PARAMS = pika.ConnectionParameters(
        host="127.0.0.1", port=int(os.environ["LEASEMQD_PORT"]), connection_attempts=3
    )


def leasemq_only(why):
    """A behaviour where leasemqd differs from RabbitMQ on purpose: skipped with AMQP_URL."""
    return pytest.mark.skipif(URL is not None, reason=f"leasemqd differs on purpose: {why}")


def connect():
    return pika.BlockingConnection(PARAMS)


def get_soon(conn, ch, queue, **kwargs):
    """basic_get, asked again for up to 5 s while the queue answers get-empty.

    leasemqd has a message back in its queue by the time the settle that returned it is
    answered, so the first get finds it; RabbitMQ's quorum queues take a nack back
    asynchronously, so against it the message can arrive a moment later.
    """
    for _ in range(500):
        got = ch.basic_get(queue=queue, **kwargs)
        if got[0] is not None:
            return got
        conn.sleep(0.01)
    raise AssertionError(f"nothing came to {queue} within 5 s")


def assert_gone(channel, queue):
    """A passive declare of `queue` is a 404: it does not exist. The channel closes."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare(queue=queue, passive=True)
    assert closed.value.reply_code == 404


def declare_refused(queue, arguments):
    """The channel.close of a queue.declare the broker refuses, made on a connection of
    its own."""
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue=queue, arguments=arguments)
    conn.close()
    return err.value


def drain(channel, queue):
    """The bodies of every message ready in `queue`, taken with auto_ack, in order."""
    got = []
    while True:
        method, _, body = channel.basic_get(queue=queue, auto_ack=True)
        if method is None:
            return got
        got.append(body.decode())


def fresh_queue(channel, prefix):
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    ok = channel.queue_declare(queue=name, durable=True)
    assert ok.method.queue == name
    assert ok.method.message_count == 0
    return name


def test_publish_then_consume_with_acks():
    n = 500
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "jobs")
    # Confirmed publishes: in the queue by the time the passive declare counts them (on
    # RabbitMQ too, whose queues take publishes asynchronously).
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish(
            exchange="",
            routing_key=queue,
            body=f"job {i}".encode(),
            properties=pika.BasicProperties(
                content_type="text/plain", headers={"n": i}, correlation_id=f"c-{i}"
            ),
        )
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == n

    ch.basic_qos(prefetch_count=20)
    seen = []

    def on_message(channel, method, properties, body):
        i = len(seen)
        assert body == f"job {i}".encode()
        assert properties.content_type == "text/plain"
        assert properties.headers == {"n": i}
        assert properties.correlation_id == f"c-{i}"
        assert not method.redelivered
        assert method.routing_key == queue
        seen.append(method.delivery_tag)
        channel.basic_ack(method.delivery_tag)
        if len(seen) == n:
            channel.stop_consuming()

    ch.basic_consume(queue=queue, on_message_callback=on_message)
    ch.start_consuming()
    assert seen == list(range(1, n + 1))
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    conn.close()


def test_nack_with_requeue_redelivers_with_the_flag_set():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "retry")
    ch.basic_publish(exchange="", routing_key=queue, body=b"flaky")
    deliveries = []

    def on_message(channel, method, properties, body):
        deliveries.append((method.delivery_tag, method.redelivered, body))
        if len(deliveries) == 1:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
            channel.stop_consuming()

    ch.basic_consume(queue=queue, on_message_callback=on_message)
    ch.start_consuming()
    assert deliveries == [(1, False, b"flaky"), (2, True, b"flaky")]
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    conn.close()


def test_ack_multiple_settles_everything_up_to_the_tag():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "multi")
    for i in range(10):
        ch.basic_publish(exchange="", routing_key=queue, body=str(i).encode())
    tags = []
    for method, _props, _body in ch.consume(queue, inactivity_timeout=5):
        assert method is not None, "timed out waiting for a delivery"
        tags.append(method.delivery_tag)
        if len(tags) == 10:
            break
    ch.basic_ack(tags[6], multiple=True)  # settles 1..=7
    ch.cancel()
    conn.close()
    # The three left (8, 9, 10) came back when the consumer ended.
    conn = connect()
    ch = conn.channel()
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 3
    bodies = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        assert method is not None, "timed out waiting for a delivery"
        assert method.redelivered
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 3:
            break
    assert bodies == [b"7", b"8", b"9"]
    conn.close()


def test_closing_a_channel_returns_its_unacked_deliveries_redelivered():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "crash")
    ch.basic_publish(exchange="", routing_key=queue, body=b"half done")
    method, _props, body = next(ch.consume(queue, inactivity_timeout=5))
    assert (body, method.redelivered) == (b"half done", False)
    ch.close()  # no ack: the worker "crashed"

    ch = conn.channel()
    method, _props, body = next(ch.consume(queue, inactivity_timeout=5))
    assert (body, method.redelivered) == (b"half done", True)
    ch.basic_ack(method.delivery_tag)
    conn.close()


def test_reject_without_requeue_drops_the_message():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "poison")
    ch.basic_publish(exchange="", routing_key=queue, body=b"not json")
    method, _props, _body = next(ch.consume(queue, inactivity_timeout=5))
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.cancel()
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    conn.close()


def test_a_body_larger_than_a_frame_comes_back_whole():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "big")
    body = os.urandom(1_000_000)  # several frames of frame_max 131072
    ch.basic_publish(exchange="", routing_key=queue, body=body)
    method, _props, got = next(ch.consume(queue, inactivity_timeout=5))
    assert got == body
    ch.basic_ack(method.delivery_tag)
    conn.close()


def test_passive_declare_of_a_missing_queue_is_a_channel_error():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue="no-such-queue", passive=True)
    assert err.value.reply_code == 404
    # The connection survives a channel error.
    ch = conn.channel()
    fresh_queue(ch, "after-error")
    conn.close()


@leasemq_only("a plugin's exchange type: RabbitMQ serves it with the plugin, 503 without")
def test_an_unsupported_method_closes_the_connection_with_540():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        ch.exchange_declare(exchange="later", exchange_type="x-delayed-message")
    assert err.value.reply_code == 540


def test_a_fanout_exchange_gives_every_bound_queue_a_copy():
    # RabbitMQ's publish/subscribe tutorial: each subscriber binds a server-named queue.
    conn = connect()
    ch = conn.channel()
    exchange = f"logs-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange=exchange, exchange_type="fanout")
    subscribers = [ch.queue_declare(queue="", exclusive=True).method.queue for _ in range(2)]
    for queue in subscribers:
        ch.queue_bind(exchange=exchange, queue=queue)
    ch.confirm_delivery()
    ch.basic_publish(exchange=exchange, routing_key="", body=b"hello, all")
    for queue in subscribers:
        method, _, body = get_soon(conn, ch, queue, auto_ack=True)
        assert (body, method.exchange) == (b"hello, all", exchange)
    ch.exchange_delete(exchange)
    conn.close()


def test_a_topic_exchange_routes_by_pattern():
    # RabbitMQ's topics tutorial.
    conn = connect()
    ch = conn.channel()
    exchange = f"animals-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange=exchange, exchange_type="topic")
    q1 = ch.queue_declare(queue="", exclusive=True).method.queue
    q2 = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(exchange=exchange, queue=q1, routing_key="*.orange.*")
    ch.queue_bind(exchange=exchange, queue=q2, routing_key="*.*.rabbit")
    ch.queue_bind(exchange=exchange, queue=q2, routing_key="lazy.#")
    ch.confirm_delivery()
    for key in ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox",
                "lazy.brown.fox", "lazy.pink.rabbit", "quick.brown.fox", "orange",
                "quick.orange.male.rabbit", "lazy.orange.male.rabbit"]:
        ch.basic_publish(exchange=exchange, routing_key=key, body=key.encode())

    assert drain(ch, q1) == ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"]
    assert drain(ch, q2) == ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox",
                         "lazy.pink.rabbit", "lazy.orange.male.rabbit"]
    ch.exchange_delete(exchange)
    conn.close()


def test_a_direct_exchange_routes_by_key_to_every_bound_queue():
    conn = connect()
    ch = conn.channel()
    exchange = f"orders-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange=exchange, exchange_type="direct", durable=True)
    billing = fresh_queue(ch, "billing")
    audit = fresh_queue(ch, "audit")
    ch.queue_bind(queue=billing, exchange=exchange, routing_key="paid")
    ch.queue_bind(queue=audit, exchange=exchange, routing_key="paid")
    ch.queue_bind(queue=audit, exchange=exchange, routing_key="shipped")
    ch.confirm_delivery()  # routed by the time they are confirmed
    ch.basic_publish(exchange=exchange, routing_key="paid", body=b"order 1 paid")
    ch.basic_publish(exchange=exchange, routing_key="shipped", body=b"order 1 shipped")
    ch.basic_publish(exchange=exchange, routing_key="lost", body=b"nobody")
    assert ch.queue_declare(queue=billing, passive=True).method.message_count == 1
    assert ch.queue_declare(queue=audit, passive=True).method.message_count == 2
    method, _, body = ch.basic_get(queue=billing, auto_ack=True)
    # As from RabbitMQ: the exchange and routing key it was published with.
    assert (body, method.exchange, method.routing_key) == (b"order 1 paid", exchange, "paid")
    ch.queue_unbind(queue=audit, exchange=exchange, routing_key="paid")
    ch.basic_publish(exchange=exchange, routing_key="paid", body=b"order 2 paid")
    assert ch.queue_declare(queue=audit, passive=True).method.message_count == 2
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare(exchange=exchange, exchange_type="direct", durable=False)
    assert closed.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(exchange=exchange)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_publish(exchange=exchange, routing_key="paid", body=b"gone")
        ch.queue_declare(queue=audit, passive=True)  # a round trip to see the close
    assert closed.value.reply_code == 404
    conn.close()


@leasemq_only("message-id is the dedup id (RabbitMQ keeps duplicates)")
def test_the_message_id_is_the_dedup_id_while_the_message_is_queued():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "dedup")
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish(
            exchange="",
            routing_key=queue,
            body=b"charge card 42",
            properties=pika.BasicProperties(message_id="charge-42"),
        )
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 1
    method, properties, _ = ch.basic_get(queue=queue, auto_ack=True)
    assert properties.message_id == "charge-42"
    conn.close()


def test_a_wrong_password_is_refused():
    params = pika.ConnectionParameters(
        host=PARAMS.host,
        port=PARAMS.port,
        virtual_host=PARAMS.virtual_host,
        credentials=pika.PlainCredentials("guest", "wrong"),
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)


def test_publisher_confirms():
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    queue = fresh_queue(ch, "confirmed")
    for i in range(50):
        ch.basic_publish(exchange="", routing_key=queue, body=str(i).encode())
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 50
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(exchange="", routing_key="no-such-queue", body=b"lost", mandatory=True)
    conn.close()


def test_reject_dead_letters_through_the_default_exchange():
    conn = connect()
    ch = conn.channel()
    dead = fresh_queue(ch, "dead")
    work = f"work-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(
        queue=work,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead},
    )
    ch.basic_publish(
        exchange="",
        routing_key=work,
        body=b"poison",
        properties=pika.BasicProperties(content_type="application/json"),
    )
    method, _props, _body = next(ch.consume(work, inactivity_timeout=5))
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.cancel()
    method, props, body = next(ch.consume(dead, inactivity_timeout=5))
    assert (body, props.content_type) == (b"poison", "application/json")
    # RabbitMQ's dead-letter headers say where and why it died.
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (work, "rejected", 1)
    assert props.headers["x-first-death-queue"] == work
    # When it died: an AMQP timestamp (whole seconds), which pika reads as a datetime.
    age = datetime.datetime.now(datetime.timezone.utc) - death["time"]
    assert datetime.timedelta(seconds=-2) < age < datetime.timedelta(seconds=60)
    ch.basic_ack(method.delivery_tag)
    conn.close()


@leasemq_only("x-max-length-bytes is not served (RabbitMQ serves it)")
def test_an_unsupported_queue_argument_is_refused_not_ignored():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        ch.queue_declare(queue="capped-bytes", arguments={"x-max-length-bytes": 1024})
    assert err.value.reply_code == 540


def test_a_full_queue_drops_its_oldest_ready_message_by_default():
    """RabbitMQ's default overflow (drop-head); messages delivered and unacked do not count."""
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    implicit, explicit = f"capped-{suffix}", f"capped-dh-{suffix}"
    ch.queue_declare(queue=implicit, arguments={"x-max-length": 3})
    ch.queue_declare(queue=explicit, arguments={"x-max-length": 3, "x-overflow": "drop-head"})
    ch.confirm_delivery()
    for queue in (implicit, explicit):
        for i in range(1, 6):
            # Confirmed, not nacked: the publish is taken, the head makes room.
            ch.basic_publish(exchange="", routing_key=queue, body=str(i).encode())
        assert ch.queue_declare(queue=queue, passive=True).method.message_count == 3
    assert drain(ch, explicit) == ["3", "4", "5"]
    # One message out for delivery and not acked: two wait, so a publish drops nothing.
    method, _, body = ch.basic_get(queue=implicit)
    assert body == b"3"
    ch.basic_publish(exchange="", routing_key=implicit, body=b"6")
    assert ch.queue_declare(queue=implicit, passive=True).method.message_count == 3
    ch.basic_publish(exchange="", routing_key=implicit, body=b"7")
    ch.basic_ack(method.delivery_tag)
    assert drain(ch, implicit) == ["5", "6", "7"]
    conn.close()


def test_a_message_past_its_ttl_is_never_delivered():
    # The queue's x-message-ttl and a message's own expiration, the shorter counting.
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    ttl, plain = f"ttl-{suffix}", fresh_queue(ch, "plain")
    ch.queue_declare(queue=ttl, arguments={"x-message-ttl": 200})
    ch.confirm_delivery()
    ch.basic_publish(exchange="", routing_key=ttl, body=b"stale")
    ch.basic_publish(exchange="", routing_key=plain, body=b"stale",
                     properties=pika.BasicProperties(expiration="200"))
    ch.basic_publish(exchange="", routing_key=plain, body=b"kept")
    conn.sleep(0.5)
    ch.basic_publish(exchange="", routing_key=ttl, body=b"fresh")
    ch.basic_publish(exchange="", routing_key=ttl, body=b"short",
                     properties=pika.BasicProperties(expiration="1"))
    conn.sleep(0.1)
    assert drain(ch, ttl) == ["fresh"]
    assert drain(ch, plain) == ["kept"]
    # A redeclare names the same TTL.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue=ttl, arguments={"x-message-ttl": 300})
    assert err.value.reply_code == 406
    ch = conn.channel()
    for queue in (ttl, plain):
        ch.queue_delete(queue)
    conn.close()


def test_an_expiration_that_is_no_number_of_milliseconds_is_a_406():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "expiring")
    # Ten years, RabbitMQ's longest, is taken; a millisecond more is refused.
    ch.basic_publish(exchange="", routing_key=queue, body=b"x",
                     properties=pika.BasicProperties(expiration="315360000000"))
    # (leasemqd looks at the head of a queue such a message went to: asked again if the
    # get meets the look.)
    _, _, body = get_soon(conn, ch, queue, auto_ack=True)
    assert body == b"x"
    for bad in ("soon", "-5", "1.5", "315360000001", "18446744073709551615"):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish(exchange="", routing_key=queue, body=b"x",
                             properties=pika.BasicProperties(expiration=bad))
            ch.queue_declare(queue=queue, passive=True)
        assert err.value.reply_code == 406
        assert "invalid expiration" in err.value.reply_text
        ch = conn.channel()
    ch.queue_delete(queue)
    conn.close()


def test_a_dead_letter_loses_its_expiration_to_its_x_death_record():
    conn = connect()
    ch = conn.channel()
    dead = fresh_queue(ch, "dead")
    work = f"work-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=work, arguments={"x-dead-letter-exchange": "",
                                            "x-dead-letter-routing-key": dead})
    ch.basic_publish(exchange="", routing_key=work, body=b"x",
                     properties=pika.BasicProperties(expiration="60000"))
    method, _, _ = get_soon(conn, ch, work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _, props, _ = get_soon(conn, ch, dead, auto_ack=True)
    assert props.expiration is None
    assert props.headers["x-death"][0]["original-expiration"] == "60000"
    for queue in (work, dead):
        ch.queue_delete(queue)
    conn.close()


@leasemq_only(
    "RabbitMQ dead-letters heads dropped by x-max-length; leasemqd drops them, so it"
    " refuses a dead-letter exchange with drop-head"
)
def test_drop_head_refuses_a_dead_letter_exchange():
    arguments = {"x-max-length": 3, "x-dead-letter-exchange": ""}
    refused = declare_refused("would-drop", arguments)
    assert refused.reply_code == 406
    assert "x-overflow=reject-publish" in refused.reply_text


def test_a_delay_queue_nobody_consumes_dead_letters_each_message_as_its_ttl_runs_out():
    """RabbitMQ's delay-queue pattern: a queue with x-message-ttl and a dead-letter
    exchange, and no consumer; a message's own expiration does the same."""
    conn = connect()
    ch = conn.channel()
    work = fresh_queue(ch, "work")
    suffix = uuid.uuid4().hex[:8]
    delay, timed = f"delay-{suffix}", f"timed-{suffix}"
    to_work = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work}
    ch.queue_declare(queue=delay, arguments={"x-message-ttl": 1000, **to_work})
    ch.queue_declare(queue=timed, arguments=to_work)
    ch.confirm_delivery()
    ch.basic_publish(exchange="", routing_key=delay, body=b"later",
                     properties=pika.BasicProperties(headers={"job": 7}))
    ch.basic_publish(exchange="", routing_key=timed, body=b"own",
                     properties=pika.BasicProperties(expiration="200"))
    ch.basic_publish(exchange="", routing_key=timed, body=b"never")
    assert ch.basic_get(queue=work)[0] is None, "not before its time"
    # leasemqd looks at a queue's head for messages past their time by taking it for a
    # moment: the message is counted again once the look hands it back.
    counts = []
    for _ in range(50):
        counts.append(ch.queue_declare(queue=delay, passive=True).method.message_count)
        if counts[-1] == 1:
            break
        conn.sleep(0.01)
    assert counts[-1] == 1, counts
    got = {}
    for _ in range(2):
        _, props, body = get_soon(conn, ch, work, auto_ack=True)
        got[body] = props
    assert set(got) == {b"later", b"own"}
    later, own = got[b"later"], got[b"own"]
    assert later.headers["job"] == 7
    death = later.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert death["queue"] == delay
    assert death["count"] == 1
    assert death["exchange"] == ""
    assert death["routing-keys"] == [delay]
    assert later.headers["x-first-death-reason"] == "expired"
    assert own.expiration is None
    assert own.headers["x-death"][0]["original-expiration"] == "200"
    assert own.headers["x-death"][0]["queue"] == timed
    assert ch.queue_declare(queue=delay, passive=True).method.message_count == 0
    assert drain(ch, timed) == ["never"]
    for queue in (work, delay, timed):
        ch.queue_delete(queue)
    conn.close()


def test_a_retry_loop_through_a_delay_queue_brings_a_rejected_message_back():
    """A work queue dead-letters its rejects to a delay queue, which dead-letters them
    back as they expire: the loop RabbitMQ users build retries with."""
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    work, retry = f"work-{suffix}", f"retry-{suffix}"
    ch.queue_declare(queue=work, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
    ch.queue_declare(queue=retry, arguments={
        "x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work})
    ch.basic_publish(exchange="", routing_key=work, body=b"flaky")
    for attempt in (1, 2):
        method, props, _ = get_soon(conn, ch, work)
        deaths = (props.headers or {}).get("x-death", [])
        assert [d["count"] for d in deaths] == [attempt - 1] * (2 if attempt > 1 else 0)
        ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_soon(conn, ch, work)
    assert body == b"flaky"
    reasons = {d["queue"]: (d["reason"], d["count"]) for d in props.headers["x-death"]}
    assert reasons == {work: ("rejected", 2), retry: ("expired", 2)}
    assert props.headers["x-first-death-reason"] == "rejected"
    ch.basic_ack(method.delivery_tag)
    for queue in (work, retry):
        ch.queue_delete(queue)
    conn.close()


def test_a_full_queue_with_reject_publish_nacks_the_publish():
    conn = connect()
    ch = conn.channel()
    queue = f"bounded-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(
        queue=queue, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
    )
    ch.confirm_delivery()
    ch.basic_publish(exchange="", routing_key=queue, body=b"1")
    ch.basic_publish(exchange="", routing_key=queue, body=b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(exchange="", routing_key=queue, body=b"3")
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 2
    conn.close()


def test_delivery_limit_dead_letters_a_poison_message():
    """x-delivery-limit 1 (RabbitMQ quorum queues): one redelivery, then the dead-letter queue."""
    conn = connect()
    ch = conn.channel()
    dead = fresh_queue(ch, "poison-dead")
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(
        queue=queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    ch.basic_publish(exchange="", routing_key=queue, body=b"poison")
    for redelivered in (False, True):
        method, _, body = get_soon(conn, ch, queue)
        assert (body, method.redelivered) == (b"poison", redelivered)
        ch.basic_nack(method.delivery_tag, requeue=True)
    method, properties, body = get_soon(conn, ch, dead, auto_ack=True)
    assert ch.basic_get(queue=queue) == (None, None, None)
    assert body == b"poison"
    assert properties.headers["x-first-death-reason"] == "delivery_limit"
    conn.close()


def test_basic_get_leases_one_message_at_a_time():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "pull")
    for body in (b"first", b"second"):
        ch.basic_publish(exchange="", routing_key=queue, body=body)
    method, _, body = ch.basic_get(queue=queue)
    assert (body, method.redelivered, method.message_count) == (b"first", False, 1)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(queue=queue)
    assert (body, method.redelivered) == (b"first", True)
    ch.basic_ack(method.delivery_tag)
    method, _, body = ch.basic_get(queue=queue, auto_ack=True)
    assert body == b"second"
    assert ch.basic_get(queue=queue) == (None, None, None)
    conn.close()


def test_cancel_then_finish_the_work_in_hand_and_ack_it():
    """RabbitMQ's graceful shutdown: after basic.cancel what was delivered can be acked."""
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "graceful")
    for i in range(3):
        ch.basic_publish(exchange="", routing_key=queue, body=f"job {i}".encode())
    ch.basic_qos(prefetch_count=2)
    in_hand = []

    def on_message(channel, method, properties, body):
        in_hand.append(method.delivery_tag)
        if len(in_hand) == 2:
            channel.stop_consuming()

    tag = ch.basic_consume(queue=queue, on_message_callback=on_message)
    ch.start_consuming()
    ch.basic_cancel(tag)
    for delivery_tag in in_hand:
        ch.basic_ack(delivery_tag)
    # The acks counted: only the third message is left, never delivered.
    method, _, body = ch.basic_get(queue=queue)
    assert (body, method.redelivered, method.message_count) == (b"job 2", False, 0)
    ch.basic_ack(method.delivery_tag)
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    conn.close()


def test_purge_and_delete():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "scratch")
    for i in range(5):
        ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    assert ch.queue_purge(queue).method.message_count == 5
    ch.basic_publish(exchange="", routing_key=queue, body=b"y")
    assert ch.queue_delete(queue).method.message_count == 1
    assert_gone(ch, queue)
    conn.close()


def test_a_server_named_exclusive_queue_belongs_to_its_connection():
    conn = connect()
    ch = conn.channel()
    queue = ch.queue_declare(queue="", exclusive=True).method.queue
    assert queue.startswith("amq.gen-")
    other = connect()
    och = other.channel()
    och.basic_publish(exchange="", routing_key=queue, body=b"for you")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        och.basic_consume(queue=queue, on_message_callback=lambda *a: None)
    assert closed.value.reply_code == 405
    method, _, body = ch.basic_get(queue=queue, auto_ack=True)
    assert body == b"for you"
    conn.close()
    och = other.channel()
    assert_gone(och, queue)
    other.close()


def test_an_exclusive_consumer_has_the_queue_alone():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "solo")
    ignore = lambda *args: None  # noqa: E731
    tag = ch.basic_consume(queue=queue, on_message_callback=ignore, exclusive=True)
    other = connect()
    och = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        och.basic_consume(queue=queue, on_message_callback=ignore)
    assert refused.value.reply_code == 403
    # Cancelled, it frees the queue; an exclusive consumer then needs it empty of others.
    ch.basic_cancel(tag)
    och = other.channel()
    och.basic_consume(queue=queue, on_message_callback=ignore)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.basic_consume(queue=queue, on_message_callback=ignore, exclusive=True)
    assert refused.value.reply_code == 403
    # The connection that held the queue is gone: anyone may take it alone.
    other.close()
    ch = conn.channel()
    ch.basic_consume(queue=queue, on_message_callback=ignore, exclusive=True)
    ch.queue_delete(queue)
    conn.close()


@leasemq_only(
    "a lease that runs out goes to another consumer and the late ack is ignored; "
    "RabbitMQ closes the channel with 406 at consumer_timeout"
)
def test_an_expired_lease_is_redelivered_and_the_late_ack_is_ignored():
    conn = connect()
    slow = conn.channel()
    queue = f"lease-{uuid.uuid4().hex[:8]}"
    slow.queue_declare(queue=queue, arguments={"x-consumer-timeout": 300})
    slow.basic_publish(exchange="", routing_key=queue, body=b"slow job")
    method, _, body = slow.basic_get(queue=queue)
    assert (body, method.redelivered) == (b"slow job", False)
    late_tag = method.delivery_tag
    # Another worker waits for it: it comes back once the 300 ms lease runs out.
    fast = conn.channel()
    method, _, body = next(fast.consume(queue, inactivity_timeout=10))
    assert method is not None, "the message came back after its lease ran out"
    assert (body, method.redelivered) == (b"slow job", True)
    fast.basic_ack(method.delivery_tag)
    # The first worker's ack comes too late: ignored, and its channel stays open.
    slow.basic_ack(late_tag)
    assert slow.queue_declare(queue=queue, passive=True).method.message_count == 0
    assert slow.is_open
    conn.close()


def test_a_redeclare_that_says_otherwise_is_refused():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "flags")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(queue=queue, durable=False)
    assert closed.value.reply_code == 406
    assert "durable" in closed.value.reply_text
    ch = conn.channel()
    mine = ch.queue_declare(queue=f"mine-{uuid.uuid4().hex[:8]}", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(queue=mine, exclusive=False)
    assert closed.value.reply_code == 405
    ch = conn.channel()
    ch.queue_delete(queue)
    conn.close()


def test_amq_queue_names_are_the_servers():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(queue=f"amq.mine-{uuid.uuid4().hex[:8]}")
    assert closed.value.reply_code == 403
    conn.close()


def test_a_value_no_broker_knows_closes_only_the_channel():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(
            queue=f"odd-{uuid.uuid4().hex[:8]}",
            arguments={"x-max-length": 10, "x-overflow": "bogus"},
        )
    assert closed.value.reply_code == 406
    assert conn.is_open
    conn.close()


def test_a_user_id_other_than_the_connections_is_refused():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "claims")
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"mine", pika.BasicProperties(user_id="guest"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_publish("", queue, b"forged", pika.BasicProperties(user_id="someone-else"))
    assert closed.value.reply_code == 406
    ch = conn.channel()
    method, props, body = get_soon(conn, ch, queue, auto_ack=True)
    assert (body, props.user_id) == (b"mine", "guest")
    assert ch.queue_delete(queue).method.message_count == 0
    conn.close()


def test_an_empty_queue_name_is_the_queue_last_declared():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "latest")
    ch.basic_publish("", queue, b"here")
    method, _, body = get_soon(conn, ch, "", auto_ack=True)
    assert body == b"here"
    ch.queue_delete("")
    assert_gone(ch, queue)
    conn.close()


def test_delete_if_empty_counts_only_what_waits_to_be_delivered():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "inhand")
    ch.basic_publish("", queue, b"taken")
    get_soon(conn, ch, queue)  # leased, not acked
    assert ch.queue_delete(queue, if_empty=True).method.message_count == 0
    assert_gone(ch, queue)
    conn.close()


def test_exchange_redeclare_with_another_type_closes_the_channel_and_unbind_of_nothing_is_fine():
    conn = connect()
    ch = conn.channel()
    exchange = f"routes-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange, exchange_type="direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare(exchange, exchange_type="fanout")
    assert closed.value.reply_code == 406
    assert conn.is_open
    ch = conn.channel()
    queue = fresh_queue(ch, "unbound")
    ch.queue_unbind(queue, exchange, routing_key="never-bound")
    ch.queue_unbind(queue, f"missing-{uuid.uuid4().hex[:8]}", routing_key="k")
    ch.exchange_delete(exchange)
    ch.queue_delete(queue)
    conn.close()


def test_a_multiple_requeue_after_cancel_comes_back_in_delivery_order():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "order")
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", queue, f"m{i}".encode())
    seen = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: seen.append(b))
    while len(seen) < 4:
        conn.process_data_events(time_limit=0.1)
    ch.basic_cancel(tag)
    ch.basic_nack(delivery_tag=0, multiple=True, requeue=True)
    bodies = [get_soon(conn, ch, queue, auto_ack=True)[2] for _ in range(4)]
    assert bodies == [b"m0", b"m1", b"m2", b"m3"]
    ch.queue_delete(queue)
    conn.close()


def test_an_auto_delete_queue_goes_when_its_last_consumer_does():
    conn = connect()
    ch = conn.channel()
    queue = f"passing-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue, auto_delete=True)
    first = ch.basic_consume(queue, lambda *a: None)
    second = ch.basic_consume(queue, lambda *a: None)
    ch.basic_cancel(first)
    assert ch.queue_declare(queue=queue, passive=True).method.consumer_count == 1
    ch.basic_cancel(second)
    # leasemqd deletes it before answering the cancel; RabbitMQ's queue process may
    # finish a moment after, so the look is repeated for up to 5 s.
    for _ in range(500):
        try:
            ch.queue_declare(queue=queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404
            break
        conn.sleep(0.01)
    else:
        raise AssertionError(f"{queue} is still there")
    conn.close()


def test_the_default_exchange_and_quorum_queues_refuse_as_rabbitmq_does():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare("", passive=True)
    assert closed.value.reply_code == 403
    assert closed.value.reply_text.startswith("ACCESS_REFUSED - ")
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(
            queue=f"q-{uuid.uuid4().hex[:8]}",
            durable=True,
            exclusive=True,
            arguments={"x-queue-type": "quorum"},
        )
    assert closed.value.reply_code == 406
    assert closed.value.reply_text.startswith("PRECONDITION_FAILED - ")
    conn.close()


def test_a_connection_error_names_its_code_first():
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        ch.basic_recover(requeue=False)
    assert closed.value.reply_code == 540
    assert closed.value.reply_text.startswith("NOT_IMPLEMENTED - ")


def test_an_auto_delete_exchange_goes_with_its_last_binding():
    conn = connect()
    ch = conn.channel()
    exchange = f"replies-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange, exchange_type="direct", auto_delete=True)
    queue = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(queue, exchange, routing_key="a")
    ch.queue_bind(queue, exchange, routing_key="b")
    ch.queue_unbind(queue, exchange, routing_key="a")
    ch.exchange_declare(exchange, passive=True)
    ch.queue_unbind(queue, exchange, routing_key="b")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare(exchange, passive=True)
    assert closed.value.reply_code == 404
    conn.close()


def test_rabbitmqs_rpc_tutorial_runs_unchanged():
    # The server: a worker on a named queue, one request at a time, answering to
    # reply_to with the request's correlation_id.
    server = connect()
    sch = server.channel()
    requests = f"rpc-{uuid.uuid4().hex[:8]}"
    sch.queue_declare(queue=requests)
    sch.basic_qos(prefetch_count=1)

    def on_request(ch, method, props, body):
        n = int(body)
        ch.basic_publish(
            exchange="",
            routing_key=props.reply_to,
            properties=pika.BasicProperties(correlation_id=props.correlation_id),
            body=str(n * n).encode(),
        )
        ch.basic_ack(delivery_tag=method.delivery_tag)

    sch.basic_consume(queue=requests, on_message_callback=on_request)

    # The client: an exclusive callback queue, consumed with auto_ack.
    client = connect()
    cch = client.channel()
    callback = cch.queue_declare(queue="", exclusive=True).method.queue
    answers = {}

    def on_response(ch, method, props, body):
        answers[props.correlation_id] = int(body)

    cch.basic_consume(queue=callback, on_message_callback=on_response, auto_ack=True)
    for n in range(5):
        cid = str(uuid.uuid4())
        cch.basic_publish(
            exchange="",
            routing_key=requests,
            properties=pika.BasicProperties(reply_to=callback, correlation_id=cid),
            body=str(n).encode(),
        )
        for _ in range(500):
            if cid in answers:
                break
            server.process_data_events(time_limit=0.01)
            client.process_data_events(time_limit=0.01)
        assert answers.get(cid) == n * n
    sch.queue_delete(requests)
    client.close()
    server.close()


def test_a_get_with_auto_ack_moves_no_other_message():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "line")
    ch.confirm_delivery()
    for body in [b"m0", b"m1", b"m2"]:
        ch.basic_publish("", queue, body)
    first, _, body = ch.basic_get(queue)
    assert body == b"m0"
    assert ch.basic_get(queue, auto_ack=True)[2] == b"m1"
    ch.basic_nack(first.delivery_tag, requeue=True)
    method, _, body = get_soon(conn, ch, queue, auto_ack=True)
    assert (body, method.redelivered) == (b"m0", True)
    assert ch.basic_get(queue, auto_ack=True)[2] == b"m2"
    ch.queue_delete(queue)
    conn.close()


def test_a_headers_exchange_routes_by_the_headers_the_binding_asks_for():
    conn = connect()
    ch = conn.channel()
    exchange = f"docs-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange, exchange_type="headers")
    every = ch.queue_declare(queue="", exclusive=True).method.queue
    either = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(every, exchange, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(either, exchange, arguments={"x-match": "any", "format": "pdf", "type": "log"})
    ch.confirm_delivery()
    for name, headers in [
        ("pdf report", {"format": "pdf", "type": "report"}),
        ("pdf", {"format": "pdf"}),
        ("zip log", {"format": "zip", "type": "log"}),
        ("zip report", {"format": "zip", "type": "report"}),
        ("none", None),
    ]:
        ch.basic_publish(exchange, "ignored", name.encode(), pika.BasicProperties(headers=headers))

    assert drain(ch, every) == ["pdf report"]
    assert drain(ch, either) == ["pdf report", "pdf", "zip log"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_bind(every, exchange, arguments={"x-match": "most"})
    assert closed.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(exchange)
    conn.close()


def test_direct_reply_to_answers_the_requesting_channel_without_a_reply_queue():
    # RabbitMQ's direct reply-to: the client consumes from the pseudo-queue with
    # auto_ack and names it as reply_to; the server replies to the name it is handed.
    server = connect()
    sch = server.channel()
    requests = fresh_queue(sch, "direct-rpc")
    client = connect()
    cch = client.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        cch.basic_consume(queue="amq.rabbitmq.reply-to", on_message_callback=print)
    assert closed.value.reply_code == 406
    cch = client.channel()
    answers = []

    def on_response(ch, method, props, body):
        answers.append((method.routing_key, props.correlation_id, body))

    cch.basic_consume(
        queue="amq.rabbitmq.reply-to", on_message_callback=on_response, auto_ack=True
    )
    cch.basic_publish(
        exchange="",
        routing_key=requests,
        properties=pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c-1"),
        body=b"ping",
    )
    _, props, _ = get_soon(server, sch, requests, auto_ack=True)
    reply_to = props.reply_to
    assert reply_to.startswith("amq.rabbitmq.reply-to.")
    # The name is alive while its consumer is: a declare answers 0 messages, 1 consumer.
    ok = sch.queue_declare(queue=reply_to, passive=True)
    assert (ok.method.message_count, ok.method.consumer_count) == (0, 1)
    sch.basic_publish(
        exchange="",
        routing_key=reply_to,
        properties=pika.BasicProperties(correlation_id=props.correlation_id),
        body=b"pong",
    )
    for _ in range(500):
        if answers:
            break
        client.process_data_events(time_limit=0.01)
    assert answers == [(reply_to, "c-1", b"pong")]
    # A channel that does not consume from the pseudo-queue may not name it.
    other = client.channel()
    other.basic_publish(
        exchange="",
        routing_key=requests,
        properties=pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"),
        body=b"lost",
    )
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        other.queue_declare(queue=requests, passive=True)
    assert closed.value.reply_code == 406
    # With its channel closed the name is gone.
    cch.close()
    for _ in range(500):
        probe = server.channel()
        try:
            probe.queue_declare(queue=reply_to, passive=True)
        except pika.exceptions.ChannelClosedByBroker as gone:
            assert gone.reply_code == 404
            break
        probe.close()
        server.sleep(0.01)
    else:
        raise AssertionError("the reply name outlived its channel")
    sch = server.channel()
    sch.queue_delete(requests)
    client.close()
    server.close()


def test_x_expires_deletes_a_queue_unused_that_long_but_not_while_consumed():
    conn = connect()
    ch = conn.channel()
    probe = conn.channel()
    probe.confirm_delivery()

    def alive(queue):
        # A mandatory publish comes back once the queue is gone; a publish is no use of
        # it (a passive declare would be one, and start its time again).
        try:
            probe.basic_publish(exchange="", routing_key=queue, body=b"probe", mandatory=True)
            return True
        except pika.exceptions.UnroutableError:
            return False

    def gone_within(queue, seconds):
        for _ in range(int(seconds * 100)):
            if not alive(queue):
                return True
            conn.sleep(0.01)
        return False

    idle = f"expires-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=idle, arguments={"x-expires": 300})
    assert alive(idle)
    assert gone_within(idle, 5)
    # Redeclared with another x-expires: RabbitMQ's 406.
    kept = f"expires-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=kept, arguments={"x-expires": 300})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue=kept, arguments={"x-expires": 400})
    assert err.value.reply_code == 406
    ch = conn.channel()
    # A consumer keeps it past its time; from its going, the time runs again.
    tag = ch.basic_consume(queue=kept, on_message_callback=lambda *a: None, auto_ack=True)
    conn.sleep(0.6)
    assert alive(kept)
    ch.basic_cancel(tag)
    assert gone_within(kept, 5)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue=kept, passive=True)
    assert err.value.reply_code == 404
    conn.close()


def test_an_exchange_redeclare_compares_internal_and_alternate_exchange_only():
    conn = connect()
    ch = conn.channel()
    name = f"redeclared-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange=name, exchange_type="direct")
    # RabbitMQ keeps the first declare's arguments and compares only these two.
    ch.exchange_declare(exchange=name, exchange_type="direct", arguments={"x-note": 1})
    for changed in ({"arguments": {"alternate-exchange": "amq.fanout"}}, {"internal": True}):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare(exchange=name, exchange_type="direct", **changed)
        assert err.value.reply_code == 406
        ch = conn.channel()
    ch.exchange_delete(name)
    conn.close()


def test_cc_and_bcc_headers_route_copies_and_bcc_is_not_delivered():
    # RabbitMQ's sender-selected distribution: CC and BCC name more routing keys on the
    # publish's exchange; BCC is taken out of what is delivered.
    conn = connect()
    ch = conn.channel()
    to, cc, bcc = (fresh_queue(ch, name) for name in ("to", "cc", "bcc"))
    ch.basic_publish(
        exchange="",
        routing_key=to,
        properties=pika.BasicProperties(headers={"CC": [cc, to], "BCC": [bcc]}),
        body=b"memo",
    )
    for queue in (to, cc, bcc):
        method, props, body = get_soon(conn, ch, queue, auto_ack=True)
        assert (method.routing_key, body) == (to, b"memo")
        assert props.headers == {"CC": [cc, to]}
        assert ch.basic_get(queue=queue, auto_ack=True)[0] is None, "one copy each"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish(
            exchange="", routing_key=to, properties=pika.BasicProperties(headers={"CC": cc}), body=b"x"
        )
        ch.queue_declare(queue=to, passive=True)
    assert err.value.reply_code == 406
    ch = conn.channel()
    for queue in (to, cc, bcc):
        ch.queue_delete(queue)
    conn.close()


def test_exchange_to_exchange_bindings_route_on_once_per_exchange():
    # What a source exchange routes to a bound exchange goes on through it, with the same
    # routing key; a cycle ends, and a queue reached by two ways gets one copy.
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    front, events = f"front-{suffix}", f"events-{suffix}"
    ch.exchange_declare(exchange=front, exchange_type="direct")
    ch.exchange_declare(exchange=events, exchange_type="topic")
    direct_q, events_q = fresh_queue(ch, "direct"), fresh_queue(ch, "events")
    ch.queue_bind(queue=direct_q, exchange=front, routing_key="order.paid")
    ch.exchange_bind(destination=events, source=front, routing_key="order.paid")
    ch.exchange_bind(destination=events, source=front, routing_key="order.shipped")
    ch.exchange_bind(destination=front, source=events, routing_key="#")
    ch.queue_bind(queue=events_q, exchange=events, routing_key="order.*")
    ch.queue_bind(queue=direct_q, exchange=events, routing_key="#")
    ch.confirm_delivery()
    for key in ("order.paid", "order.shipped", "order.lost"):
        ch.basic_publish(exchange=front, routing_key=key, body=key.encode())
    assert drain(ch, direct_q) == ["order.paid", "order.shipped"]
    assert drain(ch, events_q) == ["order.paid", "order.shipped"]
    ch.exchange_unbind(destination=events, source=front, routing_key="order.paid")
    ch.exchange_unbind(destination=events, source=front, routing_key="never-bound")
    ch.basic_publish(exchange=front, routing_key="order.paid", body=b"again")
    assert drain(ch, direct_q) == ["again"]
    assert drain(ch, events_q) == []
    # The default exchange takes no bindings; a missing exchange is a 404.
    for source, destination, code in ((front, "", 403), ("", front, 403),
                                      (f"missing-{suffix}", front, 404),
                                      (front, f"missing-{suffix}", 404)):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_bind(destination=destination, source=source, routing_key="k")
        assert err.value.reply_code == code
        ch = conn.channel()
    for exchange in (front, events):
        ch.exchange_delete(exchange)
    for queue in (direct_q, events_q):
        ch.queue_delete(queue)
    conn.close()


def test_an_alternate_exchange_takes_what_its_exchange_routes_nowhere():
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    orders, unrouted = f"orders-{suffix}", f"unrouted-{suffix}"
    ch.exchange_declare(exchange=unrouted, exchange_type="fanout")
    ch.exchange_declare(exchange=orders, exchange_type="direct",
                        arguments={"alternate-exchange": unrouted})
    billing, lost = fresh_queue(ch, "billing"), fresh_queue(ch, "lost")
    ch.queue_bind(queue=billing, exchange=orders, routing_key="paid")
    ch.queue_bind(queue=lost, exchange=unrouted)
    ch.confirm_delivery()
    ch.basic_publish(exchange=orders, routing_key="paid", body=b"paid", mandatory=True)
    # Routed by the alternate: not returned, though the exchange itself routed it nowhere.
    ch.basic_publish(exchange=orders, routing_key="refunded", body=b"refunded", mandatory=True)
    assert drain(ch, billing) == ["paid"]
    method, _, body = get_soon(conn, ch, lost, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"refunded", orders, "refunded")
    # An alternate that is not there is skipped: unroutable.
    ch.exchange_delete(unrouted)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(exchange=orders, routing_key="refunded", body=b"x", mandatory=True)
    # A redeclare must name the same alternate; its type must be a string.
    for arguments in ({}, {"alternate-exchange": "other"}):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare(exchange=orders, exchange_type="direct", arguments=arguments)
        assert err.value.reply_code == 406
        ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare(exchange=f"typed-{suffix}", exchange_type="direct",
                            arguments={"alternate-exchange": 5})
    assert err.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(orders)
    for queue in (billing, lost):
        ch.queue_delete(queue)
    conn.close()


def test_an_internal_exchange_takes_only_what_other_exchanges_route_to_it():
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    public, hidden = f"public-{suffix}", f"hidden-{suffix}"
    ch.exchange_declare(exchange=public, exchange_type="fanout")
    ch.exchange_declare(exchange=hidden, exchange_type="fanout", internal=True)
    ch.exchange_bind(destination=hidden, source=public)
    queue = fresh_queue(ch, "behind")
    ch.queue_bind(queue=queue, exchange=hidden)
    ch.confirm_delivery()
    ch.basic_publish(exchange=public, routing_key="", body=b"through")
    assert drain(ch, queue) == ["through"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish(exchange=hidden, routing_key="", body=b"direct")
    assert err.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare(exchange=hidden, exchange_type="fanout")
    assert err.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(public)
    ch.exchange_delete(hidden)
    ch.queue_delete(queue)
    conn.close()


def test_an_auto_delete_exchange_goes_when_its_last_destination_exchange_does():
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"source-{suffix}", f"sink-{suffix}"
    ch.exchange_declare(exchange=source, exchange_type="fanout", auto_delete=True)
    ch.exchange_declare(exchange=sink, exchange_type="fanout")
    ch.exchange_bind(destination=sink, source=source)
    # In use means bound as a source; the sink is only a destination.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_delete(source, if_unused=True)
    assert err.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(sink, if_unused=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare(exchange=source, exchange_type="fanout", passive=True)
    assert err.value.reply_code == 404
    conn.close()


def test_reject_dead_letters_through_a_named_exchange():
    # RabbitMQ's dead-letter exchange: a dead letter is published to it, with the
    # dead-letter routing key where the queue has one and with its own keys where not.
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    dlx, fanout = f"dlx-{suffix}", f"dlx-all-{suffix}"
    ch.exchange_declare(exchange=dlx, exchange_type="direct")
    ch.exchange_declare(exchange=fanout, exchange_type="fanout")
    failed, everything = fresh_queue(ch, "failed"), fresh_queue(ch, "everything")
    ch.queue_bind(queue=failed, exchange=dlx, routing_key="failed")
    ch.queue_bind(queue=everything, exchange=fanout)
    keyed, keyless = f"keyed-{suffix}", f"keyless-{suffix}"
    ch.queue_declare(queue=keyed, arguments={"x-dead-letter-exchange": dlx,
                                             "x-dead-letter-routing-key": "failed"})
    ch.queue_declare(queue=keyless, arguments={"x-dead-letter-exchange": fanout})
    for queue in (keyed, keyless):
        ch.basic_publish(exchange="", routing_key=queue, body=queue.encode(),
                         properties=pika.BasicProperties(content_type="text/plain"))
    method, _, _ = get_soon(conn, ch, keyed)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _, _ = get_soon(conn, ch, keyless)
    ch.basic_nack(method.delivery_tag, requeue=False)

    method, props, body = get_soon(conn, ch, failed, auto_ack=True)
    assert (body, props.content_type) == (keyed.encode(), "text/plain")
    assert (method.exchange, method.routing_key) == (dlx, "failed")
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (keyed, "rejected", 1)
    assert (death["exchange"], death["routing-keys"]) == ("", [keyed])
    assert props.headers["x-first-death-queue"] == keyed
    assert props.headers["x-first-death-exchange"] == ""

    method, props, body = get_soon(conn, ch, everything, auto_ack=True)
    assert body == keyless.encode()
    assert (method.exchange, method.routing_key) == (fanout, keyless), "its own key"
    assert props.headers["x-death"][0]["queue"] == keyless
    # A redeclare names the same dead-letter exchange and key, or is a 406.
    for arguments in ({"x-dead-letter-exchange": fanout},
                      {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "other"}):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue=keyed, arguments=arguments)
        assert err.value.reply_code == 406
        ch = conn.channel()
    ch.queue_declare(queue=keyed, arguments={"x-dead-letter-exchange": dlx,
                                             "x-dead-letter-routing-key": "failed"})
    for queue in (keyed, keyless, failed, everything):
        ch.queue_delete(queue)
    for exchange in (dlx, fanout):
        ch.exchange_delete(exchange)
    conn.close()


def test_a_message_dead_again_counts_its_deaths_per_queue_and_reason():
    conn = connect()
    ch = conn.channel()
    suffix = uuid.uuid4().hex[:8]
    dlx = f"retry-{suffix}"
    ch.exchange_declare(exchange=dlx, exchange_type="fanout")
    work, retry = f"work-{suffix}", f"retry-{suffix}"
    # Work dead-letters to retry, retry through the default exchange back to work: a
    # retry loop, each death counted in the record of its queue and reason.
    ch.queue_declare(queue=work, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_declare(queue=retry, arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": work})
    ch.queue_bind(queue=retry, exchange=dlx)
    ch.basic_publish(exchange="", routing_key=work, body=b"again")
    for _ in range(2):
        method, _, _ = get_soon(conn, ch, work)
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, _, _ = get_soon(conn, ch, retry)
        ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_soon(conn, ch, work, auto_ack=True)
    assert body == b"again"
    deaths = {(d["queue"], d["reason"]): d["count"] for d in props.headers["x-death"]}
    assert deaths == {(work, "rejected"): 2, (retry, "rejected"): 2}
    assert props.headers["x-death"][0]["queue"] == retry, "the latest first"
    assert props.headers["x-first-death-queue"] == work
    assert ch.queue_declare(queue=retry, passive=True).method.message_count == 0
    for queue in (work, retry):
        ch.queue_delete(queue)
    ch.exchange_delete(dlx)
    conn.close()


def test_a_queue_name_may_hold_any_utf8_as_in_rabbitmq():
    # Celery names a worker's queues `name@host.celery.pidbox`; others use `/` or spaces.
    conn = connect()
    ch = conn.channel()
    name = f"worker@host/eu café {uuid.uuid4().hex[:8]}"
    assert ch.queue_declare(queue=name).method.queue == name
    ch.queue_bind(queue=name, exchange="amq.direct", routing_key=name)
    ch.confirm_delivery()
    ch.basic_publish(exchange="", routing_key=name, body=b"direct")
    ch.basic_publish(exchange="amq.direct", routing_key=name, body=b"bound")
    method, _, body = get_soon(conn, ch, name, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"direct", "", name)
    method, _, body = get_soon(conn, ch, name)
    assert (body, method.exchange, method.routing_key) == (b"bound", "amq.direct", name)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = get_soon(conn, ch, name, auto_ack=True)
    assert (body, method.redelivered) == (b"bound", True)
    assert ch.queue_delete(queue=name).method.message_count == 0
    conn.close()


def test_a_transaction_holds_publishes_and_acks_until_its_commit():
    conn = connect()
    ch = conn.channel()
    queue = fresh_queue(ch, "tx")
    ch.basic_publish(exchange="", routing_key=queue, body=b"first")
    method, _, body = get_soon(conn, ch, queue)
    assert body == b"first"
    ch.tx_select()
    ch.basic_publish(exchange="", routing_key=queue, body=b"second")
    ch.basic_publish(exchange="", routing_key=queue, body=b"third")
    ch.basic_ack(method.delivery_tag)
    # Nothing of the transaction shows before its commit.
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    ch.tx_rollback()
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 0
    # The rolled-back ack left "first" unacked on the channel: acked again, committed.
    ch.basic_publish(exchange="", routing_key=queue, body=b"second")
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    assert ch.queue_declare(queue=queue, passive=True).method.message_count == 1
    method, _, body = ch.basic_get(queue=queue, auto_ack=True)
    assert body == b"second"
    conn.close()


def test_tx_and_confirms_do_not_mix_and_commit_needs_tx_select():
    conn = connect()
    for steps, text in [
        (lambda ch: ch.tx_commit(), "not transactional"),
        (lambda ch: (ch.confirm_delivery(), ch.tx_select()), "from confirm to tx"),
        (lambda ch: (ch.tx_select(), ch.confirm_delivery()), "from tx to confirm"),
    ]:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            steps(ch)
        assert err.value.reply_code == 406
        assert text in err.value.reply_text
    conn.close()


def test_queue_mode_and_version_are_taken_and_compared_on_a_redeclare():
    """RabbitMQ's hints on how a classic queue keeps its messages: taken (they change
    nothing in leasemqd), checked, and a redeclare must repeat them."""
    conn = connect()
    ch = conn.channel()
    queue = f"lazy-{uuid.uuid4().hex[:8]}"
    hints = {"x-queue-mode": "lazy", "x-queue-version": 2}
    ch.queue_declare(queue=queue, arguments=hints)
    ch.queue_declare(queue=queue, arguments=hints)
    ch.basic_publish(exchange="", routing_key=queue, body=b"kept")
    for other, text in [
        ({"x-queue-mode": "default", "x-queue-version": 2},
         "inequivalent arg 'x-queue-mode' for queue"),
        ({"x-queue-version": 2}, "inequivalent arg 'x-queue-mode' for queue"),
        ({"x-queue-mode": "lazy", "x-queue-version": 1},
         "inequivalent arg 'x-queue-version' for queue"),
    ]:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue=queue, arguments=other)
        assert err.value.reply_code == 406
        assert text in err.value.reply_text
        ch = conn.channel()
    assert drain(ch, queue) == ["kept"]
    for bad, text in [
        ({"x-queue-mode": "eager"}, "unsupported queue mode 'eager'"),
        ({"x-queue-version": 3}, "unsupported queue version '3'"),
        ({"x-queue-version": -1}, "': {value_negative,-1}"),
    ]:
        refused = declare_refused(f"bad-{uuid.uuid4().hex[:8]}", bad)
        assert refused.reply_code == 406
        assert text in refused.reply_text
    ch.queue_delete(queue)
    conn.close()


def test_a_quorum_queue_refuses_a_classic_queues_priorities_and_storage_hints():
    """x-max-priority, x-queue-mode and x-queue-version are a classic queue's: a quorum
    queue refuses each with RabbitMQ's 406."""
    for key, value in [("x-max-priority", 5), ("x-queue-mode", "lazy"), ("x-queue-version", 2)]:
        queue = f"quorum-{uuid.uuid4().hex[:8]}"
        conn = connect()
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue=queue, durable=True,
                             arguments={"x-queue-type": "quorum", key: value})
        conn.close()
        assert (err.value.reply_code, err.value.reply_text) == (
            406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' "
                 "in vhost '/' of queue type rabbit_quorum_queue")


def test_locators_are_taken_for_their_queue_type_and_compared_on_a_redeclare():
    """x-queue-master-locator (a classic queue's) and x-queue-leader-locator (a quorum
    queue's) say which node of a cluster a queue lives on: taken (leasemqd is one node),
    checked, and a redeclare must repeat them."""
    conn = connect()
    ch = conn.channel()
    for kind, key, value, other in [
        ("classic", "x-queue-master-locator", "min-masters", "random"),
        ("quorum", "x-queue-leader-locator", "balanced", "client-local"),
    ]:
        queue = f"located-{uuid.uuid4().hex[:8]}"
        args = {"x-queue-type": kind, key: value}
        ch.queue_declare(queue=queue, durable=True, arguments=args)
        ch.queue_declare(queue=queue, durable=True, arguments=args)
        for redeclared, said in [
            ({key: other}, f"received '{other}' but current is '{value}'"),
            ({}, f"received none but current is the value '{value}' of type 'longstr'"),
        ]:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                ch.queue_declare(queue=queue, durable=True,
                                 arguments={"x-queue-type": kind, **redeclared})
            assert (err.value.reply_code, err.value.reply_text) == (
                406, f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{queue}' "
                     f"in vhost '/': {said}")
            ch = conn.channel()
        ch.queue_delete(queue)
    conn.close()
    # Each is refused on the other type of queue, and a value of the wrong type or that
    # RabbitMQ does not know on its own (RabbitMQ 3.10 fails a master locator it does not
    # know with 541; only the leader locator's refusal is compared).
    for kind, key, value, why in [
        ("quorum", "x-queue-master-locator", "random", "of queue type rabbit_quorum_queue"),
        ("classic", "x-queue-leader-locator", "balanced", "of queue type rabbit_classic_queue"),
        ("quorum", "x-queue-leader-locator", "min-masters", ": invalid_queue_locator_arg"),
        ("quorum", "x-queue-leader-locator", 5, ": {unacceptable_type,signedint}"),
        ("classic", "x-dead-letter-strategy", "at-least-once", "of queue type rabbit_classic_queue"),
        ("quorum", "x-dead-letter-strategy", "exactly-once", ": invalid_dlx_strategy"),
        ("quorum", "x-dead-letter-strategy", 1, ": {unacceptable_type,signedint}"),
    ]:
        queue = f"located-{uuid.uuid4().hex[:8]}"
        conn = connect()
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue=queue, durable=True,
                             arguments={"x-queue-type": kind, key: value})
        conn.close()
        assert (err.value.reply_code, err.value.reply_text) == (
            406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' "
                 f"in vhost '/'{' ' if why.startswith('of') else ''}{why}")


def test_a_quorum_queue_takes_a_dead_letter_strategy_as_celery_declares_it():
    # Celery 5.5's quorum-queue mode: a quorum queue with a dead-letter exchange, its
    # overflow rejecting publishes, and a dead-letter strategy of either kind.
    conn = connect()
    ch = conn.channel()
    for strategy in ["at-least-once", "at-most-once"]:
        queue = f"celery-quorum-{uuid.uuid4().hex[:8]}"
        arguments = {"x-queue-type": "quorum", "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": f"{queue}.dead",
                     "x-overflow": "reject-publish", "x-dead-letter-strategy": strategy}
        ch.queue_declare(queue=queue, durable=True, arguments=arguments)
        ch.queue_declare(queue=queue, durable=True, arguments=arguments)
        ch.queue_delete(queue)
    conn.close()


def pump(conns, until, seconds=5):
    """Runs the connections' I/O until `until()` holds, for up to `seconds`."""
    for _ in range(seconds * 20):
        for conn in conns:
            conn.process_data_events(time_limit=0.025)
        if until():
            return
    raise AssertionError(f"not within {seconds} s")


def test_a_single_active_consumer_has_the_queue_until_it_goes():
    """x-single-active-consumer: the first consumer gets every message; the next in line
    gets them once it goes, those it left unacked redelivered."""
    first, second, publisher = connect(), connect(), connect()
    queue = f"sac-{uuid.uuid4().hex[:8]}"
    ch = publisher.channel()
    ch.queue_declare(queue=queue, arguments={"x-single-active-consumer": True})
    got = {1: [], 2: []}
    for n, conn in ((1, first), (2, second)):
        conn.channel().basic_consume(
            queue, lambda _ch, m, _p, body, n=n: got[n].append((body, m.redelivered)))
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish(exchange="", routing_key=queue, body=str(i).encode())
    pump([first, second], lambda: len(got[1]) == 3)
    second.process_data_events(time_limit=0.2)
    assert got[2] == [], "waits its turn"
    assert ch.queue_declare(queue=queue, passive=True).method.consumer_count == 2
    first.close()
    pump([second], lambda: len(got[2]) == 3)
    assert got[2] == [(b"0", True), (b"1", True), (b"2", True)]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue=queue)
    assert err.value.reply_code == 406
    assert "inequivalent arg 'x-single-active-consumer'" in err.value.reply_text
    second.close()
    publisher.channel().queue_delete(queue)
    publisher.close()


# Published to a queue declared with x-max-priority 5: (body, priority), and the order a
# consumer gets them in: highest level first (9 and 255 count as 5, none as 0), in publish
# order within a level.
PRIORITIES = [("none 1", None), ("3 a", 3), ("9", 9), ("5", 5), ("3 b", 3), ("0", 0),
              ("255", 255), ("none 2", None)]
BY_PRIORITY = ["9", "5", "255", "3 a", "3 b", "none 1", "0", "none 2"]


def priority_queue(ch):
    """A fresh queue with x-max-priority 5, PRIORITIES published to it with confirms."""
    queue = f"prio-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue, arguments={"x-max-priority": 5})
    ch.confirm_delivery()
    for body, priority in PRIORITIES:
        ch.basic_publish(exchange="", routing_key=queue, body=body.encode(),
                         properties=pika.BasicProperties(priority=priority))
    return queue


def test_a_priority_queue_gives_basic_get_its_highest_level_first():
    """x-max-priority: basic_get takes the highest priority first, FIFO within a level; a
    requeued message goes back to its level; the priority is delivered as published."""
    conn = connect()
    ch = conn.channel()
    queue = priority_queue(ch)
    method, properties, body = ch.basic_get(queue=queue)
    assert (body, properties.priority) == (b"9", 9)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(queue=queue, auto_ack=True)
    assert (body, method.redelivered) == (b"9", True)
    assert drain(ch, queue) == BY_PRIORITY[1:]
    ch.queue_delete(queue)
    conn.close()


def test_a_priority_queue_orders_what_waits_behind_a_consumers_prefetch():
    """x-max-priority with a consumer of prefetch 2: it gets the highest levels first, and
    a message published while it holds two goes ahead of the lower ones still waiting."""
    conn = connect()
    ch = conn.channel()
    queue = priority_queue(ch)
    got = []
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=2)
    consumer.basic_consume(queue, lambda _ch, m, _p, body: got.append((m.delivery_tag, body)))
    pump([conn], lambda: len(got) == 2)
    conn.process_data_events(time_limit=0.1)
    assert [body for _, body in got] == [b"9", b"5"], "no more than the prefetch"
    ch.basic_publish(exchange="", routing_key=queue, body=b"4",
                     properties=pika.BasicProperties(priority=4))
    acked = 0
    while acked < len(PRIORITIES) + 1:
        pump([conn], lambda: len(got) > acked)
        consumer.basic_ack(got[-1][0], multiple=True)
        acked = len(got)
    assert [body.decode() for _, body in got] == BY_PRIORITY[:3] + ["4"] + BY_PRIORITY[3:]
    ch.queue_delete(queue)
    conn.close()


def test_x_max_priority_is_checked_and_a_redeclare_must_repeat_it():
    """x-max-priority takes 0 to 255, RabbitMQ's 406 otherwise; a redeclare must say the
    same (any integer type)."""
    for value, why in [(256, "{max_value_exceeded,256}"), (-1, "{value_negative,-1}"),
                       ("5", '"expected integer, got longstr"')]:
        queue = f"prio-bad-{uuid.uuid4().hex[:8]}"
        refused = declare_refused(queue, {"x-max-priority": value})
        assert refused.reply_code == 406
        assert refused.reply_text == (
            f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{queue}' "
            f"in vhost '/': {why}")
    conn = connect()
    ch = conn.channel()
    queue = f"prio-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue, arguments={"x-max-priority": 0})
    ch.queue_delete(queue)
    ch.queue_declare(queue=queue, arguments={"x-max-priority": 10})
    ch.queue_declare(queue=queue, arguments={"x-max-priority": 10})
    head = f"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue '{queue}' in vhost '/'"
    for other, text in [
        ({"x-max-priority": 4}, f"{head}: received '4' but current is '10'"),
        ({}, f"{head}: received none but current is the value '10' of type 'signedint'"),
    ]:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue=queue, arguments=other)
        assert (err.value.reply_code, err.value.reply_text) == (406, text)
        ch = conn.channel()
    ch.queue_delete(queue)
    conn.close()


def test_x_priority_consumers_come_first_while_they_have_room():
    """Consumer priorities (x-priority): a message goes to the consumer of the highest
    priority whose prefetch has room, to a lower one only past that; an ack makes room."""
    conn = connect()
    ch = conn.channel()
    queue = f"cprio-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=1)
    got = []

    def on(name):
        return lambda _ch, m, _p, body: got.append((name, m.delivery_tag, body.decode()))

    consumer.basic_consume(queue, on("low"), arguments={"x-priority": -1})
    consumer.basic_consume(queue, on("plain"))
    consumer.basic_consume(queue, on("high"), arguments={"x-priority": 10})
    for body in "abcd":
        ch.basic_publish(exchange="", routing_key=queue, body=body.encode())
    pump([conn], lambda: len(got) == 3)
    conn.process_data_events(time_limit=0.1)
    # Who got what; the order the deliveries of several consumers arrive in is not fixed.
    assert {name: body for name, _, body in got} == {"high": "a", "plain": "b", "low": "c"}
    consumer.basic_ack(next(tag for name, tag, _ in got if name == "high"))
    pump([conn], lambda: len(got) == 4)
    assert (got[3][0], got[3][2]) == ("high", "d")
    ch.queue_delete(queue)
    conn.close()


def test_consumer_arguments_are_checked_as_rabbitmq_checks_them():
    """x-priority takes an integer, x-cancel-on-ha-failover a boolean: RabbitMQ's 406
    otherwise, naming the queue."""
    conn = connect()
    ch = conn.channel()
    queue = f"cargs-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue)
    for key, value, why in [("x-priority", "5", '"expected integer, got longstr"'),
                            ("x-priority", True, '"expected integer, got bool"'),
                            ("x-cancel-on-ha-failover", 1, "{unacceptable_type,signedint}")]:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_consume(queue, lambda *_: None, arguments={key: value})
        assert (err.value.reply_code, err.value.reply_text) == (
            406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/': {why}")
        ch = conn.channel()
    ch.basic_consume(queue, lambda *_: None,
                     arguments={"x-priority": 2**40, "x-cancel-on-ha-failover": True})
    ch.queue_delete(queue)
    conn.close()


def test_each_consumer_priority_keeps_its_own_round_robin():
    """Deliveries to a higher-priority consumer in between do not send the lower ones'
    turn back to their first."""
    conn = connect()
    ch = conn.channel()
    queue = f"cturn-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue)
    high, low = conn.channel(), conn.channel()
    high.basic_qos(prefetch_count=1)
    got = []

    def on(name):
        return lambda _ch, m, _p, body: got.append((name, m.delivery_tag, body.decode()))

    high.basic_consume(queue, on("high"), arguments={"x-priority": 5})
    low.basic_consume(queue, on("a"))
    low.basic_consume(queue, on("b"))
    for round_ in range(3):
        for body in (f"{round_}-1", f"{round_}-2"):
            # Published on the channel that acked: RabbitMQ takes the ack first.
            high.basic_publish(exchange="", routing_key=queue, body=body.encode())
        pump([conn], lambda: len(got) == 2 * (round_ + 1))
        high.basic_ack(next(tag for name, tag, body in got if body == f"{round_}-1"))
    assert {(name, body) for name, _, body in got} == {
        ("high", "0-1"), ("a", "0-2"), ("high", "1-1"), ("b", "1-2"), ("high", "2-1"), ("a", "2-2")}
    ch.queue_delete(queue)
    conn.close()


def test_consumer_priorities_beyond_32_bits_are_told_apart():
    """x-priority values of 64 bits are compared whole: 2**41 above 2**40, though the one
    that came first would be served first were they equal."""
    conn = connect()
    ch = conn.channel()
    queue = f"cwide-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue=queue)
    lower, higher = conn.channel(), conn.channel()
    got = []

    def on(name):
        return lambda _ch, _m, _p, body: got.append((name, body.decode()))

    for channel, name, priority in [(lower, "lower", 2**40), (higher, "higher", 2**41)]:
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(queue, on(name), arguments={"x-priority": priority})
    for n, body in enumerate(["a", "b"], start=1):
        ch.basic_publish(exchange="", routing_key=queue, body=body.encode())
        pump([conn], lambda: len(got) == n)
    assert got == [("higher", "a"), ("lower", "b")]
    ch.queue_delete(queue)
    conn.close()
