"""Apache's C++ RocketMQ client (PyPI ``rocketmq`` 0.4.4) as a command-line peer for tests.

Run it in a subprocess, so that a crash or the library's background threads cannot take down
pytest; every subcommand prints one JSON document on stdout (logs go to ~/logs/rocketmq-cpp).

    python tests/cpp_peer.py produce --namesrv ADDR --topic T [--group G] [--batch] < messages.json
    python tests/cpp_peer.py pull    --namesrv ADDR --topic T [--group G] [--expression E]
    python tests/cpp_peer.py push    --namesrv ADDR --topic T --group G --expect N [--timeout S]
    python tests/cpp_peer.py push    --namesrv ADDR --topic T --group G --stop-file PATH

``produce`` reads a JSON list of messages ``{"body": str, "tags": str, "keys": str,
"properties": {name: value}}`` (or generates ``--count`` of them) and prints
``{"results": [...]}``, one result per send (or one for a batch):
``{"status": "OK", "msg_id": ..., "offset": ...}`` (or ``{"error": ...}``).

``pull`` reads every queue from offset 0 to its end and prints ``{"messages": [...], "pulls":
[[broker, queue, offset, status, nextBeginOffset], ...]}``. ``push`` consumes as a group until
``--expect`` messages arrived (or ``--timeout``, or until ``--stop-file`` exists), waits
``--linger`` seconds, shuts down and prints ``{"messages": [...]}``; it first prints
``{"started": true}`` once it has started, so read the last line. Each message has topic,
tags, keys, body (text; bodies are read through a C string, so they end at the first NUL byte),
id, queue_id, queue_offset, store_size, commit_log_offset, born/store timestamps and the user
properties named with ``--props``. ``push --fail-keys K1,K2`` fails the first delivery of those
messages (they are listed under ``failed``), which the client then sends back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _message_json(msg, props) -> dict:
    return {
        "topic": _text(msg.topic), "tags": _text(msg.tags), "keys": _text(msg.keys),
        "body": _text(msg.body), "id": _text(msg.id), "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset, "store_size": msg.store_size,
        "commit_log_offset": msg.commit_log_offset, "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp, "reconsume_times": msg.reconsume_times,
        "properties": {p: _text(msg.get_property(p)) for p in props},
    }


def _build(topic: str, spec: dict):
    from rocketmq.client import Message

    msg = Message(topic)
    if spec.get("keys"):
        msg.set_keys(spec["keys"])
    if spec.get("tags"):
        msg.set_tags(spec["tags"])
    for name, value in (spec.get("properties") or {}).items():
        msg.set_property(name, value)
    msg.set_body(spec.get("body", ""))
    return msg


def produce(args) -> dict:
    from rocketmq.client import Producer

    if args.count is not None:
        specs = [{"body": f"{args.body_prefix}{i}", "tags": args.tags, "keys": f"k{i}"}
                 for i in range(args.count)]
    else:
        specs = json.load(sys.stdin)
    producer = Producer(args.group, timeout=args.send_timeout)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        producer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    producer.start()
    results = []
    try:
        if args.batch:
            msgs = [_build(args.topic, s) for s in specs]
            try:
                r = producer.send_batch(msgs)
                results.append({"status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
            except Exception as exc:  # the library raises its own exception types
                results.append({"error": f"{type(exc).__name__}: {exc}"})
        else:
            for spec in specs:
                try:
                    r = producer.send_sync(_build(args.topic, spec))
                    results.append({"status": r.status.name, "msg_id": r.msg_id,
                                    "offset": r.offset})
                except Exception as exc:
                    results.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        producer.shutdown()
    return {"results": results}


def pull(args) -> dict:
    """Pull every queue from offset 0 until NO_NEW_MSG.

    The wrapper's own ``PullConsumer.pull`` keys its offsets by topic and queue id only, so
    with two brokers it skips messages; this loop makes the same library calls per
    (broker, queue).
    """
    import ctypes

    from rocketmq.client import PullConsumer, RecvMessage
    from rocketmq.ffi import _CMessageQueue, _CPullStatus, dll

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    consumer.start()
    out, statuses = [], []
    try:
        queues = ctypes.POINTER(_CMessageQueue)()
        size = ctypes.c_int()
        dll.FetchSubscriptionMessageQueues(consumer._handle, args.topic.encode(),
                                           ctypes.pointer(queues), ctypes.pointer(size))
        for i in range(size.value):
            mq = queues[i]
            offset, rounds, timeouts = 0, 0, 0
            while rounds < 100000:
                rounds += 1
                res = dll.Pull(consumer._handle, ctypes.pointer(mq), args.expression.encode(),
                               offset, args.max_num)
                status = _CPullStatus(res.pullStatus).name
                statuses.append([mq.brokerName.decode(), mq.queueId, offset, status,
                                 res.nextBeginOffset])
                if res.pullStatus != _CPullStatus.BROKER_TIMEOUT:
                    offset = res.nextBeginOffset
                if res.pullStatus == _CPullStatus.FOUND:
                    for k in range(res.size):
                        m = _message_json(RecvMessage(res.msgFoundList[k]), args.props)
                        m["broker"] = mq.brokerName.decode()
                        out.append(m)
                # a timed-out pull is asked again (a busy broker on shared cores), as a
                # consumer would; 20 in a row end this queue
                timeouts = timeouts + 1 if res.pullStatus == _CPullStatus.BROKER_TIMEOUT else 0
                done = res.pullStatus == _CPullStatus.NO_NEW_MSG or timeouts >= 20
                dll.ReleasePullResult(res)
                if done:
                    break
        dll.ReleaseSubscriptionMessageQueue(queues)
    finally:
        consumer.shutdown()
    return {"messages": out, "pulls": statuses}


def _subscribe(consumer, topic: str, on_message, expression: str) -> None:
    """``PushConsumer.subscribe`` with a callback that answers RECONSUME_LATER itself: the
    wrapper's own turns an exception into RECONSUME_LATER but then raises it out of the ctypes
    callback, whose return value is then undefined (some failed messages were taken as
    consumed, and never sent back)."""
    from rocketmq.client import RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import _CConsumeStatus, dll

    def raw(_, msg):
        ok = on_message(RecvMessage(msg))
        return (_CConsumeStatus.CONSUME_SUCCESS if ok else _CConsumeStatus.RECONSUME_LATER).value

    ffi_check(dll.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    consumer._register_callback(raw)


def push(args) -> dict:
    from rocketmq.client import PushConsumer

    got, failed = [], []
    lock = threading.Lock()
    done = threading.Event()

    def on_message(msg) -> bool:
        """Whether the message is consumed (False: RECONSUME_LATER, the client sends it back)."""
        if _text(msg.keys) in args.fail_keys and msg.reconsume_times < args.fail_times:
            with lock:
                failed.append(_message_json(msg, args.props))
            return False
        with lock:
            got.append(_message_json(msg, args.props))
            if len(got) >= args.expect:
                done.set()
        return True

    while args.start_file and not os.path.exists(args.start_file):
        time.sleep(0.05)  # the test sets the scene first (it may depend on our pid)
    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    _subscribe(consumer, args.topic, on_message, args.expression)
    consumer.start()
    print(json.dumps({"started": True}), flush=True)
    try:
        if args.stop_file:
            deadline = time.monotonic() + args.timeout
            while not os.path.exists(args.stop_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            done.wait(args.timeout)
        time.sleep(args.linger)  # the client persists offsets every 5 s and at shutdown
    finally:
        consumer.shutdown()
    with lock:
        return {"messages": list(got), "failed": list(failed)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("produce", "pull", "push"):
        s = sub.add_parser(name)
        s.add_argument("--namesrv", required=True)
        s.add_argument("--topic", required=True)
        s.add_argument("--group", default=f"cpp_peer_{name}")
        s.add_argument("--access-key")
        s.add_argument("--secret-key")
        if name == "produce":
            s.add_argument("--batch", action="store_true", help="one send_batch call")
            s.add_argument("--send-timeout", type=int, default=5000)
            s.add_argument("--count", type=int,
                           help="send COUNT generated messages instead of reading stdin")
            s.add_argument("--body-prefix", default="message ")
            s.add_argument("--tags", default="")
        else:
            s.add_argument("--expression", default="*")
            s.add_argument("--props", type=lambda v: [x for x in v.split(",") if x], default=[],
                           help="comma-separated property names to report")
        if name == "pull":
            s.add_argument("--max-num", type=int, default=32)
        if name == "push":
            s.add_argument("--expect", type=int, default=sys.maxsize)
            s.add_argument("--stop-file", help="consume until this file exists (a group member "
                           "whose share is not known in advance)")
            s.add_argument("--timeout", type=float, default=30.0)
            s.add_argument("--linger", type=float, default=0.0)
            s.add_argument("--fail-keys", type=lambda v: set(x for x in v.split(",") if x),
                           default=set(), help="fail the first delivery of messages with these "
                           "keys (RECONSUME_LATER: the client sends them back)")
            s.add_argument("--start-file", help="start the consumer once this file exists")
            s.add_argument("--fail-times", type=int, default=1, help="fail those messages' "
                           "deliveries while their reconsume times are below this")
    args = p.parse_args(argv)
    result = {"produce": produce, "pull": pull, "push": push}[args.command](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
