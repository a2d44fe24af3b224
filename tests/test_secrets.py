"""accessKey and secretKey never appear in logs, exception messages, reprs, the Spark plan or
the checkpoint: an ACL-enabled embedded cluster, a checkpointed stream and a batch read with
the right credentials and with a wrong secret, then a grep for both keys in everything they left.

The Spark part runs in a subprocess so its whole stdout and stderr (driver, JVM, Python
workers) can be captured. A ``sitecustomize`` on the PYTHONPATH that Spark's Python workers
inherit sends the ``rocketmq_spark`` loggers of every process (driver, planner, executors) to
one file at DEBUG; Spark's event log is on as well, so the SQL plans Spark records are grepped
too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark.client import MessageQueue
from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.config import ClientConfig
from rocketmq_spark.client.errors import AuthError
from rocketmq_spark.client.responses import redact_remark
from rocketmq_spark.source.batch_reader import RocketMQBatchReader
from rocketmq_spark.source.connect import client_config
from rocketmq_spark.source.options import OptionError, parse_source_options
from rocketmq_spark.source.stream_reader import RocketMQStreamReader

AK, SK = "AKtest7Q9X", "SKsecret5Z3W8"
WRONG_SK = "SKwrong4V6Y1"
KEYS = (AK, SK, WRONG_SK)

SITECUSTOMIZE = """
import logging, os
_path = os.environ.get("RMQ_TEST_LOG_FILE")
if _path:
    _handler = logging.FileHandler(_path)
    _handler.setFormatter(logging.Formatter(
        "%(asctime)s pid=%(process)d %(levelname)s %(name)s: %(message)s"))
    _log = logging.getLogger("rocketmq_spark")
    _log.setLevel(logging.DEBUG)
    _log.addHandler(_handler)
    _log.debug("debug logging on in %s", os.path.basename(os.sys.argv[0] or "python"))
