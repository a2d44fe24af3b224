#!/usr/bin/env python
"""What the exactly-once sink's record adds to a micro-batch's commit on S3, against a local
checkpoint, in one run.

The driver-side store work of one micro-batch's commit, as ``RocketMQStreamWriter`` does it
(``rocketmq_spark/sink/writer.py``): read the query id from Spark's ``metadata`` (local in
both cases, as on this machine's Spark), check the responder's lease (at most every few
seconds), look for the batch (skipped above the batches recorded at the run's start), write
``committed/<b>.json`` with ``--handles`` half-message handles, write ``ended/<b>`` (pruning
old batches is the responder's, off the commit's path). No broker: only the record, so the
difference is the store's.

* local: the record on the local disk (temporary file, fsync, rename, fsync of the folder).
* s3: the record on S3 through pyarrow's S3 client over HTTP to moto's standalone server on
  loopback (tests/s3_server.py); it also counts the HTTP requests per batch from the server's
  log. A real S3 endpoint adds its network round trip (a few ms to tens of ms) per request.

Reported: median and p90 ms per batch for each, the added ms (s3 - local) and requests per
batch. Run: ``.venv/bin/python ci/bench_checkpoint_store.py [--batches 300] [--handles 500]``.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from rocketmq_spark.client.txn.transaction import HalfHandle  # noqa: E402
from rocketmq_spark.sink.commit_record import BatchRecord, open_record, spark_checkpoint  # noqa: E402
from rocketmq_spark.sink.exactly_once import RESPONDER_LEASE  # noqa: E402
from rocketmq_spark.storage import Lease, StorageOptions, lease_looks_held, spark_log  # noqa: E402
from s3_server import start_s3_server  # noqa: E402


def one_run(checkpoint: Path, storage: StorageOptions, batches: int, handles: int) -> list:
    """Milliseconds per batch of the record's work for ``batches`` micro-batches."""
    log = open_record(str(checkpoint), storage, check=True)
    lease = Lease(log.store, RESPONDER_LEASE)  # a responder holding the lease, as in a query
    assert lease.acquire(30)
    log.absent_above = max(log.committed_ids(), default=-1)
    times, seen_held = [], -1e9
    for b in range(batches):
        record = BatchRecord(b, "q-bench", "g", [f"t{b}"], [
            HalfHandle("broker-a", "127.0.0.1:10911", f"{b:08X}{i:08X}", b * handles + i,
                       10 ** 9 + i, "") for i in range(handles)])
        started = time.perf_counter()
        assert spark_log.query_id(spark_checkpoint(str(checkpoint), storage)) == "q-bench"
        if time.monotonic() - seen_held > 5.0 and lease_looks_held(log.store, RESPONDER_LEASE):
            seen_held = time.monotonic()
        assert log.committed(b) is None
        log.record_commit(record)
        log.mark_ended(b)
        times.append((time.perf_counter() - started) * 1000)
        if lease.renew_due():
            lease.renew()
    lease.release()
    return times


def summary(times: list) -> str:
    ordered = sorted(times)
    return (f"median {statistics.median(ordered):.2f} ms, p90 "
            f"{ordered[int(len(ordered) * 0.9)]:.2f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--handles", type=int, default=500)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    checkpoint = work / "cp"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q-bench"}) + "\n")
    server = start_s3_server(work)
    try:
        server.create_bucket("bench")
        local = one_run(checkpoint, StorageOptions(), args.batches, args.handles)
        s3_options = StorageOptions.from_raw(server.options(location="s3://bench/q/rocketmq-sink"))
        before = len(server.requests())
        s3 = one_run(checkpoint, s3_options, args.batches, args.handles)
        requests = server.requests()[before:]
    finally:
        server.proc.terminate()
    per_batch = len(requests) / args.batches
    kinds: dict = {}
    for r in requests:
        verb = re.sub(r"\x1b\[[0-9;]*m", "", r).split()[0]  # the server colours some lines
        kinds[verb] = kinds.get(verb, 0) + 1
    one = HalfHandle("broker-a", "127.0.0.1:10911", "X" * 16, 10 ** 6, 10 ** 9, "")
    size = len(BatchRecord(0, "q", "g", ["t"], [one] * args.handles).to_json())
    print(f"record per micro-batch, {args.batches} batches of {args.handles} handles "
          f"(committed/<b>.json ~{size // 1024} KiB)")
    print(f"  local checkpoint : {summary(local)}")
    print(f"  S3 (moto, HTTP)  : {summary(s3)}")
    print(f"  added by S3      : {statistics.median(s3) - statistics.median(local):.2f} ms "
          f"(median), ratio s3/local {statistics.median(s3) / statistics.median(local):.1f}")
    print(f"  S3 requests      : {per_batch:.2f} per batch "
          f"({', '.join(f'{k} {v / args.batches:.2f}' for k, v in sorted(kinds.items()))}; "
          "the lease's renewals included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
