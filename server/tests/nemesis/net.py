"""Three hosts on one machine: a network namespace per node, each with a veth pair to a
bridge in the calling namespace, where the clients run. Partitions are blackhole routes
inside the namespaces, both ways, so that established connections stop too; each is
checked to block a TCP connect before it is trusted, and to let one through once healed.
Needs root and iproute2 (`ip`)."""

import os
import subprocess
import time

SUBNET = "10.77.0"
BRIDGE_ADDR = f"{SUBNET}.254"


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class Net:
    def __init__(self, nodes, tag=None):
        self.nodes = nodes
        # Short names (an interface name is at most 15 bytes) that carry the pid, so that
        # what a run killed before its clean-up left behind can be told and removed.
        self.tag = tag or f"lmq{os.getpid()}"
        self.bridge = f"{self.tag}br"
        self.cuts = set()

    def ns(self, node):
        return f"{self.tag}n{node}"

    def addr(self, node):
        return f"{SUBNET}.{node}"

    def up(self):
        remove_stale()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node in range(1, self.nodes + 1):
            ns, outer = self.ns(node), f"{self.tag}v{node}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", outer, "master", self.bridge)
            sh("ip", "link", "set", outer, "up")
            self.run_in(node, "ip", "addr", "add", f"{self.addr(node)}/24", "dev", "eth0")
            self.run_in(node, "ip", "link", "set", "eth0", "up")
            self.run_in(node, "ip", "link", "set", "lo", "up")

    def down(self):
        for node in range(1, self.nodes + 1):
            sh("ip", "netns", "del", self.ns(node), check=False)
            sh("ip", "link", "del", f"{self.tag}v{node}", check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def run_in(self, node, *args, check=True):
        return sh("ip", "netns", "exec", self.ns(node), *args, check=check)

    def command_in(self, node, args):
        """`args` as run inside node's namespace (`ip netns exec` execs it: its pid is the
        program's own)."""
        return ["ip", "netns", "exec", self.ns(node), *args]

    def cut(self, a, b):
        """Blocks all traffic between nodes a and b, both ways."""
        for src, dst in ((a, b), (b, a)):
            self.run_in(src, "ip", "route", "add", "blackhole", f"{self.addr(dst)}/32")
        self.cuts.add((min(a, b), max(a, b)))

    def heal(self):
        for a, b in sorted(self.cuts):
            for src, dst in ((a, b), (b, a)):
                self.run_in(src, "ip", "route", "del", "blackhole", f"{self.addr(dst)}/32",
                            check=False)
        self.cuts.clear()

    def reaches(self, src, dst, port):
        """Whether a TCP connect from node src's namespace to dst:port gets an answer (a
        refusal counts: the packets went through)."""
        probe = (f"import socket,sys\ns=socket.socket()\ns.settimeout(1)\n"
                 f"try:\n    s.connect(('{self.addr(dst)}',{port}))\nexcept ConnectionRefusedError:\n"
                 f"    pass\nexcept OSError:\n    sys.exit(1)\n")
        return self.run_in(src, "python3", "-c", probe, check=False).returncode == 0

    def check_cut(self, a, b, port):
        """Fails unless the cut between a and b blocks a connect, in both directions."""
        for src, dst in ((a, b), (b, a)):
            if self.reaches(src, dst, port):
                raise RuntimeError(f"a cut between nodes {a} and {b} let a connect through")

    def check_whole(self, port, wait=5.0):
        """Fails unless every node reaches every other (after a heal)."""
        deadline = time.monotonic() + wait
        for a in range(1, self.nodes + 1):
            for b in range(1, self.nodes + 1):
                while a != b and not self.reaches(a, b, port):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node {a} does not reach node {b} after a heal")
                    time.sleep(0.1)


def remove_stale():
    """Removes the namespaces and links of runs whose process is gone (killed before
    their clean-up): they would hold this run's addresses."""
    import re
    names = sh("ip", "netns", "list").stdout.split() + [
        line.split(":")[1].strip().split("@")[0]
        for line in sh("ip", "-o", "link", "show").stdout.splitlines()]
    for name in names:
        m = re.fullmatch(r"lmq(\d+)(n\d+|v\d+|br)", name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        if m.group(2).startswith("n"):
            sh("ip", "netns", "del", name, check=False)
        else:
            sh("ip", "link", "del", name, check=False)
