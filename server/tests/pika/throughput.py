"""Publish+consume throughput of one pika client through leasemqd (not a test).

Usage: throughput.py PORT [MESSAGES] [BODY_BYTES]

Publishes MESSAGES messages to a fresh queue, then consumes them with basic_consume
(prefetch 100) and acks each one; prints the rate of each phase and of the whole.
"""

import sys
import time
import uuid

import pika

port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
size = int(sys.argv[3]) if len(sys.argv) > 3 else 100

conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port))
ch = conn.channel()
queue = f"bench-{uuid.uuid4().hex[:8]}"
ch.queue_declare(queue=queue)
body = b"x" * size

start = time.perf_counter()
for _ in range(n):
    ch.basic_publish(exchange="", routing_key=queue, body=body)
# A round trip, so that every publish has been put before the clock stops.
ch.queue_declare(queue=queue, passive=True)
published = time.perf_counter()

ch.basic_qos(prefetch_count=100)
count = 0


def on_message(channel, method, _properties, _body):
    global count
    channel.basic_ack(method.delivery_tag)
    count += 1
    if count == n:
        channel.stop_consuming()


ch.basic_consume(queue=queue, on_message_callback=on_message)
ch.start_consuming()
done = time.perf_counter()
conn.close()

print(f"{n} messages of {size} bytes")
print(f"publish: {n / (published - start):,.0f} msg/s")
print(f"consume+ack: {n / (done - published):,.0f} msg/s")
print(f"publish+consume: {n / (done - start):,.0f} msg/s end to end")
