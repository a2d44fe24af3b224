"""The driver side of group membership (rocketmq_spark/client/group/membership.py) against the
embedded brokers over real sockets, without Spark: members agree on their shares, hear the
broker's NOTIFY_CONSUMER_IDS_CHANGED, hand queues over through committed offsets, respect
broker locks, and leave (commit, unlock, unregister) on SIGTERM."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.config import ClientConfig
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.group.allocation import allocate_all
from rocketmq_spark.client.group.membership import GroupMember, member_client_id

from group_helpers import lock_holders
from waiting import wait_until

HERE = Path(__file__).resolve().parent


def make_member(namesrv: str, group: str, topic: str, name: str, **kw) -> GroupMember:
    return GroupMember(namesrv, ClientConfig(client_id=member_client_id(name)), group,
                       lambda: [topic], lambda queues, first: {mq: 0 for mq in queues}, **kw)


@pytest.fixture
def cluster(embedded_cluster_factory):
    c = embedded_cluster_factory(brokers=2, rebalance_lock_max_live_seconds=2.0)
    c.create_topic("MemberT", queues=6)
    return c


def queues_of(cluster, topic="MemberT"):
    with Admin(cluster.namesrv_addr) as admin:
        return admin.queues(topic, refresh=True)


def test_client_id_is_readable_and_unique_per_run():
    a, b = member_client_id("orders-etl"), member_client_id("orders-etl")
    assert a != b
    ip, _, rest = a.partition("@")
    assert ip.count(".") == 3 and rest.startswith(f"spark-orders-etl-{os.getpid()}-")


def test_members_agree_and_rebalance_on_the_brokers_notification(cluster):
    members = []
    try:
        members.append(make_member(cluster.namesrv_addr, "agree", "MemberT", "a").start())
        assert len(members[0].wanted) == 12
        members.append(make_member(cluster.namesrv_addr, "agree", "MemberT", "b").start())
        # The 20 s round is far away: only the notification can make "a" rebalance this soon.
        wait_until(lambda: len(members[0].wanted) == 6, 5, "a to hear of b")
        assert members[0].notifications >= 1
        members.append(make_member(cluster.namesrv_addr, "agree", "MemberT", "c").start())
        wait_until(lambda: all(len(m.wanted) == 4 for m in members), 5, "4 queues each")
        ids = [m.client_id for m in members]
        expected = allocate_all("averagely", queues_of(cluster), ids)
        for m in members:
            assert sorted(m.wanted) == sorted(expected[m.client_id])
        connections = members[0].admin.brokers.get_consumer_connection_list(
            cluster.broker("broker-a").addr, "agree")
        assert sorted(c["clientId"] for c in connections["connectionSet"]) == sorted(ids)
        assert connections["consumeType"] == "CONSUME_ACTIVELY"
        assert set(connections["subscriptionTable"]) == {"MemberT", "%RETRY%agree"}
        members.pop().leave()  # UNREGISTER_CLIENT: the others hear it at once
        wait_until(lambda: all(len(m.wanted) == 6 for m in members), 5, "6 queues each again")
    finally:
        for m in members:
            m.leave()


def test_hand_over_commits_then_unlocks_and_the_successor_starts_there(cluster):
    group = "handover"
    a = make_member(cluster.namesrv_addr, group, "MemberT", "a", lock_queues=True).start()
    b = None
    try:
        entered = a.apply_allocation({}).entering
        assert len(entered) == 12 and set(entered.values()) == {0}
        assert set(lock_holders(cluster, group).values()) == {a.client_id}
        b = make_member(cluster.namesrv_addr, group, "MemberT", "b", lock_queues=True).start()
        wait_until(lambda: len(a.wanted) == 6, 5, "a to give up 6 queues")
        # b may not read them yet: a still holds their locks until its running batch ends.
        assert b.apply_allocation({}).entering == {}
        done = {mq: 40 + mq.queue_id for mq in entered}  # a's batches ended here
        kept = a.apply_allocation(done).kept
        assert sorted(kept) == sorted(a.wanted)
        moved = sorted(set(entered) - set(kept))
        with Admin(cluster.namesrv_addr) as admin:
            group_offsets = admin.offsets("committed", moved, group=group)
        assert group_offsets == {mq: done[mq] for mq in moved}  # committed before unlocking
        wait_until(lambda: len(b.lock_ok) == 6, 5, "b to lock the queues a released")
        joined = b.apply_allocation({}).entering
        assert joined == {mq: done[mq] for mq in moved}
        assert lock_holders(cluster, group) == {
            **{mq: a.client_id for mq in kept}, **{mq: b.client_id for mq in moved}}
    finally:
        a.leave()
        if b is not None:
            b.leave()
    assert lock_holders(cluster, group) == {}


def test_a_locked_queue_is_not_read_until_released_or_expired(cluster):
    group = "locked"
    queues = queues_of(cluster)
    blocked = queues[:3]
    address = cluster.broker("broker-a").addr
    blocker = Admin(cluster.namesrv_addr, config=ClientConfig(client_id="blocker"))
    member = make_member(cluster.namesrv_addr, group, "MemberT", "m", lock_queues=True,
                         interval=0.5)
    try:
        assert blocker.brokers.lock_batch_mq(address, group, blocked) == blocked
        member.start()
        entering = member.apply_allocation({}).entering
        assert set(entering) == set(queues) - set(blocked)
        blocker.brokers.unlock_batch_mq(address, group, blocked[:1])
        after = {mq: 0 for mq in entering}
        wait_until(lambda: blocked[0] in member.apply_allocation(after).entering, 5,
                   "the released queue to join")
        # The other two expire (2 s here; 60 s on a default broker) as the blocker never
        # renews them.
        t0 = time.monotonic()
        state = {mq: 0 for mq in queues if mq not in blocked[1:]}
        wait_until(lambda: set(blocked[1:]) <= set(member.apply_allocation(state).entering), 10,
                   "the expired locks to be taken")
        assert time.monotonic() - t0 > 1.0
    finally:
        member.leave()
        blocker.close()


def test_a_member_whose_lock_is_taken_stops_reading_that_queue(cluster):
    group = "stolen"
    member = make_member(cluster.namesrv_addr, group, "MemberT", "m", lock_queues=True,
                         interval=0.5)
    thief = Admin(cluster.namesrv_addr, config=ClientConfig(client_id="thief"))
    try:
        member.start()
        held = member.apply_allocation({}).entering
        victim = sorted(held)[0]
        # The broker restarted and forgot the member's locks, and another client locked the
        # queue first (set on the broker's loop, so no renewal of the member's comes between).
        broker = cluster._broker(victim.broker_name)
        cluster._call(lambda: broker._locks.__setitem__(
            (group, (victim.topic, victim.broker_name, victim.queue_id)),
            ("thief", time.monotonic())))
        wait_until(lambda: victim not in member.lock_ok, 5, "the member to notice")
        thief.brokers.lock_batch_mq(cluster.broker(victim.broker_name).addr, group, [victim])
        share = member.apply_allocation({mq: 7 for mq in held})
        assert victim not in share.kept and victim not in member.held
        with Admin(cluster.namesrv_addr) as admin:  # not committed: it may belong to another
            assert admin.offsets("committed", [victim], group=group)[victim] != 7
    finally:
        member.leave()
        thief.close()


def test_sigterm_leaves_the_group_commits_and_unlocks(cluster, tmp_path):
    """SIGTERM (how Spark ends the runner) while the main thread is inside a request on the
    member's own connection (here a pull the broker holds for 30 s): the member still commits,
    unlocks and unregisters at once, then dies of the signal."""
    group = "sigterm"
    script = tmp_path / "member.py"
    script.write_text(f"""
