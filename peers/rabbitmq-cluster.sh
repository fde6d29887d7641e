#!/usr/bin/env bash
# A three-node RabbitMQ cluster on one host, on loopback, from Debian's `rabbitmq-server`
# package: the peer that `leasemq-loadgen throughput --target … --target … --target …
# --queue-arg x-queue-type=quorum` measures replicated leasemqd against.
#
#   peers/rabbitmq-cluster.sh up     [BASE]   install if missing, start, cluster
#   peers/rabbitmq-cluster.sh status [BASE]   cluster_status as node 1 sees it
#   peers/rabbitmq-cluster.sh down   [BASE]   stop the three nodes and epmd
#
# Nodes rabbit1..3@localhost listen for AMQP on 127.0.0.1:5672, 5673, 5674 and for Erlang
# distribution on 25672..25674; epmd listens on 127.0.0.1 only. Each node keeps its data
# and logs in BASE/rmq/N (BASE: the argument, else $RMQ_CLUSTER_BASE, else
# /tmp/rmq-cluster); `down` leaves them, so `up` afterwards brings back the same cluster
# (remove BASE for a fresh one). Nodes run as the package's `rabbitmq` user, with its home
# (/var/lib/rabbitmq) and so one Erlang cookie for all three. Runs as root, without
# systemd: the package starts nothing on its own here. CI never runs this.
set -euo pipefail

BASE=${2:-${RMQ_CLUSTER_BASE:-/tmp/rmq-cluster}}
RMQ_HOME=/var/lib/rabbitmq
RMQ_BIN=/usr/lib/rabbitmq/bin
NODES=(1 2 3)
# How long each node may take to boot (three BEAM VMs on two cores: about 20-40 s).
START_TIMEOUT_S=180

node_name() { echo "rabbit$1@localhost"; }
amqp_port() { echo $((5671 + $1)); }
dist_port() { echo $((25671 + $1)); }

die() {
    echo "rabbitmq-cluster: $*" >&2
    exit 1
}

# Runs a command as the `rabbitmq` user in the environment every node and CLI call shares.
as_rabbitmq() {
    local cmd=$1
    su rabbitmq -s /bin/sh -c "env HOME=$RMQ_HOME ERL_EPMD_ADDRESS=127.0.0.1 $cmd"
}

# rabbitmqctl against node N: ctl N ARGS...
ctl() {
    local n=$1
    shift
    as_rabbitmq "$RMQ_BIN/rabbitmqctl -n $(node_name "$n") $*"
}

running() { ctl "$1" ping >/dev/null 2>&1; }

port_taken() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install_if_missing() {
    [ -x "$RMQ_BIN/rabbitmq-server" ] && return 0
    echo "rabbitmq-cluster: installing rabbitmq-server (apt-get)"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "the package has no $RMQ_BIN/rabbitmq-server"
}

# One cookie, written before any node starts: three nodes booting at once would otherwise
# race to create it.
ensure_cookie() {
    local cookie=$RMQ_HOME/.erlang.cookie
    [ -s "$cookie" ] && return 0
    (umask 077 && head -c 64 /dev/urandom | tr -dc 'A-Z' | head -c 20 >"$cookie")
    chown rabbitmq: "$cookie"
    chmod 400 "$cookie"
}

start_node() {
    local n=$1 dir=$BASE/rmq/$1
    if port_taken "$(amqp_port "$n")" || port_taken "$(dist_port "$n")"; then
        die "port $(amqp_port "$n") or $(dist_port "$n") is taken, and not by $(node_name "$n")" \
            "(a single-node RabbitMQ? stop it first: rabbitmqctl stop)"
    fi
    mkdir -p "$dir/mnesia" "$dir/log"
    chown -R rabbitmq: "$dir"
    as_rabbitmq "RABBITMQ_NODENAME=$(node_name "$n") RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT=$(amqp_port "$n") RABBITMQ_DIST_PORT=$(dist_port "$n") \
        RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
        RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
        $RMQ_BIN/rabbitmq-server -detached" >"$dir/start.log" 2>&1 ||
        die "$(node_name "$n") did not start; see $dir/start.log and $dir/log"
}

# Waits until node N answers, then until its RabbitMQ application has started.
wait_booted() {
    local n=$1 deadline=$((SECONDS + START_TIMEOUT_S))
    until running "$n"; do
        [ "$SECONDS" -lt "$deadline" ] ||
            die "$(node_name "$n") did not come up in ${START_TIMEOUT_S}s; see $BASE/rmq/$n/log"
        sleep 2
    done
    ctl "$n" await_startup >/dev/null ||
        die "$(node_name "$n") did not finish booting; see $BASE/rmq/$n/log"
}

# Whether node N (2 or 3) already belongs to node 1's cluster: its own view names node 1.
clustered() {
    ctl "$1" cluster_status --formatter json 2>/dev/null | grep -q "\"$(node_name 1)\""
}

up() {
    [ "$(id -u)" = 0 ] || die "run as root (nodes run as the rabbitmq user, via su)"
    install_if_missing
    ensure_cookie
    mkdir -p "$BASE/rmq"
    chmod 755 "$BASE" "$BASE/rmq"
    # Start every stopped node before waiting on any: a node restarted from its data waits
    # for the peers it last saw.
    for n in "${NODES[@]}"; do
        if running "$n"; then
            echo "$(node_name "$n") is already running"
        else
            start_node "$n"
        fi
    done
    for n in "${NODES[@]}"; do
        wait_booted "$n"
    done
    for n in "${NODES[@]:1}"; do
        clustered "$n" && continue
        ctl "$n" stop_app
        ctl "$n" join_cluster "$(node_name 1)"
        ctl "$n" start_app
    done
    ctl 1 cluster_status
    ctl 1 version
}

status() {
    running 1 || die "$(node_name 1) is not running (peers/rabbitmq-cluster.sh up starts it)"
    ctl 1 cluster_status
}

down() {
    [ "$(id -u)" = 0 ] || die "run as root"
    [ -x "$RMQ_BIN/rabbitmqctl" ] || { echo "rabbitmq-server is not installed"; return 0; }
    for n in "${NODES[@]}"; do
        if running "$n"; then
            ctl "$n" stop || echo "rabbitmq-cluster: $(node_name "$n") did not stop cleanly" >&2
        else
            echo "$(node_name "$n") is not running"
        fi
    done
    # epmd exits on `-kill` once no node is registered with it.
    local epmd
    epmd=$(command -v epmd || ls /usr/lib/erlang/erts-*/bin/epmd 2>/dev/null | head -n 1 || true)
    if [ -n "$epmd" ] && pgrep -u rabbitmq -x epmd >/dev/null; then
        as_rabbitmq "$epmd -kill" >/dev/null 2>&1 || true
        sleep 1
        local pid
        for pid in $(pgrep -u rabbitmq -x epmd || true); do
            kill "$pid"
        done
    fi
    echo "stopped; data and logs are kept in $BASE/rmq"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) status ;;
    *)
        echo "usage: $0 up|down|status [BASE]   (BASE: \$RMQ_CLUSTER_BASE or /tmp/rmq-cluster)" >&2
        exit 2
        ;;
esac
