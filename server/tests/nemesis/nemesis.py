#!/usr/bin/env python3
"""Three `leasemqd` nodes, one network namespace each, under faults while pika clients
publish with confirms and ack in transactions; then a checker (contract §9, R1-R4).

The faults, in a seeded order, each held a few seconds and then undone:

- kill: `kill -9` of a shard's leader, restarted on its data dir;
- pause: SIGSTOP of a shard's leader, then SIGCONT;
- isolate: a node cut off from both peers (its clients still reach it);
- cut: the link between a shard's leader and one follower.

After the last fault every node is up and whole again, the producers stop, and the
consumers drain. The run fails if a confirmed message was not acked by then (lost), a
message came again after a committed ack of it, or a message came that was never sent.
It reports how long each queue went without a confirm after a leader's death.

    nemesis.py --bin target/debug/leasemqd --seconds 60 [--seed N] [--out FILE]
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import workload
from net import Net

AMQP_PORT = 5672
RAFT_PORT = 7000
METRICS_PORT = 9100
SHARDS = 2
QUEUES = [f"jobs-{i}" for i in range(4)]


class Cluster:
    def __init__(self, net, binary, work):
        self.net, self.binary, self.work = net, binary, work
        self.secret = os.path.join(work, "secret")
        with open(self.secret, "w") as f:
            f.write("a secret the nodes share\n")
        self.procs = {}
        self.paused = set()

    def raft(self, node):
        return f"{self.net.addr(node)}:{RAFT_PORT}"

    def log(self, node):
        return os.path.join(self.work, f"node-{node}.log")

    def start(self, node):
        peers = ",".join(f"{n}={self.raft(n)}" for n in range(1, self.net.nodes + 1))
        args = [self.binary, "--listen", f"{self.net.addr(node)}:{AMQP_PORT}",
                "--shards", str(SHARDS), "--data-dir", os.path.join(self.work, f"data-{node}"),
                "--cluster", "nemesis", "--node-id", str(node), "--raft-listen",
                self.raft(node), "--peers", peers, "--cluster-secret-file", self.secret,
                "--user", "test:test", "--raft-election-timeout-ms", "500",
                "--cluster-call-timeout", "3000", "--log-level", "warn",
                "--metrics", f"{self.net.addr(node)}:{METRICS_PORT}"]
        with open(self.log(node), "rb") if os.path.exists(self.log(node)) else open(os.devnull, "rb") as f:
            ready_before = f.read().count(b" ready")
        out = open(self.log(node), "ab")
        self.procs[node] = subprocess.Popen(self.net.command_in(node, args), stdout=out,
                                            stderr=out)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(self.log(node), "rb") as f:
                if f.read().count(b" ready") > ready_before:
                    return
            if self.procs[node].poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"node {node} did not start: see {self.log(node)}")

    def kill(self, node):
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def pause(self, node, paused):
        self.procs[node].send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
        (self.paused.add if paused else self.paused.discard)(node)

    def admin(self, action, node, *more, timeout=5):
        args = [self.binary, "cluster", action, "--raft", self.raft(node),
                "--cluster-secret-file", self.secret, *more]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return done.stdout if done.returncode == 0 else None

    def leader(self, shard, wait=30):
        """The node that leads `shard` by its own word, once one does."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for node in sorted(self.procs):
                if node in self.paused:
                    continue
                out = self.admin("status", node, "--json", timeout=2)
                if out and json.loads(out)["shards"][shard]["leader"] == node:
                    return node
            time.sleep(0.1)
        raise RuntimeError(f"shard {shard} found no leader in {wait} s")

    def queue_gauges(self):
        """Each queue's ready and unacked messages and consumers, as a node's metrics
        show them (from the queue's leader)."""
        import urllib.request
        for node in sorted(self.procs):
            url = f"http://{self.net.addr(node)}:{METRICS_PORT}/metrics"
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                continue
            gauges = {}
            for line in text.splitlines():
                for name in ("messages_ready", "messages_unacked", "consumers"):
                    prefix = f"leasemq_queue_{name}{{"
                    if line.startswith(prefix):
                        queue = line.split('queue="')[1].split('"')[0]
                        gauges.setdefault(queue, {})[name] = float(line.rsplit(" ", 1)[1])
            return gauges
        return None

    def stop_all(self):
        for node in list(self.procs):
            if node in self.paused:
                self.pause(node, False)
            self.kill(node)


class Nemesis:
    KINDS = ["kill", "pause", "isolate", "cut"]

    def __init__(self, cluster, net, rng, hold):
        self.cluster, self.net, self.rng, self.hold = cluster, net, rng, hold
        self.events = []

    def run(self, kind):
        shard = self.rng.randrange(SHARDS)
        leader = self.cluster.leader(shard)
        others = [n for n in range(1, self.net.nodes + 1) if n != leader]
        at = time.monotonic()
        self.events.append({"kind": kind, "node": leader, "shard": shard, "at": at})
        print(f"  {at - START:6.1f} s  {kind} (shard {shard}'s leader, node {leader})",
              flush=True)
        if kind == "kill":
            self.cluster.kill(leader)
            time.sleep(self.hold)
            self.cluster.start(leader)
        elif kind == "pause":
            self.cluster.pause(leader, True)
            time.sleep(self.hold)
            self.cluster.pause(leader, False)
        else:
            cut_off = self.rng.choice([leader, *others]) if kind == "isolate" else leader
            peers = [n for n in range(1, self.net.nodes + 1) if n != cut_off]
            if kind == "cut":
                peers = [self.rng.choice(others)]
            for peer in peers:
                self.net.cut(cut_off, peer)
                self.net.check_cut(cut_off, peer, RAFT_PORT)
            time.sleep(self.hold)
            self.net.heal()
            self.net.check_whole(RAFT_PORT)


