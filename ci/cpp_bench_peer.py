#!/usr/bin/env python
"""Timed runs of Apache's C++ client (PyPI ``rocketmq`` 0.4.4) for ci/bench_protocol.py.

Runs in its own process (the library starts threads of its own) and prints one JSON line:

    cpp_bench_peer.py produce NAMESRV TOPIC COUNT SIZE  ->  {"count": N, "seconds": S, "cpu": C}
    cpp_bench_peer.py pull    NAMESRV TOPIC GROUP       ->  {"count": N, "bytes": B, "seconds": S,
                                                             "cpu": C}

``cpu`` is the CPU seconds (user + system, every thread of this process: the library's own
threads included) spent between the start and the end of the timed loop.

``pull`` reads every queue of the topic from offset 0 until PULL_NOT_FOUND, fetching each
message's body, so it delivers the same payload our reader does.
"""
import json
import resource
import sys
import time


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def produce(namesrv: str, topic: str, count: int, size: int) -> dict:
    from rocketmq.client import Message, Producer

    producer = Producer("cpp-bench-producer")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    body = b"x" * size
    started, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(count):
        msg = Message(topic)
        msg.set_body(body)
        producer.send_sync(msg)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    producer.shutdown()
    return {"count": count, "seconds": seconds, "cpu": cpu}


def pull(namesrv: str, topic: str, group: str) -> dict:
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.start()
    count = size = 0
    started, cpu = time.perf_counter(), cpu_seconds()
    for msg in consumer.pull(topic):
        size += len(msg.body)
        count += 1
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    consumer.shutdown()
    return {"count": count, "bytes": size, "seconds": seconds, "cpu": cpu}


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "produce":
        result = produce(args[0], args[1], int(args[2]), int(args[3]))
    elif command == "pull":
        result = pull(args[0], args[1], args[2])
    else:
        raise SystemExit(f"unknown command {command!r}; use produce or pull")
    print(json.dumps(result), flush=True)
