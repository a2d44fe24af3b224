"""Run an embedded cluster until SIGINT/SIGTERM.

    python -m rocketmq_spark.embedded --brokers 2 --data-dir DIR [--port-namesrv N]

Prints one line per server once they listen, then ``ready``::

    namesrv 127.0.0.1:9876
    broker broker-a 127.0.0.1:40123
    broker broker-b 127.0.0.1:40125
    ready

(with ``--slaves N``, a line ``slave broker-a 1 127.0.0.1:40127`` after each broker's, per
slave)

(plus ``tls MODE CERTFILE`` before ``ready`` when serving TLS, and ``proxy HOST:PORT`` and
``proxy-tls CERTFILE`` with ``--grpc-proxy``, ``proxy-remoting HOST:PORT`` with
``--proxy-remoting``).

``--topic NAME[:QUEUES]`` creates topics, ``--fill TOPIC:COUNT[:SIZE]`` stores COUNT messages of
SIZE bytes (default 100) spread round-robin over the topic's queues on every broker, without a
client (for benchmarks).
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import List, Optional

from .cluster import EmbeddedCluster

FILL_CHUNK = 20000


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rocketmq_spark.embedded",
                                description="An embedded RocketMQ-compatible name server and "
                                            "brokers (4.9.8 personality, or 5.1.4's with "
                                            "--release 5.1).")
    p.add_argument("--brokers", type=int, default=1, help="number of brokers (default 1)")
    p.add_argument("--slaves", type=int, default=0,
                   help="slaves per broker (brokerId 1, 2, ...; default 0)")
    p.add_argument("--data-dir", help="keep messages, topics and offsets here across restarts")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    p.add_argument("--port-namesrv", type=int, default=0, help="name server port (default: free)")
    p.add_argument("--broker-ports", help="comma-separated broker ports (default: free)")
    p.add_argument("--topic", action="append", default=[], metavar="NAME[:QUEUES]",
                   help="create a topic on every broker (repeatable)")
    p.add_argument("--fill", action="append", default=[], metavar="TOPIC:COUNT[:SIZE]",
                   help="store COUNT messages of SIZE bytes round-robin over the topic's queues")
    p.add_argument("--acl", action="append", default=[], metavar="ACCESS:SECRET",
                   help="enable ACL with this account (repeatable)")
    p.add_argument("--tls", choices=("enforcing", "permissive"), help="serve TLS")
    p.add_argument("--tls-cert", help="PEM certificate (default: a fresh self-signed one)")
    p.add_argument("--tls-key", help="PEM key for --tls-cert")
    p.add_argument("--grpc-proxy", action="store_true",
                   help="also serve the 5.x proxy's gRPC MessagingService (TLS unless "
                        "--grpc-proxy-plaintext)")
    p.add_argument("--grpc-proxy-port", type=int, default=0, help="proxy port (default: free)")
    p.add_argument("--grpc-proxy-plaintext", action="store_true",
                   help="serve the proxy without TLS")
    p.add_argument("--proxy-remoting", action="store_true",
                   help="also serve the 5.x proxy's remoting port (give it to clients as their "
                        "name server)")
    p.add_argument("--proxy-remoting-port", type=int, default=0,
                   help="proxy remoting port (default: free)")
    p.add_argument("--max-transfer-count", type=int, default=32, help="per-pull message cap")
    p.add_argument("--max-transfer-bytes", type=int, default=256 * 1024, help="per-pull byte cap")
    p.add_argument("--no-auto-create", action="store_true",
                   help="do not create unknown topics on first send (no TBW102)")
    p.add_argument("--search-by-time", choices=("lower", "nearest"), default="lower",
                   help="SEARCH_OFFSET_BY_TIMESTAMP semantics (default lower, as 5.1.1+)")
    p.add_argument("--transaction-check-interval", type=float, default=60.0, metavar="SECONDS",
                   help="how often half messages are checked back (default 60, as 4.x)")
    p.add_argument("--transaction-timeout", type=float, default=6.0, metavar="SECONDS",
                   help="age before a half message is checked back (default 6)")
    p.add_argument("--transaction-check-max", type=int, default=15,
                   help="check-backs before a half message is discarded (default 15)")
    p.add_argument("--send-queue-capacity", type=int, default=10_000, metavar="N",
                   help="requests the send queue holds before [OVERLOAD] (default 10000)")
    p.add_argument("--wait-ms-in-send-queue", type=int, default=200, metavar="MS",
                   help="queue wait before a send gets [TIMEOUT_CLEAN_QUEUE] (default 200)")
    p.add_argument("--pull-queue-capacity", type=int, default=100_000, metavar="N",
                   help="requests the pull queue holds before [OVERLOAD] (default 100000)")
    p.add_argument("--wait-ms-in-pull-queue", type=int, default=5_000, metavar="MS",
                   help="queue wait before a pull gets [TIMEOUT_CLEAN_QUEUE] (default 5000)")
    p.add_argument("--no-broker-fast-failure", action="store_true",
                   help="never answer [TIMEOUT_CLEAN_QUEUE] (brokerFastFailureEnable=false)")
    p.add_argument("--enable-property-filter", action="store_true",
                   help="serve SQL92 property filters on pulls (enablePropertyFilter=true)")
    p.add_argument("--release", choices=("4.9", "5.1"), default="4.9",
                   help="the Apache release the brokers behave as (default 4.9: 4.9.8; 5.1: "
                        "5.1.4's op-topic bodies and topic message types)")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def fill(cluster: EmbeddedCluster, topic: str, count: int, size: int) -> None:
    """Store ``count`` messages of ``size`` bytes, round-robin over every readable queue."""
    queues = []
    for b in cluster.brokers:
        config = cluster.topic_config(topic, b.name)
        if config is None:
            cluster.create_topic(topic, 4, brokers=[b.name])
            config = cluster.topic_config(topic, b.name)
        queues.extend((b.name, q) for q in range(config.write_queue_nums))
    if not queues:
        raise SystemExit(f"topic {topic} has no writable queues")
    per_queue = [count // len(queues) + (1 if i < count % len(queues) else 0)
                 for i in range(len(queues))]
    seq = 0
    for (broker, qid), n in zip(queues, per_queue):
        done = 0
        while done < n:
            k = min(FILL_CHUNK, n - done)
            bodies = [(b"%0*d" % (size, seq + i))[-size:] if size else b"" for i in range(k)]
            cluster.append(topic, broker, qid, bodies)
            done += k
            seq += k


def _cluster(args: argparse.Namespace, acl, ports) -> EmbeddedCluster:
    return EmbeddedCluster(
        brokers=args.brokers, slaves=args.slaves, data_dir=args.data_dir, host=args.host,
        namesrv_port=args.port_namesrv, broker_ports=ports, acl=acl, tls=args.tls,
        tls_cert=args.tls_cert, tls_key=args.tls_key, call_timeout=600.0,
        grpc_proxy=args.grpc_proxy, grpc_proxy_tls=not args.grpc_proxy_plaintext,
        grpc_proxy_port=args.grpc_proxy_port, proxy_remoting=args.proxy_remoting,
        proxy_remoting_port=args.proxy_remoting_port,
        max_transfer_count=args.max_transfer_count, max_transfer_bytes=args.max_transfer_bytes,
        auto_create_topics=not args.no_auto_create, search_by_time=args.search_by_time,
        transaction_check_interval=args.transaction_check_interval,
        transaction_timeout=args.transaction_timeout,
        transaction_check_max=args.transaction_check_max,
        send_queue_capacity=args.send_queue_capacity,
        wait_ms_in_send_queue=args.wait_ms_in_send_queue,
        pull_queue_capacity=args.pull_queue_capacity,
        wait_ms_in_pull_queue=args.wait_ms_in_pull_queue,
        broker_fast_failure=not args.no_broker_fast_failure,
        enable_property_filter=args.enable_property_filter, release=args.release)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    acl = dict(a.split(":", 1) for a in args.acl) if args.acl else None
    ports = [int(p) for p in args.broker_ports.split(",")] if args.broker_ports else None
    try:
        cluster = _cluster(args, acl, ports)
    except ValueError as exc:  # a bad setting: say which, without a stack trace
        raise SystemExit(f"python -m rocketmq_spark.embedded: {exc}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        for spec in args.topic:
            name, _, queues = spec.partition(":")
            cluster.create_topic(name, int(queues) if queues else 4)
        for spec in args.fill:
            parts = spec.split(":")
            started = time.monotonic()
            fill(cluster, parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 100)
            logging.getLogger(__name__).info("filled %s in %.1f s", spec,
                                             time.monotonic() - started)
        print(f"namesrv {cluster.namesrv_addr}", flush=True)
        for b in cluster.brokers:
            print(f"broker {b.name} {b.addr}", flush=True)
            for node in cluster.brokers_of(b.name)[1:]:
                print(f"slave {b.name} {node.broker_id} {node.addr}", flush=True)
        if cluster.tls_settings is not None:
            print(f"tls {cluster.tls_settings.mode} {cluster.tls_settings.certfile}", flush=True)
        if args.grpc_proxy:
            print(f"proxy {cluster.proxy_endpoint}", flush=True)
            if cluster.proxy_tls_cert:
                print(f"proxy-tls {cluster.proxy_tls_cert}", flush=True)
        if args.proxy_remoting:
            print(f"proxy-remoting {cluster.proxy_remoting_addr}", flush=True)
        print("ready", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
