"""Where a checkpoint lives: a URI's scheme mapped to a store kind, a library and a path.

Spark names its checkpoint with Hadoop's schemes (``s3a://``, ``abfss://``, ``viewfs://``...);
the connector reaches the same bytes through ``pyarrow.fs``. The mapping is pure (no library
is loaded here), so it can be checked without any store at hand.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlparse

from .errors import StorageConfigError

# scheme -> store kind
SCHEMES = {
    "": "local", "file": "local",
    "hdfs": "hdfs", "viewfs": "hdfs",
    "s3": "s3", "s3a": "s3", "s3n": "s3",
    "gs": "gcs",
    "abfs": "azure", "abfss": "azure", "wasb": "azure", "wasbs": "azure",
}
# store kind -> the extra that brings its library
EXTRAS = {"local": None, "hdfs": "hdfs", "s3": "s3", "gcs": "gcs", "azure": "azure"}
# Hadoop's spelling of each kind, for messages and the s3a:// -> s3:// mapping
CANONICAL = {"s3": "s3", "gcs": "gs"}


@dataclass(frozen=True)
class Location:
    """A parsed location. ``path`` is what the library takes: a local absolute path, an
    HDFS path, ``bucket/key`` (S3, GCS) or ``container/path`` (Azure). ``authority``: the
    bucket, ``container@account.host`` or the name node."""

    uri: str
    scheme: str
    kind: str
    authority: str
    path: str

    @property
    def bucket(self) -> str:
        """The bucket (S3, GCS) or container (Azure)."""
        return self.path.split("/", 1)[0] if self.kind in ("s3", "gcs", "azure") else ""

    @property
    def account(self) -> Optional[str]:
        """Azure's storage account (``container@ACCOUNT.dfs.core.windows.net``)."""
        if self.kind != "azure" or "@" not in self.authority:
            return None
        return self.authority.split("@", 1)[1].split(".", 1)[0]

    @property
    def host(self) -> Optional[str]:
        """Azure's endpoint host after the account (``dfs.core.windows.net``)."""
        if self.kind != "azure" or "@" not in self.authority:
            return None
        rest = self.authority.split("@", 1)[1]
        return rest.split(".", 1)[1] if "." in rest else None

    def child(self, name: str) -> "Location":
        """The location of ``name`` under this one."""
        name = name.strip("/")
        uri = self.uri.rstrip("/") + "/" + name
        path = (os.path.join(self.path, name) if self.kind == "local"
                else posixpath.join(self.path, name))
        return Location(uri, self.scheme, self.kind, self.authority, path)

    def __str__(self) -> str:
        return self.uri


def parse_location(uri: str, what: str = "checkpoint location") -> Location:
    """Parse ``uri``; an unknown scheme or a location without its bucket fails here, naming
    them."""
    text = (uri or "").strip()
    if not text:
        raise StorageConfigError(f"the {what} is empty")
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if len(scheme) == 1 and os.name == "nt":  # a drive letter
        scheme = ""
    kind = SCHEMES.get(scheme)
    if kind is None:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES) if s)
        raise StorageConfigError(f"the {what} {text!r} has the scheme {scheme}:, which the "
                                 f"connector cannot store to; use a local path or one of "
                                 f"{known}")
    if kind == "local":
        path = os.path.abspath(parsed.path if scheme == "file" else text)
        return Location(path if scheme == "" else f"file://{path}", scheme, kind, "", path)
    authority = parsed.netloc
    key = parsed.path.strip("/")
    if kind == "hdfs":
        return Location(text.rstrip("/"), scheme, kind, authority, "/" + key)
    if not authority:
        raise StorageConfigError(f"the {what} {text!r} names no bucket or container "
                                 f"({scheme}://BUCKET/path)")
    if kind == "azure":
        if "@" not in authority:
            raise StorageConfigError(f"the {what} {text!r} names no storage account "
                                     f"({scheme}://CONTAINER@ACCOUNT.dfs.core.windows.net/path)")
        container = authority.split("@", 1)[0]
        path = posixpath.join(container, key) if key else container
        return Location(text.rstrip("/"), scheme, kind, authority, path)
    bucket = authority
    path = posixpath.join(bucket, key) if key else bucket
    uri_out = f"{CANONICAL[kind]}://{path}"
    return Location(uri_out, CANONICAL[kind], kind, bucket, path)


RECORD_DIR = "rocketmq-sink"


def record_location(checkpoint_location: Optional[str], override: Optional[str] = None,
                    subdir: str = RECORD_DIR) -> Location:
    """Where a record lives: ``override`` when given, else ``<checkpointLocation>/<subdir>``
    (Spark's ``s3a://b/p`` becomes ``s3://b/p/rocketmq-sink``: the same bucket and keys)."""
    if override:
        return parse_location(override, "option checkpointStorage.location")
    return parse_location(checkpoint_location or "", "checkpointLocation").child(subdir)
