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
# (admin's password, which leasemqctl reads) and RABBITMQADMIN (the rabbitmqadmin script:
# $RABBITMQADMIN if set, else the package's /usr/bin/rabbitmqadmin, else one taken out of
# Debian's package into target/rabbitmqadmin with `apt-get download`, which needs no
# RabbitMQ installed). broker_node.sh starts and stops the brokers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/target/pika-venv"

SUITE=management_rabbitmq
RMQ_NODE=mgmtsuite@localhost
RMQ_PORT=${MGMT_RMQ_PORT:-5790}
RMQ_HTTP_PORT=${MGMT_RMQ_HTTP_PORT:-15790}
RMQ_DIST_PORT=${MGMT_RMQ_DIST_PORT:-25790}
LQD_PORT=${MGMT_LQD_PORT:-5792}
LQD_HTTP_PORT=${MGMT_LQD_HTTP_PORT:-15792}
# How long a broker may take to be ready (a RabbitMQ node with the management plugin on two
# busy cores: 30-90 s).
START_TIMEOUT_S=180

usage() {
    echo "usage: $0 rabbitmq [PYTEST ARGS...]" >&2
    echo "       $0 leasemqd BINARY [PYTEST ARGS...]" >&2
    exit 2
}

# shellcheck source=broker_node.sh
. "$here/broker_node.sh"
RABBITMQADMIN=$(rabbitmqadmin_path "$root")

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
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RMQ_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $RMQ_HTTP_PORT
load_definitions = $dir/definitions.json
loopback_users = none
EOF
    boot_rabbitmq "[rabbitmq_management]" "$RMQ_PORT" "$RMQ_HTTP_PORT"
    write_rabbitmqctl_wrapper
    mgmt_port=$RMQ_PORT
    mgmt_http_port=$RMQ_HTTP_PORT
    # -q drops the CLI's "Listing queues for vhost / ..." banner but keeps the header row.
    mgmt_ctl="$dir/rabbitmqctl -n $RMQ_NODE -q"
    # A node name nothing answers to: `ping` fails.
    mgmt_ctl_unreachable="$dir/rabbitmqctl -n nosuchnode@localhost -q"
}

start_leasemqd() {
    boot_leasemqd "$leasemqd_bin" "$LQD_PORT" "$LQD_HTTP_PORT" -- \
        --listen "127.0.0.1:$LQD_PORT" --management "127.0.0.1:$LQD_HTTP_PORT" \
        --definitions "$dir/definitions.json" --shards 2
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
