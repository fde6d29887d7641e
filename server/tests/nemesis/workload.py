"""The clients and the checker. Producers publish unique ids with confirms; consumers ack
in transactions. Every thread keeps its own record, read once the run is over:

- a producer: each id it sent, and whether it was confirmed (acked), or its outcome is
  unknown (nacked, or its connection ended before the answer: the broker may hold it);
- a consumer: each delivery (id, how many times it was delivered before, from
  `x-delivery-count`), and each id whose ack a `commit-ok` covered, with that count.

The checker then finds:

- lost: confirmed, and by the end of the drain (every fault healed, every node up, the
  consumers on until all is acked or nothing more comes) neither acked nor in a commit
  that failed (whose outcome is unknown); of them, those never delivered at all are
  counted apart;
- acked then redelivered: delivered with a count above one a committed ack covered (the
  count grows by one with each delivery, so a later delivery means the ack did not hold);
- unexpected: delivered, never sent;
- duplicates: delivered more than once (allowed: delivery is at least once).
"""

import threading
import time

import pika

USER = ("test", "test")


def params(addr, port):
    return pika.ConnectionParameters(
        host=addr, port=port, credentials=pika.PlainCredentials(*USER),
        # A node that stops answering (SIGSTOP, an isolated host) ends the connection
        # within a few seconds; the client goes on with another node.
        heartbeat=2, socket_timeout=2, stack_timeout=4, blocked_connection_timeout=4,
        connection_attempts=1)


class Stop:
    def __init__(self):
        self.event = threading.Event()

    def is_set(self):
        return self.event.is_set()


class Client(threading.Thread):
    """A client that goes on with the next node whenever its connection ends, until
    stopped; `session` is what it does on one connection."""

    def __init__(self, name, nodes, queues, stop, first):
        super().__init__(daemon=True)
        self.name_, self.nodes, self.queues, self.stop = name, nodes, queues, stop
        self.first = first
        self.connects = 0

    def run(self):
        turn = self.first
        while not self.stop.is_set():
            addr, port = self.nodes[turn % len(self.nodes)]
            turn += 1
            try:
                conn = pika.BlockingConnection(params(addr, port))
            except Exception:
                time.sleep(0.2)
                continue
            self.connects += 1
            try:
                self.session(conn)
            except Exception:
                pass
            finally:
                try:
                    conn.close()
                except Exception:
                    pass


class Producer(Client):
    def __init__(self, name, nodes, queues, stop, first=0):
        super().__init__(name, nodes, queues, stop, first)
        # (id, queue, confirmed-or-None for unknown, when answered)
        self.sent = []
        self.seq = 0

    def session(self, conn):
        ch = conn.channel()
        ch.confirm_delivery()
        for q in self.queues:
            ch.queue_declare(q, durable=True)
        while not self.stop.is_set():
            self.seq += 1
            mid = f"{self.name_}-{self.seq}"
            q = self.queues[self.seq % len(self.queues)]
            props = pika.BasicProperties(delivery_mode=2, message_id=mid)
            try:
                ch.basic_publish("", q, mid.encode(), props)
                self.sent.append((mid, q, True, time.monotonic()))
            except pika.exceptions.NackError:
                # Unavailable: its outcome is unknown.
                self.sent.append((mid, q, None, time.monotonic()))
            except Exception:
                self.sent.append((mid, q, None, time.monotonic()))
                raise


