"""Planning rules as pure functions: next end offsets, fair limits, partitions, offset dicts."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.errors import DataLossError
from rocketmq_spark.source.offsets import from_offset, to_offset
from rocketmq_spark.source.planning import QueueRange, fair_caps, next_end, pack, ranges, split

A0, A1, B0 = (MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1),
              MessageQueue("T", "broker-b", 0))


def unreachable(mq):
    return "unreachable"


def vanished(mq):
    return "vanished"


def test_routed_queues_move_to_latest_and_silent_brokers_keep_their_offset():
    end = next_end({A0: 5, A1: 7, B0: 9}, [A0, A1, B0], vanished, {A0: 10, A1: 7}, {}, True)
    assert end == {A0: 10, A1: 7, B0: 9}  # B0 did not answer: no progress, no loss


def test_unrouted_queue_of_a_stopped_broker_is_kept_not_lost():
    assert next_end({A0: 5, B0: 9}, [A0], unreachable, {A0: 6}, {}, True) == {A0: 6, B0: 9}


def test_vanished_queue_fails_or_is_dropped():
    with pytest.raises(DataLossError) as err:
        next_end({A0: 5, B0: 9}, [A0], vanished, {A0: 6}, {}, True)
    assert "T/broker-b/0" in str(err.value)
    assert next_end({A0: 5, B0: 9}, [A0], vanished, {A0: 6}, {}, False) == {A0: 6}


def test_new_queue_enters_with_an_empty_range_at_its_min_offset():
    end = next_end({A0: 5}, [A0, A1], vanished, {A0: 8, A1: 40}, {A1: 3}, True)
    assert end == {A0: 8, A1: 3}
    assert ranges({A0: 5}, end) == [QueueRange(A0, 5, 8)]  # A1 is read from 3 next batch


def test_queue_whose_max_went_backwards_is_data_loss():
    with pytest.raises(DataLossError) as err:
        next_end({A0: 50}, [A0], vanished, {A0: 10}, {}, True)
    assert "went back" in str(err.value)
    assert next_end({A0: 50}, [A0], vanished, {A0: 10}, {}, False) == {A0: 10}
    assert ranges({A0: 50}, {A0: 10}) == []


def test_limit_is_split_fairly_and_target_caps_available_now():
    end = next_end({A0: 0, A1: 0, B0: 0}, [A0, A1, B0], vanished,
                   {A0: 1000, A1: 5, B0: 1000}, {}, True, max_rows=101)
    assert end == {A0: 48, A1: 5, B0: 48}
    capped = next_end({A0: 0, A1: 0}, [A0, A1], vanished, {A0: 1000, A1: 1000}, {}, True,
                      target={A0: 10, A1: 2000})
    assert capped == {A0: 10, A1: 1000}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=12), st.integers(1, 3000))
def test_fair_caps_properties(avail, limit):
    queues = [MessageQueue("T", "b", i) for i in range(len(avail))]
    available = dict(zip(queues, avail))
    caps = fair_caps(available, limit)
    assert sum(caps.values()) == min(limit, sum(avail))
    assert all(0 <= caps[q] <= available[q] for q in queues)
    # No queue that could take more is more than one message behind another queue.
    hungry = [q for q in queues if caps[q] < available[q]]
    if hungry:
        assert max(caps.values()) - min(caps[q] for q in hungry) <= 1
    assert fair_caps(dict(reversed(list(available.items()))), limit) == caps


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 400)), min_size=1, max_size=6),
       st.integers(1, 40))
def test_split_covers_each_range_exactly(spec, min_partitions):
    queue_ranges = [QueueRange(MessageQueue("T", "b", i), s, s + n)
                    for i, (s, n) in enumerate(spec) if n > 0]
    parts = split(queue_ranges, min_partitions)
    for r in queue_ranges:
        mine = sorted((p.start, p.end) for p in parts if p.queue == r.queue)
        assert mine[0][0] == r.start and mine[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert all(e > s for s, e in mine)
    total = sum(r.size for r in queue_ranges)
    if queue_ranges:
        assert len(parts) >= min(min_partitions, total)


def test_offsets_are_canonical_json():
    positions = {B0: 3, A1: 2, A0: 1}
    offset = to_offset(positions)
    assert json.dumps(offset) == ('{"version": 2, "queues": {"T/broker-a/0": 1, '
                                  '"T/broker-a/1": 2, "T/broker-b/0": 3}}')
    assert from_offset(json.loads(json.dumps(offset))) == positions
    for bad in ({"T/broker-a/x": 1}, {"T/broker-a/0": -1}, {"T/broker-a/0": "1"},
                {"nokey": 1}):
        with pytest.raises(ValueError):
            from_offset(bad)


def test_small_ranges_are_packed_and_large_ones_stand_alone():
    small = [QueueRange(MessageQueue("T", "b", i), 0, 10) for i in range(6)]
    big = QueueRange(MessageQueue("T", "b", 9), 0, 50_000)
    groups = pack(small + [big], min_messages=25)
    assert [[r.queue.queue_id for r in g] for g in groups] == [[0, 1, 2], [3, 4, 5], [9]]
    assert pack(small, min_messages=4096) == [small]
    # minPartitions asks for parallelism: no packing, ranges split instead.
    assert len(pack([big], min_partitions=4)) == 4