import sys, json, time
sys.path.insert(0, {str(HERE)!r})
from test_group_member import make_member
from rocketmq_spark.client.pull import PullRequest
m = make_member({cluster.namesrv_addr!r}, {group!r}, "MemberT", "term", lock_queues=True)
m.start()
entered = m.apply_allocation({{}}).entering
m.apply_allocation({{mq: 11 for mq in entered}})  # a batch ended at 11 everywhere
print(json.dumps({{"id": m.client_id, "held": len(m.held)}}), flush=True)
mq = sorted(entered)[0]
m.admin.brokers.pull(m.addresses[mq.broker_name], PullRequest(
    {group!r}, mq.topic, mq.queue_id, 0, mq.broker_name, suspend_timeout_ms=30000))
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=str(HERE))
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["held"] == 12
        assert len(lock_holders(cluster, group)) == 12
        assert ready["id"] in cluster.consumer_clients(group)
        queues = queues_of(cluster)
        wait_until(lambda: sum(cluster._call(lambda b=b: len(b.long_poll))
                               for b in cluster._brokers), 10, "the pull to be parked")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM  # then it dies of the signal, as before
        assert time.monotonic() - t0 < 3
    finally:
        proc.kill()
    # Locks outlive connections on a RocketMQ broker: only an unlock frees them this soon.
    assert lock_holders(cluster, group) == {}
    assert cluster.consumer_clients(group) == []
    with Admin(cluster.namesrv_addr) as admin:
        assert set(admin.offsets("committed", queues, group=group).values()) == {11}


