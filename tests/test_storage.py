"""The storage layer (rocketmq_spark/storage): the scheme mapping, the missing-library errors,
the ``checkpointStorage.*`` options, and the sink's record on S3 through S3's HTTP API (moto's
standalone server on loopback, tests/s3_server.py; pyarrow's S3 client, no patched client).

HDFS, GCS and Azure have no server here: their mapping and their missing-library errors are
tested; their stores were only read from pyarrow's documentation.
"""
from __future__ import annotations

import json

import pytest

from rocketmq_spark.options import OptionError
from rocketmq_spark.sink.commit_record import BatchRecord, CommitLog, open_record
from rocketmq_spark.client.txn.transaction import HalfHandle
from rocketmq_spark.storage import (
    StorageConfigError, StorageError, StorageOptions, parse_location, record_location,
)
from rocketmq_spark.storage.filesystems import filesystem
from rocketmq_spark.storage.store import open_store
from s3_server import s3_server_fixture  # noqa: F401 (the fixture s3_server)


@pytest.mark.parametrize("uri, kind, path, shown", [
    ("/tmp/cp", "local", "/tmp/cp", "/tmp/cp"),
    ("file:///tmp/cp", "local", "/tmp/cp", "file:///tmp/cp"),
    ("s3a://bkt/jobs/q1", "s3", "bkt/jobs/q1", "s3://bkt/jobs/q1"),
    ("s3://bkt/jobs/q1/", "s3", "bkt/jobs/q1", "s3://bkt/jobs/q1"),
    ("s3n://bkt/q", "s3", "bkt/q", "s3://bkt/q"),
    ("gs://bkt/q", "gcs", "bkt/q", "gs://bkt/q"),
    ("hdfs://nn:8020/user/spark/cp", "hdfs", "/user/spark/cp", "hdfs://nn:8020/user/spark/cp"),
    ("viewfs://cluster/cp", "hdfs", "/cp", "viewfs://cluster/cp"),
    ("abfss://box@acct.dfs.core.windows.net/cp", "azure", "box/cp",
     "abfss://box@acct.dfs.core.windows.net/cp"),
    ("wasbs://box@acct.blob.core.windows.net/cp", "azure", "box/cp",
     "wasbs://box@acct.blob.core.windows.net/cp"),
])
def test_each_scheme_maps_to_its_store_and_path(uri, kind, path, shown):
    location = parse_location(uri)
    assert (location.kind, location.path, location.uri) == (kind, path, shown)


def test_sparks_s3a_checkpoint_gives_the_same_bucket_and_keys_for_the_record():
    assert record_location("s3a://b/p").uri == "s3://b/p/rocketmq-sink"
    assert record_location("s3a://b/p").path == "b/p/rocketmq-sink"
    assert record_location("/tmp/cp", "s3://other/rec").uri == "s3://other/rec"
    abfs = record_location("abfss://box@acct.dfs.core.windows.net/cp")
    assert (abfs.account, abfs.host, abfs.bucket) == ("acct", "dfs.core.windows.net", "box")


@pytest.mark.parametrize("uri, message", [
    ("ftp://host/cp", "scheme ftp:, which the connector cannot store to"),
    ("s3a:///cp", "names no bucket"),
    ("abfss://box/cp", "names no storage account"),
])
def test_bad_locations_name_what_is_wrong(uri, message):
    with pytest.raises(StorageConfigError, match=message):
        parse_location(uri)


def _missing(name: str):
    def loader(module: str):
        raise ImportError(f"No module named '{name}'")
    return loader


def _without(attribute: str):
    """A pyarrow.fs without one filesystem class (a pyarrow built without that store)."""
    import pyarrow.fs

    class Module:
        def __getattr__(self, name):
            if name == attribute:
                raise AttributeError(f"module 'pyarrow.fs' has no attribute '{name}'")
            return getattr(pyarrow.fs, name)
    return lambda module: Module()