class Consumer(Client):
    BATCH = 20

    def __init__(self, name, nodes, queues, stop, first=0):
        super().__init__(name, nodes, queues, stop, first)
        # (id, count before, when)
        self.delivered = []
        # (id, count before, when its commit-ok came)
        self.acked = []
        # (id, count before) of acks whose commit failed: their outcome is unknown (a
        # commit answered by a queue that was unavailable may still have taken effect)
        self.tried = []
        self.failed_commits = 0
        self.last_delivery = time.monotonic()

    def session(self, conn):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=self.BATCH)
        ch.tx_select()
        held, cancelled = [], []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))

        def on_message(_ch, method, props, body):
            count = (props.headers or {}).get("x-delivery-count", 0)
            mid = body.decode()
            now = time.monotonic()
            self.delivered.append((mid, count, now))
            self.last_delivery = now
            held.append((method.delivery_tag, mid, count))

        for q in self.queues:
            ch.queue_declare(q, durable=True)
            ch.basic_consume(q, on_message)
        since = time.monotonic()
        while not self.stop.is_set() and not cancelled:
            conn.process_data_events(time_limit=0.05)
            if held and (len(held) >= self.BATCH or time.monotonic() - since > 0.2):
                for tag, _, _ in held:
                    ch.basic_ack(tag)
                try:
                    ch.tx_commit()
                except Exception:
                    # Not known to be committed (a 406: a lease that ended, or a queue
                    # that was unavailable; or the connection went).
                    self.failed_commits += 1
                    self.tried.extend((mid, count) for _, mid, count in held)
                    raise
                now = time.monotonic()
                self.acked.extend((mid, count, now) for _, mid, count in held)
                held.clear()
                since = time.monotonic()
            elif not held:
                since = time.monotonic()


def check(producers, consumers):
    sent = {}
    for p in producers:
        for mid, q, confirmed, _ in p.sent:
            sent[mid] = confirmed
    deliveries = {}
    for c in consumers:
        for mid, count, _ in c.delivered:
            deliveries.setdefault(mid, []).append(count)
    acked = {}
    for c in consumers:
        for mid, count, _ in c.acked:
            acked[mid] = max(count, acked.get(mid, -1))
    confirmed = [m for m, ok in sent.items() if ok]
    tried = {mid for c in consumers for mid, _ in c.tried}
    lost = [m for m in confirmed if m not in acked and m not in tried]
    never_delivered = [m for m in lost if m not in deliveries]
    redelivered = [m for m, count in acked.items() if max(deliveries.get(m, [-1])) > count]
    unexpected = [m for m in deliveries if m not in sent]
    duplicates = [m for m, counts in deliveries.items() if len(counts) > 1]
    return {
        "sent": len(sent),
        "confirmed": len(confirmed),
        "unknown": sum(1 for ok in sent.values() if ok is None),
        "delivered": len(deliveries),
        "deliveries": sum(len(c) for c in deliveries.values()),
        "acked": len(acked),
        "ack_unknown": len(tried - set(acked)),
        "failed_commits": sum(c.failed_commits for c in consumers),
        "lost": len(lost),
        "lost_never_delivered": len(never_delivered),
        "acked_then_redelivered": len(redelivered),
        "unexpected": len(unexpected),
        "duplicates": len(duplicates),
        "examples": {"lost": lost[:5], "acked_then_redelivered": redelivered[:5],
                     "unexpected": unexpected[:5]},
    }


def confirms_by_queue(producers):
    """Each queue's confirm times, ascending."""
    times = {}
    for p in producers:
        for _, q, ok, at in p.sent:
            if ok:
                times.setdefault(q, []).append(at)
    return {q: sorted(t) for q, t in times.items()}


def self_test():
    """The checker finds what it looks for: records with one fault of each kind."""
    class Record:
        pass
    p, c = Record(), Record()
    p.sent = [("a", "q", True, 0), ("b", "q", True, 0), ("c", "q", None, 0),
              ("d", "q", True, 0), ("e", "q", True, 0)]
    # a: acked at its first delivery, then delivered again (the ack did not hold);
    # b: confirmed, never delivered; d: delivered, never acked, gone; e: in a failed
    # commit, gone (its ack's outcome is unknown: not lost); x: never sent.
    c.delivered = [("a", 0, 1), ("a", 1, 2), ("d", 0, 1), ("e", 0, 1), ("x", 0, 1)]
    c.acked = [("a", 0, 1.5)]
    c.tried = [("e", 0)]
    c.failed_commits = 1
    got = check([p], [c])
    want = {"lost": 2, "lost_never_delivered": 1, "acked_then_redelivered": 1,
            "unexpected": 1, "duplicates": 1}
    assert {k: got[k] for k in want} == want, got
