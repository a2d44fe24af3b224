"""A lease object: one holder at a time, on any store, without locks or conditional writes.

The object holds ``{"owner", "seq", "ttlS", "expires", "released"}``. ``pyarrow.fs`` offers
no conditional create and object stores no lock, so the rules rest on what every store gives:
a write is whole or nothing, and a read after a write sees it (S3 since December 2020, GCS,
Azure, HDFS, a local disk).

* **Taking**: read the object. Free (absent or released): write ours. Held by another: watch
  it; only when its content has not changed for a whole ``ttl`` *by our own clock* is it
  expired. Then write ours, wait ``settle`` and read again: ours is still there only if no
  rival wrote after us. A rival that read the old content before our write lands writes
  within ``settle`` of its read (a take whose read-to-write took longer is given up), so its
  write lands before our second read and we step back.
* **Holding**: the holder renews every ``ttl / 4`` (read: still ours? write; read back) and
  counts itself the holder only until ``ttl * 0.8 - margin`` after the start of its last
  renewal that read back its own content. A rival waits a whole ``ttl`` after it last saw
  the content change, which is after that renewal started: the holder's window closes first,
  even with clocks running 20 % apart (monotonic clocks; wall clocks are not trusted).
* **Fencing**: an owner whose window closed (a paused zombie) never renews; it takes the lease
  again under a fresh owner name, as a rival would. Before each answer the holder checks its
  window (:meth:`Lease.held`); a renewal that reads back a stranger ends the holding at once.

What this does not cover: a holder paused for longer than ``margin`` between :meth:`held`
and the act it guards. Keep the guarded act short and the margin above it.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import Callable, Optional

from .store import Store

TTL_S = 10.0
SETTLE_S = 1.0
MARGIN_S = 2.0
DRIFT = 0.8


def new_owner(tag: str = "") -> str:
    """An owner name no other taker has: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{tag}{secrets.token_hex(4)}"


class Lease:
    """The lease object ``name`` of ``store`` (see the module's docstring)."""

    def __init__(self, store: Store, name: str, tag: str = "", ttl_s: float = TTL_S,
                 settle_s: float = SETTLE_S, margin_s: float = MARGIN_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if ttl_s * DRIFT - margin_s <= ttl_s / 4 + settle_s:
            raise ValueError("a lease's ttl must leave room for its renewals and margin")
        self.store, self.name, self.tag = store, name, tag
        self.ttl_s, self.settle_s, self.margin_s = ttl_s, settle_s, margin_s
        self.clock, self.sleep = clock, sleep
        self.owner = new_owner(tag)
        self._seq = 0
        self._valid_until = 0.0  # monotonic
        self._last_renew = 0.0

    # ----------------------------------------------------------------- reading the object

    def _read(self) -> Optional[dict]:
        return self._read_bytes(self.store.read(self.name))

    def _write(self, released: bool = False) -> None:
        self._seq += 1
        body = {"owner": self.owner, "seq": self._seq, "ttlS": self.ttl_s,
                "expires": time.time() + self.ttl_s, "released": released}
        self.store.write(self.name, json.dumps(body).encode())

    @staticmethod
    def _free(content: Optional[dict]) -> bool:
        return content is None or bool(content.get("released"))

    # ----------------------------------------------------------------------------- taking

    def acquire(self, wait_s: float, still_wanted: Callable[[], bool] = lambda: True) -> bool:
        """Take the lease within ``wait_s`` seconds; False when another holder kept it (or
        ``still_wanted`` turned false)."""
        deadline = self.clock() + wait_s
        seen: Optional[str] = None
        seen_since = 0.0
        while still_wanted():
            started = self.clock()
            raw = self.store.read(self.name)
            content = self._read_bytes(raw)
            text = raw.decode(errors="replace") if raw else ""  # any change restarts the ttl
            if text != seen:
                seen, seen_since = text, started
            expired = started - seen_since >= self.ttl_s
            if self._free(content) or expired:
                if self._take(started):
                    return True
                seen, seen_since = None, 0.0
                continue
            if self.clock() >= deadline:
                return False
            self.sleep(min(self.ttl_s / 8, max(0.0, deadline - self.clock())) or 0.05)
        return False

    @staticmethod
    def _read_bytes(raw: Optional[bytes]) -> Optional[dict]:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return {"owner": "?"}  # not ours to read: a stranger's

    def _take(self, read_started: float) -> bool:
        """Write ours after a read that found the lease free or expired; hold it if no rival
        wrote after us."""
        self.owner = new_owner(self.tag)
        write_started = self.clock()
        self._write()
        if self.clock() - read_started > self.settle_s:
            return False  # too slow to rule a rival out: start over
        self.sleep(self.settle_s)
        content = self._read()
        if content is None or content.get("owner") != self.owner:
            return False
        self._valid_until = write_started + self.ttl_s * DRIFT - self.margin_s
        self._last_renew = write_started
        return True

    # ---------------------------------------------------------------------------- holding

    def held(self) -> bool:
        """Whether this holder may act now (its window is open); no I/O."""
        return self.clock() < self._valid_until

    def renew_due(self) -> bool:
        return self.held() and self.clock() - self._last_renew >= self.ttl_s / 4

    def renew(self) -> bool:
        """Extend the window; False when the lease is lost (the window closed, or a stranger's
        content was found): the holder must stop acting."""
        if not self.held():
            self._valid_until = 0.0
            return False
        started = self.clock()
        try:
            content = self._read()
            if content is None or content.get("owner") != self.owner:
                self._valid_until = 0.0
                return False
            self._write()
            content = self._read()
        except Exception:
            return self.held()  # the store is down: keep the window we have
        if content is None or content.get("owner") != self.owner or not self.held():
            self._valid_until = 0.0
            return False
        self._valid_until = started + self.ttl_s * DRIFT - self.margin_s
        self._last_renew = started
        return True

    def release(self) -> None:
        """Give the lease up at once (a clean exit): a successor need not wait a ttl."""
        if not self.held():
            return
        self._valid_until = 0.0
        try:
            content = self._read()
            if content is not None and content.get("owner") == self.owner:
                self._write(released=True)
        except Exception:
            pass  # it expires on its own


def lease_looks_held(store: Store, name: str, now: Optional[float] = None) -> bool:
    """Whether the lease object says someone holds it (by the wall-clock expiry its holder
    wrote): a cheap hint for starting a taker, never for acting."""
    data = store.read(name)
    if not data:
        return False
    try:
        content = json.loads(data)
    except ValueError:
        return True
    now = time.time() if now is None else now
    return not content.get("released") and float(content.get("expires", 0)) > now
