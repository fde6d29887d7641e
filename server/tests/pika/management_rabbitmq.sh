#!/usr/bin/env bash
# Runs test_management.py (the management HTTP API, rabbitmqadmin and the ctl) against one
# broker started from fresh fixtures (management_fixtures.py: definitions.json with the users
# admin, watcher, manager and plain, and passwords.json):
#
#   server/tests/pika/management_rabbitmq.sh rabbitmq [PYTEST ARGS...]
#   server/tests/pika/management_rabbitmq.sh leasemqd BINARY [PYTEST ARGS...]
#
# `rabbitmq` starts a standalone node of Debian's rabbitmq-server (mgmtsuite@localhost, as
# the package's `rabbitmq` user, so run as root) with the management plugin enabled and the
# fixtures' definitions, so that the suite itself is checked against RabbitMQ; its ctl is
# `rabbitmqctl -n mgmtsuite@localhost -q`. `leasemqd BINARY` starts that leasemqd binary
# with the same definitions and its management listener; its ctl is the `leasemqctl` beside
# BINARY, pointed at that listener as `admin`. Either way the broker is stopped when the
# tests end, pass or fail, and the exit status is pytest's.
#
# Ports (loopback only), chosen clear of a local RabbitMQ cluster on 5672-5674/25672-25674
# and of security_rabbitmq.sh's 5780-5783/25780: RabbitMQ AMQP 5790, management HTTP 15790,
# Erlang distribution 25790; leasemqd AMQP 5792, management HTTP 15792. MGMT_RMQ_PORT,
# MGMT_RMQ_HTTP_PORT, MGMT_RMQ_DIST_PORT, MGMT_LQD_PORT and MGMT_LQD_HTTP_PORT override
# them. The fixtures, logs and the node's data go to a fresh directory under /tmp, removed
# after a pass and kept (its path printed) after a failure.
#
# What the suite is told, in its environment: MGMT_DIR (the fixtures directory, with a
# `scratch` folder any user may write, for files the ctl exports and imports), MGMT_BROKER
# (rabbitmq or leasemqd), MGMT_HOST, MGMT_PORT (AMQP), MGMT_URL (the HTTP API's base URL),
# CTL (the ctl command line to which a command and its arguments are appended),
# CTL_UNREACHABLE (the same ctl aimed at a node that does not exist), LEASEMQCTL_PASSWORD
# (admin's password, which leasemqctl reads) and RABBITMQADMIN (the rabbitmqadmin script).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/target/pika-venv"

RMQ_BIN=/usr/lib/rabbitmq/bin
RMQ_HOME=/var/lib/rabbitmq
RMQ_NODE=mgmtsuite@localhost
RMQ_PORT=${MGMT_RMQ_PORT:-5790}
RMQ_HTTP_PORT=${MGMT_RMQ_HTTP_PORT:-15790}
RMQ_DIST_PORT=${MGMT_RMQ_DIST_PORT:-25790}
LQD_PORT=${MGMT_LQD_PORT:-5792}
LQD_HTTP_PORT=${MGMT_LQD_HTTP_PORT:-15792}
RABBITMQADMIN=${RABBITMQADMIN:-/usr/bin/rabbitmqadmin}
# How long a broker may take to be ready (a RabbitMQ node with the management plugin on two
# busy cores: 30-90 s).
START_TIMEOUT_S=180

die() {
    echo "management_rabbitmq: $*" >&2
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
[ -x "$RABBITMQADMIN" ] || die "no rabbitmqadmin at $RABBITMQADMIN (set RABBITMQADMIN)"

broker=${1:-}
shift || true
case $broker in
    rabbitmq) ;;
    leasemqd)
        [ $# -ge 1 ] || usage
        leasemqd_bin=$(realpath "$1")
        shift
        [ -x "$leasemqd_bin" ] || die "$leasemqd_bin is not an executable"
        leasemqctl_bin="$(dirname "$leasemqd_bin")/leasemqctl"
        [ -x "$leasemqctl_bin" ] || die "no leasemqctl beside $leasemqd_bin"
        ;;
    *) usage ;;
esac

dir=$(mktemp -d /tmp/leasemq-management.XXXXXX)
chmod 755 "$dir"
"$venv/bin/python" "$here/management_fixtures.py" "$dir"
# Files the ctl writes and reads: rabbitmqctl runs as the rabbitmq user, the tests as root.
mkdir "$dir/scratch"
chmod 1777 "$dir/scratch"

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
            echo "management_rabbitmq: $RMQ_NODE did not stop cleanly" >&2
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
        echo "management_rabbitmq: leasemqd ignored SIGTERM for 10 s; killing it" >&2
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
        echo "management_rabbitmq: fixtures and logs kept in $dir" >&2
    fi
}
trap cleanup EXIT

