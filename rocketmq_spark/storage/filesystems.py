"""The ``pyarrow.fs`` filesystem of a location, built from its URI and ``checkpointStorage.*``.

A store whose library is missing (a pyarrow built without S3, GCS or Azure, or no libhdfs and
JVM for HDFS) fails here, naming the scheme and what to install. ``loader`` imports the
library module; tests hand in one that fails, to see that message.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from .errors import StorageConfigError, StorageError
from .locations import EXTRAS, Location
from .options import StorageOptions

Loader = Callable[[str], Any]
CLASSES = {"s3": "S3FileSystem", "gcs": "GcsFileSystem", "azure": "AzureFileSystem",
           "hdfs": "HadoopFileSystem"}


def install_hint(kind: str) -> str:
    extra = EXTRAS[kind]
    hint = f"pip install 'rocketmq-spark[{extra}]'"
    if kind == "hdfs":
        hint += (" and give the driver Hadoop's libhdfs and a JVM (HADOOP_HOME, "
                 "JAVA_HOME, CLASSPATH from `hadoop classpath --glob`; ARROW_LIBHDFS_DIR if "
                 "libhdfs.so is elsewhere)")
    return hint


def library_class(location: Location, loader: Loader = importlib.import_module) -> Any:
    """The ``pyarrow.fs`` class of ``location``'s store, or an error naming the scheme and
    the extra to install."""
    name = CLASSES[location.kind]
    try:
        module = loader("pyarrow.fs")
        return getattr(module, name)
    except (ImportError, AttributeError) as exc:
        raise StorageConfigError(
            f"the checkpoint storage {location.scheme}:// needs pyarrow.fs.{name}, which this "
            f"Python cannot load ({type(exc).__name__}: {exc}): "
            f"{install_hint(location.kind)}") from None


def filesystem(location: Location, options: StorageOptions,
               loader: Loader = importlib.import_module) -> Any:
    """A ``pyarrow.fs`` filesystem for ``location`` (None for a local one: the local store
    uses ``os`` directly, for fsync)."""
    if location.kind == "local":
        return None
    cls = library_class(location, loader)
    kwargs = options.library_kwargs(location.kind, location.scheme)
    if location.kind == "s3":
        kwargs.setdefault("allow_delayed_open", True)  # a small object in one PutObject
    if location.kind == "azure":
        kwargs.setdefault("account_name", location.account)
        host = location.host or ""
        if host.startswith("dfs.") and "dfs_storage_authority" not in kwargs:
            kwargs["dfs_storage_authority"] = host
        elif host.startswith("blob.") and "blob_storage_authority" not in kwargs:
            kwargs["blob_storage_authority"] = host
    if location.kind == "hdfs":
        if location.scheme == "viewfs" or not location.authority:
            kwargs["host"] = (f"viewfs://{location.authority}" if location.scheme == "viewfs"
                              else "default")
            kwargs["port"] = 0
        else:
            host, _, port = location.authority.partition(":")
            kwargs["host"], kwargs["port"] = host, int(port or 8020)
    try:
        return cls(**kwargs)
    except (OSError, ValueError, TypeError) as exc:
        message = scrub(str(exc), options)
        if location.kind == "hdfs":
            raise StorageConfigError(
                f"the checkpoint storage {location.uri} (hdfs) could not be opened: "
                f"{message}. {install_hint('hdfs')}") from None
        raise StorageError(f"the checkpoint storage {location.uri} could not be opened: "
                           f"{message}") from None


def scrub(text: str, options: StorageOptions) -> str:
    """``text`` without any secret value given in ``options``."""
    for secret in options.secrets():
        text = text.replace(secret, "***")
    return text
