#!/usr/bin/env bash
# How threads wait, idle and busy, in one run: the load generator of this tree against the
# load generators of earlier commits, each case run by every build in turn, round after
# round, so that all builds meet the same machine noise. A change to how threads wait or
# hand off is measured with this against the build before the waits changed (ba28709) as
# well as against its parent: small losses add up unseen when each change is compared only
# with the one before it.
#
#   bench-harness/waits.sh [--rounds N] [--duration D] [--cases LIST] [REV ...]
#
# REV: commits to compare with (default: ba28709, the last build whose waits only
# yielded). Each is built once into target/waits/<rev> from a worktree under it.
# --rounds: rounds of every case and build (default 5); medians are reported.
# --duration: the measured window of each throughput run (default 3s).
# --cases: a comma-separated subset of the cases below (default: all of them).
#
# Cases (2 shards, 16-byte bodies; "busy": beside two CPU-bound threads of another
# process, the same process for every build, started from this tree's load generator):
#   pm8 pm4 pm1      per-message put/ack, N producers, N consumers, N queues, idle
#   busy-pm4         per-message 4/4/4 beside the busy threads
#   batch2           batched 2/2/2, idle
#   busy-batch2      batched 2/2/2 beside the busy threads
#   late             redelivery lateness p99 with 1 000 000 leases, idle (µs, lower is
#                    better; every other case is acked msg/s)
#
# Prints each run as it ends, then a table of medians, each build's ratio to this tree,
# and each build's busy rates as a share of its idle ones.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
duration=3s
cases="pm8,pm4,pm1,busy-pm4,batch2,busy-batch2,late"
revs=()
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) revs+=("$1"); shift ;;
    esac
done
[ ${#revs[@]} -gt 0 ] || revs=(ba28709)
IFS=, read -r -a case_list <<<"$cases"

root=$(pwd)
work=$root/target/waits
mkdir -p "$work"

echo "== building this tree"
cargo build --release --locked -p leasemq-loadgen >&2
cp target/release/leasemq-loadgen "$work/lg-tree"
builds=(tree)
for rev in "${revs[@]}"; do
    sha=$(git rev-parse --short=9 "$rev^{commit}")
    bin=$work/lg-$sha
    if [ ! -x "$bin" ]; then
        echo "== building $rev ($sha)"
        src=$work/src-$sha
        # A worktree left registered by a removed target/ would refuse the add.
        git worktree prune
        [ -d "$src" ] || git worktree add --detach "$src" "$sha" >&2
        (cd "$src" && CARGO_TARGET_DIR=$work/target-$sha cargo build --release --locked \
            -p leasemq-loadgen >&2)
        cp "$work/target-$sha/release/leasemq-loadgen" "$bin"
    fi
    builds+=("$sha")
done

# Two CPU-bound threads in a process of their own, until this script closes their input.
hog_pid=
start_hog() {
    local fifo
    fifo=$(mktemp -u)
    mkfifo "$fifo"
    "$work/lg-tree" __background-load 2 <"$fifo" &
    hog_pid=$!
    exec 3>"$fifo"
    rm -f "$fifo"
    sleep 0.2
}
stop_hog() {
    exec 3>&-
    kill "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=
}
trap '[ -z "$hog_pid" ] || stop_hog' EXIT

# One run of a case by a build: prints its figure.
run_case() {
    local bin=$1 case=$2 out
    local pm=(throughput --shards 2 --duration "$duration" --api per-message)
    local batch=(throughput --shards 2 --duration "$duration" --producers 2 --consumers 2 --queues 2)
    case $case in
    pm8) out=$("$bin" "${pm[@]}" --producers 8 --consumers 8 --queues 8) ;;
    pm4) out=$("$bin" "${pm[@]}" --producers 4 --consumers 4 --queues 4) ;;
    pm1) out=$("$bin" "${pm[@]}" --producers 1 --consumers 1 --queues 1) ;;
    busy-pm4)
        start_hog
        out=$("$bin" "${pm[@]}" --producers 4 --consumers 4 --queues 4)
        stop_hog ;;
    batch2) out=$("$bin" "${batch[@]}") ;;
    busy-batch2)
        start_hog
        out=$("$bin" "${batch[@]}")
        stop_hog ;;
    late)
        out=$("$bin" redelivery --leases 1000000 --shards 1)
        # The lateness row: its name, count, p50, p90, p99 (µs).
        echo "$out" | awk '$1 == "redelivery" && $2 == "lateness" { print $6; exit }'
        return ;;
    *) echo "unknown case $case" >&2; exit 2 ;;
    esac
    echo "$out" | awk '$1 == "acked" { gsub(",", "", $2); print $2; exit }'
}

results=$work/results.txt
: >"$results"
for round in $(seq 1 "$rounds"); do
    for case in "${case_list[@]}"; do
        # Each round starts with another build, so that no build always runs first.
        n=${#builds[@]}
        for i in $(seq 0 $((n - 1))); do
            build=${builds[$(((i + round) % n))]}
            figure=$(run_case "$work/lg-$build" "$case")
            echo "round $round  $case  $build  $figure"
            echo "$case $build $figure" >>"$results"
        done
    done
done

echo
echo "medians of $rounds rounds (acked msg/s; late: p99 µs); ratio: build / tree"
awk -v builds="${builds[*]}" -v cases="${case_list[*]}" '
    { v[$1 " " $2] = v[$1 " " $2] " " $3 }
    function median(list,    a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
        if (n == 0) return 0
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
        nb = split(builds, b, " "); nc = split(cases, c, " ")
        printf "%-12s", "case"
        for (i = 1; i <= nb; i++) printf " %12s", b[i]
        for (i = 2; i <= nb; i++) printf " %10s", b[i] "/tree"
        printf "\n"
        for (k = 1; k <= nc; k++) {
            printf "%-12s", c[k]
            for (i = 1; i <= nb; i++) { m[c[k], i] = median(v[c[k] " " b[i]]); printf " %12.0f", m[c[k], i] }
            for (i = 2; i <= nb; i++) printf " %10.2f", m[c[k], 1] ? m[c[k], i] / m[c[k], 1] : 0
            printf "\n"
        }
        printf "\nbusy / idle\n"
        split("busy-pm4:pm4 busy-batch2:batch2", pairs, " ")
        for (p in pairs) {
            split(pairs[p], q, ":")
            if (!((q[1], 1) in m) || !((q[2], 1) in m)) continue
            printf "%-12s", q[1]
            for (i = 1; i <= nb; i++) printf " %12.3f", m[q[2], i] ? m[q[1], i] / m[q[2], i] : 0
            printf "\n"
        }
    }' "$results"
