"""Where the connector keeps what outlives a driver: under a checkpoint, on any store.

A layer of its own, below ``source/`` and ``sink/`` (both may use it; it imports neither, nor
Spark): :mod:`.locations` maps a URI to a store, :mod:`.store` reads and writes whole objects,
:mod:`.lease` keeps one holder at a time, :mod:`.spark_log` reads Spark's own checkpoint files.
"""
from .errors import StorageConfigError, StorageError
from .lease import Lease, lease_looks_held
from .locations import Location, parse_location, record_location
from .options import StorageOptions
from .store import Entry, LocalStore, Store, open_store, open_uri

__all__ = ["Entry", "Lease", "LocalStore", "Location", "StorageConfigError", "StorageError",
           "StorageOptions", "Store", "lease_looks_held", "open_store", "open_uri",
           "parse_location", "record_location"]
