"""The embedded 5.x proxy's remoting port, with hand-built frames and with our client.

What it answers and refuses follows Apache RocketMQ 5.1's proxy remoting source (read, not run
against a genuine proxy): GetTopicRouteActivity.java and ProxyTopicRouteData.java (routes),
AbstractRemotingActivity.java (the ``bname``/``n`` field, VERSION_NOT_SUPPORTED),
PullMessageActivity.java (subscription, suspend + 10 s), ConsumerManagerActivity.java (lock,
consumer list), ClientManagerActivity.java (heartbeats), TransactionActivity.java and
TransactionProcessor.java (END_TRANSACTION), RemotingProtocolServer.java (what is registered).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rocketmq_spark.client import (
    ClientConfig, Producer, QueueRangeReader, ReadSettings, make_tls_context,
)
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.read.busy_brokers import BusyBrokers, busy_target
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.properties import encode_properties
from rocketmq_spark.client.protocol.route import TopicRouteData
from rocketmq_spark.client.errors import ResponseError
from rocketmq_spark.client.group.requests import lock_queues, master_addresses
from raw_client import RawClient
from embedded_cli import embedded_cli, printed
from waiting import wait_until

NO_BNAME = "Request doesn't have field bname"
END_TRANSACTION = 37
PEER = Path(__file__).with_name("cpp_peer.py")
BUSY_REMARK = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in "
               "queue: 5012ms, size of queue: 4711")


@pytest.fixture(scope="module")
def proxied():
    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=2, proxy_remoting=True) as cluster:
        yield cluster


def pull_fields(topic, queue_id=0, offset=0, sys_flag=4, suspend=0, group="G", bname=None):
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
              "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": str(sys_flag),
              "commitOffset": "0", "suspendTimeoutMillis": str(suspend), "subVersion": "0",
              "subscription": "*", "expressionType": "TAG"}
    if bname is not None:
        fields["bname"] = bname
    return fields


def test_routes_name_every_broker_at_the_proxy_address(proxied, unique_name):
    topic = unique_name("PxRoute")
    proxied.create_topic(topic, 2)
    with RawClient(proxied.proxy_remoting_addr) as raw:
        r = raw.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert r.code == ResponseCode.SUCCESS
        route = TopicRouteData.from_json(r.body)
        assert sorted(b.broker_name for b in route.broker_datas) == ["broker-a", "broker-b"]
        assert {a for b in route.broker_datas for a in b.broker_addrs.values()} == {
            proxied.proxy_remoting_addr}
        assert all(list(b.broker_addrs) == [0] for b in route.broker_datas)
        # what a genuine 5.1.4 proxy adds (captures/rocketmq-5.1.4-proxy-remoting seq 3)
        assert (r.fields["MSG_REGION"], r.fields["TRACE_ON"]) == ("", "false")
        missing = raw.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "PxNoSuchTopic"})
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        assert missing.remark.startswith("CODE: 17  DESC: No topic route info in name server "
                                         "for the topic: PxNoSuchTopic\n")


def test_refusals_as_the_5_1_proxy_words_them(proxied, unique_name):
    topic = unique_name("PxRefuse")
    proxied.create_topic(topic, 2)
    with RawClient(proxied.proxy_remoting_addr) as raw:
        no_bname = raw.request(RequestCode.PULL_MESSAGE, pull_fields(topic))
        assert (no_bname.code, no_bname.remark) == (ResponseCode.VERSION_NOT_SUPPORTED, NO_BNAME)
        # SEND_MESSAGE_V2 names its broker in "n", not "bname"
        v2 = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
              "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
              "bname": "broker-a"}
        refused = raw.request(RequestCode.SEND_MESSAGE_V2, v2, b"x")
        assert (refused.code, refused.remark) == (ResponseCode.VERSION_NOT_SUPPORTED, NO_BNAME)
        sent = raw.request(RequestCode.SEND_MESSAGE_V2, {**v2, "n": "broker-a"}, b"x")
        assert sent.code == ResponseCode.SUCCESS
        unknown = raw.request(RequestCode.GET_MAX_OFFSET,
                              {"topic": topic, "queueId": "0", "bname": "broker-zz"})
        assert unknown.code == ResponseCode.TOPIC_NOT_EXIST and "broker-zz" in unknown.remark
        cluster_info = raw.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        assert (cluster_info.code, cluster_info.remark) == (
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 106 not supported")
        no_sub = raw.request(RequestCode.PULL_MESSAGE,
                             pull_fields(topic, sys_flag=0, bname="broker-a", group="PxNobody"))
        assert (no_sub.code, no_sub.remark) == (ResponseCode.SUBSCRIPTION_NOT_LATEST,
                                                "the consumer's subscription not latest")
        nobody = raw.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "PxNone"})
        assert (nobody.code, nobody.remark) == (ResponseCode.SYSTEM_ERROR, None)
        empty = json.dumps({"clientId": "c", "consumerGroup": "g", "mqSet": []}).encode()
        lock = raw.request(RequestCode.LOCK_BATCH_MQ, body=empty)
        assert (lock.code, lock.remark) == (ResponseCode.SYSTEM_ERROR,
                                            "MessageQueue set is empty")


def test_a_suspended_pull_is_held_at_the_broker_and_answered_through_the_proxy(proxied,
                                                                              unique_name):
    topic = unique_name("PxLongPoll")
    proxied.create_topic(topic, 1, brokers=["broker-b"])
    with RawClient(proxied.proxy_remoting_addr, timeout=20) as raw:
        waiting = raw.send(RequestCode.PULL_MESSAGE,
                           pull_fields(topic, sys_flag=4 | 2, suspend=15000, bname="broker-b"))
        time.sleep(0.3)  # give the pull time to be suspended; it must still be waiting
        assert not waiting.done()
        proxied.append(topic, "broker-b", 0, [b"wake"])
        answer = waiting.result(15)
        assert answer.code == ResponseCode.SUCCESS and answer.fields["nextBeginOffset"] == "1"
        quiet = raw.request(RequestCode.PULL_MESSAGE,
                            pull_fields(topic, 0, 1, sys_flag=4 | 2, suspend=300,
                                        bname="broker-b"))
        assert quiet.code == ResponseCode.PULL_NOT_FOUND


def test_offsets_commits_and_locks_reach_each_broker_through_one_address(proxied, unique_name):
    topic, group = unique_name("PxOffsets"), unique_name("PxGroup")
    proxied.create_topic(topic, 2)
    for b in proxied.brokers:
        proxied.append(topic, b.name, 1, [b"%d" % i for i in range(3 if b.name == "broker-a"
                                                                     else 5)])
    with Admin(proxied.proxy_remoting_addr) as admin:
        queues = admin.queues(topic, refresh=True)
        assert {admin.master_address(mq) for mq in queues} == {proxied.proxy_remoting_addr}
        maxes = admin.offsets("max", queues)
        assert {(mq.broker_name, mq.queue_id): n for mq, n in maxes.items()} == {
            ("broker-a", 0): 0, ("broker-a", 1): 3, ("broker-b", 0): 0, ("broker-b", 1): 5}
        admin.commit_offsets(group, {mq: maxes[mq] for mq in queues})
        wait_until(lambda: proxied.consumer_offset(group, topic, "broker-b", 1) == 5, 10,
                   "broker-b's commit")
        assert proxied.consumer_offset(group, topic, "broker-a", 1) == 3
        # one LOCK_BATCH_MQ per broker: the proxy hands a request to its first queue's broker
        addresses = master_addresses(admin, [topic])
        granted, refused = lock_queues(admin, group, queues, addresses, threading.Event())
        assert sorted(granted) == sorted(queues) and not refused
        me = admin.remoting.config.client_id
        for b in proxied.brokers:
            assert proxied.lock_holders(group, b.name) == {
                (topic, b.name, q): me for q in (0, 1)}


def test_end_transaction_is_answered_at_once_and_dropped_without_a_relayed_check(
        proxied, unique_name):
    """TransactionActivity answers SUCCESS before anything is decided; a genuine 5.1.4 proxy
    keeps no prepared send over remoting, so a first-phase END_TRANSACTION finds nothing and
    reaches no broker (captures/rocketmq-5.1.4-proxy-remoting seq 710-728, 955/956)."""
    topic, group = unique_name("PxTxn"), unique_name("PxTxnGroup")
    proxied.create_topic(topic, 1, brokers=["broker-a"])
    props = encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": "PXUNIQ1"})
    v2 = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "4",
          "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false",
          "n": "broker-a"}
    with RawClient(proxied.proxy_remoting_addr) as raw:
        half = raw.request(RequestCode.SEND_MESSAGE_V2, v2, b"held")
        assert half.code == ResponseCode.SUCCESS
        forwarded = proxied.proxy_remoting.forwarded
        end = {"producerGroup": group, "tranStateTableOffset": half.fields["queueOffset"],
               "commitLogOffset": str(int(half.fields["msgId"][-16:], 16)),
               "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "PXUNIQ1",
               "transactionId": "PXUNIQ1", "bname": "broker-a"}
        unknown = raw.request(END_TRANSACTION, {**end, "transactionId": "PXNEVER"})
        assert (unknown.code, unknown.remark) == (ResponseCode.SUCCESS, None)
        answer = raw.request(END_TRANSACTION, end)
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
        assert proxied.proxy_remoting.forwarded == forwarded  # nothing went to a broker
    assert proxied.max_offset(topic, "broker-a", 0) == 0
    assert len(proxied.pending_transactions("broker-a")) >= 1


def test_heartbeats_make_the_proxy_list_the_group_across_brokers(proxied, unique_name):
    group = unique_name("PxMembers")
    with Producer(proxied.proxy_remoting_addr):
        pass
    with Admin(proxied.proxy_remoting_addr) as admin:
        admin.brokers.heart_beat(proxied.proxy_remoting_addr, consumer_group=group)
        members = admin.brokers.get_consumer_list_by_group(proxied.proxy_remoting_addr, group)
        assert members == [admin.remoting.config.client_id]
        assert proxied.proxy_remoting.clients.consumers[group].client_ids() == members
        # a group nobody heartbeated: the proxy's NullPointerException, read as no members
        assert admin.brokers.get_consumer_list_by_group(proxied.proxy_remoting_addr,
                                                        unique_name("PxNobody")) == []
        with pytest.raises(ResponseError, match="subscribe to topics by name"):
            admin.names.topic_list()
        # no GET_BROKER_CLUSTER_INFO at a proxy: the brokers are those of the routes looked up
        topic = unique_name("PxInfo")
        proxied.create_topic(topic, 1)
        admin.names.route(topic)
        info = admin.names.cluster_info()
        assert sorted(info.broker_addr_table) == ["broker-a", "broker-b"]
        assert {b.master_addr for b in info.broker_addr_table.values()} == {
            proxied.proxy_remoting_addr}


def test_a_busy_broker_behind_the_proxy_holds_up_only_its_own_readers(proxied, unique_name):
    """broker-a in flow control answers busy through the proxy; broker-b shares the proxy's
    address but not broker-a's backoff (nor does its reader end broker-a's episode)."""
    topic = unique_name("PxBusy")
    proxied.create_topic(topic, 1)
    for b in proxied.brokers:
        proxied.append(topic, b.name, 0, [b"%d" % i for i in range(2000)])
    proxied.fail_next(100_000, ResponseCode.SYSTEM_BUSY, BUSY_REMARK,
                      request_codes=[RequestCode.PULL_MESSAGE], broker="broker-a")
    brokers, got = BusyBrokers(), {}
    try:
        with Admin(proxied.proxy_remoting_addr) as admin:
            queues = {mq.broker_name: mq for mq in admin.queues(topic, refresh=True)}

            def read(broker, **kw):
                reader = QueueRangeReader(
                    admin.brokers, admin.address, queues[broker], 0, 2000,
                    ReadSettings(consumer_group="px-busy", **{"retry_backoff": 0.01,
                                                              "busy_backoff_max": 0.05, **kw}),
                    busy_brokers=brokers)
                return [o for batch in reader for o in
                        batch.column("queue_offset").to_pylist()], reader

            def read_a():
                got["a"] = read("broker-a", busy_timeout=30.0, retry_backoff=1.0,
                                busy_backoff_max=2.0)[0]

            thread = threading.Thread(target=read_a, daemon=True)
            thread.start()
            a_target = busy_target(proxied.proxy_remoting_addr, "broker-a")
            wait_until(lambda: brokers.episode(a_target)[1] >= 2, 10, "broker-a's busy answers")
            offsets_b, reader_b = read("broker-b")
            assert offsets_b == list(range(2000)) and reader_b.busy_answers == 0
            assert reader_b.busy_wait == 0.0  # never held up by broker-a's backoff
            assert brokers.episode(a_target)[1] >= 2 and thread.is_alive()
            proxied.clear_faults()
            thread.join(30)
            assert got["a"] == list(range(2000))
    finally:
        proxied.clear_faults()


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_the_4x_cpp_client_gets_routes_but_every_pull_and_send_is_refused(proxied, unique_name):
    """rocketmq-client-cpp 2.x predates the ``bname`` field: through the proxy it routes, but
    the proxy refuses each PULL_MESSAGE and SEND_MESSAGE(_V2) (VERSION_NOT_SUPPORTED), which
    it reports as BROKER_TIMEOUT and 'No route info'. Directly it reads the same queues."""
    topic = unique_name("PxCpp")
    proxied.create_topic(topic, 1)
    for b in proxied.brokers:
        proxied.append(topic, b.name, 0, [b"m%d" % i for i in range(3)])
    forwarded = proxied.proxy_remoting.forwarded

    def peer(*args):
        out = subprocess.run([sys.executable, str(PEER), *args, "--topic", topic],
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    through = peer("pull", "--namesrv", proxied.proxy_remoting_addr)
    assert through["messages"] == []
    assert {(b, status) for b, _, _, status, _ in through["pulls"]} == {
        ("broker-a", "BROKER_TIMEOUT"), ("broker-b", "BROKER_TIMEOUT")}
    sent = peer("produce", "--namesrv", proxied.proxy_remoting_addr, "--count", "2",
                "--send-timeout", "3000")
    assert all("No route info of this topic" in r.get("error", "") for r in sent["results"])
    assert proxied.proxy_remoting.forwarded == forwarded  # nothing reached a broker
    direct = peer("pull", "--namesrv", proxied.namesrv_addr)
    assert len(direct["messages"]) == 6


def test_the_cli_serves_the_proxy_remoting_port():
    with embedded_cli("--brokers", "2", "--proxy-remoting", "--topic", "CliPx:2",
                      "--fill", "CliPx:40:8") as (_, lines):
        [(_, proxy)] = printed(lines, "proxy-remoting")
        with Admin(proxy) as admin:
            queues = admin.queues("CliPx", refresh=True)
            assert {admin.master_address(mq) for mq in queues} == {proxy}
            assert sum(admin.offsets("max", queues).values()) == 40


def test_a_read_waits_for_a_broker_that_left_the_proxy_and_came_back(proxied, unique_name):
    """broker-b stops: the proxy no longer finds it (TOPIC_NOT_EXIST of the topic named after
    it). A reader of its queue waits, as for a broker gone from the route, and reads on when
    it is back."""
    topic = unique_name("PxGone")
    proxied.create_topic(topic, 1, brokers=["broker-b"])
    proxied.append(topic, "broker-b", 0, [b"%d" % i for i in range(300)])
    got = {}
    with Admin(proxied.proxy_remoting_addr) as admin:
        (mq,) = admin.queues(topic, refresh=True)
        admin.address(mq)  # the route is known before the broker goes
        proxied.broker("broker-b").stop()
        try:
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 300,
                                      ReadSettings(consumer_group="px-gone", retry_backoff=0.05,
                                                   retry_deadline=60.0))

            def read():
                got["offsets"] = [o for batch in reader for o in
                                  batch.column("queue_offset").to_pylist()]

            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            wait_until(lambda: reader.retries >= 2, 20, "the reader to wait for broker-b")
        finally:
            proxied.broker("broker-b").start()
        thread.join(60)
    assert got["offsets"] == list(range(300))


def test_tls_to_the_proxy_and_from_it_to_the_brokers(embedded_cluster_factory, unique_name):
    cluster = embedded_cluster_factory(brokers=2, tls="enforcing", proxy_remoting=True)
    topic = unique_name("PxTls")
    cluster.create_topic(topic, 1)
    for b in cluster.brokers:
        cluster.append(topic, b.name, 0, [b"%d" % i for i in range(50)])
    config = ClientConfig(tls=make_tls_context(verify=False))
    with Admin(cluster.proxy_remoting_addr, config=config) as admin:
        queues = admin.queues(topic, refresh=True)
        assert sum(admin.offsets("max", queues).values()) == 100
        for mq in queues:
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 50,
                                      ReadSettings(consumer_group="px-tls"))
            assert [o for batch in reader for o in
                    batch.column("queue_offset").to_pylist()] == list(range(50))
    assert cluster.proxy_remoting.forwarded >= 4
