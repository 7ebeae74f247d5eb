#!/usr/bin/env bash
# Interoperability check of the example broker with kafka-python (from PyPI).
#
# Builds and starts the broker on a free loopback port, creates a Python venv with
# kafka-python, produces 1,000 messages with acks=all (all must be acknowledged) and reads
# them back with a manually assigned consumer (complete and in order).
# Exits non-zero on any failure; always stops the broker; every step has a time limit.
#
# Environment:
#   BROKER_PROFILE      debug (default) or release
#   CARGO_TARGET_DIR    cargo's target directory (default: <workspace>/target)
#   INTEROP_VENV        where the venv lives (default: $CARGO_TARGET_DIR/interop-venv); reused
#   KAFKA_PYTHON_SPEC   pip requirement (default: kafka-python==3.0.12)
#   BROKER_FLAGS        extra broker flags (e.g. --stall-followers, to see the check fail)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
profile="${BROKER_PROFILE:-debug}"
target_dir="${CARGO_TARGET_DIR:-$workspace/target}"
venv="${INTEROP_VENV:-$target_dir/interop-venv}"
spec="${KAFKA_PYTHON_SPEC:-kafka-python==3.0.12}"
work="$(mktemp -d)"
broker_pid=""

stop_broker() {
    if [[ -n "$broker_pid" ]] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -INT "$broker_pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$broker_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$broker_pid" 2>/dev/null || true
        wait "$broker_pid" 2>/dev/null || true
    fi
    broker_pid=""
}
cleanup() {
    stop_broker
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "== building the broker ($profile)"
build_flags=(-p purgatory-examples --bin broker)
[[ "$profile" == "release" ]] && build_flags+=(--release)
(cd "$workspace" && timeout 1200 cargo build "${build_flags[@]}")
broker_bin="$target_dir/$profile/broker"

echo "== python venv with $spec ($venv)"
if ! "$venv/bin/python" -c "import kafka" 2>/dev/null; then
    timeout 120 python3 -m venv "$venv"
    timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
fi
"$venv/bin/python" -c "import kafka; print('kafka-python', kafka.__version__)"

echo "== starting the broker"
# shellcheck disable=SC2086 # BROKER_FLAGS is a list of words on purpose
"$broker_bin" --listen 127.0.0.1:0 --followers 2 --replication-delay-ms 50 ${BROKER_FLAGS:-} \
    >"$work/broker.out" 2>"$work/broker.err" &
broker_pid=$!
address=""
for _ in $(seq 1 300); do
    address="$(sed -n 's/^broker listening on \([0-9.]*:[0-9]*\).*/\1/p' "$work/broker.out")"
    [[ -n "$address" ]] && break
    if ! kill -0 "$broker_pid" 2>/dev/null; then
        echo "FAIL: the broker exited at start"; cat "$work/broker.err"; exit 1
    fi
    sleep 0.1
done
if [[ -z "$address" ]]; then
    echo "FAIL: the broker did not start listening within 30 s"; exit 1
fi
echo "broker at $address"

echo "== kafka-python: 1,000 messages, acks=all, then read back"
status=0
timeout 180 "$venv/bin/python" "$here/check_kafka_python.py" "$address" --messages 1000 \
    --timeout-s 120 || status=$?

if ! kill -0 "$broker_pid" 2>/dev/null; then
    echo "FAIL: the broker died during the check"; cat "$work/broker.err"; status=1
fi
stop_broker
if [[ -s "$work/broker.err" ]]; then
    echo "-- broker stderr:"; cat "$work/broker.err"
fi
if [[ $status -ne 0 ]]; then
    echo "interop: FAILED"
    exit "$status"
fi
echo "interop: kafka-python OK"
