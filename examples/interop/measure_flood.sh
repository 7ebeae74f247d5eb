#!/usr/bin/env bash
# Issue #29, finding 2, against the example broker (release build, default flags: 2
# followers 50 ms behind): CONNECTIONS (default 10000) polls that cannot complete, each
# naming the partition 6 times, wait while 8 connections send tiny acks=0 produces for
# FLOOD_S (default 20) s; a good client's acks=all produces (timeout 5 s) during the flood,
# how long after it the high watermark caught up, then how long SIGTERM takes.
#
# Environment: RUNS (default 3); CONNECTIONS; FLOOD_S; CATCH_UP_S (default 300: how long
# after the flood the high watermark may take); BROKER_FLAGS (e.g. "--followers 0"); BROKER (a broker binary to measure
# instead of this workspace's, e.g. one built at another commit); CARGO_TARGET_DIR as for
# cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$workspace/target}"
runs="${RUNS:-3}"
connections="${CONNECTIONS:-10000}"
flood_s="${FLOOD_S:-20}"
catch_up_s="${CATCH_UP_S:-300}"
work="$(mktemp -d)"
# shellcheck source=broker_process.sh
source "$here/broker_process.sh"

(cd "$workspace" && timeout 1800 cargo build --release -p purgatory-examples --bin broker --bin broker_load)
broker="${BROKER:-$target_dir/release/broker}"
load="$target_dir/release/broker_load"
if [[ "$(ulimit -n)" -lt $((connections + 100)) ]]; then
    ulimit -n $((connections + 1000)) || { echo "raise the open-file limit above $connections"; exit 1; }
fi

for run in $(seq 1 "$runs"); do
    echo "== run $run: ${BROKER_FLAGS:-default flags}, $connections parked polls, 8 connections of acks=0 produces for $flood_s s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    # All from one loopback address: above the default --max-connections-per-ip, and with
    # the flood's own connections above the default --max-connections (10,000 at most; a
    # later flag in BROKER_FLAGS wins).
    # shellcheck disable=SC2086
    start_broker --max-connections-per-ip "$((connections + 100))" \
        --max-connections "$((connections + 100))" ${BROKER_FLAGS:-}
    timeout 900 "$load" flood --broker "$address" --connections "$connections" --flood-s "$flood_s" \
        --catch-up-s "$catch_up_s" || true
    sent=$(date +%s.%N)
    kill -TERM "$broker_pid"
    for _ in $(seq 1 3000); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$broker_pid" 2>/dev/null; then
        echo "  SIGTERM: still running after 300 s"
    else
        echo "  SIGTERM -> exit: $(echo "$(date +%s.%N) - $sent" | bc) s"
    fi
    stop_broker
done
