"""Checks the example broker with kafka-python: 1,000 messages produced with acks=all must
all be acknowledged, then read back, complete and in order, by a consumer with a manually
assigned partition (no consumer group).

Usage: check_kafka_python.py BOOTSTRAP [--topic demo] [--messages 1000] [--timeout-s 60]
Exit status 0 on success, 1 on a failed check.
"""

import argparse
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout_s
    expected = [b"interop-%06d" % i for i in range(args.messages)]

    # kafka-python uses request_timeout_ms as its network timeout too: keep it above the
    # broker's replication delay and the fetch max wait.
    producer = KafkaProducer(
        bootstrap_servers=args.bootstrap,
        acks="all",
        request_timeout_ms=15000,
        linger_ms=5,
    )
    started = time.monotonic()
    futures = [producer.send(args.topic, value=v, partition=0) for v in expected]
    producer.flush(timeout=max(1.0, deadline - time.monotonic()))
    offsets = []
    for future in futures:
        offsets.append(future.get(timeout=max(1.0, deadline - time.monotonic())).offset)
    producer.close(timeout=5)
    produce_s = time.monotonic() - started
    if offsets != list(range(offsets[0], offsets[0] + len(expected))):
        print("FAIL: acknowledged offsets are not contiguous")
        return 1
    print("produced %d messages with acks=all, all acknowledged (offsets %d..%d) in %.2f s"
          % (len(offsets), offsets[0], offsets[-1], produce_s))

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=500,
        request_timeout_ms=15000,
        consumer_timeout_ms=1000,
    )
    partition = TopicPartition(args.topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, offsets[0])
    received = []
    while len(received) < len(expected) and time.monotonic() < deadline:
        for message in consumer:
            received.append((message.offset, message.value))
            if len(received) >= len(expected):
                break
    consumer.close()
    values = [v for _, v in received]
    if values != expected:
        print("FAIL: read back %d messages; complete and in order: %s"
              % (len(values), values == expected[:len(values)]))
        return 1
    if [o for o, _ in received] != offsets:
        print("FAIL: offsets read back differ from the acknowledged ones")
        return 1
    print("consumed %d messages back from a manually assigned partition, complete and in order"
          % len(received))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # any client error is a failed check, reported in one line
        print("FAIL: %s: %s" % (type(error).__name__, error))
        sys.exit(1)