def aged(cluster, queues) -> None:
    """Messages whose head retention removed: a 4.9.x broker then answers QUERY_NOT_FOUND for
    a group with no offset (for a queue whose first message is still in memory it answers 0,
    and RocketMQ's own consumers start there too)."""
    for mq in queues:
        cluster.append(mq.topic, mq.broker_name, mq.queue_id, [b"x"] * 5)
        cluster.truncate(mq.topic, mq.broker_name, mq.queue_id, 2)


def test_queues_added_to_the_topic_join_at_their_first_message(cluster):
    """``startingOffsets`` applies to the query's first batch only: a queue the topic gains
    later is allocated at the next rebalance, seconds after its first messages, so it joins at
    its first message (as queues new to a stream do), never at "latest"."""
    aged(cluster, queues_of(cluster))
    calls = []

    def entry(queues, first):
        calls.append((sorted(q.key for q in queues), first))
        return {mq: 1000 if first else 0 for mq in queues}  # 1000 plays "latest"

    member = GroupMember(cluster.namesrv_addr, ClientConfig(client_id=member_client_id("grow")),
                         "grow", lambda: ["MemberT"], entry)
    try:
        member.start()
        first = member.apply_allocation({}, first=True).entering
        assert set(first.values()) == {1000} and calls[-1][1] is True
        cluster.add_queues("MemberT", 7)
        aged(cluster, [mq for mq in queues_of(cluster) if mq.queue_id == 6])
        member.rebalance()  # the next round (every rebalanceIntervalMs)
        grown = member.apply_allocation(first).entering
        assert sorted(mq.queue_id for mq in grown) == [6, 6] and set(grown.values()) == {0}
        assert calls[-1][1] is False
    finally:
        member.leave()


def test_consumer_progress_sees_each_members_queues_through_the_broker(cluster):
    """What ``mqadmin consumerProgress`` does per member: GET_CONSUMER_RUNNING_INFO to a
    broker, which asks the member on its own connection and passes the answer back."""
    group = "progress"
    a = make_member(cluster.namesrv_addr, group, "MemberT", "a", lock_queues=True).start()
    b = make_member(cluster.namesrv_addr, group, "MemberT", "b", lock_queues=True).start()
    admin = Admin(cluster.namesrv_addr)
    try:
        wait_until(lambda: len(a.wanted) == 6 and len(b.lock_ok) == 6, 10, "6 queues each")
        for m in (a, b):
            m.apply_allocation({})
        address = cluster.broker("broker-b").addr
        for m in (a, b):
            body = admin.brokers.get_consumer_running_info(address, group, m.client_id)
            text = body.decode()
            keys = re.findall(r'\{"brokerName":"([^"]+)","queueId":(\d+),"topic":"([^"]+)"\}:',
                              text)
            assert sorted(MessageQueue(t, bn, int(q)) for bn, q, t in keys) == sorted(m.held)
            assert '"locked":true' in text and f'"clientId":"{m.client_id}"' in text
            assert '"PROP_CONSUME_TYPE":"CONSUME_ACTIVELY"' in text
        with pytest.raises(Exception, match="not online"):
            admin.brokers.get_consumer_running_info(address, group, "10.0.0.9@nobody")
    finally:
        a.leave()
        b.leave()
        admin.close()
