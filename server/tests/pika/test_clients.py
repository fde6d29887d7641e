"""Other unmodified Python clients against leasemqd (or, with AMQP_URL, against that broker).

Celery is the task queue most Python services run on RabbitMQ: a worker and a client that
sends it tasks and waits for their results through the `rpc://` backend (a reply queue
per client, declared with `x-expires`). The worker runs as `celery worker` starts it, with
remote control, mingle and gossip on: those use a fanout exchange, queues named after the
worker's `name@host` and declared with `x-message-ttl` and `x-expires`, and replies to a
`ping` and an `inspect` through the client's reply queue.
"""

import importlib
import os
import subprocess
import sys
import time

import pika
import pytest

URL = os.environ.get("AMQP_URL")
if URL is None:
    URL = f"amqp://guest:guest@127.0.0.1:{os.environ['LEASEMQD_PORT']}/%2f"

APP = """
import os
from celery import Celery

app = Celery("leasemq_celery_app", broker=os.environ["BROKER"], backend="rpc://")
app.conf.task_default_queue = os.environ["TASK_QUEUE"]


@app.task
def add(x, y):
    return x + y
"""


def consumers(queue):
    """How many consumers `queue` has; 0 where it does not exist yet."""
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        return conn.channel().queue_declare(queue=queue, passive=True).method.consumer_count
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if conn.is_open:
            conn.close()


def test_a_celery_worker_runs_tasks_and_sends_back_their_results(tmp_path):
    pytest.importorskip("celery")
    (tmp_path / "leasemq_celery_app.py").write_text(APP)
    queue = f"celery-{os.getpid()}-{int(time.time())}"
    env = dict(os.environ, BROKER=URL, TASK_QUEUE=queue, PYTHONPATH=str(tmp_path))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "leasemq_celery_app", "worker", "--pool=solo",
         "-n", f"worker-{os.getpid()}@%h", "--loglevel=warning"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # The worker is ready once it consumes its queue.
        for _ in range(300):
            if consumers(queue) > 0 or worker.poll() is not None:
                break
            time.sleep(0.1)
        assert worker.poll() is None, worker.stdout.read().decode()
        assert consumers(queue) > 0, "the worker did not start consuming within 30 s"
        os.environ.update(BROKER=URL, TASK_QUEUE=queue)
        sys.path.insert(0, str(tmp_path))
        try:
            app = importlib.import_module("leasemq_celery_app")
            results = [app.add.delay(i, i) for i in range(5)]
            assert [r.get(timeout=30) for r in results] == [0, 2, 4, 6, 8]
            # Remote control: a broadcast to every worker, answered on a reply queue.
            name = f"worker-{os.getpid()}@"
            pongs = app.app.control.ping(timeout=5)
            assert any(n.startswith(name) and r == {"ok": "pong"}
                       for pong in pongs for n, r in pong.items()), pongs
            queues = app.app.control.inspect(timeout=5).active_queues()
            assert any(n.startswith(name) and [q["name"] for q in qs] == [queue]
                       for n, qs in (queues or {}).items()), queues
            app.app.close()
        finally:
            sys.path.remove(str(tmp_path))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        conn = pika.BlockingConnection(pika.URLParameters(URL))
        conn.channel().queue_delete(queue=queue)
        conn.close()
