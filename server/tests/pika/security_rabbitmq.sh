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
# removed after a pass and kept (its path printed) after a failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/target/pika-venv"

RMQ_BIN=/usr/lib/rabbitmq/bin
RMQ_HOME=/var/lib/rabbitmq
RMQ_NODE=secsuite@localhost
RMQ_PORT=${SEC_RMQ_PORT:-5780}
RMQ_TLS_PORT=${SEC_RMQ_TLS_PORT:-5781}
RMQ_DIST_PORT=${SEC_RMQ_DIST_PORT:-25780}
LQD_PORT=${SEC_LQD_PORT:-5782}
LQD_TLS_PORT=${SEC_LQD_TLS_PORT:-5783}
# How long a broker may take to be ready (a RabbitMQ node on two busy cores: 20-60 s).
START_TIMEOUT_S=120

die() {
    echo "security_rabbitmq: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 rabbitmq [PYTEST ARGS...]" >&2
    echo "       $0 leasemqd BINARY [PYTEST ARGS...]" >&2
    exit 2
}

port_taken() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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

# What the EXIT trap undoes; set as each thing is started.
rmq_started=0
epmd_was_running=1
leasemqd_pid=""
status=1

# Runs a command as the `rabbitmq` user, in the environment the node and its CLI share.
as_rabbitmq() {
    su rabbitmq -s /bin/sh -c "env HOME=$RMQ_HOME ERL_EPMD_ADDRESS=127.0.0.1 $1"
}

ctl() { as_rabbitmq "$RMQ_BIN/rabbitmqctl -n $RMQ_NODE $*"; }

stop_rabbitmq() {
    if [ "$rmq_started" = 1 ]; then
        # With the pid file, `stop` returns once the node's VM has exited.
        ctl stop "$dir/rabbitmq.pid" >/dev/null 2>&1 ||
            echo "security_rabbitmq: $RMQ_NODE did not stop cleanly" >&2
        # epmd, if this script's node started it, exits on `-kill` once no node is
        # registered with it (it refuses while any other node is).
        if [ "$epmd_was_running" = 0 ]; then
            as_rabbitmq "epmd -kill" >/dev/null 2>&1 || true
        fi
    fi
}

stop_leasemqd() {
    [ -n "$leasemqd_pid" ] || return 0
    kill -TERM "$leasemqd_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$leasemqd_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$leasemqd_pid" 2>/dev/null; then
        echo "security_rabbitmq: leasemqd ignored SIGTERM for 10 s; killing it" >&2
        kill -KILL "$leasemqd_pid" 2>/dev/null || true
    fi
    wait "$leasemqd_pid" 2>/dev/null || true
}

cleanup() {
    stop_rabbitmq
    stop_leasemqd
    if [ "$status" = 0 ]; then
        rm -rf "$dir"
    else
        echo "security_rabbitmq: fixtures and logs kept in $dir" >&2
    fi
}
trap cleanup EXIT

start_rabbitmq() {
    [ "$(id -u)" = 0 ] || die "run as root (the node runs as the rabbitmq user, via su)"
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server is not installed ($RMQ_BIN)"
    local port
    for port in "$RMQ_PORT" "$RMQ_TLS_PORT" "$RMQ_DIST_PORT"; do
        if port_taken "$port"; then
            die "port $port is taken (a node left from an earlier run? rabbitmqctl -n $RMQ_NODE stop)"
        fi
    done

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
    # No plugins: the package's default plugin file is not read.
    echo "[]." >"$dir/enabled_plugins"
    mkdir -p "$dir/mnesia" "$dir/log"
    # The node reads the certificate, key and definitions, and writes its data and logs,
    # as the rabbitmq user.
    chown -R rabbitmq: "$dir"

    as_rabbitmq "epmd -names" >/dev/null 2>&1 || epmd_was_running=0
    rmq_started=1
    as_rabbitmq "RABBITMQ_NODENAME=$RMQ_NODE RABBITMQ_DIST_PORT=$RMQ_DIST_PORT \
        RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf \
        RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
        RABBITMQ_PID_FILE=$dir/rabbitmq.pid \
        RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
        $RMQ_BIN/rabbitmq-server -detached" >"$dir/start.log" 2>&1 ||
        die "$RMQ_NODE did not start; see $dir/start.log and $dir/log"

    local deadline=$((SECONDS + START_TIMEOUT_S))
    until ctl ping >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$dir"/log/*.log >&2 2>/dev/null || true
            die "$RMQ_NODE did not answer within ${START_TIMEOUT_S}s"
        fi
        sleep 2
    done
    # Booting includes importing definitions.json; the listeners open after it.
    ctl await_startup --timeout "$START_TIMEOUT_S" >/dev/null || {
        tail -n 40 "$dir"/log/*.log >&2 2>/dev/null || true
        die "$RMQ_NODE did not finish booting"
    }
    until port_taken "$RMQ_TLS_PORT"; do
        [ "$SECONDS" -lt "$deadline" ] || die "$RMQ_NODE does not listen on $RMQ_TLS_PORT"
        sleep 1
    done
    sec_port=$RMQ_PORT
    sec_tls_port=$RMQ_TLS_PORT
}

start_leasemqd() {
    local port
    for port in "$LQD_PORT" "$LQD_TLS_PORT"; do
        if port_taken "$port"; then die "port $port is taken"; fi
    done
    "$leasemqd_bin" --listen "127.0.0.1:$LQD_PORT" --tls-listen "127.0.0.1:$LQD_TLS_PORT" \
        --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" \
        --definitions "$dir/definitions.json" --shards 2 >"$dir/leasemqd.log" 2>&1 &
    leasemqd_pid=$!
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until grep -q ready "$dir/leasemqd.log"; do
        if ! kill -0 "$leasemqd_pid" 2>/dev/null; then
            cat "$dir/leasemqd.log" >&2
            leasemqd_pid=""
            die "leasemqd exited before it was ready"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            cat "$dir/leasemqd.log" >&2
            die "leasemqd did not say it was ready within ${START_TIMEOUT_S}s"
        fi
        sleep 0.1
    done
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