@pytest.mark.parametrize("uri, cls, extra", [
    ("s3a://bkt/cp", "S3FileSystem", "s3"),
    ("gs://bkt/cp", "GcsFileSystem", "gcs"),
    ("abfss://box@acct.dfs.core.windows.net/cp", "AzureFileSystem", "azure"),
    ("hdfs://nn:8020/cp", "HadoopFileSystem", "hdfs"),
])
def test_a_missing_library_names_the_scheme_and_the_extra(uri, cls, extra):
    location = parse_location(uri)
    for loader in (_missing("pyarrow"), _without(cls)):
        with pytest.raises(StorageConfigError) as info:
            filesystem(location, StorageOptions(), loader)
        text = str(info.value)
        assert f"{location.scheme}://" in text and f"rocketmq-spark[{extra}]" in text
        assert cls in text


def test_a_missing_library_fails_the_sink_before_anything_is_written(tmp_path):
    with pytest.raises(OptionError, match=r"s3://.*rocketmq-spark\[s3\]"):
        open_record(str(tmp_path / "cp"), StorageOptions({"location": "s3://bkt/rec"}),
                    loader=_without("S3FileSystem"), check=True)
    assert not (tmp_path / "cp").exists()


def test_hdfs_without_libhdfs_names_the_scheme_and_what_to_install():
    """No JVM with Hadoop here: pyarrow's HadoopFileSystem cannot load libhdfs."""
    with pytest.raises(StorageConfigError, match=r"hdfs.*libhdfs"):
        open_store(parse_location("hdfs://127.0.0.1:1/cp"))


def test_options_pass_through_and_unknown_keys_are_named():
    options = StorageOptions.from_raw({"checkpointStorage.endpoint": "h:9000",
                                       "checkpointstorage.pathStyleAccess": "true",
                                       "checkpointStorage.region": "eu-west-1",
                                       "checkpointStorage.secret_key": "SKsecret9",
                                       "nameServer": "x"})
    kwargs = options.library_kwargs("s3", "s3")
    assert kwargs == {"endpoint_override": "h:9000", "force_virtual_addressing": False,
                      "region": "eu-west-1", "secret_key": "SKsecret9"}
    assert "SKsecret9" not in repr(options)
    with pytest.raises(StorageConfigError, match="checkpointStorage.secret_key is not known for "
                                                 "a gs:// store") as info:
        StorageOptions({"secret_key": "SKsecret9"}).library_kwargs("gcs", "gs")
    assert "SKsecret9" not in str(info.value)
    with pytest.raises(StorageConfigError, match=r"anonymous must be true or false"):
        StorageOptions({"anonymous": "maybe"}).library_kwargs("s3", "s3")
    from rocketmq_spark.sink.options import parse_sink_options

    with pytest.raises(OptionError, match="checkpointStorage.region place the record of "
                                          "deliveryGuarantee=exactlyOnce"):
        parse_sink_options({"nameServer": "h:9876", "checkpointStorage.region": "eu"})
    assert parse_sink_options({"nameServer": "h:9876", "deliveryGuarantee": "exactlyOnce",
                               "checkpointStorage.region": "eu"}).checkpoint_storage.values \
        == {"region": "eu"}
    with pytest.raises(OptionError, match="checkpointStorage.endpoint_override is not known"):
        open_record("/tmp/never-made-cp", StorageOptions({"endpoint": "h:1"}))


# ---------------------------------------------------------------------------- S3 (moto)


def record(batch: int) -> BatchRecord:
    return BatchRecord(batch, "q-s3", "g", ["t1"],
                       [HalfHandle("b0", "127.0.0.1:10911", "uk", 3, 100 + batch, "tx")])


