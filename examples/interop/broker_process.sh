# Sourced by the measuring scripts: one example broker process at a time, on a free
# loopback port. Needs `work` (a scratch folder the caller removes) and `broker` (the
# binary) set; gives `start_broker FLAGS...` (sets `address` and `broker_pid`) and
# `stop_broker`, and stops the broker and removes `work` on exit.

broker_pid=""

stop_broker() {
    if [[ -n "$broker_pid" ]]; then
        kill -INT "$broker_pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$broker_pid" 2>/dev/null || true
        wait "$broker_pid" 2>/dev/null || true
        broker_pid=""
    fi
}
trap 'stop_broker; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

start_broker() {
    # Emptied first: the new broker's shell truncates it only once it runs, and the loop
    # below must not read the previous broker's address.
    : >"$work/broker.out"
    "$broker" --listen 127.0.0.1:0 "$@" >"$work/broker.out" 2>"$work/broker.err" &
    broker_pid=$!
    address=""
    for _ in $(seq 1 300); do
        address="$(sed -n 's/^broker listening on \([0-9.]*:[0-9]*\).*/\1/p' "$work/broker.out")"
        [[ -n "$address" ]] && return 0
        sleep 0.1
    done
    echo "the broker did not start"; cat "$work/broker.err"; exit 1
}
