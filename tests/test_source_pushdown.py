"""Filter pushdown for batch reads (Spark 4.1+, ``spark.sql.python.filterPushdown.enabled``):
every pushed-down read gives what Spark's own filtering of the whole read gives, and the
brokers really serve fewer messages (counted on the embedded brokers' queues)."""
from __future__ import annotations

import datetime as dt
import json
import uuid
from contextlib import contextmanager

import pytest

from rocketmq_spark import spark_compat
from rocketmq_spark.embedded import pull as broker_pull
from rocketmq_spark.embedded.queue import ConsumeQueue
from rocketmq_spark.source.pushdown import ReadPlan, sql92_with_tags, translate

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
needs_pushdown = pytest.mark.skipif(not spark_compat.FILTER_PUSHDOWN,
                                    reason="this Spark has no pushFilters (4.1+)")

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, ms
MINUTE = 60_000
MINUTES, PER_MINUTE, QUEUES = 10, 100, 4
TAGS = "abc"
COLUMNS = ("topic", "brokerName", "queueId", "queueOffset", "tags", "keys", "storeTimestamp")


def at(minutes: int, seconds: int = 0) -> str:
    """A Spark timestamp literal that long after T0."""
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(
        milliseconds=T0 + minutes * MINUTE + seconds * 1000)
    return f"timestamp'{moment:%Y-%m-%d %H:%M:%S.%f}'"


@pytest.fixture(scope="module")
def history(embedded_cluster_session):
    """A topic on both brokers, 4 queues each, whose messages were stored over ten minutes:
    each queue has 100 messages a minute, minute i tagged "abc"[i % 3]."""
    cluster = embedded_cluster_session
    topic = f"Pushdown-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, queues=QUEUES)
    for b in cluster.brokers:
        for qid in range(QUEUES):
            for minute in range(MINUTES):
                cluster.append(topic, b.name, qid,
                               [f"{b.name}/{qid}/{minute}/{j}".encode()
                                for j in range(PER_MINUTE)],
                               tags=TAGS[minute % 3], keys=f"{qid}-{minute}",
                               store_timestamp=T0 + minute * MINUTE + qid * 1000)
    return cluster, topic


class Served:
    """Messages the brokers' queues of one topic hand out in pulls, counted in the store
    (the brokers' C pull answers are switched off meanwhile, so every pull is counted)."""

    def __init__(self, cluster, topics, monkeypatch):
        self.count = 0
        mine = set()
        for b in cluster.brokers:
            broker = cluster._broker(b.name)
            monkeypatch.setattr(broker.fast_paths, "pulls", None)
            for topic in [topics] if isinstance(topics, str) else topics:
                for qid in range(QUEUES):
                    queue = cluster._call(broker.store.existing_queue, topic, qid)
                    if queue is not None:
                        mine.add(id(queue))

        def counting(original):
            def read(queue, *args, **kwargs):
                body, examined, found = original(queue, *args, **kwargs)
                if id(queue) in mine:
                    self.count += found
                return body, examined, found
            return read

        monkeypatch.setattr(ConsumeQueue, "read", counting(ConsumeQueue.read))
        monkeypatch.setattr(ConsumeQueue, "read_filtered", counting(ConsumeQueue.read_filtered))
        monkeypatch.setattr(broker_pull, "read_matching", counting(broker_pull.read_matching))

    def take(self) -> int:
        n, self.count = self.count, 0
        return n


@pytest.fixture
def served(history, monkeypatch) -> Served:
    return Served(*history, monkeypatch)