def test_the_record_on_s3_round_trips_over_http(s3_server, tmp_path):
    s3_server.create_bucket("rec-rt")
    storage = StorageOptions.from_raw(s3_server.options(location="s3a://rec-rt/q/rocketmq-sink"))
    log = open_record(str(tmp_path / "cp"), storage, check=True)
    assert log.root == "s3://rec-rt/q/rocketmq-sink"
    before = len(s3_server.requests())
    log.record_commit(record(0))
    puts = [r for r in s3_server.requests()[before:] if r.startswith(("PUT", "POST"))]
    assert puts == ["PUT /rec-rt/q/rocketmq-sink/committed/0.json HTTP/1.1"], \
        "a record is not one PutObject"
    log.mark_ended(0)
    log.record_commit(record(1))
    log.record_abort(2, ["tA", "tB"])
    fresh = CommitLog(log.store)
    assert fresh.committed(0) == record(0) and fresh.committed(5) is None
    assert fresh.committed_ids() == [0, 1] and fresh.pending() == [1]
    assert fresh.ended_at(0) is not None and fresh.ended_at(1) is None
    assert fresh.aborted_tokens(2) == {"tA", "tB"}
    assert fresh.last_active() > 0
    assert s3_server.keys("rec-rt") == [
        "q/rocketmq-sink/aborted/" + k.rsplit("/", 1)[1]
        for k in s3_server.keys("rec-rt", "q/rocketmq-sink/aborted/")] + [
        "q/rocketmq-sink/committed/0.json", "q/rocketmq-sink/committed/1.json",
        "q/rocketmq-sink/ended/0"]
    assert json.loads(s3_server.client().get_object(
        Bucket="rec-rt", Key="q/rocketmq-sink/committed/0.json")["Body"].read())["batchId"] == 0
    assert not (tmp_path / "cp").exists(), "nothing of the record is on the local disk"


def test_pruning_on_s3_keeps_the_newest_settled_batches(s3_server, tmp_path):
    s3_server.create_bucket("rec-prune")
    storage = StorageOptions.from_raw(s3_server.options(location="s3://rec-prune/r"))
    log = CommitLog(open_record(str(tmp_path / "cp"), storage).store, retain=2)
    for b in range(5):
        log.record_commit(record(b))
        if b != 1:
            log.mark_ended(b)
    assert log.prune(limit=1) == 1 and log.prune() == 1  # 0, then 2; 1 is not settled, 3
    # and 4 are the newest
    assert log.committed_ids() == [1, 3, 4] and log.ended_ids() == [3, 4]
    assert log.pending() == [1] and log.prune() == 0


def test_a_bucket_that_does_not_exist_is_named_and_nothing_is_written(s3_server, tmp_path):
    storage = StorageOptions.from_raw(s3_server.options(location="s3://no-such-bucket/rec"))
    before = s3_server.requests()
    with pytest.raises(StorageError, match=r"s3://no-such-bucket/rec: the bucket "
                                           r"'no-such-bucket' does not exist"):
        open_record(str(tmp_path / "cp"), storage, check=True)
    assert not [r for r in s3_server.requests()[len(before):] if r.startswith(("PUT", "POST"))]


@pytest.mark.parametrize("access, secret", [("AKIAUNKNOWNKEY0000", "SKunknownSecret7"),
                                            (None, "SKwrongSecret3")])
def test_refused_credentials_name_the_bucket_and_hide_the_secret(s3_server, tmp_path, access,
                                                                 secret):
    s3_server.create_bucket("rec-creds")
    options = s3_server.options(location="s3://rec-creds/rec", secretKey=secret)
    if access:
        options["checkpointStorage.accessKey"] = access
    before = s3_server.requests()
    with pytest.raises(StorageError) as info:
        open_record(str(tmp_path / "cp"), StorageOptions.from_raw(options), check=True)
    text = str(info.value)
    assert "s3://rec-creds/rec" in text and "'rec-creds'" in text
    assert secret not in text and (access is None or access not in text)
    assert not [r for r in s3_server.requests()[len(before):] if r.startswith(("PUT", "POST"))]
    assert s3_server.keys("rec-creds") == []
