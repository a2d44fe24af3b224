"""The source's offsets in the checkpoint: version 2 written, every form an earlier release
wrote still read (rocketmq_spark/source/offsets.py; the forms from its git history), and a
stream started on a version 1 checkpoint going on without loss or duplicates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.source.offsets import (
    UNRESOLVED, entries_of, from_offset, is_unresolved, queue_offsets, to_offset, with_entries,
)
from source_helpers import ids_of, max_offsets, produce, reader, run_available_now

A0, A1, B0 = (MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1),
              MessageQueue("T", "broker-b", 0))


# ------------------------------------------------------------------ version 2: what is written

def test_version_2_is_canonical_json_with_its_fields_in_a_fixed_order():
    offset = to_offset({B0: 3, A1: 2, A0: 1})
    assert json.dumps(offset) == ('{"version": 2, "queues": {"T/broker-a/0": 1, '
                                  '"T/broker-a/1": 2, "T/broker-b/0": 3}}')
    back = json.loads(json.dumps(offset))
    assert from_offset(back) == {A0: 1, A1: 2, B0: 3} and entries_of(back) == {}
    assert not is_unresolved(back)


def test_version_2_without_queues_is_resolved_and_empty():
    offset = json.loads(json.dumps(to_offset({})))
    assert offset == {"version": 2, "queues": {}}
    assert not is_unresolved(offset) and from_offset(offset) == {}


def test_version_2_unresolved_start():
    offset = json.loads(json.dumps(UNRESOLVED))
    assert offset == {"version": 2, "queues": None}
    assert is_unresolved(offset) and from_offset(offset) == {} and entries_of(offset) == {}


def test_version_2_entering_queues():
    end = to_offset({A0: 10, B0: 7}, {B0: 3})
    assert json.dumps(end) == ('{"version": 2, "queues": {"T/broker-a/0": 10, "T/broker-b/0": '
                               '7}, "entering": {"T/broker-b/0": 3}}')
    back = json.loads(json.dumps(end))
    assert from_offset(back) == {A0: 10, B0: 7} and entries_of(back) == {B0: 3}
    assert with_entries(to_offset({A0: 1}), {}) == to_offset({A0: 1})


# ------------------------------------------------------------------ version 1: what was written

def test_version_1_queue_map():
    """17795fd onwards: ``{"topic/brokerName/queueId": next offset}``, keys sorted."""
    old = {"T/broker-a/0": 1, "T/broker-a/1": 2, "T/broker-b/0": 3}
    assert from_offset(old) == {A0: 1, A1: 2, B0: 3} and entries_of(old) == {}
    assert not is_unresolved(old)
    assert queue_offsets(old) == old
    assert to_offset(from_offset(old)) == {"version": 2, "queues": old}


def test_version_1_unresolved_start_is_an_empty_object():
    assert is_unresolved({}) and from_offset({}) == {}


def test_version_1_no_queues_yet():
    """a20db52 onwards: a resolved start with no queue is ``{"(no queues yet)": 0}``."""
    old = {"(no queues yet)": 0}
    assert not is_unresolved(old) and from_offset(old) == {} and queue_offsets(old) == {}


def test_version_1_entered_at_beside_the_queue_keys():
    """d72086a onwards (Spark 4.0, 4.1): the entering queues under ``"(entered at)"``."""
    old = {"(entered at)": {"T/broker-b/0": 3}, "T/broker-a/0": 10, "T/broker-b/0": 7}
    assert from_offset(old) == {A0: 10, B0: 7} and entries_of(old) == {B0: 3}
    assert with_entries(old, entries_of(old)) == to_offset({A0: 10, B0: 7}, {B0: 3})
    with pytest.raises(ValueError, match="must map queues"):
        entries_of({"(entered at)": 5})


# ------------------------------------------------------------------ refused

@pytest.mark.parametrize("bad, message", [
    ({"T/broker-a/x": 1}, "queueId"),
    ({"T/broker-a/0": -1}, "non-negative integer"),
    ({"T/broker-a/0": "1"}, "non-negative integer"),
    ({"nokey": 1}, "nokey"),
    ({"version": 2, "queues": {"T/broker-a/0": True}}, "non-negative integer"),
    ({"version": 2, "queues": [1]}, "must map queues"),
    ({"version": 2, "queues": {}, "other": 1}, "unknown fields"),
    ({"version": 3, "queues": {}}, "version 3; this rocketmq-spark reads versions 1 and 2"),
    ([1, 2], "must be a JSON object"),
])
def test_malformed_offsets_are_refused_naming_the_fault(bad, message):
    with pytest.raises(ValueError, match=message):
        from_offset(bad)


# ------------------------------------------------------------------ as startingOffsets

def test_starting_offsets_take_an_offset_as_the_checkpoint_writes_it():
    from rocketmq_spark.options import OptionError
    from rocketmq_spark.source.options import parse_queue_values

    text = json.dumps(to_offset({A0: 4, B0: 9}))
    assert parse_queue_values("startingOffsets", text, allow_modes=True) == {A0: 4, B0: 9}
    assert parse_queue_values("startingOffsets", '{"T/broker-a/0": 4}', True) == {A0: 4}
    with pytest.raises(OptionError, match="startingOffsets: the offset names no queue"):
        parse_queue_values("startingOffsets", json.dumps(to_offset({})), True)
    with pytest.raises(OptionError, match="startingOffsets: this rocketmq offset has version 7"):
        parse_queue_values("startingOffsets", '{"version": 7, "queues": {}}', True)


# ------------------------------------------------------------------ a real checkpoint

def _rewrite_offset_log_as_version_1(checkpoint: Path) -> int:
    """Turn every batch's source offset in the offset log into the version 1 queue map, as a
    release before the version field wrote it; returns how many were rewritten."""
    count = 0
    for path in (checkpoint / "offsets").iterdir():
        if not path.name.isdigit():
            continue
        lines = path.read_text().splitlines()
        new = json.loads(lines[-1])
        assert new["version"] == 2
        lines[-1] = json.dumps(queue_offsets(new) or {"(no queues yet)": 0})
        path.write_text("\n".join(lines) + "\n")
        count += 1
    return count


def test_a_stream_goes_on_from_a_version_1_checkpoint(spark, cluster, topic, tmp_path):
    checkpoint, sink = tmp_path / "cp", str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(0, 300))
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                maxMessagesPerTrigger=100)
    run_available_now(spark, df, str(checkpoint), sink)
    assert ids_of(spark.read.parquet(sink).collect()) == list(range(300))
    assert _rewrite_offset_log_as_version_1(checkpoint) >= 3

    produce(cluster.namesrv_addr, topic, range(300, 450))
    second = run_available_now(spark, df, str(checkpoint), sink)
    assert ids_of(spark.read.parquet(sink).collect()) == list(range(450)), \
        "each message once after the upgrade"
    end = json.loads(second.lastProgress["sources"][0]["endOffset"])
    assert end["version"] == 2 and queue_offsets(end) == max_offsets(cluster.namesrv_addr,
                                                                       topic)
