"""One interface for what the connector keeps under a checkpoint: small named objects.

What each store guarantees, and what this code relies on:

* **local disk / NFS** (``os``): a file is written to a temporary name, fsynced, renamed over
  its name (atomic on POSIX) and the directory fsynced: it exists whole or not at all, and
  survives a crash of the machine.
* **HDFS** (``pyarrow.fs.HadoopFileSystem``, through libhdfs): the same temporary file and
  rename; HDFS's rename is atomic on the name node. Only read from the library's
  documentation here (no HDFS runs on this project's machines).
* **S3 and S3-compatible stores** (``pyarrow.fs.S3FileSystem``): an object is written by one
  ``PutObject`` (``allow_delayed_open`` makes pyarrow send a small object in one PUT instead
  of a multipart upload), which S3 applies whole or not at all; since December 2020 S3 reads
  are strongly consistent after a write, a LIST included. S3 has a conditional create
  (``If-None-Match: *``, since August 2024), but ``pyarrow.fs`` does not expose it, so the
  code does not rely on it: each object of the record has one writer at a time (the query's
  driver; the responder's lease, :mod:`.lease`, settles who that is without it).
* **Google Cloud Storage** (``GcsFileSystem``) and **Azure Blob / ADLS Gen2**
  (``AzureFileSystem``): one upload is atomic and reads are strongly consistent after it, as
  on S3. Only read from the libraries' documentation here (no server runs in the tests).

Nothing here renames on an object store: a rename is a copy there and not atomic.
"""
from __future__ import annotations

import importlib
import os
import posixpath
import tempfile
import time
from dataclasses import dataclass
from typing import Any, List, Optional

from .errors import StorageError
from .filesystems import Loader, filesystem, scrub
from .locations import Location, parse_location
from .options import StorageOptions


@dataclass(frozen=True)
class Entry:
    """An object under a folder: its name and when it was last written (epoch seconds)."""

    name: str
    mtime: float


class Store:
    """Named objects under one location (``name`` may hold ``/``)."""

    location: Location

    def read(self, name: str) -> Optional[bytes]:
        """The whole object, or None when there is none."""
        raise NotImplementedError

    def write(self, name: str, data: bytes) -> None:
        """Write the object whole or not at all."""
        raise NotImplementedError

    def list(self, folder: str) -> List[Entry]:
        """The objects directly under ``folder`` (none when it does not exist)."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove the object (nothing when it is gone already)."""
        raise NotImplementedError

    def check(self) -> None:
        """Fail now, naming the location, when the store cannot be reached (a bucket that
        does not exist, credentials refused); reads only."""

    def local_dir(self) -> Optional[str]:
        """The folder on this machine (a local store only)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.uri!r})"


class LocalStore(Store):
    """A folder on a local disk or an NFS mount."""

    def __init__(self, location: Location):
        self.location = location
        self.root = location.path

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def read(self, name: str) -> Optional[bytes]:
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        write_atomic(self._path(name), data)

    def list(self, folder: str) -> List[Entry]:
        directory = self._path(folder)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            if n.startswith(".tmp-"):
                continue
            try:
                out.append(Entry(n, os.stat(os.path.join(directory, n)).st_mtime))
            except FileNotFoundError:
                continue
        return out

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass

    def check(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"the checkpoint storage {self.root} cannot be created: "
                               f"{exc}") from None

    def local_dir(self) -> Optional[str]:
        return self.root


def write_atomic(path: str, data: bytes) -> None:
    """Write ``path`` so that it exists whole or not at all, durably."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class ArrowStore(Store):
    """A location on HDFS or an object store, through a ``pyarrow.fs`` filesystem."""

    def __init__(self, location: Location, fs: Any, options: StorageOptions):
        self.location = location
        self.fs = fs
        self._options = options
        self._renames = location.kind == "hdfs"

    def _path(self, name: str) -> str:
        return posixpath.join(self.location.path, name)

    def _fail(self, doing: str, exc: BaseException) -> StorageError:
        return StorageError(f"the checkpoint storage {self.location.uri}: {doing} failed: "
                            f"{scrub(str(exc), self._options)}")

    def read(self, name: str) -> Optional[bytes]:
        try:
            with self.fs.open_input_stream(self._path(name)) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail(f"reading {name}", exc) from None

    def write(self, name: str, data: bytes) -> None:
        path = self._path(name)
        target = (posixpath.join(posixpath.dirname(path), f".tmp-{os.getpid()}-"
                                 f"{time.time_ns()}") if self._renames else path)
        try:
            if self._renames:
                self.fs.create_dir(posixpath.dirname(path), recursive=True)
            with self.fs.open_output_stream(target) as f:
                f.write(data)
            if self._renames:
                self.fs.move(target, path)
        except OSError as exc:
            raise self._fail(f"writing {name}", exc) from None

    def list(self, folder: str) -> List[Entry]:
        from pyarrow.fs import FileSelector, FileType

        try:
            infos = self.fs.get_file_info(FileSelector(self._path(folder),
                                                       allow_not_found=True))
        except OSError as exc:
            raise self._fail(f"listing {folder}", exc) from None
        return [Entry(posixpath.basename(i.path),
                      i.mtime.timestamp() if i.mtime is not None else 0.0)
                for i in infos if i.type == FileType.File
                and not posixpath.basename(i.path).startswith(".tmp-")]

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(f"deleting {name}", exc) from None

    def check(self) -> None:
        from pyarrow.fs import FileType

        root = self.location.bucket if self.location.bucket else self.location.path
        what = ("bucket" if self.location.kind in ("s3", "gcs") else
                "container" if self.location.kind == "azure" else "path")
        try:
            info = self.fs.get_file_info(root)
            if info.type == FileType.NotFound and self.location.kind != "hdfs":
                raise StorageError(f"the checkpoint storage {self.location.uri}: the {what} "
                                   f"{root!r} does not exist (or is not visible to these "
                                   "credentials); create it first")
            # a listing proves read access (HEAD of a bucket may pass where a read fails)
            self.list("")
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(f"the checkpoint storage {self.location.uri}: the {what} "
                               f"{root!r} cannot be read: {scrub(str(exc), self._options)}"
                               ) from None


def open_store(location: Location, options: Optional[StorageOptions] = None,
               loader: Loader = importlib.import_module) -> Store:
    """The store of ``location``."""
    options = options or StorageOptions()
    if location.kind == "local":
        options.library_kwargs("local", location.scheme or "file")  # no keys for a disk
        return LocalStore(location)
    fs = filesystem(location, options, loader)
    return ArrowStore(location, fs, options)


def open_uri(uri: str, options: Optional[StorageOptions] = None,
             loader: Loader = importlib.import_module) -> Store:
    """The store of a URI or path."""
    return open_store(parse_location(uri), options, loader)
