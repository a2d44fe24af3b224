"""pytest fixtures for the embedded cluster.

Enable with ``pytest_plugins = ["rocketmq_spark.embedded.pytest_plugin"]`` in a conftest.

* ``embedded_cluster``: a fresh 2-broker cluster per test.
* ``embedded_cluster_session``: one 2-broker cluster for the whole session (use unique topic and
  group names, e.g. from ``unique_name``).
* ``embedded_cluster_factory``: ``make(**kwargs)`` builds and starts clusters with any options
  (ACL, TLS, data_dir, caps, ``release="5.1"``); all are stopped after the test.
* ``unique_name``: a function returning names unique within the session (``prefix-N``).
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterator, List

import pytest

from .cluster import EmbeddedCluster

_counter = itertools.count(1)


@pytest.fixture
def embedded_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def embedded_cluster_session() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2) as cluster:
        yield cluster


@pytest.fixture
def embedded_cluster_factory() -> Iterator[Callable[..., EmbeddedCluster]]:
    clusters: List[EmbeddedCluster] = []

    def make(**kwargs) -> EmbeddedCluster:
        cluster = EmbeddedCluster(**kwargs).start()
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in reversed(clusters):
        cluster.stop()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    def make(prefix: str = "T") -> str:
        return f"{prefix}-{next(_counter)}"
    return make
