#!/usr/bin/env bash
# Three leasemqd nodes, one network namespace each, under faults (kill -9 and SIGSTOP of
# a leader, a node isolated, a peer link cut) while pika clients publish with confirms
# and ack in transactions; then a checker: nothing confirmed lost, nothing acked
# delivered again, nothing unexpected (nemesis.py says how).
#
#   server/tests/nemesis/run.sh [SECONDS] [nemesis.py options: --seed N --out FILE ...]
#
# Needs root (network namespaces), iproute2 and python3 with venv; pika is installed into
# the virtual environment the pika suite uses (target/pika-venv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cd "$root"

seconds="${1:-60}"
shift || true
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "the nemesis run needs root and iproute2 (ip): it makes network namespaces" >&2
    exit 1
fi

venv="$root/target/pika-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pika' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "pika>=1.3,<2"
fi

# leasemqd as `cargo test --workspace` builds it: after a test run nothing is built again.
cargo test --locked --workspace --no-run
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" "$here/nemesis.py" --bin "$root/target/debug/leasemqd" \
    --seconds "$seconds" "$@"