"""

SCRIPT = r'''
import json, logging, os, sys, time, traceback
from contextlib import redirect_stdout
from io import StringIO

from pyspark.sql import SparkSession

ak, sk, wrong = os.environ["RMQ_AK"], os.environ["RMQ_SK"], os.environ["RMQ_WRONG_SK"]
namesrv, topic, work = sys.argv[1], sys.argv[2], sys.argv[3]
logging.getLogger("rocketmq_spark").info("script starts")
os.makedirs(os.path.join(work, "eventlog"), exist_ok=True)
spark = (SparkSession.builder.master("local[2]").appName("secrets")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.eventLog.enabled", "true")
         .config("spark.eventLog.dir", os.path.join(work, "eventlog"))
         .config("spark.sql.streaming.stopTimeout", "30s")
         .getOrCreate())
report = {"errors": {}, "plans": {}, "progress": []}


def options(r, secret):
    return (r.format("rocketmq").option("nameServer", namesrv).option("subscribe", topic)
            .option("accessKey", ak).option("secretKey", secret)
            .option("consumerGroup", "secrets-group"))


def explain(df):
    out = StringIO()
    with redirect_stdout(out):
        df.explain(True)
    return out.getvalue()


# A checkpointed stream with the right credentials, run twice (restart from the checkpoint).
stream = options(spark.readStream, sk).option("startingOffsets", "earliest").load()
report["plans"]["stream-df"] = explain(stream)
for run in range(2):
    q = (stream.writeStream.format("parquet").option("path", os.path.join(work, "sink"))
         .option("checkpointLocation", os.path.join(work, "checkpoint"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    out = StringIO()
    with redirect_stdout(out):
        q.explain(True)
    report["plans"][f"stream-query-{run}"] = out.getvalue()
    report["progress"] += [json.loads(p.json) for p in q.recentProgress]
    assert q.exception() is None, str(q.exception())
report["rows"] = spark.read.parquet(os.path.join(work, "sink")).count()

# A batch read with the right credentials.
batch = options(spark.read, sk).load()
report["plans"]["batch"] = explain(batch)
report["batch_rows"] = batch.count()

# The same with a wrong secret: both must fail with an auth error.
try:
    options(spark.read, wrong).load().count()
except Exception as exc:
    report["errors"]["batch"] = "".join(traceback.format_exception(exc))
try:
    q = (options(spark.readStream, wrong).option("startingOffsets", "earliest").load()
         .writeStream.format("noop")
         .option("checkpointLocation", os.path.join(work, "checkpoint-wrong"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    report["errors"]["stream"] = str(q.exception())
except Exception as exc:
    report["errors"]["stream"] = "".join(traceback.format_exception(exc))

# A bad option next to the credentials fails before anything runs.
try:
    options(spark.read, sk).option("startingOffsets", "nope").load().count()
except Exception as exc:
    report["errors"]["option"] = "".join(traceback.format_exception(exc))

print(json.dumps(report, indent=1))
with open(os.path.join(work, "report.json"), "w") as fh:
    json.dump(report, fh)
spark.stop()
'''


def _leaks(text: str, where: str) -> list:
    return [f"{key!r} in {where}" for key in KEYS if key in text]


def _grep_tree(root: Path) -> list:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{key!r} in {path.relative_to(root)}" for key in KEYS
                      if key.encode() in data]
    return found


@pytest.fixture
def acl_cluster(embedded_cluster_factory, unique_name):
    cluster = embedded_cluster_factory(brokers=2, acl={AK: SK})
    topic = unique_name("Secret")
    cluster.create_topic(topic, queues=2)
    for b in ("broker-a", "broker-b"):
        for q in (0, 1):
            cluster.append(topic, b, q, [b"%s-%d-%d" % (b.encode(), q, i) for i in range(25)],
                           keys="k")
    cluster.topic = topic
    return cluster


@pytest.mark.timeout(400)
def test_keys_never_leak_from_a_spark_run(acl_cluster, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (work / "script.py").write_text(SCRIPT)  # the keys come in the environment only
    log_file = work / "rocketmq_spark.log"
    env = dict(os.environ, RMQ_AK=AK, RMQ_SK=SK, RMQ_WRONG_SK=WRONG_SK,
               RMQ_TEST_LOG_FILE=str(log_file), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(site)] + [p for p in sys.path if p]))
    proc = subprocess.run([sys.executable, str(work / "script.py"), acl_cluster.namesrv_addr,
                           acl_cluster.topic, str(work)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=360)
    (work / "stdout.txt").write_text(proc.stdout)
    (work / "stderr.txt").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads((work / "report.json").read_text())

    # It did run: rows read both ways, logs from more than one process, the plans recorded.
    assert report["rows"] == 100 and report["batch_rows"] == 100
    log = log_file.read_text()
    assert "debug logging on" in log and "script starts" in log
    assert len({line.split()[2] for line in log.splitlines() if "pid=" in line}) >= 2, log
    assert "BatchScan rocketmq" in report["plans"]["batch"]
    assert list((work / "checkpoint" / "offsets").iterdir())
    assert list((work / "eventlog").iterdir())

    # A wrong secret fails, with an auth error, for the batch read and the stream.
    for kind in ("batch", "stream"):
        text = report["errors"].get(kind) or ""
        assert "AclException" in text and "Check signature failed" in text, (kind, text)
        assert "accessKey=<redacted>" in text, (kind, text)
    assert "startingOffsets" in report["errors"]["option"]

    # And neither key is anywhere: checkpoints, sink, event log, logs, stdout, stderr, errors,
    # plans and progress (all of them files under ``work``).
    leaks = _grep_tree(work) + _leaks(proc.stdout, "stdout") + _leaks(proc.stderr, "stderr")
    assert not leaks, leaks


def test_keys_never_leak_from_reprs_errors_and_partitions(acl_cluster):
    raw = {"nameServer": acl_cluster.namesrv_addr, "subscribe": acl_cluster.topic,
           "accessKey": AK, "secretKey": SK, "consumerGroup": "secrets-group",
           "startingOffsets": "earliest"}
    stream_options = parse_source_options(raw, streaming=True)
    batch_options = parse_source_options(raw, streaming=False)
    texts = {}
    for name, obj in (("stream options", stream_options), ("batch options", batch_options),
                      ("credentials", stream_options.credentials),
                      ("client config", client_config(stream_options)),
                      ("config", ClientConfig(credentials=Credentials(AK, SK)))):
        texts[name] = f"{obj!r} {obj!s} {obj}"
    assert "credentials=<set>" in texts["stream options"]

    stream = RocketMQStreamReader(stream_options)
    start = stream.latestOffset(stream.initialOffset(), stream.getDefaultReadLimit())
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    partitions = stream.partitions(start, end)
    assert sum(s.end - s.start for p in partitions for s in p.slices) == 100
    batch = RocketMQBatchReader(batch_options)
    texts["stream reader"] = f"{stream!r} {stream!s} {stream.__getstate__()!r}"
    texts["batch reader"] = f"{batch!r} {batch!s} {vars(batch)!r}"
    texts["partitions"] = repr(partitions) + repr(batch.partitions())
    texts["offsets"] = json.dumps([start, end])
    stream.stop()

    # Errors: a bad option next to the keys, and a wrong secret against the brokers.
    with pytest.raises(OptionError) as err:
        parse_source_options({**raw, "startingOffsets": "nope"}, streaming=True)
    texts["option error"] = f"{err.value} {err.value!r}"
    with Admin(acl_cluster.namesrv_addr,
               config=ClientConfig(credentials=Credentials(AK, WRONG_SK))) as admin:
        mq = MessageQueue(acl_cluster.topic, "broker-a", 0)
        error = admin.offsets("max", [mq])[mq]
    assert isinstance(error, AuthError), error
    texts["auth error"] = f"{error} {error!r} {error.remark} {error.args!r}"
    assert "Check signature failed for accessKey=<redacted>" in error.remark

    leaks = [leak for name, text in texts.items() for leak in _leaks(text, name)]
    assert not leaks, leaks


@pytest.mark.parametrize("remark, shown", [
    ("org.apache.rocketmq.acl.common.AclException: Check signature failed for accessKey=AK1, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java)",
     "Check signature failed for accessKey=<redacted>, org.apache"),
    ("org.apache.rocketmq.acl.common.AclException: No acl config for AK1, x", "for <redacted>, x"),
    ("User:AK1 is not found.", "User:<redacted> is not found."),
    ("No accessKey is configured", "No accessKey is configured"),
    ("topic[T] not exist, apply first please!", "topic[T] not exist, apply first please!"),
])
def test_broker_remarks_are_redacted(remark, shown):
    assert shown in redact_remark(remark) and "AK1" not in redact_remark(remark)
