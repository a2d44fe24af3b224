"""The embedded brokers' topic permissions are 4.9.8's, the gap included.

Read from Apache's source (module ``acl``, rocketmq-all-4.9.x; not run against a genuine broker
here): ``PlainAccessValidator.parse`` asks PUB on the topic of SEND_MESSAGE and SEND_MESSAGE_V2
and has no case for SEND_BATCH_MESSAGE; ``PlainPermissionManager.checkPerm`` refuses with
AclException "No default permission for topic:<T>". Seen on a genuine 4.9.8 broker with ACL on
(reported with the request for this check): a subscribe-only account's at-least-once sink write
(batches) landed, its exactly-once write (single half messages) was refused. The embedded
broker must do the same: as strict, no stricter.
"""
from __future__ import annotations

import pytest

from rocketmq_spark.client import ClientConfig, Message, Producer, QueueRangeReader, ReadSettings
from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.embedded.acl_permissions import (
    ANY, DENY, PUB, SUB, AccountPermissions, check_permission, needed_permissions,
    permission_error,
)

READER, READER_SECRET = "SubOnlyAK", "SubOnlySecret-1"
WRITER, WRITER_SECRET = "WriterAK", "WriterSecret-12"
REFUSED = "No default permission for topic:"


@pytest.fixture(scope="module")
def acl_cluster():
    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(
            brokers=1, acl={READER: READER_SECRET, WRITER: WRITER_SECRET},
            acl_permissions={READER: {"topicPerms": {"Guarded": "SUB"},
                                      "defaultGroupPerm": "SUB"}}) as cluster:
        cluster.create_topic("Guarded", queues=2)
        yield cluster


def config(ak: str, sk: str) -> ClientConfig:
    return ClientConfig(credentials=Credentials(ak, sk))


def total(cluster) -> int:
    return sum(cluster.max_offset("Guarded", "broker-a", q) for q in range(2))


def test_a_subscribe_only_account_cannot_send_one_message(acl_cluster):
    before = total(acl_cluster)
    with Producer(acl_cluster.namesrv_addr, config=config(READER, READER_SECRET)) as producer:
        with pytest.raises(Exception, match=REFUSED + "Guarded"):
            producer.send(Message("Guarded", b"single"))
    assert total(acl_cluster) == before


def test_but_its_batch_send_lands_as_on_4_9_8(acl_cluster):
    before = total(acl_cluster)
    with Producer(acl_cluster.namesrv_addr, config=config(READER, READER_SECRET)) as producer:
        producer.send_batch([Message("Guarded", b"b1"), Message("Guarded", b"b2")])
    assert total(acl_cluster) == before + 2


def test_it_reads_and_an_account_with_only_a_secret_may_do_all(acl_cluster):
    with Producer(acl_cluster.namesrv_addr, config=config(WRITER, WRITER_SECRET)) as producer:
        producer.send(Message("Guarded", b"by the writer"))
    with Admin(acl_cluster.namesrv_addr, config=config(READER, READER_SECRET)) as admin:
        queues = admin.queues("Guarded", refresh=True)
        ends = admin.offsets("max", queues)
        got = []
        for mq in queues:
            reader = QueueRangeReader(admin.brokers, lambda q, b, r: admin.address(q, b, r), mq,
                                      0, ends[mq], ReadSettings(consumer_group="readers"))
            got += [m for batch in reader for m in batch.column("body").to_pylist()]
    assert b"by the writer" in got


def test_the_spark_sink_as_on_a_genuine_4_9_8_broker(spark, acl_cluster):
    before = total(acl_cluster)
    df = spark.range(20).selectExpr("CAST(id AS STRING) AS body")

    def write(**options):
        w = (df.write.format("rocketmq").mode("append")
             .option("nameServer", acl_cluster.namesrv_addr).option("topic", "Guarded")
             .option("accessKey", READER).option("secretKey", READER_SECRET))
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    write()  # at least once: SEND_BATCH_MESSAGE, which 4.9.8 does not check
    assert total(acl_cluster) == before + 20
    with pytest.raises(Exception, match=REFUSED + "Guarded"):
        write(deliveryGuarantee="exactlyOnce")  # half messages: SEND_MESSAGE_V2, checked
    assert total(acl_cluster) == before + 20


def test_the_rules_of_checkperm():
    assert needed_permissions(320, {"b": "T"}) == {}  # SEND_BATCH_MESSAGE: no case
    assert needed_permissions(310, {"b": "T", "a": "g"}) == {"T": PUB}
    assert needed_permissions(310, {"b": "%RETRY%g", "a": "g"}) == {"%RETRY%g": SUB}
    assert needed_permissions(11, {"topic": "T", "consumerGroup": "g"}) == {
        "T": SUB, "%RETRY%g": SUB}
    sub_only = AccountPermissions.from_config({"topicPerms": {"T": "SUB"}})
    assert permission_error(sub_only, {"T": PUB}) == "No default permission for topic:T"
    assert permission_error(sub_only, {"%RETRY%g": SUB}) == "No default permission for group:g"
    assert permission_error(sub_only, {"T": SUB}) is None
    assert permission_error(AccountPermissions(admin=True), {"T": PUB}) is None
    assert not check_permission(SUB, DENY | SUB) and check_permission(ANY, PUB)
