#!/usr/bin/env bash
# Workload W4 against the example broker (release build), as reported in examples/README.md:
#   1. acks=all produce latency with 2 followers 50 ms behind (latency minus the delay),
#      with two noise floors measured right before it: how late a plain 50 ms sleep wakes
#      on this machine (timer-jitter) and acks=1 latency on the same broker;
#   2. fetch wake-up after the satisfying append (no followers: the append is the commit);
#   3. 10,000 idle long polls: broker RSS and CPU while they wait, then one append;
#   4. 5,000 long polls (max_wait 2^31-1 ms) whose clients then leave at once: the
#      broker's descriptors and RSS until its descriptors are back;
#   5. acks=1 produce latency, alone and while 10 maximal parked fetches wait (each naming
#      the partition 10,000 times, the --max-partitions-per-request cap, for more bytes
#      than will come): every append runs their try_complete.
# Each measurement starts its own broker on a free loopback port and stops it afterwards.
#
# Environment: RUNS (default 3) repetitions of each; CONNECTIONS (default 10000); LEFT
# (default 5000) polls whose clients leave; CARGO_TARGET_DIR as for cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$workspace/target}"
runs="${RUNS:-3}"
connections="${CONNECTIONS:-10000}"
left="${LEFT:-5000}"
work="$(mktemp -d)"
broker="$target_dir/release/broker"
# shellcheck source=broker_process.sh
source "$here/broker_process.sh"

(cd "$workspace" && timeout 1800 cargo build --release -p purgatory-examples --bin broker --bin broker_load)
load="$target_dir/release/broker_load"
if [[ "$(ulimit -n)" -lt $((connections + 100)) ]]; then
    ulimit -n $((connections + 1000)) || { echo "raise the open-file limit above $connections"; exit 1; }
fi

for run in $(seq 1 "$runs"); do
    echo "== run $run: produce latency, acks=all, 2 followers 50 ms behind"
    timeout 600 "$load" timer-jitter --sleep-ms 50 --samples 200
    start_broker --followers 2 --replication-delay-ms 50
    timeout 600 "$load" produce-latency --broker "$address" --requests 2000 --acks 1
    timeout 600 "$load" produce-latency --broker "$address" --requests 2000 --connections 4 \
        --replication-delay-ms 50
    stop_broker

    echo "== run $run: fetch wake-up, no followers"
    start_broker --followers 0
    timeout 600 "$load" fetch-wakeup --broker "$address" --rounds 1000
    stop_broker

    echo "== run $run: $connections idle long polls, no followers"
    # All from one loopback address: above the default --max-connections-per-ip, and with
    # the load tool's own connections above the default --max-connections (10,000 at most).
    start_broker --followers 0 --max-connections-per-ip "$((connections + left))" \
        --max-connections "$((connections + 100))"
    timeout 900 "$load" idle-polls --broker "$address" --connections "$connections" \
        --max-wait-ms 60000 --idle-s 10 --broker-pid "$broker_pid"
    stop_broker

    echo "== run $run: $left long polls whose clients leave, no followers"
    start_broker --followers 0 --max-connections-per-ip "$((connections + left))" \
        --max-connections "$((connections + 100))"
    timeout 600 "$load" left-polls --broker "$address" --connections "$left" --broker-pid "$broker_pid"
    stop_broker

    echo "== run $run: acks=1 produce latency, alone and while 10 maximal fetches are parked"
    start_broker --followers 0
    timeout 600 "$load" produce-latency --broker "$address" --requests 2000 --acks 1
    timeout 600 "$load" produce-latency --broker "$address" --requests 2000 --acks 1 \
        --parked-fetches 10 --fetch-entries 10000
    stop_broker
done
