"""Operating leasemqd: Prometheus metrics and a clean shutdown (contract §8).

Each test starts its own leasemqd (LEASEMQD_BIN) and stops it.
"""

import os
import re
import signal
import subprocess
import urllib.request

import pika
import pytest

BIN = os.environ["LEASEMQD_BIN"]


def start(*extra):
    proc = subprocess.Popen(
        [BIN, "--listen", "127.0.0.1:0", "--shards", "2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = proc.stdout.readline()
    port = re.search(r" on 127\.0\.0\.1:(\d+), ", line)
    if not port:
        proc.kill()
        raise AssertionError(f"no ready line: {line!r}")
    metrics = re.search(r"metrics on (http://\S+)", line)
    return proc, int(port.group(1)), metrics.group(1) if metrics else None


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_metrics_show_queues_connections_and_bytes():
    proc, port, url = start("--metrics", "127.0.0.1:0")
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare(queue="metered")
        for i in range(3):
            ch.basic_publish(exchange="", routing_key="metered", body=b"x" * 100)
        ch.basic_get(queue="metered")  # one leased, not acked
        lines = scrape(url).splitlines()
        for expected in [
            "leasemq_connections 1",
            "leasemq_channels 1",
            'leasemq_queue_messages_ready{vhost="/",queue="metered"} 2',
            'leasemq_queue_messages_unacked{vhost="/",queue="metered"} 1',
            'leasemq_queue_messages_published_total{vhost="/",queue="metered"} 3',
        ]:
            assert expected in lines, f"{expected!r} not in the scrape"
        incoming = [l for l in lines if l.startswith("leasemq_connection_incoming_bytes_total ")]
        assert incoming and int(incoming[0].split()[1]) > 300
        conn.close()
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(url.replace("/metrics", "/other"))
        assert err.value.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_sigterm_closes_connections_with_320_and_exits_cleanly():
    proc, port, _ = start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare(queue="work")
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=5)
        assert closed.value.reply_code == 320
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def blocked_on_publish(port, durable=False):
    """Publishes one message to the queue `held` and listens for what the server says of
    the connection for up to 5 s: the `connection.blocked` and `unblocked` methods heard."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    heard = []
    conn.add_on_connection_blocked_callback(lambda _conn, frame: heard.append(frame.method))
    conn.add_on_connection_unblocked_callback(lambda _conn, frame: heard.append(frame.method))
    ch = conn.channel()
    ch.queue_declare(queue="held", durable=durable)
    ch.basic_publish(exchange="", routing_key="held", body=b"job")
    for _ in range(50):
        if heard:
            break
        conn.process_data_events(time_limit=0.1)
    return heard


def test_memory_alarm_blocks_publishers_and_tells_them():
    # A limit of 0, as RabbitMQ's watermark of 0: the alarm is raised from the start.
    proc, port, url = start("--memory-high-watermark", "0", "--metrics", "127.0.0.1:0")
    try:
        heard = blocked_on_publish(port)
        assert [type(m).__name__ for m in heard] == ["Blocked"]
        assert heard[0].reason == "low on memory"
        params = pika.ConnectionParameters("127.0.0.1", port)
        # Another connection that only looks and consumes goes on; the publish was not
        # taken.
        other = pika.BlockingConnection(params)
        och = other.channel()
        assert och.queue_declare(queue="held", passive=True).method.message_count == 0
        och.basic_consume(queue="held", on_message_callback=lambda *a: None)
        other.close()
        lines = scrape(url).splitlines()
        assert "leasemq_alarms_memory_used_watermark 1" in lines
        assert "leasemq_resident_memory_limit_bytes 0" in lines
        resident = [l for l in lines if l.startswith("leasemq_process_resident_memory_bytes ")]
        assert resident and int(resident[0].split()[1]) > 1_000_000
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_disk_alarm_blocks_publishers_and_tells_them(tmp_path):
    # More free space than any disk has: the disk alarm is raised from the start.
    proc, port, url = start("--data-dir", str(tmp_path), "--disk-free-limit", "1000000GB",
                            "--metrics", "127.0.0.1:0")
    try:
        heard = blocked_on_publish(port, durable=True)
        assert [type(m).__name__ for m in heard] == ["Blocked"]
        assert heard[0].reason == "low on disk"
        lines = scrape(url).splitlines()
        assert "leasemq_alarms_free_disk_space_watermark 1" in lines
        assert "leasemq_alarms_memory_used_watermark 0" in lines
        assert "leasemq_disk_space_available_limit_bytes 1000000000000000" in lines
        free = [l for l in lines if l.startswith("leasemq_disk_space_available_bytes ")]
        assert free and int(free[0].split()[1]) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def hold_one(port, queue):
    """A consumer that takes one delivery of `queue` and holds it unacked, as a Celery
    worker holds an ETA task until it is due: its connection, channel and delivery."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    method, _props, body = next(ch.consume(queue, inactivity_timeout=10))
    assert method is not None and body == b"eta task"
    return conn, ch, method


def test_a_held_task_goes_to_another_worker_when_its_lease_runs_out_and_not_before():
    # --consumer-timeout: the server-wide lease. A task held past it (a Celery ETA task
    # not yet due) is handed to another consumer while the first still holds it.
    proc, port, _ = start("--consumer-timeout", "300")
    try:
        setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        sch = setup.channel()
        sch.queue_declare(queue="short")
        # A queue whose own x-consumer-timeout is longer than the task is held.
        sch.queue_declare(queue="long", arguments={"x-consumer-timeout": 60_000})
        for queue in ("short", "long"):
            sch.basic_publish(exchange="", routing_key=queue, body=b"eta task")

        first_conn, first, held = hold_one(port, "short")
        assert not held.redelivered
        second_conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        second = second_conn.channel()
        again, _props, body = next(second.consume("short", inactivity_timeout=10))
        assert again is not None and body == b"eta task" and again.redelivered
        second.basic_ack(again.delivery_tag)
        # The first worker's late ack changes nothing, and its channel stays open (where
        # RabbitMQ closes the channel at its consumer_timeout).
        first.basic_ack(held.delivery_tag)
        first_conn.process_data_events(time_limit=0.3)
        assert first.is_open

        long_conn, long_ch, kept = hold_one(port, "long")
        other_conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        other = other_conn.channel()
        # Well past the server-wide 300 ms: the long queue's lease still holds.
        method, _props, _body = next(other.consume("long", inactivity_timeout=1.5))
        assert method is None, "the task stayed with the worker that holds it"
        long_ch.basic_ack(kept.delivery_tag)
        for conn in (first_conn, second_conn, long_conn, other_conn, setup):
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
