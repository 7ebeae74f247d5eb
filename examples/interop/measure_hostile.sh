#!/usr/bin/env bash
# The memory each hostile client of issues #23 and #29 makes the broker hold (release build), as
# reported in examples/README.md. For each scenario a broker with the default flags starts
# on a free loopback port, `broker_load hostile` connects N clients that each do the
# scenario and stay, and reads the broker's RSS and descriptors from /proc before, 2 s
# after the last client, and 1 s after they all left; then the broker is stopped.
#
#   pipelined-polls  a long poll (min_bytes, max_wait 2^31-1) + 1 MiB + 4 KiB behind it
#   slow-readers     a fetch of one 8 MiB batch (max_bytes 1), never read
#   metadata-echo    a Metadata naming 3,000 unknown 32,000-byte topics (96 MB), never read
#   partial-frames   1 MiB of a request announced as 100 MiB
#   padded-poll      a Fetch v12 long poll padded to 99 MiB in a tagged field (#29, finding 1)
#   list-offsets-echo, produce-echo, fetch-echo
#                    a request naming one unknown 90 MiB topic, its echo never read (finding 3)
#   polls-then-partial  4 long polls, then 85 MiB of a request announced as 100 MiB (finding 4)
#   retention-readers  16 fetches of the segment appended just before, never read, with
#                    --retention-bytes 16777216 (issue #38, finding 5)
#
# Environment: BROKER (default: this workspace's target/release/broker) to measure another
# build, e.g. one of an older commit; EXTRA_FLAGS for the broker; CARGO_TARGET_DIR; ONLY, a
# space-separated list of the scenarios to run (default: all).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$workspace/target}"
work="$(mktemp -d)"
# shellcheck source=broker_process.sh
source "$here/broker_process.sh"

(cd "$workspace" && timeout 1800 cargo build --release -p purgatory-examples --bin broker --bin broker_load)
broker="${BROKER:-$target_dir/release/broker}"
load="$target_dir/release/broker_load"


measure() {
    local scenario="$1" connections="$2" mib="${3:-90}"
    if [[ -n "${ONLY:-}" && " $ONLY " != *" $scenario "* ]]; then
        return
    fi
    # shellcheck disable=SC2086
    start_broker --followers 0 ${EXTRA_FLAGS:-}
    timeout 300 "$load" hostile --broker "$address" --broker-pid "$broker_pid" \
        --scenario "$scenario" --connections "$connections" --mib "$mib"
    stop_broker
}

measure pipelined-polls 300
measure slow-readers 40
measure metadata-echo 4
measure partial-frames 300
measure padded-poll 25 99
measure list-offsets-echo 10 90
measure produce-echo 5 90
measure fetch-echo 5 90
measure polls-then-partial 3 85
EXTRA_FLAGS="--retention-bytes 16777216 ${EXTRA_FLAGS:-}" measure retention-readers 400 32
