"""The official gRPC client (PyPI ``rocketmq-python-client`` 5.1.2) as a command-line peer.

It installs a top-level ``rocketmq`` package, as Apache's C++ client does, so it lives in a venv
of its own (``.venv-grpc-peer``, made by ci/setup.sh) and runs in a subprocess; every subcommand
prints one JSON document on stdout (the library logs to ~/logs/rocketmq_python).

    python tests/grpc_peer.py produce --endpoints E --topic T [--tls --ca FILE] < messages.json
    python tests/grpc_peer.py receive --endpoints E --topic T --group G --expect N [--timeout S]

Both take ``--namespace NS`` (the client's 5.x namespace: its topics and group are NS%name).

``produce`` reads a JSON list of ``{"body": str, "tag": str, "keys": [str], "properties":
{name: value}, "message_group": str}`` and sends them one by one, printing ``{"results":
[{"message_id": ..., "offset": ...} | {"error": ...}]}``. ``receive`` runs a SimpleConsumer
until ``--expect`` messages arrived (each acknowledged) or ``--timeout`` passed, and prints
``{"messages": [{"topic", "body", "tag", "keys", "properties", "message_group", "message_id",
"delivery_attempt"}], "errors": [...]}``.

The library verifies TLS against gRPC's default roots only; ``--ca`` points gRPC at our
self-signed certificate through ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _config(args):
    from rocketmq import ClientConfiguration, Credentials

    credentials = Credentials(args.access_key or "", args.secret_key or "")
    return ClientConfiguration(args.endpoints, credentials, namespace=args.namespace,
                               request_timeout=args.request_timeout)


def produce(args) -> dict:
    from rocketmq import Message, Producer

    specs = json.load(sys.stdin)
    producer = Producer(_config(args), (args.topic,), tls_enable=args.tls)
    producer.startup()
    results = []
    try:
        for spec in specs:
            msg = Message()
            msg.topic = args.topic
            msg.body = spec["body"].encode("utf-8")
            if spec.get("tag"):
                msg.tag = spec["tag"]
            for key in spec.get("keys") or []:
                msg.keys = key
            for name, value in (spec.get("properties") or {}).items():
                msg.add_property(name, value)
            if spec.get("message_group"):
                msg.message_group = spec["message_group"]
            try:
                receipt = producer.send(msg)
                results.append({"message_id": receipt.message_id, "offset": receipt.offset})
            except Exception as exc:  # the library raises its own exception types
                results.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        producer.shutdown()
    return {"results": results}


def receive(args) -> dict:
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(_config(args), args.group,
                              {args.topic: FilterExpression(args.expression)},
                              await_duration=args.await_duration, tls_enable=args.tls)
    consumer.startup()
    got, errors = [], []
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < args.expect and time.monotonic() < deadline:
            try:
                messages = consumer.receive(32, args.invisible)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)
                continue
            for m in messages or []:
                got.append({
                    "topic": m.topic, "body": m.body.decode("utf-8", "replace"), "tag": m.tag,
                    "keys": sorted(m.keys or []), "properties": dict(m.properties or {}),
                    "message_group": m.message_group, "message_id": m.message_id,
                    "delivery_attempt": m.delivery_attempt})
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return {"messages": got, "errors": errors}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("produce", "receive"):
        s = sub.add_parser(name)
        s.add_argument("--endpoints", required=True)
        s.add_argument("--topic", required=True)
        s.add_argument("--tls", action="store_true")
        s.add_argument("--ca", help="PEM file of the proxy's certificate (or its CA)")
        s.add_argument("--access-key")
        s.add_argument("--secret-key")
        s.add_argument("--request-timeout", type=int, default=5)
        s.add_argument("--namespace", default="", help="the client's 5.x namespace")
        if name == "receive":
            s.add_argument("--group", required=True)
            s.add_argument("--expect", type=int, required=True)
            s.add_argument("--timeout", type=float, default=30.0)
            s.add_argument("--expression", default="*")
            s.add_argument("--await-duration", type=int, default=2)
            s.add_argument("--invisible", type=int, default=15)
    args = p.parse_args(argv)
    if args.ca:
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = args.ca
    result = {"produce": produce, "receive": receive}[args.command](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
