#!/usr/bin/env bash
# Runs test_security.py (TLS, users, vhosts, permissions) against one broker started from
# fresh fixtures (security_fixtures.py: a CA, a server certificate, definitions.json):
#
#   server/tests/pika/security_rabbitmq.sh rabbitmq [PYTEST ARGS...]
#   server/tests/pika/security_rabbitmq.sh leasemqd BINARY [PYTEST ARGS...]
#
# `rabbitmq` starts a standalone node of Debian's rabbitmq-server (secsuite@localhost, as the
# package's `rabbitmq` user, so run as root) with the fixtures' certificate and definitions,
# so that the suite itself is checked against RabbitMQ. `leasemqd BINARY` starts that
# leasemqd binary with the same files. Either way the broker is stopped when the tests end,
# pass or fail, and the exit status is pytest's.
#
# Ports (loopback only), chosen clear of a local RabbitMQ cluster on 5672-5674/25672-25674:
# RabbitMQ AMQP 5780, AMQPS 5781, Erlang distribution 25780; leasemqd AMQP 5782, AMQPS 5783.
# SEC_RMQ_PORT, SEC_RMQ_TLS_PORT, SEC_RMQ_DIST_PORT, SEC_LQD_PORT and SEC_LQD_TLS_PORT
# override them. The fixtures, logs and the node's data go to a fresh directory under /tmp,
# removed after a pass and kept (its path printed) after a failure. broker_node.sh starts
# and stops the brokers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/target/pika-venv"

SUITE=security_rabbitmq
RMQ_NODE=secsuite@localhost
RMQ_PORT=${SEC_RMQ_PORT:-5780}
RMQ_TLS_PORT=${SEC_RMQ_TLS_PORT:-5781}
RMQ_DIST_PORT=${SEC_RMQ_DIST_PORT:-25780}
LQD_PORT=${SEC_LQD_PORT:-5782}
LQD_TLS_PORT=${SEC_LQD_TLS_PORT:-5783}
# How long a broker may take to be ready (a RabbitMQ node on two busy cores: 20-60 s).
START_TIMEOUT_S=120

usage() {
    echo "usage: $0 rabbitmq [PYTEST ARGS...]" >&2
    echo "       $0 leasemqd BINARY [PYTEST ARGS...]" >&2
    exit 2
}

# shellcheck source=broker_node.sh
. "$here/broker_node.sh"

[ -x "$venv/bin/pytest" ] && "$venv/bin/python" -c 'import pika' 2>/dev/null ||
    die "no virtualenv with pika and pytest at $venv (server/tests/pika/run.sh makes it)"

broker=${1:-}
shift || true
case $broker in
    rabbitmq) ;;
    leasemqd)
        [ $# -ge 1 ] || usage
        leasemqd_bin=$(realpath "$1")
        shift
        [ -x "$leasemqd_bin" ] || die "$leasemqd_bin is not an executable"
        ;;
    *) usage ;;
esac

dir=$(mktemp -d /tmp/leasemq-security.XXXXXX)
chmod 755 "$dir"
"$venv/bin/python" "$here/security_fixtures.py" "$dir"

start_rabbitmq() {
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RMQ_PORT
listeners.ssl.default = 127.0.0.1:$RMQ_TLS_PORT
ssl_options.cacertfile = $dir/ca.pem
ssl_options.certfile = $dir/server.pem
ssl_options.keyfile = $dir/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
load_definitions = $dir/definitions.json
loopback_users = none
EOF
    boot_rabbitmq "[]" "$RMQ_PORT" "$RMQ_TLS_PORT"
    sec_port=$RMQ_PORT
    sec_tls_port=$RMQ_TLS_PORT
}

start_leasemqd() {
    boot_leasemqd "$leasemqd_bin" "$LQD_PORT" "$LQD_TLS_PORT" -- \
        --listen "127.0.0.1:$LQD_PORT" --tls-listen "127.0.0.1:$LQD_TLS_PORT" \
        --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" \
        --definitions "$dir/definitions.json" --shards 2
    sec_port=$LQD_PORT
    sec_tls_port=$LQD_TLS_PORT
}

case $broker in
    rabbitmq) start_rabbitmq ;;
    leasemqd) start_leasemqd ;;
esac

export PYTHONDONTWRITEBYTECODE=1
rc=0
SEC_DIR="$dir" SEC_HOST=127.0.0.1 SEC_PORT="$sec_port" SEC_TLS_PORT="$sec_tls_port" \
    "$venv/bin/pytest" -q -p no:cacheprovider -rfEs "$here/test_security.py" "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$broker" = leasemqd ]; then
    echo "--- leasemqd log (last 40 lines)" >&2
    tail -n 40 "$dir/leasemqd.log" >&2
fi
status=$rc
exit "$status"
