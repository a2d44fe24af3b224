#!/usr/bin/env python
"""Consumer-group membership benchmark: what a rebalance costs the Spark driver, and how fast
(and how cleanly) queues move between members.

Part ``cost`` (no Spark): an embedded cluster of 2 brokers with one topic of ``--queues`` queues
(1,000: 500 per broker) and a group of ``--members`` members (100): 99 other clients heartbeat
from connections of their own, as other applications would, and one :class:`GroupMember` (the
Spark driver's) rebalances. Timed, medians of ``--runs`` (30):

* allocation alone (each strategy; 1,000 queues, 100 client ids: the driver's CPU per round);
* one rebalance round (heartbeat both brokers, list the members, allocate, lock its share with
  ``lockQueues``): wall and CPU time;
* one idle ``apply_allocation`` (what every ``latestOffset`` poll adds, ~90 a second while idle);
* reference in the same run: one bulk GET_MAX_OFFSET lookup of the member's share (what every
  planned batch costs anyway).

Part ``handover`` (Spark, ``local[2]``): one member (``stay``) reads a topic of 2 x 6 queues
while messages flow at ``--rate``; ``--stops`` times a second member joins (6 queues each),
both read for ``--hold`` seconds, and the second member stops cleanly. Reported per cycle:
seconds from ``query.stop()`` until the survivor holds every lock (``lockQueues``; with
``--plain``, until the broker lists one member), and the messages both members read (with
``lockQueues`` only the clean-stop window can cause them: a stop that lands after a batch's
sink commit and before Spark's next trigger; ``--plain`` adds the join window). The kill figures
come from the slow test ``tests/test_group_faults.py`` (it prints them).

Run: ``.venv/bin/python ci/bench_rebalance.py [--part cost|handover|all] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))
sys.path.insert(0, str(CHECKOUT / "tests"))

from rocketmq_spark.client.admin import Admin  # noqa: E402
from rocketmq_spark.client.broker import Subscription  # noqa: E402
from rocketmq_spark.client.config import ClientConfig  # noqa: E402
from rocketmq_spark.embedded.cluster import EmbeddedCluster  # noqa: E402
from rocketmq_spark.client.group.allocation import STRATEGIES, allocate  # noqa: E402
from rocketmq_spark.client.group.membership import GroupMember, member_client_id  # noqa: E402


def timed(fn: Callable[[], object], runs: int) -> Dict[str, float]:
    """Median wall and CPU (this process) milliseconds of ``fn``."""
    walls, cpus = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - w) * 1e3)
        cpus.append((time.process_time() - c) * 1e3)
    return {"wall_ms": round(statistics.median(walls), 3),
            "cpu_ms": round(statistics.median(cpus), 3)}


def cost(args) -> dict:
    per_broker = args.queues // 2
    out: dict = {"queues": 2 * per_broker, "members": args.members}
    with EmbeddedCluster(brokers=2) as cluster:
        cluster.create_topic("RebalanceBench", queues=per_broker)
        group = "bench-group"
        others = []
        for i in range(args.members - 1):  # other applications: a connection each
            admin = Admin(cluster.namesrv_addr, config=ClientConfig(
                client_id=f"10.0.{i // 250}.{i % 250}@{4000 + i}#bench"))
            for b in cluster.brokers:
                admin.brokers.heart_beat(b.addr, group, [Subscription("RebalanceBench"),
                                                          Subscription("%RETRY%" + group)])
            others.append(admin)
        member = GroupMember(cluster.namesrv_addr,
                             ClientConfig(client_id=member_client_id("bench")), group,
                             lambda: ["RebalanceBench"], lambda qs, first: {q: 0 for q in qs},
                             lock_queues=True, interval=3600)
        member.start()
        assert len(member.members) == args.members, member.members
        queues = member.admin.queues("RebalanceBench", refresh=True)
        ids = member.members
        out["share"] = len(member.wanted)
        out["allocate"] = {s: timed(lambda s=s: allocate(s, queues, ids, member.client_id,
                                                         rooms=["room1"]), args.runs)
                           for s in STRATEGIES}
        out["rebalance_round"] = timed(member.rebalance, args.runs)
        share = member.apply_allocation({})
        positions = dict(share.entering)
        member.apply_allocation(positions)
        out["idle_apply_allocation"] = timed(lambda: member.apply_allocation(positions),
                                             args.runs * 10)
        share = sorted(member.held)
        out["reference_max_offsets"] = timed(
            lambda: member.admin.offsets("max", share), args.runs)
        member.leave()
        for admin in others:
            admin.close()
    r = out["rebalance_round"]["wall_ms"]
    out["rebalance_vs_max_lookup"] = round(r / out["reference_max_offsets"]["wall_ms"], 1)
    return out


def handover(args) -> dict:
    """Members join and stop cleanly while messages flow; with ``--plain`` without
    ``lockQueues`` (then a join can also read messages twice: the previous owner reads on
    until its running batch ends)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from group_helpers import (Feeder, duplicates, lock_holders, member_query, shares,
                               sink_rows)
    from waiting import wait_until

    spark = (SparkSession.builder.master("local[2]").appName("bench-rebalance")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-rebalance-"))
    locks = not args.plain
    options = {"lockQueues": str(locks).lower()}
    out: dict = {"lockQueues": locks}
    with EmbeddedCluster(brokers=2) as cluster:
        topic, group = "HandoverBench", "bench-handover"
        cluster.create_topic(topic, queues=6)
        n = args.messages
        feeder = Feeder(cluster.namesrv_addr, topic, n, rate=args.rate, chunk=20)

        def split(sizes):
            if locks:
                return sorted(shares(lock_holders(cluster, group)).values()) == sizes
            return len(cluster.consumer_clients(group)) == len(sizes)

        def start(name: str):
            # On a loaded machine Spark may give up on a Python runner that takes more than
            # its fixed 10 s to connect back; try again rather than lose the run.
            for attempt in range(3):
                try:
                    return member_query(spark, cluster.namesrv_addr, topic, group, name, work,
                                        **options)
                except AssertionError as exc:
                    if "connect back" not in str(exc) or attempt == 2:
                        raise
                    print(f"{name}: Spark's runner did not connect back in time; again")

        start("stay")
        wait_until(lambda: split([12]), 60, "the first member")
        feeder.start()
        times = []
        for i in range(args.stops):
            q = start(f"go{i}")
            wait_until(lambda: split([6, 6]), 60, "6 queues each")
            time.sleep(args.hold)  # both read for a while
            t0 = time.monotonic()
            q.stop()
            wait_until(lambda: split([12]), 120, "the stopped member's queues to move")
            times.append(time.monotonic() - t0)
            if feeder.sent >= n:
                break
        feeder.finish()
        feeder.join(600)
        n = feeder.n
        names = ["stay"] + [f"go{i}" for i in range(len(times))]
        wait_until(lambda: sum(len(sink_rows(spark, work, m)) for m in names) >= n, 300,
                   "every message")
        by_member = {m: [int(r["keys"]) for r in sink_rows(spark, work, m)] for m in names}
        for q in spark.streams.active:
            q.stop()
    keys = [k for m in names for k in by_member[m]]
    assert set(keys) == set(range(n)), "a message was lost"
    stay_keys = set(by_member["stay"])
    out.update(
        messages=n, cycles=len(times), read_twice=len(duplicates(keys)),
        read_twice_by_cycle=[len(stay_keys & set(by_member[m])) for m in names[1:]],
        # with locks: until the other member holds every lock; plain: until the broker
        # lists one member (the queues move at the survivor's next batch boundary)
        clean_stop_handover_s={"median": round(statistics.median(times), 3),
                               "max": round(max(times), 3),
                               "each": [round(t, 3) for t in times]})
    spark.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("cost", "handover", "all"), default="all")
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--members", type=int, default=100)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--stops", type=int, default=8, help="join-and-stop cycles")
    p.add_argument("--plain", action="store_true", help="members without lockQueues")
    p.add_argument("--hold", type=float, default=2.0, help="seconds both members read")
    p.add_argument("--messages", type=int, default=1_000_000, help="at most")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--json")
    args = p.parse_args()
    # The embedded brokers notify members that are closing at the end of a part; asyncio
    # logs each refused write.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    result = {}
    if args.part in ("cost", "all"):
        result["cost"] = cost(args)
        print(json.dumps(result["cost"], indent=1))
    if args.part in ("handover", "all"):
        result["handover"] = handover(args)
        print(json.dumps(result["handover"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
