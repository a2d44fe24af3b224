"""The storage layer's errors: each names the location (scheme and bucket) at fault."""
from __future__ import annotations


class StorageError(Exception):
    """A store could not be reached or refused a request."""


class StorageConfigError(StorageError, ValueError):
    """A location or a ``checkpointStorage.*`` option the connector cannot use."""
