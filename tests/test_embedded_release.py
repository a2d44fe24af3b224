"""The embedded server's release switch: ``release="5.1"`` (``--release 5.1``) makes the brokers
behave as Apache 5.1.4's; the default stays 4.9.8's."""
from __future__ import annotations

import pytest

from rocketmq_spark.client.protocol.codes import RequestCode
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.embedded.options import ServerOptions

from embedded_cli import embedded_cli, printed
from raw_client import RawClient


def test_release_option_is_checked_and_ordered():
    assert ServerOptions().release == "4.9" and ServerOptions().version == 409
    five = ServerOptions(release="5.1")
    assert five.version == 441 and five.at_least("5.1") and five.at_least("4.9")
    assert not ServerOptions().at_least("5.1")
    assert ServerOptions(release="5.1", version=409).version == 409  # an explicit one wins
    with pytest.raises(ValueError, match="release must be one of"):
        ServerOptions(release="5.0")
    with pytest.raises(ValueError, match="unknown release"):
        five.at_least("6")


@pytest.mark.parametrize("release, version", [("4.9", 409), ("5.1", 441)])
def test_answers_carry_the_release_version(release, version):
    # a genuine broker stamps its answers with MQVersion.CURRENT_VERSION (5.1.4: V5_1_4, 441)
    with EmbeddedCluster(release=release) as cluster:
        client = RawClient(cluster.brokers[0].addr)
        try:
            answer = client.request(RequestCode.GET_MAX_OFFSET, {"topic": "TBW102", "queueId": "0"})
        finally:
            client.close()
        assert answer.version == version


def test_cli_release_flag():
    with embedded_cli("--release", "5.1", "--topic", "RelT:2") as (proc, lines):
        client = RawClient(printed(lines, "broker")[0][2])
        try:
            answer = client.request(RequestCode.GET_MAX_OFFSET, {"topic": "TBW102", "queueId": "0"})
            assert answer.version == 441
        finally:
            client.close()