def unavailability(events, confirms):
    """For each leader's death: how long until every queue had a confirm again."""
    gaps = []
    for event in (e for e in events if e["kind"] == "kill"):
        worst = 0.0
        for times in confirms.values():
            after = next((t for t in times if t > event["at"]), None)
            worst = max(worst, (after if after is not None else float("inf")) - event["at"])
        gaps.append(worst)
    return sorted(gaps)


def percentile(values, p):
    if not values:
        return None
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def drain(producers, consumers, stop_producers, limit=90, quiet=5):
    """Producers stop; consumers go on until every confirmed message is acked (or in a
    commit whose outcome is unknown), or nothing has come for `quiet` seconds."""
    stop_producers.event.set()
    for p in producers:
        p.join(timeout=15)
    confirmed = {mid for p in producers for mid, _, ok, _ in p.sent if ok}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        acked = {mid for c in consumers for mid, _, _ in c.acked}
        acked |= {mid for c in consumers for mid, _ in c.tried}
        last = max(c.last_delivery for c in consumers)
        if confirmed <= acked or time.monotonic() - last > quiet:
            return
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--hold", type=float, default=4, help="seconds each fault lasts")
    ap.add_argument("--calm", type=float, default=3, help="seconds between faults")
    ap.add_argument("--out", help="write the summary as JSON here")
    ap.add_argument("--dump", help="write every client's record as JSON here")
    args = ap.parse_args()
    workload.self_test()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    print(f"nemesis: {args.seconds:.0f} s, seed {seed}", flush=True)
    net = Net(3)
    work = tempfile.mkdtemp(prefix="leasemq-nemesis-")
    cluster = Cluster(net, os.path.abspath(args.bin), work)
    try:
        net.up()
        for node in (1, 2, 3):
            cluster.start(node)
        net.check_whole(RAFT_PORT)
        # Partitions must block before they are trusted: a cut checked at once.
        net.cut(1, 2)
        net.check_cut(1, 2, RAFT_PORT)
        net.heal()
        net.check_whole(RAFT_PORT)
        if cluster.admin("init", 1) is None:
            raise RuntimeError("cluster init failed")
        for shard in range(SHARDS):
            cluster.leader(shard)
        summary = run(args, rng, net, cluster)
        summary["seed"] = seed
    except Exception:
        for node in (1, 2, 3):
            if os.path.exists(cluster.log(node)):
                with open(cluster.log(node), errors="replace") as f:
                    sys.stderr.write(f"--- node {node}'s log (tail)\n" + "".join(f.readlines()[-30:]))
        raise
    finally:
        cluster.stop_all()
        net.down()
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    bad = summary["lost"] + summary["acked_then_redelivered"] + summary["unexpected"]
    if bad:
        print("nemesis: FAILED", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print("nemesis: passed")


def run(args, rng, net, cluster):
    global START
    nodes = [(net.addr(n), AMQP_PORT) for n in (1, 2, 3)]
    stop_producers, stop_consumers = workload.Stop(), workload.Stop()
    producers = [workload.Producer(f"p{i}", nodes, QUEUES, stop_producers, first=i)
                 for i in range(3)]
    consumers = [workload.Consumer(f"c{i}", nodes, QUEUES, stop_consumers, first=i)
                 for i in range(3)]
    START = time.monotonic()
    for t in producers + consumers:
        t.start()
    nemesis = Nemesis(cluster, net, rng, args.hold)
    kinds = []
    time.sleep(args.calm)
    while time.monotonic() - START + args.hold < args.seconds:
        if not kinds:
            kinds = rng.sample(Nemesis.KINDS, len(Nemesis.KINDS))
        nemesis.run(kinds.pop())
        time.sleep(args.calm)
    print(f"  {time.monotonic() - START:6.1f} s  drain", flush=True)
    drain(producers, consumers, stop_producers)
    at_end = cluster.queue_gauges()
    stop_consumers.event.set()
    for c in consumers:
        c.join(timeout=15)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({"sent": {p.name_: p.sent for p in producers},
                       "delivered": {c.name_: c.delivered for c in consumers},
                       "acked": {c.name_: c.acked for c in consumers},
                       "events": nemesis.events, "start": START}, f)
    summary = workload.check(producers, consumers)
    gaps = unavailability(nemesis.events, workload.confirms_by_queue(producers))
    summary["faults"] = {k: sum(1 for e in nemesis.events if e["kind"] == k)
                         for k in Nemesis.KINDS}
    summary["unavailable_after_leader_death_s"] = {
        "p50": percentile(gaps, 50), "p99": percentile(gaps, 99),
        "max": gaps[-1] if gaps else None}
    summary["queues_at_end"] = at_end
    summary["seconds"] = round(time.monotonic() - START, 1)
    summary["connects"] = sum(t.connects for t in producers + consumers)
    return summary


START = time.monotonic()

if __name__ == "__main__":
    main()
