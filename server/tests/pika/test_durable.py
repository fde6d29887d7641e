"""Durable queues through leasemqd with the unmodified pika client (contract §7, §8).

Each test starts its own leasemqd (LEASEMQD_BIN) on a data dir, publishes with publisher
confirms, kills the server with SIGKILL or stops it with SIGTERM, starts it again on the same
data dir and checks what a consumer gets.
"""

import json
import os
import re
import signal
import subprocess
import time

import pika
import pytest

BIN = os.environ["LEASEMQD_BIN"]


class Server:
    def __init__(self, data_dir):
        self.proc = subprocess.Popen(
            [BIN, "--listen", "127.0.0.1:0", "--shards", "2", "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # Log lines may come first (a restart after a kill says what it cut from a torn
        # write): the ready line is the first that says "ready".
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if " ready: " in line or len(seen) > 50:
                break
        found = re.search(r" on 127\.0\.0\.1:(\d+), .*durable queues in ", seen[-1] if seen else "")
        if not found:
            self.proc.kill()
            raise AssertionError(f"no ready line naming the data dir: {seen!r}")
        self.port = int(found.group(1))

    def channel(self):
        params = pika.ConnectionParameters("127.0.0.1", self.port, connection_attempts=1)
        self.connection = pika.BlockingConnection(params)
        return self.connection.channel()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=10) == 0


def refused(declare, **arguments):
    """The channel.close with which the server answers `declare(**arguments)` (the channel
    is closed after it)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        declare(**arguments)
    return closed.value


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


def test_confirmed_publishes_to_a_durable_queue_survive_a_kill(data_dir):
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue="jobs", durable=True)
        ch.queue_declare(queue="scratch", durable=False)
        # Exclusive: it goes with its connection, which the kill ends too.
        ch.queue_declare(queue="mine", durable=True, exclusive=True)
        ch.basic_publish(exchange="", routing_key="mine", body=b"for this connection")
        for i in range(100):
            # Returns once the broker confirmed: the message is on disk.
            ch.basic_publish(exchange="", routing_key="jobs", body=f"job {i}".encode())
        ch.basic_publish(exchange="", routing_key="scratch", body=b"in memory")
        ch.basic_qos(prefetch_count=1)
        method, _, body = next(ch.consume("jobs", inactivity_timeout=10))
        assert (body, method.redelivered) == (b"job 0", False)
        # Not acked: the crash comes with the delivery in hand.
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        assert refused(ch.queue_declare, queue="scratch", passive=True).reply_code == 404
        ch = server.connection.channel()
        assert refused(ch.queue_declare, queue="mine", passive=True).reply_code == 404
        ch = server.connection.channel()
        # Its program, started again, declares it as before.
        ch.queue_declare(queue="mine", durable=True, exclusive=True)
        ch = server.connection.channel()
        ok = ch.queue_declare(queue="jobs", durable=True)
        assert ok.method.message_count == 100
        got = []
        for method, _, body in ch.consume("jobs", inactivity_timeout=5):
            if method is None:
                break
            got.append((body.decode(), method.redelivered))
            ch.basic_ack(method.delivery_tag)
        assert got[0] == ("job 0", True), "the delivery in hand at the crash comes back first"
        assert [b for b, _ in got] == [f"job {i}" for i in range(100)]
        assert all(not r for _, r in got[1:])
    finally:
        server.stop()

    # Acked before a clean stop: gone for good.
    server = Server(data_dir)
    try:
        ch = server.channel()
        assert ch.queue_declare(queue="jobs", passive=True).method.message_count == 0
    finally:
        server.stop()


def count_within(ch, queue, expected, seconds=10):
    """The ready count of `queue` once it is `expected`, asked again for up to `seconds`:
    dead letters go on to their queue from a task of the server's, after the reject."""
    for _ in range(seconds * 100):
        count = ch.queue_declare(queue=queue, passive=True).method.message_count
        if count == expected:
            return count
        ch.connection.sleep(0.01)
    return count


def test_dead_letters_of_a_durable_queue_survive_a_kill_and_go_on_after_it(data_dir):
    """A dead letter is put to its queue before it leaves the durable queue's holding
    queue: across a kill it is in one or the other (or, put but not yet taken, in both:
    at least once), and it goes on after the restart, before any client declares the queue
    that dead-letters again (the server kept where its dead letters go). Many
    are rejected at once just before the kill, so that some are still held then. A
    transient queue may take a durable one's dead letters, as in RabbitMQ."""
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parked"}
    n = 2000
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.queue_declare(queue="parked", durable=True)
        ch.queue_declare(queue="transient-dead", durable=False)
        ch.queue_declare(queue="work", durable=True, arguments=args)
        ch.queue_declare(queue="work-2", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "transient-dead"})
        ch.confirm_delivery()
        ch.basic_publish(exchange="", routing_key="work-2", body=b"short-lived")
        method, _, _ = ch.basic_get(queue="work-2")
        ch.basic_reject(method.delivery_tag, requeue=False)
        assert count_within(ch, "transient-dead", 1) == 1
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(n):
            ch.basic_publish(exchange="", routing_key="work", body=f"poison {i}".encode(),
                             properties=props)
        ch.basic_qos(prefetch_count=n)
        last, received = None, 0
        for method, _, _ in ch.consume("work", inactivity_timeout=10):
            last, received = method, received + 1
            if received == n:
                break
        # One nack for all. A confirmed publish after it on the channel is on disk only
        # once what came before it is: the nack is then durable, and the kill comes while
        # the dead letters are on their way.
        ch.basic_nack(last.delivery_tag, multiple=True, requeue=False)
        ch.basic_publish(exchange="", routing_key="work-2", body=b"barrier", properties=props)
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        got = set()
        for _ in range(1000):
            while True:
                method, _, body = ch.basic_get(queue="parked", auto_ack=True)
                if method is None:
                    break
                got.add(body)
            if len(got) == n:
                break
            ch.connection.sleep(0.01)
        left = ch.queue_declare(queue="work", passive=True).method.message_count
        assert (len(got), left) == (n, 0)
        assert got == {f"poison {i}".encode() for i in range(n)}
    finally:
        server.stop()


