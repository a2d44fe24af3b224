"""The exactly-once kill tests (tests/test_sink_exactly_once_kills.py: the driver SIGKILLed
after its record, half-way through its END_TRANSACTIONs and after its commit, a task failed
mid-write, END_TRANSACTIONs lost, Apache's C++ PushConsumer checking every row arrives once)
with the sink's record on S3: moto's server on loopback, over S3's HTTP API.

The same harness, by import: its pipeline runs with ``checkpointStorage.*`` options that put
the record on S3 (Spark's own checkpoint stays local: pyspark ships no hadoop-aws jar), and
the checks of the record read it from S3 through the storage layer. On brokers behaving as
4.9.8's (killed after the record, half-way through the END_TRANSACTIONs and after the commit)
and as 5.1.4's (the harness's kill points for it).
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import test_sink_exactly_once_kills as kills
from rocketmq_spark.sink.commit_record import CommitLog, open_record
from rocketmq_spark.storage import StorageOptions
from s3_server import s3_server_fixture  # noqa: F401 (the fixture s3_server)
from waiting import wait_until

pytestmark = kills.pytestmark


def s3_pipeline(options: dict):
    """The harness's Pipeline with the record on S3 (``options``: checkpointStorage.*)."""
    extra = [arg for key, value in options.items() for arg in ("--sink-option",
                                                                f"{key}={value}")]

    class S3Pipeline(kills.Pipeline):
        def __init__(self, namesrv: str, source: str, sink: str, work: Path, *more: str):
            super().__init__(namesrv, source, sink, work, *extra, *more)
            self.storage = StorageOptions.from_raw(options)

        def record(self) -> CommitLog:
            return open_record(str(self.work / "cp"), self.storage)

        def sink_recorded(self, batch: int) -> bool:
            return self.record().committed(batch) is not None

    return S3Pipeline


def killed_by_hook_s3(cluster, pipeline, sink: str, point: str, batch: int) -> None:
    """The harness's check at a kill point, reading the record on S3."""
    pipeline.start("--kill-at", f"{point}:{batch}")
    pipeline.wait_killed_by_hook()
    assert batch in pipeline.batches("offsets") and batch not in pipeline.batches("commits")
    record = pipeline.record()
    assert record.committed(batch) is not None, f"batch {batch} not recorded on S3"
    assert not (pipeline.work / "cp" / "rocketmq-sink" / "committed").exists()
    ended = record.ended_at(batch) is not None
    before, through = pipeline.rows_through(batch - 1), pipeline.rows_through(batch)
    if point == "after_commit":
        assert ended
        wait_until(lambda: kills.total(cluster, sink) >= through, 30,
                   f"batches 0-{batch} in the output after the sink committed batch {batch}")
        time.sleep(0.5)
        assert kills.total(cluster, sink) == through, "duplicates in the output"
        return
    assert not ended
    if point == "after_record":
        assert kills.total(cluster, sink) == before
    else:
        wait_until(lambda: kills.total(cluster, sink) > before, 30, "the first half's COMMITs")
    assert kills.total(cluster, sink) <= through


# The harness's kill points per broker release, with a mid-END_TRANSACTION kill on 4.9 too.
KILLS_S3 = {"4.9": [("after_record", 1), ("mid_end", 3), ("after_commit", 5)],
            "5.1": kills.KILLS["5.1"]}


@pytest.mark.slow  # four Spark driver starts, 3-8 minutes on two cores, as the local variant
@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", sorted(KILLS_S3))
def test_exactly_once_through_three_driver_kills_with_the_record_on_s3(
        embedded_cluster_factory, s3_server, tmp_path, monkeypatch, release):
    bucket = f"eo-kills-{release.replace('.', '-')}"
    s3_server.create_bucket(bucket)
    options = s3_server.options(location=f"s3a://{bucket}/q/rocketmq-sink")
    monkeypatch.setattr(kills, "Pipeline", s3_pipeline(options))
    monkeypatch.setattr(kills, "killed_by_hook", killed_by_hook_s3)
    seen = kills.run_kills(kills.transactional_cluster(embedded_cluster_factory, release),
                           tmp_path, 5_000, 500, KILLS_S3[release])
    keys = s3_server.keys(bucket, "q/rocketmq-sink/")
    assert [k for k in keys if "/kill-fired/" in k], "the kill hooks' markers are not on S3"
    assert seen["checks_sent"] > 0
