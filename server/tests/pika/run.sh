#!/usr/bin/env bash
# End-to-end test of leasemqd with unmodified clients: builds leasemqd, starts it on a free
# port, runs test_pika.py (pika) and test_clients.py (a Celery worker and client) with
# pytest, and stops the server; test_durable.py starts its own servers on a data dir,
# kills and restarts them; test_operations.py starts its own to scrape --metrics and to
# stop one with SIGTERM. test_security.py (contract §10: TLS, users, vhosts, permissions)
# runs through security_rabbitmq.sh, which starts a leasemqd of its own with the
# certificates and definitions file it makes (and runs the same suite against RabbitMQ
# with `security_rabbitmq.sh rabbitmq`); test_management.py (contract §11: the management
# API, Debian's rabbitmqadmin and leasemqctl) runs last through management_rabbitmq.sh,
# which does the same with its own definitions (and fetches rabbitmqadmin out of Debian's
# package with apt-get where it is not installed).
#
# Needs python3 (with venv) and network access to PyPI the first time: pika, pytest, celery
# (test_clients.py) and websocket-client (the management suite's console test, which runs
# where Debian's chromium is installed) go into a virtual environment under
# target/pika-venv, reused on later runs.
# Extra arguments go to pytest (e.g. -k nack). With AMQP_URL=amqp://… it runs test_pika.py
# against that broker instead (no leasemqd), e.g. a local RabbitMQ:
#   AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f server/tests/pika/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cd "$root"

venv="$root/target/pika-venv"
if [ ! -x "$venv/bin/pytest" ] ||
    ! "$venv/bin/python" -c 'import pika, celery, websocket' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "pika>=1.3,<2" "pytest>=7" "celery>=5.3,<6" \
        "websocket-client>=1.6,<2"
fi

# AMQP_URL: run test_pika.py and test_clients.py against that broker (a RabbitMQ, say)
# instead of leasemqd.
if [ -n "${AMQP_URL:-}" ]; then
    export PYTHONDONTWRITEBYTECODE=1
    exec "$venv/bin/pytest" -q -p no:cacheprovider -rs "$here/test_pika.py" \
        "$here/test_clients.py" "$@"
fi

# leasemqd as `cargo test --workspace` builds it (the test profile, optimised, with the
# workspace's features): after a test run nothing is built again.
cargo test --locked --workspace --no-run
log="$(mktemp)"
target/debug/leasemqd --listen 127.0.0.1:0 --shards 2 >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT

# The ready line names the port the server picked.
port=""
for _ in $(seq 1 100); do
    port="$(sed -n 's/.* on 127\.0\.0\.1:\([0-9]*\),.*/\1/p' "$log")"
    [ -n "$port" ] && break
    if ! kill -0 "$server" 2>/dev/null; then
        cat "$log" >&2
        echo "leasemqd exited before it was ready" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$port" ]; then
    cat "$log" >&2
    echo "leasemqd did not say it was ready" >&2
    exit 1
fi

export PYTHONDONTWRITEBYTECODE=1
status=0
LEASEMQD_PORT="$port" LEASEMQD_BIN="$root/target/debug/leasemqd" "$venv/bin/pytest" -q \
    -p no:cacheprovider "$here/test_pika.py" "$here/test_clients.py" "$here/test_durable.py" \
    "$here/test_operations.py" "$@" || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- leasemqd log" >&2
    cat "$log" >&2
fi
bash "$here/security_rabbitmq.sh" leasemqd "$root/target/debug/leasemqd" "$@" || status=$?
bash "$here/management_rabbitmq.sh" leasemqd "$root/target/debug/leasemqd" "$@" || status=$?
exit "$status"