# A ctl for the suite: rabbitmqctl as the rabbitmq user, with the CLI's environment, every
# argument passed through unchanged.
write_rabbitmqctl_wrapper() {
    cat >"$dir/rabbitmqctl" <<EOF
#!/bin/sh
exec runuser -u rabbitmq -- env HOME=$RMQ_HOME ERL_EPMD_ADDRESS=127.0.0.1 \\
    $RMQ_BIN/rabbitmqctl "\$@"
EOF
    chmod 755 "$dir/rabbitmqctl"
}

start_rabbitmq() {
    [ "$(id -u)" = 0 ] || die "run as root (the node runs as the rabbitmq user, via su)"
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server is not installed ($RMQ_BIN)"
    local port
    for port in "$RMQ_PORT" "$RMQ_HTTP_PORT" "$RMQ_DIST_PORT"; do
        if port_taken "$port"; then
            die "port $port is taken (a node left from an earlier run? rabbitmqctl -n $RMQ_NODE stop)"
        fi
    done

    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RMQ_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $RMQ_HTTP_PORT
load_definitions = $dir/definitions.json
loopback_users = none
EOF
    # The management plugin only: the package's default plugin file is not read.
    echo "[rabbitmq_management]." >"$dir/enabled_plugins"
    mkdir -p "$dir/mnesia" "$dir/log"
    # The node reads the definitions, and writes its data and logs, as the rabbitmq user.
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
    # Booting includes importing definitions.json and starting the management plugin; the
    # listeners open after it.
    ctl await_startup --timeout "$START_TIMEOUT_S" >/dev/null || {
        tail -n 40 "$dir"/log/*.log >&2 2>/dev/null || true
        die "$RMQ_NODE did not finish booting"
    }
    until port_taken "$RMQ_PORT" && port_taken "$RMQ_HTTP_PORT"; do
        [ "$SECONDS" -lt "$deadline" ] ||
            die "$RMQ_NODE does not listen on $RMQ_PORT and $RMQ_HTTP_PORT"
        sleep 1
    done
    write_rabbitmqctl_wrapper
    mgmt_port=$RMQ_PORT
    mgmt_http_port=$RMQ_HTTP_PORT
    # -q drops the CLI's "Listing queues for vhost / ..." banner but keeps the header row.
    mgmt_ctl="$dir/rabbitmqctl -n $RMQ_NODE -q"
    # A node name nothing answers to: `ping` fails.
    mgmt_ctl_unreachable="$dir/rabbitmqctl -n nosuchnode@localhost -q"
}

start_leasemqd() {
    local port
    for port in "$LQD_PORT" "$LQD_HTTP_PORT"; do
        if port_taken "$port"; then die "port $port is taken"; fi
    done
    "$leasemqd_bin" --listen "127.0.0.1:$LQD_PORT" --management "127.0.0.1:$LQD_HTTP_PORT" \
        --definitions "$dir/definitions.json" --shards 2 >"$dir/leasemqd.log" 2>&1 &
    leasemqd_pid=$!
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until grep -q " ready: " "$dir/leasemqd.log" && port_taken "$LQD_HTTP_PORT"; do
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
    mgmt_port=$LQD_PORT
    mgmt_http_port=$LQD_HTTP_PORT
    mgmt_ctl="$leasemqctl_bin --url http://127.0.0.1:$LQD_HTTP_PORT --user admin"
    # Port 1 on loopback: nothing listens there.
    mgmt_ctl_unreachable="$leasemqctl_bin --url http://127.0.0.1:1 --user admin"
}

case $broker in
    rabbitmq) start_rabbitmq ;;
    leasemqd) start_leasemqd ;;
esac

admin_password=$("$venv/bin/python" -c \
    'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' "$dir/passwords.json")

export PYTHONDONTWRITEBYTECODE=1
rc=0
MGMT_DIR="$dir" MGMT_BROKER="$broker" MGMT_HOST=127.0.0.1 MGMT_PORT="$mgmt_port" \
    MGMT_URL="http://127.0.0.1:$mgmt_http_port" CTL="$mgmt_ctl" \
    CTL_UNREACHABLE="$mgmt_ctl_unreachable" LEASEMQCTL_PASSWORD="$admin_password" \
    RABBITMQADMIN="$RABBITMQADMIN" \
    "$venv/bin/pytest" -q -p no:cacheprovider -rfEs "$here/test_management.py" "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$broker" = leasemqd ]; then
    echo "--- leasemqd log (last 40 lines)" >&2
    tail -n 40 "$dir/leasemqd.log" >&2
fi
status=$rc
exit "$status"
