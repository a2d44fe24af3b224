"""Shared fixtures: the genuine RocketMQ 4.9.8 capture in shared/captures/rocketmq-4.9.8.

A copy of the capture lives in ``tests/data/capture-rocketmq-4.9.8``; set ``ROCKETMQ_CAPTURE_DIR``
to use another. Its README defines the frame records: ``frame_len`` counts the whole frame
(4-byte length prefix included), ``header_len`` is the low 24 bits of the header-length word,
``serialize`` names its high byte, ``header_text`` holds the exact header bytes as UTF-8 and
``body_hex`` the body.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict, List

import pytest

pytest_plugins = ["rocketmq_spark.embedded.pytest_plugin"]

CAPTURE_DIR = Path(os.environ.get(
    "ROCKETMQ_CAPTURE_DIR", Path(__file__).resolve().parent / "data" / "capture-rocketmq-4.9.8"))

SERIALIZE_TYPES = {"JSON": 0, "ROCKETMQ": 1}


class Capture:
    """The capture's records plus the few look-ups the tests share."""

    def __init__(self, folder: Path):
        with open(folder / "frames.jsonl", encoding="utf-8") as fh:
            self.frames: List[dict] = [json.loads(line) for line in fh if line.strip()]
        with open(folder / "client_view.json", encoding="utf-8") as fh:
            self.client_view: dict = json.load(fh)
        self.by_seq: Dict[int, dict] = {r["seq"]: r for r in self.frames}

    @staticmethod
    def frame_bytes(record: dict) -> bytes:
        """The frame as it was on the wire, rebuilt from its record."""
        header = record["header_text"].encode("utf-8")
        word = (SERIALIZE_TYPES[record["serialize"]] << 24) | record["header_len"]
        return (struct.pack(">I", record["frame_len"] - 4) + struct.pack(">I", word) + header
                + bytes.fromhex(record["body_hex"]))

    @staticmethod
    def ext_text(value) -> str:
        """A header value as the string Java sees: numbers and booleans as their JSON text."""
        return value if isinstance(value, str) else json.dumps(value)

    @staticmethod
    def body(record: dict) -> bytes:
        return bytes.fromhex(record["body_hex"])

    def request_of(self, response: dict) -> dict:
        return self.by_seq[response["request_seq"]]

    def responses_to(self, request_code: int) -> List[dict]:
        return [r for r in self.frames
                if r["rpc"] == "response" and r.get("request_code") == request_code]


def _load_capture() -> Capture:
    if not (CAPTURE_DIR / "frames.jsonl").is_file():
        pytest.fail(f"the RocketMQ 4.9.8 capture is missing at {CAPTURE_DIR} "
                    "(set ROCKETMQ_CAPTURE_DIR to its folder)")
    return Capture(CAPTURE_DIR)


@pytest.fixture(scope="session")
def capture() -> Capture:
    return _load_capture()


def pytest_generate_tests(metafunc):
    """``capture_record``: one test per frame of the capture."""
    if "capture_record" in metafunc.fixturenames:
        try:
            records = Capture(CAPTURE_DIR).frames
        except OSError:
            records = [None]  # the test then fails through the ``capture`` fixture
        metafunc.parametrize(
            "capture_record", records,
            ids=[f"seq{r['seq']}-{r['code_name']}" if r else "missing" for r in records])


# ---------------------------------------------------------------------------------------- Spark

@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run (starting one takes seconds)."""
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-tests")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# ------------------------------------------------------------------------------------ cluster

@pytest.fixture
def cluster(embedded_cluster_session):
    """The session's embedded cluster (two brokers and a name server), shared by every test
    that asks for it: name topics and groups with ``unique_name``. A test file that needs a
    cluster of its own (fresh, or with other options) overrides this fixture and says why."""
    return embedded_cluster_session


@pytest.fixture
def topic(cluster, unique_name) -> str:
    """A new 4-queue topic on ``cluster``."""
    name = unique_name("Topic")
    cluster.create_topic(name, queues=4)
    return name
