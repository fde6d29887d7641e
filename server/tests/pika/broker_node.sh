# Sourced by the acceptance suites' runners (security_rabbitmq.sh, management_rabbitmq.sh):
# starting and stopping the broker a suite runs against, a standalone node of Debian's
# rabbitmq-server or a leasemqd binary, and undoing it all on exit.
#
# The runner sets, before sourcing: SUITE (its name, for messages), RMQ_NODE and
# RMQ_DIST_PORT (the node's name and Erlang distribution port), and START_TIMEOUT_S; and
# `dir`, its fresh fixtures directory, before it starts a broker. It then calls boot_rabbitmq or boot_leasemqd, runs its tests, sets
# `status` to their exit status and exits: the EXIT trap stops the broker, and removes
# `dir` after a pass (keeps it, printing its path, after a failure).

RMQ_BIN=/usr/lib/rabbitmq/bin
RMQ_HOME=/var/lib/rabbitmq

die() {
    echo "$SUITE: $*" >&2
    exit 1
}

port_taken() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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
            echo "$SUITE: $RMQ_NODE did not stop cleanly" >&2
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
        echo "$SUITE: leasemqd ignored SIGTERM for 10 s; killing it" >&2
        kill -KILL "$leasemqd_pid" 2>/dev/null || true
    fi
    wait "$leasemqd_pid" 2>/dev/null || true
}

cleanup() {
    stop_rabbitmq
    stop_leasemqd
    [ -n "${dir:-}" ] || return 0
    if [ "$status" = 0 ]; then
        rm -rf "$dir"
    else
        echo "$SUITE: fixtures and logs kept in $dir" >&2
    fi
}
trap cleanup EXIT

# boot_rabbitmq PLUGINS PORT...: starts the node with the config the runner wrote to
# $dir/rabbitmq.conf and the plugins PLUGINS (an Erlang list: `[]`,
# `[rabbitmq_management]`), once the PORTs it is to listen on and its distribution port are
# free; returns once it has booted (its definitions imported, its plugins started) and
# listens on every PORT.
boot_rabbitmq() {
    local plugins=$1
    shift
    [ "$(id -u)" = 0 ] || die "run as root (the node runs as the rabbitmq user, via su)"
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server is not installed ($RMQ_BIN)"
    local port
    for port in "$@" "$RMQ_DIST_PORT"; do
        if port_taken "$port"; then
            die "port $port is taken (a node left from an earlier run? rabbitmqctl -n $RMQ_NODE stop)"
        fi
    done
    # The package's default plugin file is not read.
    echo "$plugins." >"$dir/enabled_plugins"
    mkdir -p "$dir/mnesia" "$dir/log"
    # The node reads the fixtures, and writes its data and logs, as the rabbitmq user.
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
    # Booting includes importing the definitions and starting the plugins; the listeners
    # open after it.
    ctl await_startup --timeout "$START_TIMEOUT_S" >/dev/null || {
        tail -n 40 "$dir"/log/*.log >&2 2>/dev/null || true
        die "$RMQ_NODE did not finish booting"
    }
    for port in "$@"; do
        until port_taken "$port"; do
            [ "$SECONDS" -lt "$deadline" ] || die "$RMQ_NODE does not listen on $port"
            sleep 1
        done
    done
}

# boot_leasemqd BINARY PORT... -- ARGS...: starts BINARY with ARGS (its log in
# $dir/leasemqd.log) once the PORTs it is to listen on are free; returns once its ready
# line is out and it listens on every PORT.
boot_leasemqd() {
    local bin=$1 port
    shift
    local ports=()
    while [ "$1" != -- ]; do
        ports+=("$1")
        shift
    done
    shift
    for port in "${ports[@]}"; do
        if port_taken "$port"; then die "port $port is taken"; fi
    done
    "$bin" "$@" >"$dir/leasemqd.log" 2>&1 &
    leasemqd_pid=$!
    local deadline=$((SECONDS + START_TIMEOUT_S))
    local listening
    while true; do
        listening=1
        for port in "${ports[@]}"; do
            port_taken "$port" || listening=0
        done
        if grep -q " ready: " "$dir/leasemqd.log" && [ "$listening" = 1 ]; then
            return 0
        fi
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
}

# Where a suite finds Debian's rabbitmqadmin: RABBITMQADMIN, else the package's
# /usr/bin/rabbitmqadmin, else a copy taken out of the package into target/ (fetched with
# apt-get the first time, without installing the package: the script needs only Python).
rabbitmqadmin_path() {
    local root=$1
    if [ -n "${RABBITMQADMIN:-}" ]; then
        echo "$RABBITMQADMIN"
    elif [ -x /usr/bin/rabbitmqadmin ]; then
        echo /usr/bin/rabbitmqadmin
    else
        local unpacked="$root/target/rabbitmqadmin"
        if [ ! -x "$unpacked/usr/bin/rabbitmqadmin" ] && command -v apt-get >/dev/null 2>&1; then
            mkdir -p "$unpacked"
            (cd "$unpacked" && rm -f ./*.deb &&
                { apt-get download -q rabbitmq-server >/dev/null 2>&1 ||
                    { apt-get update -qq && apt-get download -q rabbitmq-server >/dev/null; }; } &&
                dpkg-deb -x ./rabbitmq-server_*.deb . && rm -f ./*.deb) >&2 ||
                echo "$SUITE: could not fetch rabbitmqadmin with apt-get" >&2
        fi
        echo "$unpacked/usr/bin/rabbitmqadmin"
    fi
}
