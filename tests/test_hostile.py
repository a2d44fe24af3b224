"""Malformed data from a broker, for real: the embedded broker serves a damaged stored record
(``EmbeddedCluster.corrupt``) and every reader fails with an error that names the queue and the
offset. Nothing is skipped silently (not even with failOnDataLoss=false: a corrupt message is
not lost, it is wrong), the Python worker survives, a checkpointed stream never commits past the
bad message, and it resumes once the message is repaired or retention drops it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketmq_spark.client import MessageQueue, QueueRangeReader, ReadSettings
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import MessageDecodeError
from rocketmq_spark.client.protocol import pull_decode
from rocketmq_spark.embedded.cluster import EmbeddedCluster
from rocketmq_spark.source.offsets import queue_offsets
from source_helpers import committed, ids_of, reader, run_available_now

BAD = 70  # the damaged message's offset in the reader tests
WORKER_CRASH = ("Python worker exited unexpectedly", "crashed", "Segmentation fault",
                "SIGSEGV", "EOFException")


def _one_queue(cluster, name: str, n: int = 100) -> MessageQueue:
    cluster.create_topic(name, queues=1, brokers=["broker-a"])
    cluster.append(name, "broker-a", 0, [b"m%d" % i for i in range(n)], tags="x",
                   keys="k")
    return MessageQueue(name, "broker-a", 0)


def _read(cluster, mq, start, end, **settings):
    with Admin(cluster.namesrv_addr) as admin:
        r = QueueRangeReader(admin.brokers, admin.address, mq, start, end,
                             ReadSettings(consumer_group="hostile", **settings))
        return [row["body"] for batch in r for row in batch.to_pylist()]


@pytest.fixture(params=["C", "numpy"])
def decoder(request, monkeypatch):
    if request.param == "C" and pull_decode._native is None:
        pytest.skip("the C accelerator is not built")
    monkeypatch.setattr(pull_decode, "FORCE_PURE_PYTHON", request.param == "numpy")
    return request.param


# ----------------------------------------------------------------------------- the client


@pytest.mark.parametrize("field", EmbeddedCluster.CORRUPT_FIELDS)
def test_reader_names_the_queue_and_offset_of_a_damaged_message(cluster, unique_name, field,
                                                                  decoder):
    mq = _one_queue(cluster, unique_name("Hostile"))
    cluster.corrupt(mq.topic, mq.broker_name, mq.queue_id, BAD, field)

    # Everything before it reads, although the broker's answer holds the bad record too.
    assert _read(cluster, mq, 0, BAD) == [b"m%d" % i for i in range(BAD)]
    assert _read(cluster, mq, BAD + 1, 100) == [b"m%d" % i for i in range(BAD + 1, 100)]
    for start, settings in ((0, {}), (BAD - 3, {}), (BAD, {}), (0, {"fail_on_data_loss": False}),
                            (0, {"subscription": "x"}), (0, {"max_msg_nums": 1})):
        with pytest.raises(MessageDecodeError) as err:
            _read(cluster, mq, start, 100, **settings)
        text = str(err.value)
        assert f"corrupt message in queue {mq.key} at offset {BAD} " in text, (settings, text)
        assert err.value.queue == mq and err.value.queue_offset == BAD

    cluster.repair(mq.topic, mq.broker_name, mq.queue_id, BAD)
    assert _read(cluster, mq, 0, 100) == [b"m%d" % i for i in range(100)]


def test_a_damaged_body_passes_only_with_the_crc_check_off(cluster, unique_name):
    mq = _one_queue(cluster, unique_name("Hostile"))
    cluster.corrupt(mq.topic, mq.broker_name, mq.queue_id, BAD, "body")
    with pytest.raises(MessageDecodeError, match="body CRC mismatch"):
        _read(cluster, mq, 0, 100)
    bodies = _read(cluster, mq, 0, 100, verify_crc=False)  # verifyCrc=false: the user's call
    assert len(bodies) == 100 and bodies[BAD] != b"m%d" % BAD


def test_a_message_the_filter_leaves_out_does_not_fail_the_read(cluster, unique_name):
    mq = _one_queue(cluster, unique_name("Hostile"))
    cluster.append(mq.topic, "broker-a", 0, [b"y%d" % i for i in range(10)], tags="y")
    cluster.corrupt(mq.topic, mq.broker_name, mq.queue_id, BAD, "magic")
    # The broker filters by the consume queue's tag code: the bad record is never sent.
    assert _read(cluster, mq, 0, 110, subscription="y") == [b"y%d" % i for i in range(10)]


def test_corrupt_checks_its_arguments(cluster, unique_name):
    mq = _one_queue(cluster, unique_name("Hostile"), n=2)
    with pytest.raises(ValueError, match="field must be one of"):
        cluster.corrupt(mq.topic, mq.broker_name, 0, 0, "everything")
    with pytest.raises(IndexError):
        cluster.corrupt(mq.topic, mq.broker_name, 0, 5)
    with pytest.raises(KeyError):
        cluster.repair(mq.topic, mq.broker_name, 0, 1)


# ------------------------------------------------------------------------------- Spark


def _assert_our_error(text: str, mq: MessageQueue, offset: int) -> None:
    assert f"corrupt message in queue {mq.key} at offset {offset}" in text, text[-3000:]
    assert "MessageDecodeError" in text, text[-3000:]
    for sign in WORKER_CRASH:
        assert sign not in text, f"the Python worker crashed ({sign!r}):\n{text[-3000:]}"


def _committed_batches(checkpoint: Path) -> dict:
    """Source offsets of every batch Spark committed: {batch id: {queue key: offset}}."""
    out = {}
    commits = checkpoint / "commits"
    for f in commits.iterdir() if commits.is_dir() else []:
        if f.name.isdigit():
            lines = (checkpoint / "offsets" / f.name).read_text().splitlines()
            out[int(f.name)] = queue_offsets(json.loads(lines[-1]))
    return out


def test_batch_read_of_a_damaged_message_fails_naming_it(spark, cluster, unique_name):
    topic = unique_name("HostileBatch")
    cluster.create_topic(topic, queues=2)
    for b in ("broker-a", "broker-b"):
        for q in (0, 1):
            cluster.append(topic, b, q, [f"{b}-{q}-{i}".encode() for i in range(40)], keys="k")
    mq = MessageQueue(topic, "broker-b", 1)
    cluster.corrupt(topic, mq.broker_name, mq.queue_id, 25, "size")

    def df(**options):
        r = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
            .option("subscribe", topic)
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    for lenient in ("true", "false"):
        with pytest.raises(Exception) as err:
            df(failOnDataLoss=lenient).collect()
        _assert_our_error(str(err.value), mq, 25)
    # Up to just before it, the read works.
    ending = json.dumps({topic: {"broker-a/0": -1, "broker-a/1": -1, "broker-b/0": -1,
                                 "broker-b/1": 25}})
    assert df(endingOffsets=ending).count() == 3 * 40 + 25
    cluster.repair(topic, mq.broker_name, mq.queue_id, 25)
    assert df().count() == 160


def test_stream_stops_at_a_damaged_message_and_resumes_once_it_is_gone(
        spark, cluster, unique_name, tmp_path):
    topic, group = unique_name("HostileStream"), unique_name("hostile-group")
    cluster.create_topic(topic, queues=1)  # one queue on each broker
    sent = {"broker-a": [], "broker-b": []}

    def put(n: int) -> None:
        for b in sent:
            first = len(sent[b])
            ids = [(1000 if b == "broker-b" else 0) + first + i for i in range(n)]
            for i in ids:  # one message each, keys carry the id
                cluster.append(topic, b, 0, [b"v%d" % i], keys=str(i))
            sent[b] += ids

    checkpoint, sink = tmp_path / "cp", str(tmp_path / "out")

    def stream(**options):
        return reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                      consumerGroup=group, **options)

    put(20)
    run_available_now(spark, stream(), str(checkpoint), sink)
    assert spark.read.parquet(sink).count() == 40

    put(20)
    mq = MessageQueue(topic, "broker-a", 0)
    bad = 25
    cluster.corrupt(topic, "broker-a", 0, bad, "crc")
    for options in ({}, {"failOnDataLoss": "false"}):
        with pytest.raises(Exception) as err:
            run_available_now(spark, stream(**options), str(checkpoint), sink)
        _assert_our_error(str(err.value), mq, bad)
        # Nothing of the failed batch is reported as done: not in the sink, not committed in
        # the checkpoint, not committed to the consumer group.
        assert ids_of(spark.read.parquet(sink).select("keys").collect()) == sorted(
            sent["broker-a"][:20] + sent["broker-b"][:20])
        for batch, offsets in _committed_batches(checkpoint).items():
            assert offsets.get(mq.key, 0) <= bad, (batch, offsets)
        assert committed(cluster.namesrv_addr, topic, group)[mq.key] <= bad

    # Retention drops the bad message; the same checkpoint resumes past it, losing only what
    # retention took (logged and counted with failOnDataLoss=false).
    cluster.truncate(topic, "broker-a", 0, bad + 1)
    run_available_now(spark, stream(failOnDataLoss="false"), str(checkpoint), sink)
    lost = set(sent["broker-a"][20:bad + 1])
    want = sorted(set(sent["broker-a"] + sent["broker-b"]) - lost)
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == want
    assert committed(cluster.namesrv_addr, topic, group)[mq.key] == 40
