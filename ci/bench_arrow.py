"""What building the Spark source's RecordBatch costs (rocketmq_spark.source.arrow.to_spark_batch).

For 100,000 stored messages of 100-byte bodies and eight properties each (with and without a
repeated TAGS property on one row in ten, which takes the slow path that resolves duplicates),
it times ``to_spark_batch`` with and without the ``properties`` column, best of 15, and prints
each time and its ratio to a reference measured in the same run on the same records:
``decode_columns``, the C decoder that turns the pull body into the columns ``to_spark_batch``
starts from. Ratios, unlike times, carry from one machine to another.

    .venv/bin/python ci/bench_arrow.py [--rows N] [--repeat N]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

from rocketmq_spark.client.protocol.message import encode_stored_message
from rocketmq_spark.client.protocol.pull_decode import decode_columns
from rocketmq_spark.source.arrow import to_spark_batch


def pull_body(rows: int, duplicate_every: int) -> bytes:
    """``rows`` stored records as a broker returns them in a pull body."""
    records = []
    for i in range(rows):
        props = (f"UNIQ_KEY\x017F0000010001{i:020X}\x02WAIT\x01true\x02TAGS\x01TagA\x02"
                 f"KEYS\x01key{i}\x02CLUSTER\x01DefaultCluster\x02MIN_OFFSET\x010\x02"
                 f"MAX_OFFSET\x01{i}\x02")
        if duplicate_every and i % duplicate_every == 0:
            props += "TAGS\x01TagB\x02"
        records.append(encode_stored_message(
            topic="TopicTest", queue_id=i % 4, queue_offset=1000 + i, physical_offset=200 * i,
            body=b"x" * 100, properties=props, born_timestamp=1700000000123 + i,
            store_timestamp=1700000000456 + i, born_host="10.0.0.1:5555",
            store_host="10.0.0.2:10911", reconsume_times=i % 3))
    return b"".join(records)


def best_of(repeat: int, step: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs of ``step``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    rows = args.rows
    for duplicate_every in (0, 10):
        body = pull_body(rows, duplicate_every)
        reference = best_of(args.repeat, lambda: decode_columns(body))
        columns = decode_columns(body)
        duplicates = f"1/{duplicate_every}" if duplicate_every else "0"
        print(f"decode_columns (reference), duplicate rows {duplicates}: "
              f"{reference * 1e3:.2f} ms per {rows} rows")
        for include in (False, True):
            took = best_of(args.repeat, lambda: to_spark_batch(columns, "broker-a", include))
            print(f"to_spark_batch include_properties={include}, duplicate rows {duplicates}: "
                  f"{took * 1e3:.2f} ms = {took / rows * 1e6:.4f} us/row = "
                  f"{took / reference:.3f} x the decode")


if __name__ == "__main__":
    main()