def test_a_durable_queue_comes_back_as_it_was_declared(data_dir):
    """What RabbitMQ keeps of a durable queue beyond its messages comes back after a kill
    with no client declaring it again: its arguments (a redeclare with others is refused),
    its message TTL, its dead-letter route and its own expiry."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.queue_declare(queue="timed", durable=True, arguments={"x-message-ttl": 300})
        ch.queue_declare(queue="parked", durable=True)
        ch.queue_declare(queue="failing", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parked"})
        ch.queue_declare(queue="short-lived", durable=True, arguments={"x-expires": 500})
        ch.queue_declare(queue="deleted", durable=True, arguments={"x-message-ttl": 5})
        ch.queue_delete(queue="deleted")
        # Kept before each declare and delete is answered.
        kept = {q["name"] for q in json.loads((data_dir / "leasemqd-queues.json").read_text())[
            "queues"]}
        assert kept == {"timed", "parked", "failing", "short-lived"}
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        closed = refused(ch.queue_declare, queue="timed", durable=True,
                         arguments={"x-message-ttl": 1000})
        assert closed.reply_code == 406
        assert "x-message-ttl" in closed.reply_text
        ch = server.connection.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange="", routing_key="timed", body=b"stale")
        ch.basic_publish(exchange="", routing_key="failing", body=b"doomed")
        method, _, body = ch.basic_get(queue="failing")
        assert body == b"doomed"
        ch.basic_reject(method.delivery_tag, requeue=False)
        assert count_within(ch, "parked", 1) == 1
        # Past the TTL: dropped when reached, never delivered.
        ch.connection.sleep(0.5)
        assert ch.basic_get(queue="timed", auto_ack=True)[0] is None
        # Unused since the start, past its 500 ms: deleted.
        ch.connection.sleep(1.5)
        assert refused(ch.queue_declare, queue="short-lived", passive=True).reply_code == 404
        # A queue deleted before the kill is not brought back by its old declaration.
        ch = server.connection.channel()
        ch.queue_declare(queue="deleted", durable=True)
    finally:
        server.stop()


def test_a_durable_delay_queue_sends_on_what_expired_while_the_server_was_down(data_dir):
    """A delay queue (x-message-ttl and a dead-letter exchange, no consumer) keeps its
    messages across a kill; once the server is back, those whose time ran out meanwhile go
    on to their queue with no client declaring or reaching the delay queue."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue="due", durable=True)
        ch.queue_declare(queue="later", durable=True, arguments={
            "x-message-ttl": 300, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "due"})
        for i in range(5):
            ch.basic_publish(exchange="", routing_key="later", body=f"job {i}".encode(),
                             properties=pika.BasicProperties(delivery_mode=2))
    finally:
        server.kill()
    # Down for longer than the TTL.
    time.sleep(0.5)

    server = Server(data_dir)
    try:
        ch = server.channel()
        assert count_within(ch, "due", 5) == 5
        assert ch.queue_declare(queue="later", passive=True).method.message_count == 0
        bodies = []
        for _ in range(5):
            _, props, body = ch.basic_get(queue="due", auto_ack=True)
            assert props.headers["x-death"][0]["reason"] == "expired"
            bodies.append(body)
        assert bodies == [f"job {i}".encode() for i in range(5)]
    finally:
        server.stop()