@contextmanager
def pushdown(spark, on: bool):
    before = spark.conf.get(PUSHDOWN_CONF, None)
    spark.conf.set(PUSHDOWN_CONF, "true" if on else "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(PUSHDOWN_CONF)
        else:
            spark.conf.set(PUSHDOWN_CONF, before)


def query(spark, history, where: str, on: bool, **options):
    cluster, topic = history
    with pushdown(spark, on):
        r = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
            .option("subscribe", topic)
        for k, v in options.items():
            r = r.option(k, v)
        rows = r.load().where(where).select(*COLUMNS).collect()
    return sorted(tuple(row) for row in rows)


def both(spark, history, served, where: str, **options):
    """(rows, messages served) of the read with pushdown off, then on."""
    off = query(spark, history, where, False, **options)
    served_off = served.take()
    on = query(spark, history, where, True, **options)
    return off, served_off, on, served.take()


# --------------------------------------------------------------------- reads through Spark

@needs_pushdown
def test_tags_are_pushed_and_intersect_the_filter_option(spark, history, served):
    off, served_off, on, served_on = both(spark, history, served, "tags IN ('a', 'b')",
                                          filter="a || c")
    assert on == off and {r[4] for r in on} == {"a"}
    assert len(on) == 2 * QUEUES * 4 * PER_MINUTE  # minutes 0, 3, 6, 9 of every queue
    # Off: the broker sends a and c (the option); on: only a, each row once.
    assert served_on == len(on) and served_off == 2 * QUEUES * 7 * PER_MINUTE


@needs_pushdown
def test_a_store_time_window_reads_its_offsets_only(spark, history, served):
    where = f"storeTimestamp >= {at(3)} AND storeTimestamp < {at(5)}"
    off, served_off, on, served_on = both(spark, history, served, where)
    assert on == off and len(on) == 2 * QUEUES * 2 * PER_MINUTE
    assert served_off == 2 * QUEUES * MINUTES * PER_MINUTE
    # The window's rows plus the messages the searches by time look at near each bound.
    assert len(on) <= served_on < served_off / 2


@needs_pushdown
def test_a_window_between_store_times_is_rechecked_by_spark(spark, history, served):
    """Bounds inside a run of equal store times: offsets by time are a superset there."""
    where = f"storeTimestamp > {at(3)} AND storeTimestamp <= {at(4, 1)}"
    off, _, on, _ = both(spark, history, served, where)
    assert on == off
    # Queue q's minute m is stored at at(m, q): minute 3 of queues 1-3 (queue 0's is at
    # exactly at(3)), and minute 4 of queues 0 and 1.
    assert len(on) == 2 * PER_MINUTE * (QUEUES - 1) + 2 * PER_MINUTE * 2


@needs_pushdown
def test_queue_columns_prune_queues(spark, history, served):
    _, topic = history
    where = f"brokerName = 'broker-b' AND queueId IN (1, 3) AND topic = '{topic}'"
    off, served_off, on, served_on = both(spark, history, served, where)
    assert on == off and {(r[1], r[2]) for r in on} == {("broker-b", 1), ("broker-b", 3)}
    assert served_on == len(on) == 2 * MINUTES * PER_MINUTE
    assert served_off == 2 * QUEUES * MINUTES * PER_MINUTE


@needs_pushdown
def test_per_queue_offsets_still_name_every_queue_when_queues_are_pruned(
        spark, history, served):
    """endingOffsets must give every queue of the subscription; pruning does not change that,
    and the pruned read ends where the option says."""
    cluster, topic = history
    ends = json.dumps({topic: {f"{b.name}/{q}": 10 * (q + 1) for b in cluster.brokers
                               for q in range(QUEUES)}})
    off, _, on, served_on = both(spark, history, served, "queueId = 2", endingOffsets=ends)
    assert on == off and len(on) == served_on == 2 * 30


@needs_pushdown
def test_topic_is_matched_as_the_column_shows_it_without_the_namespace(
        spark, embedded_cluster_session, monkeypatch):
    cluster, ns = embedded_cluster_session, f"ns{uuid.uuid4().hex[:6]}"
    for name in ("P-a", "P-b"):
        cluster.create_topic(f"{ns}%{name}", queues=1)
        for b in cluster.brokers:
            cluster.append(f"{ns}%{name}", b.name, 0, [b"x"] * 50, keys=name)
    served = Served(cluster, [f"{ns}%P-a", f"{ns}%P-b"], monkeypatch)
    rows = []
    for on in (False, True):
        with pushdown(spark, on):
            df = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
                .option("namespace", ns).option("subscribePattern", "P-.*").load()
            rows.append(sorted(tuple(r) for r in df.where("topic = 'P-a'")
                               .select("topic", "brokerName", "queueOffset").collect()))
            rows.append(served.take())
    off, served_off, on, served_on = rows
    assert on == off and {r[0] for r in on} == {"P-a"} and len(on) == 100
    assert (served_off, served_on) == (200, 100)


@needs_pushdown
def test_queue_offset_bounds_cut_ranges(spark, history, served):
    off, _, on, served_on = both(spark, history, served,
                                 "queueOffset >= 100 AND queueOffset < 150")
    assert on == off and served_on == len(on) == 2 * QUEUES * 50
    off, _, on, served_on = both(spark, history, served, "queueOffset = 7")
    assert on == off and served_on == len(on) == 2 * QUEUES


@needs_pushdown
@pytest.mark.parametrize("where, options", [
    ("tags = 'a'", {"filter": "b"}),
    ("queueOffset > 500 AND queueOffset < 400", {}),
    (f"storeTimestamp >= {at(5)} AND storeTimestamp < {at(2)}", {}),
], ids=["tags-vs-option", "offsets", "times"])
def test_contradictions_read_nothing(spark, history, served, where, options):
    off, served_off, on, served_on = both(spark, history, served, where, **options)
    assert on == off == [] and served_on == 0


@needs_pushdown
def test_filters_it_cannot_take_stay_with_spark(spark, history, served):
    """Only queueId is pushed; the rest (a LIKE, a NOT, born times, an OR) Spark evaluates."""
    where = (f"queueId = 1 AND keys LIKE '1-%' AND NOT (tags = 'b') AND bornTimestamp > {at(-1)}"
             " AND (queueOffset < 300 OR tags = 'c')")
    off, _, on, served_on = both(spark, history, served, where)
    assert on == off and len(on) == 2 * PER_MINUTE * 4  # minutes 0, 2, 5 and 8
    assert served_on == 2 * MINUTES * PER_MINUTE  # both brokers' queue 1, whole


@needs_pushdown
def test_tags_go_into_a_sql92_subscription(spark, embedded_cluster_factory, monkeypatch):
    """With filterType=SQL92 the tags join the expression (the broker sends only them);
    Spark still checks them."""
    cluster = embedded_cluster_factory(brokers=1, enable_property_filter=True)
    topic = f"Sql92-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, queues=QUEUES)
    for qid in range(QUEUES):
        for region in ("eu", "us"):
            for tag in ("a", "it's"):
                cluster.append(topic, "broker-a", qid, [b"x"] * 50, tags=tag, keys=region,
                               properties={"region": region})
    served = Served(cluster, topic, monkeypatch)
    got = []
    for where in ("tags = 'it''s'", "tags IN ('a', 'b')"):
        off, served_off, on, served_on = both(
            spark, (cluster, topic), served, where, filterType="SQL92", filter="region = 'eu'")
        # Both reads also probe each broker with a one-message pull (filter_check).
        got.append((len(on), served_off - served_on))
        assert on == off and {r[5] for r in on} == {"eu"}
    assert got == [(QUEUES * 50, QUEUES * 50)] * 2  # the other tag's eu messages stay home


def test_without_pushdown_spark_reads_and_filters_everything(spark, history, served):
    """With the flag off (and on a Spark without pushFilters, either way) reads are what they
    were: the reader has no pushFilters, Spark refuses nothing and filters every row."""
    settings = [False] if spark_compat.FILTER_PUSHDOWN else [False, True]
    where = f"queueId = 2 AND tags = 'a' AND storeTimestamp < {at(4)}"
    for on in settings:
        rows = query(spark, history, where, on)
        assert len(rows) == 2 * 2 * PER_MINUTE and {(r[2], r[4]) for r in rows} == {(2, "a")}
        assert served.take() == 2 * QUEUES * MINUTES * PER_MINUTE


# --------------------------------------------------------------------- the translation

def _filters():
    return pytest.importorskip("pyspark.sql.datasource")


@needs_pushdown
def test_translate_returns_what_it_cannot_take_by_reference():
    ds = _filters()
    ts = dt.datetime(2026, 1, 1, 0, 0, 0, 500, tzinfo=dt.timezone.utc)
    taken = [ds.EqualTo(("queueId",), 1), ds.In(("tags",), ["x", "y"]),
             ds.GreaterThanOrEqual(("queueOffset",), 10), ds.LessThan(("queueOffset",), 20)]
    time_filters = [ds.GreaterThan(("storeTimestamp",), ts),
                    ds.LessThanOrEqual(("storeTimestamp",), ts)]
    left = [ds.IsNotNull(("tags",)), ds.Not(ds.EqualTo(("tags",), "x")),
            ds.EqualTo(("tags",), " x"), ds.EqualTo(("tags",), "x||y"),
            ds.EqualTo(("properties", "k"), "v"), ds.StringStartsWith(("keys",), "k"),
            ds.EqualTo(("bornTimestamp",), ts), ds.In(("queueOffset",), [3, 9]),
            ds.EqualNullSafe(("queueId",), None)]
    filters = taken + time_filters + left
    plan, keep = translate(filters)
    assert [id(f) for f in keep] == [id(f) for f in time_filters + left]
    assert plan.queue_ids == {1} and plan.tags == {"x", "y"}
    assert (plan.from_offset, plan.to_offset) == (10, 10)  # the IN's [3, 10) narrows too
    assert plan.reads_nothing
    # Microseconds past a millisecond: the widest millisecond window that holds them.
    assert (plan.since_ms, plan.until_ms) == (T0, T0 + 1)


@needs_pushdown
def test_translate_folds_conjuncts_into_one_plan():
    ds = _filters()
    plan, keep = translate([ds.In(("brokerName",), ["a", "b", None]),
                            ds.EqualTo(("brokerName",), "b"),
                            ds.In(("topic",), ["T"]), ds.GreaterThan(("queueOffset",), 4),
                            ds.LessThanOrEqual(("queueOffset",), 9)])
    assert keep == [] and not plan.reads_nothing
    assert plan.brokers == {"b"} and plan.topics == {"T"}
    assert (plan.from_offset, plan.to_offset) == (5, 10)
    assert plan.keeps(_mq("T", "b", 0)) and not plan.keeps(_mq("T", "a", 0))
    start, end = plan.cut({_mq("T", "b", 0): 0}, {_mq("T", "b", 0): 7})
    assert (list(start.values()), list(end.values())) == ([5], [7])
    assert plan.with_tags(["x", "y"]).tags == {"x", "y"}
    assert ReadPlan(tags=frozenset("a")).with_tags(["b"]).reads_nothing


@needs_pushdown
def test_a_sql92_subscription_leaves_tags_to_spark():
    ds = _filters()
    tag = ds.EqualTo(("tags",), "x")
    plan, keep = translate([tag], tag_filter_exact=False)
    assert keep == [tag] and plan.tags == {"x"}
    assert sql92_with_tags("a > 1", ["y'z", "x"]) == "(a > 1) AND (TAGS IN ('x', 'y''z'))"


def _mq(topic, broker, qid):
    from rocketmq_spark.client.protocol.route import MessageQueue

    return MessageQueue(topic, broker, qid)


@needs_pushdown
def test_spark_calls_push_filters_from_the_worker_the_reader_looks_for():
    """The reader has pushFilters only in this planning worker (see batch_reader); a PySpark
    that moved it would leave every read without pushdown, so say so here first."""
    import importlib.util

    from rocketmq_spark.source.batch_reader import PUSHDOWN_WORKER

    spec = importlib.util.find_spec(PUSHDOWN_WORKER)
    assert spec is not None and "pushFilters" in open(spec.origin, encoding="utf-8").read()
