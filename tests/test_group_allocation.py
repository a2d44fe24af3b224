"""Queue allocation in a consumer group: every strategy must give exactly the assignment that
Apache RocketMQ's Java client computes, or members written in different languages read the
same queue twice (or leave one unread).

``tests/data/group_allocation_cases.json`` holds 115 cases (hand-picked edge cases and random
ones: several topics, brokers named ``room@name``, duplicate and non-ASCII client ids) with the
shares that the 4.9.x ``AllocateMessageQueue*`` rules and ``ConsistentHashRouter`` produced
when run on OpenJDK 17, topic by topic after sorting both lists as ``RebalanceImpl`` does.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.group.allocation import (
    AVERAGELY, AVERAGELY_BY_CIRCLE, CONSISTENT_HASH, MACHINE_ROOM, HashRing, allocate,
    allocate_all, averagely, java_queue_text, java_sorted, strategy_function,
)

CASES = json.loads((Path(__file__).resolve().parent / "data" / "group_allocation_cases.json")
                   .read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['strategy']}" for i, c in enumerate(CASES)])
def test_matches_the_java_clients_assignment(case):
    queues = [MessageQueue.from_key(k) for k in case["queues"]]
    got = allocate_all(case["strategy"], queues, case["members"], case["virtualNodes"],
                       case["rooms"])
    assert {m: [q.key for q in share] for m, share in got.items()} == case["expected"]


def test_cases_cover_every_strategy_and_the_hard_inputs():
    strategies = Counter(c["strategy"] for c in CASES)
    assert set(strategies) == {AVERAGELY, AVERAGELY_BY_CIRCLE, CONSISTENT_HASH, MACHINE_ROOM}
    assert min(strategies.values()) >= 25
    members = [m for c in CASES for m in c["members"]]
    assert any(ord(ch) > 0xFFFF for m in members for ch in m), "a non-BMP client id"
    assert any(len(c["members"]) != len(set(c["members"])) for c in CASES), "duplicate ids"
    assert any(len({k.split("/")[0] for k in c["queues"]}) > 1 for c in CASES), "two topics"


def test_known_shares():
    t = [MessageQueue("T", "broker-a", i) for i in range(6)] + \
        [MessageQueue("T", "broker-b", i) for i in range(6)]
    shares = allocate_all(AVERAGELY, t, ["m2", "m1"])
    assert shares["m1"] == t[:6] and shares["m2"] == t[6:]
    three = allocate_all(AVERAGELY, t, ["c", "a", "b"])
    assert [len(three[m]) for m in "abc"] == [4, 4, 4] and three["b"] == t[4:8]
    circle = allocate_all(AVERAGELY_BY_CIRCLE, t[:5], ["a", "b"])
    assert circle["a"] == [t[0], t[2], t[4]] and circle["b"] == [t[1], t[3]]
    assert allocate(AVERAGELY, t, ["a", "b"], "stranger") == []
    # Java's MessageQueue.toString, the text that consistent hashing places on the ring.
    assert java_queue_text(t[0]) == "MessageQueue [topic=T, brokerName=broker-a, queueId=0]"


def test_client_ids_sort_as_java_strings():
    # U+1F600 is a surrogate pair in UTF-16 (0xD83D...), which sorts before U+FFFF in Java
    # and after it in Python's code point order.
    assert java_sorted(["\uffffy", "\U0001F600x", "a"]) == ["a", "\U0001F600x", "\uffffy"]


def test_machine_room_reads_only_the_named_rooms_brokers():
    queues = ([MessageQueue("T", "room1@broker-a", i) for i in range(3)]
              + [MessageQueue("T", "room2@broker-b", i) for i in range(3)]
              + [MessageQueue("T", "broker-c", 0), MessageQueue("T", "room1@x@", 0)])
    shares = allocate_all(MACHINE_ROOM, queues, ["a", "b"], rooms=["room1"])
    # Eligible: room1@broker-a/0..2 and room1@x@/0 (Java's split drops the trailing "").
    assert shares == {"a": queues[0:2], "b": [queues[2], queues[7]]}


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="unknown allocation strategy 'roundRobin'"):
        strategy_function("roundRobin")


# ----------------------------------------------------------------------------- properties

member_ids = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=15, unique=True)
queue_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["T", "U", "%RETRY%g"]),
              st.sampled_from(["broker-a", "broker-b", "room1@broker-c", "room2@broker-d"]),
              st.integers(0, 40)),
    min_size=0, max_size=120, unique=True)


def _owners(strategy, queues, members, **kw):
    owners = Counter()
    for share in allocate_all(strategy, queues, members, **kw).values():
        owners.update(share)
    return owners


@settings(max_examples=150, deadline=None)
@given(queue_lists, member_ids, st.sampled_from([AVERAGELY, AVERAGELY_BY_CIRCLE,
                                                 CONSISTENT_HASH]), st.integers(1, 30))
def test_every_queue_has_exactly_one_member(queues, members, strategy, virtual_nodes):
    owners = _owners(strategy, queues, members, virtual_nodes=virtual_nodes)
    assert set(owners) == set(queues)
    assert all(n == 1 for n in owners.values())


@settings(max_examples=100, deadline=None)
@given(queue_lists, member_ids, st.sets(st.sampled_from(["room1", "room2", "room3"])))
def test_machine_room_gives_each_eligible_queue_one_member(queues, members, rooms):
    owners = _owners(MACHINE_ROOM, queues, members, rooms=rooms)
    eligible = {q for q in queues if q.broker_name.split("@")[0] in rooms}
    assert set(owners) == eligible and all(n == 1 for n in owners.values())


@settings(max_examples=100, deadline=None)
@given(queue_lists, member_ids, st.randoms(use_true_random=False))
def test_shares_do_not_depend_on_input_order_and_are_balanced(queues, members, rnd):
    shuffled_q, shuffled_m = list(queues), list(members)
    rnd.shuffle(shuffled_q)
    rnd.shuffle(shuffled_m)
    for strategy in (AVERAGELY, AVERAGELY_BY_CIRCLE, CONSISTENT_HASH):
        assert allocate_all(strategy, queues, members) == \
            allocate_all(strategy, shuffled_q, shuffled_m)
    per_topic = Counter(q.topic for q in queues)
    for topic, n in per_topic.items():
        sizes = [len([q for q in share if q.topic == topic])
                 for share in allocate_all(AVERAGELY, queues, members).values()]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 200), min_size=1, max_size=100, unique=True), member_ids,
       st.text(min_size=1, max_size=12))
def test_consistent_hash_moves_only_queues_to_a_joining_member(queue_ids, members, newcomer):
    if newcomer in members:
        return
    queues = [MessageQueue("T", "broker-a", i) for i in queue_ids]
    before = allocate_all(CONSISTENT_HASH, queues, members)
    after = allocate_all(CONSISTENT_HASH, queues, members + [newcomer])
    for member in members:
        assert set(after[member]) <= set(before[member])


def test_averagely_is_the_plain_function_after_sorting():
    queues = [MessageQueue("T", "b", i) for i in range(10)]
    ids = [f"id{i}" for i in range(4)]
    rnd = random.Random(7)
    for _ in range(20):
        me = rnd.choice(ids)
        assert allocate(AVERAGELY, queues, ids, me) == averagely(queues, ids, me)
    ring = HashRing(ids, 0)
    assert ring.route("anything") is None  # no points: nobody (as Java's router)