def test_a_durable_priority_queue_comes_back_with_its_levels(data_dir):
    """A durable queue declared with x-max-priority keeps the argument and each message's
    priority across a kill: a redeclare without it is refused, and what was published
    before comes out highest priority first."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue="ranked", durable=True, arguments={"x-max-priority": 3})
        for body, priority in [("low", None), ("high", 3), ("mid", 2), ("over", 200)]:
            ch.basic_publish(exchange="", routing_key="ranked", body=body.encode(),
                             properties=pika.BasicProperties(priority=priority))
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        closed = refused(ch.queue_declare, queue="ranked", durable=True)
        assert closed.reply_code == 406
        assert "inequivalent arg 'x-max-priority'" in closed.reply_text
        ch = server.connection.channel()
        ch.queue_declare(queue="ranked", durable=True, arguments={"x-max-priority": 3})
        bodies = []
        for _ in range(4):
            _, props, body = ch.basic_get(queue="ranked", auto_ack=True)
            bodies.append((body.decode(), props.priority))
        assert bodies == [("high", 3), ("over", 200), ("mid", 2), ("low", None)]
    finally:
        server.stop()


def test_durable_exchanges_and_bindings_of_durable_queues_survive_a_kill(data_dir):
    """As in RabbitMQ: a durable exchange, and its bindings to durable queues, come back."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.exchange_declare(exchange="orders", exchange_type="direct", durable=True)
        ch.exchange_declare(exchange="scratch-x", exchange_type="direct", durable=False)
        ch.queue_declare(queue="billing", durable=True)
        ch.queue_declare(queue="scratch-q", durable=False)
        ch.queue_bind(queue="billing", exchange="orders", routing_key="paid")
        ch.queue_bind(queue="scratch-q", exchange="orders", routing_key="paid")
        ch.queue_bind(queue="billing", exchange="scratch-x", routing_key="paid")
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.exchange_declare(exchange="orders", exchange_type="direct", passive=True)
        closed = refused(ch.exchange_declare, exchange="scratch-x", exchange_type="direct",
                         passive=True)
        assert closed.reply_code == 404
        ch = server.connection.channel()
        ch.confirm_delivery()
        # The binding of the in-memory queue went with the queue: a queue of that name
        # declared now does not get what the exchange routes.
        ch.queue_declare(queue="scratch-q", durable=False)
        ch.basic_publish(exchange="orders", routing_key="paid", body=b"invoice")
        assert ch.queue_declare(queue="billing", passive=True).method.message_count == 1
        assert ch.queue_declare(queue="scratch-q", passive=True).method.message_count == 0
    finally:
        server.stop()


def test_bindings_between_durable_exchanges_and_alternates_survive_a_kill(data_dir):
    """As in RabbitMQ: a binding between durable exchanges comes back, as do an exchange's
    alternate and whether it is internal; one to an exchange that is not durable does not."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.exchange_declare(exchange="unrouted", exchange_type="fanout", durable=True)
        ch.exchange_declare(exchange="front", exchange_type="direct", durable=True,
                            arguments={"alternate-exchange": "unrouted"})
        ch.exchange_declare(exchange="hidden", exchange_type="fanout", durable=True,
                            internal=True)
        ch.exchange_declare(exchange="scratch-x", exchange_type="fanout", durable=False)
        for queue in ("jobs", "lost", "scratch-q"):
            ch.queue_declare(queue=queue, durable=True)
        ch.exchange_bind(destination="hidden", source="front", routing_key="job")
        ch.exchange_bind(destination="scratch-x", source="front", routing_key="job")
        ch.queue_bind(queue="jobs", exchange="hidden")
        ch.queue_bind(queue="scratch-q", exchange="scratch-x")
        ch.queue_bind(queue="lost", exchange="unrouted")
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange="front", routing_key="job", body=b"work")
        ch.basic_publish(exchange="front", routing_key="other", body=b"stray")
        counts = [ch.queue_declare(queue=q, passive=True).method.message_count
                  for q in ("jobs", "lost", "scratch-q")]
        assert counts == [1, 1, 0]
        closed = refused(ch.exchange_declare, exchange="hidden", exchange_type="fanout",
                         durable=True)
        assert closed.reply_code == 406, "still internal"
        ch = server.connection.channel()
        ch.exchange_declare(exchange="front", exchange_type="direct", durable=True,
                            arguments={"alternate-exchange": "unrouted"})
    finally:
        server.stop()


def test_a_committed_transaction_survives_a_kill(data_dir):
    """tx.commit-ok comes once the committed publishes are on disk."""
    server = Server(data_dir)
    try:
        ch = server.channel()
        ch.queue_declare(queue="orders", durable=True)
        ch.tx_select()
        for i in range(100):
            ch.basic_publish(exchange="", routing_key="orders", body=f"order {i}".encode())
        ch.tx_commit()
        ch.basic_publish(exchange="", routing_key="orders", body=b"never committed")
    finally:
        server.kill()

    server = Server(data_dir)
    try:
        ch = server.channel()
        got = []
        while True:
            method, _, body = ch.basic_get(queue="orders", auto_ack=True)
            if method is None:
                break
            got.append(body)
        assert got == [f"order {i}".encode() for i in range(100)]
    finally:
        server.stop()
