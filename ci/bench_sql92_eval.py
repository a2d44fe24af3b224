#!/usr/bin/env python
"""SQL92 filter benchmark: the embedded broker's cost per message of a property filter.

Two numbers per expression, over realistic property maps (what a 4.x producer stores: TAGS,
KEYS, UNIQ_KEY, WAIT, CLUSTER and a few user properties, some missing, some not numbers):

* eval: ``Expression.evaluate`` alone on already-decoded maps (the compiled closures);
* pull: ``property_filter.read_matching`` on a stored queue, i.e. what a filtered pull costs
  the broker per examined message: decoding each record's properties plus the evaluation.

Run: ``.venv/bin/python ci/bench_sql92_eval.py`` (``--messages N``, ``--rounds R``; the best
round is reported, in µs per message, and ``--json`` writes the table).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from typing import Dict, List

from rocketmq_spark.client.filter import parse_sql92
from rocketmq_spark.client.protocol.properties import decode_properties, encode_properties
from rocketmq_spark.embedded.property_filter import read_matching, record_properties
from rocketmq_spark.embedded.queue import ConsumeQueue

EXPRESSIONS = [
    "TAGS = 'TagA'",
    "region IN ('eu', 'us', 'ap') AND price > 100",
    "a BETWEEN 3 AND 12 AND b = 'x'",
    "(priority >= 5 OR vip = 'true') AND region <> 'cn' AND retries IS NULL",
    "price > 99.5 AND NOT (region IN ('eu')) OR KEYS IS NOT NULL AND amount < 2147483648",
]


def property_maps(count: int, seed: int = 7) -> List[Dict[str, str]]:
    rng = random.Random(seed)
    maps = []
    for i in range(count):
        props = {"TAGS": rng.choice(["TagA", "TagB", "TagC"]), "KEYS": f"order-{i}",
                 "UNIQ_KEY": f"7F000001{i:024X}", "WAIT": "true", "CLUSTER": "DefaultCluster",
                 "a": str(rng.randrange(20)), "price": str(rng.randrange(1000)),
                 "amount": str(rng.randrange(1 << 40)),
                 "region": rng.choice(["eu", "us", "ap", "cn"]),
                 "priority": rng.choice(["1", "5", "9", "high"])}
        if rng.random() < 0.5:
            props["b"] = rng.choice(["x", "y"])
        if rng.random() < 0.3:
            props["vip"] = "true"
        if rng.random() < 0.1:
            props["retries"] = "1"
        maps.append(props)
    return maps


def build_queue(maps: List[Dict[str, str]]) -> ConsumeQueue:
    """A queue of records with these properties (the layout is all read_matching needs)."""
    queue = ConsumeQueue("BenchT", 0)
    for props in maps:
        text = encode_properties(props).encode()
        body = b"x" * 100
        topic = b"BenchT"
        fixed = bytearray(4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8)
        record = (bytes(fixed) + len(body).to_bytes(4, "big") + body + bytes([len(topic)])
                  + topic + len(text).to_bytes(2, "big") + text)
        record = len(record).to_bytes(4, "big") + record[4:]
        queue.append(record, 0, 0)
    return queue


def best_of(rounds: int, fn) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    maps = property_maps(args.messages)
    queue = build_queue(maps)
    assert decode_properties(encode_properties(maps[0])) == maps[0]
    assert all(record_properties(queue.record(0), 0).get(k) == v for k, v in maps[0].items())
    rows = []
    print(f"{'expression':<84} {'match':>6} {'eval µs':>8} {'pull µs':>8}")
    for text in EXPRESSIONS:
        expr = parse_sql92(text)
        evaluate = expr.evaluate
        matched = sum(evaluate(p) for p in maps)
        eval_s = best_of(args.rounds, lambda: [evaluate(p) for p in maps])

        def pull_all():
            offset = 0
            while offset < len(maps):
                _, examined, _ = read_matching(queue, offset, expr, 1 << 30, 1 << 30, 1 << 62)
                offset += examined
        pull_s = best_of(args.rounds, pull_all)
        row = {"expression": text, "matched": matched / len(maps),
               "eval_us": eval_s / len(maps) * 1e6, "pull_us": pull_s / len(maps) * 1e6}
        rows.append(row)
        print(f"{text:<84} {row['matched']:>6.0%} {row['eval_us']:>8.2f} {row['pull_us']:>8.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"messages": args.messages, "rounds": args.rounds, "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
