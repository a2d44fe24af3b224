"""Exactly once (``deliveryGuarantee=exactlyOnce``): the commit record and settlement.

Tasks send every row as a half message carrying (query id, batch id, write token) in its
properties and return the handles END_TRANSACTION needs. On the driver, ``commit(messages,
batchId)``:

1. records durably, under the checkpoint (``<checkpointLocation>/rocketmq-sink/``), that the
   batch is committed, with the write tokens of the task attempts Spark kept and their
   handles (a temporary file, fsync, atomic rename, fsync of the directory);
2. sends END_TRANSACTION COMMIT for every handle;
3. marks the batch's END_TRANSACTIONs as sent (``ended/<batchId>``).

A batch already recorded (a replay after a crash between the record and Spark's commit log)
rolls back the new half messages instead. ``abort`` rolls back what it got and records the
aborted tokens.

Check-backs are answered from the record (:func:`decide`): a token of a recorded batch →
COMMIT, unless the END_TRANSACTION sent for that row's original half message has already
settled it (an op message exists for its half offset: then the broker is asking about a copy
it re-stored while our END_TRANSACTION was on its way, and a COMMIT would write the row
twice) → ROLLBACK; any other token of a recorded or older batch → ROLLBACK; a batch not
recorded yet, or whose END_TRANSACTIONs are being sent → UNKNOWN (asked again later).

On restart, the first ``streamWriter()`` of the new run (on the driver, before any task
writes) settles what the last run left pending (:func:`settle`): for a batch recorded but not
marked, the op topic says which half messages the dead driver's END_TRANSACTIONs reached; only
the others get a COMMIT. Never a blind second COMMIT.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set
from urllib.parse import urlparse

from ..client.errors import RocketMQError
from ..client.protocol import message as M
from ..client.pull import PullRequest, PullStatus
from ..client.remoting import RemotingClient
from ..client.transaction import (
    OP_TOPIC, CheckRequest, HalfHandle, Outcome, end_transactions,
)
from ..options import OptionError

log = logging.getLogger(__name__)

RECORD_DIR = "rocketmq-sink"
# Properties every half message of an exactlyOnce write carries.
QUERY_PROPERTY = "SPARK_QUERY_ID"
BATCH_PROPERTY = "SPARK_BATCH_ID"
TOKEN_PROPERTY = "SPARK_WRITE_TOKEN"
# How long after the END_TRANSACTIONs of a batch were sent a check-back about one of its rows
# is answered UNKNOWN: the broker may still be working through them.
END_GRACE_SECONDS = 10.0
OP_LOOKUP_GROUP = "spark-rocketmq-sink-op-lookup"
KILL_ENV = "ROCKETMQ_SPARK_SINK_KILL"
KILL_POINTS = ("after_record", "mid_end", "after_commit")
# A genuine 4.x broker's defaults: transactionCheckInterval 60 s, transactionCheckMax 15.
BROKER_CHECK_INTERVAL = 60
BROKER_CHECK_MAX = 15


def record_root(checkpoint_location: Optional[str]) -> str:
    """The sink's directory under a local checkpoint location (a path or a file: URI)."""
    if not checkpoint_location:
        raise OptionError("option deliveryGuarantee=exactlyOnce needs the query's "
                          "checkpointLocation option (the sink keeps its commit record "
                          "under it): set .option(\"checkpointLocation\", ...) on writeStream")
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        raise OptionError(f"option deliveryGuarantee=exactlyOnce keeps its commit record under "
                          f"checkpointLocation, which must be a local path or file: URI (got "
                          f"{checkpoint_location!r}; {parsed.scheme}: is not supported yet)")
    path = parsed.path if parsed.scheme == "file" else checkpoint_location
    return os.path.join(os.path.abspath(path), RECORD_DIR)


def _write_atomic(path: str, data: bytes) -> None:
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


@dataclass
class BatchRecord:
    """What ``commit`` recorded about one micro-batch."""

    batch_id: int
    query_id: str
    group: str
    tokens: List[str]
    handles: List[HalfHandle]
    op_start: Dict[str, int] = field(default_factory=dict)  # broker address -> op offset

    def to_json(self) -> bytes:
        return json.dumps({"batchId": self.batch_id, "queryId": self.query_id,
                           "group": self.group, "tokens": self.tokens,
                           "opStart": self.op_start,
                           "handles": [h.to_tuple() for h in self.handles]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "BatchRecord":
        obj = json.loads(data)
        return cls(int(obj["batchId"]), obj["queryId"], obj["group"], list(obj["tokens"]),
                   [HalfHandle.from_tuple(t) for t in obj["handles"]],
                   {k: int(v) for k, v in obj.get("opStart", {}).items()})


class CommitLog:
    """The sink's record under the checkpoint: ``committed/<batchId>.json``,
    ``ended/<batchId>``, ``aborted/<batchId>-<n>.json``."""

    def __init__(self, root: str, retain: int = 200):
        self.root = root
        self.retain = retain
        self._cache: Dict[int, BatchRecord] = {}

    def _path(self, kind: str, name: str) -> str:
        return os.path.join(self.root, kind, name)

    def committed(self, batch_id: int) -> Optional[BatchRecord]:
        record = self._cache.get(batch_id)
        if record is None:
            try:
                with open(self._path("committed", f"{batch_id}.json"), "rb") as f:
                    record = BatchRecord.from_json(f.read())
            except FileNotFoundError:
                return None
            self._cache[batch_id] = record
        return record

    def committed_ids(self) -> List[int]:
        try:
            names = os.listdir(os.path.join(self.root, "committed"))
        except FileNotFoundError:
            return []
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def record_commit(self, record: BatchRecord) -> None:
        _write_atomic(self._path("committed", f"{record.batch_id}.json"), record.to_json())
        self._cache[record.batch_id] = record

    def ended_at(self, batch_id: int) -> Optional[float]:
        """When the batch's END_TRANSACTIONs were marked sent (None: not marked)."""
        try:
            return os.stat(self._path("ended", str(batch_id))).st_mtime
        except FileNotFoundError:
            return None

    def mark_ended(self, batch_id: int) -> None:
        _write_atomic(self._path("ended", str(batch_id)), b"")
        self._prune()

    def pending(self) -> List[int]:
        """Batches recorded as committed whose END_TRANSACTIONs were not marked sent."""
        return [b for b in self.committed_ids() if self.ended_at(b) is None]

    def record_abort(self, batch_id: int, tokens: Sequence[str]) -> None:
        name = f"{batch_id}-{time.time_ns()}.json"
        _write_atomic(self._path("aborted", name), json.dumps(list(tokens)).encode())

    def aborted_tokens(self, batch_id: int) -> Set[str]:
        out: Set[str] = set()
        directory = os.path.join(self.root, "aborted")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for n in names:
            if n.startswith(f"{batch_id}-") and n.endswith(".json"):
                with open(os.path.join(directory, n), "rb") as f:
                    out.update(json.loads(f.read()))
        return out

    def touch(self) -> None:
        """Note activity (the check-back responder stays while the query writes)."""
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, "active"), "a"):
            os.utime(os.path.join(self.root, "active"))

    def last_active(self) -> float:
        try:
            return os.stat(os.path.join(self.root, "active")).st_mtime
        except FileNotFoundError:
            return 0.0

    def _prune(self) -> None:
        """Drop the handles of old settled batches (a broker stops asking about a half
        message after transactionCheckMax checks); keep the newest ``retain``."""
        ids = self.committed_ids()
        for b in ids[:-self.retain] if len(ids) > self.retain else []:
            if self.ended_at(b) is None:
                continue
            for kind, name in (("committed", f"{b}.json"), ("ended", str(b))):
                try:
                    os.unlink(self._path(kind, name))
                except FileNotFoundError:
                    pass
            self._cache.pop(b, None)


# ------------------------------------------------------------------------------ op topic


class OpTopic:
    """Which half offsets a broker has settled: its op topic holds one message per COMMIT or
    ROLLBACK (tag ``d``, body the half message's queue offset)."""

    def __init__(self, remoting: RemotingClient):
        from ..client.broker import BrokerClient

        self.brokers = BrokerClient(remoting)
        self._seen: Dict[str, Set[int]] = {}
        self._from: Dict[str, int] = {}
        self._next: Dict[str, int] = {}

    def max_offset(self, address: str) -> int:
        from ..client.protocol.route import MessageQueue

        try:
            return self.brokers.get_max_offset(address, MessageQueue(OP_TOPIC, "", 0),
                                               timeout=5)
        except RocketMQError:  # no op topic yet: nothing settled so far
            return 0

    def settled(self, address: str, start: int) -> Set[int]:
        """Half offsets with an op message at or after op offset ``start`` (read
        incrementally: later calls read only what was added since)."""
        if address not in self._from or start < self._from[address]:
            self._from[address], self._next[address] = start, start
            self._seen[address] = set()
        offset, seen = self._next[address], self._seen[address]
        while True:
            request = PullRequest(OP_LOOKUP_GROUP, OP_TOPIC, 0, offset, max_msg_nums=32)
            try:
                result = self.brokers.pull(address, request, timeout=5)
            except RocketMQError as exc:
                log.warning("reading %s on %s failed: %s", OP_TOPIC, address, exc)
                break
            if result.status is PullStatus.FOUND:
                for m in M.decode_messages(result.body, verify_crc=False):
                    try:
                        seen.add(int(m.body.decode().strip()))
                    except ValueError:
                        pass
                offset = result.next_begin_offset
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_begin_offset > offset:
                offset = result.next_begin_offset
                continue
            break
        self._next[address] = offset
        return seen


# ------------------------------------------------------------------------------ decisions


def decide(commit_log: CommitLog, query_id: str, ops: OpTopic, request: CheckRequest,
           now: Optional[float] = None) -> Outcome:
    """The answer to a check-back, from the record (see the module's docstring)."""
    props = request.properties
    if props.get(QUERY_PROPERTY) != query_id or BATCH_PROPERTY not in props:
        return Outcome.UNKNOWN  # not this query's (another writer in the group)
    try:
        batch_id = int(props[BATCH_PROPERTY])
    except ValueError:
        return Outcome.UNKNOWN
    token = props.get(TOKEN_PROPERTY, "")
    record = commit_log.committed(batch_id)
    if record is None:
        if token in commit_log.aborted_tokens(batch_id):
            return Outcome.ROLLBACK
        ids = commit_log.committed_ids()
        if ids and batch_id < ids[-1]:
            return Outcome.ROLLBACK  # older than a committed batch: never to be committed
        return Outcome.UNKNOWN       # maybe still running
    if token not in record.tokens:
        return Outcome.ROLLBACK      # a failed or replayed attempt
    ended = commit_log.ended_at(batch_id)
    now = time.time() if now is None else now
    if ended is None or now - ended < END_GRACE_SECONDS:
        return Outcome.UNKNOWN       # END_TRANSACTIONs being sent (or a restart will settle)
    original = next((h for h in record.handles if h.uniq_key == request.uniq_key
                     and h.address == request.address), None)
    if original is None:
        original = next((h for h in record.handles if h.uniq_key == request.uniq_key), None)
    if original is None:
        return Outcome.UNKNOWN
    settled = ops.settled(original.address, record.op_start.get(original.address, 0))
    return Outcome.ROLLBACK if original.queue_offset in settled else Outcome.COMMIT


# ------------------------------------------------------------------------------ kill hooks


def _driver_jvm_pid() -> Optional[int]:
    """The nearest ancestor process that is a JVM (the Spark driver), from /proc."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            return None
        if cmdline and os.path.basename(cmdline[0]) == b"java":
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def kill_point(commit_log: CommitLog, point: str, batch_id: int) -> None:
    """Test hook: SIGKILL the driver JVM at ``point`` of ``batch_id``'s commit when the
    environment variable ``ROCKETMQ_SPARK_SINK_KILL`` names it (``point:batchId``, several
    separated by commas). Each fires once per checkpoint (a marker file remembers it)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    wanted = {s.strip() for s in spec.split(",") if s.strip()}
    if f"{point}:{batch_id}" not in wanted:
        return
    marker = os.path.join(commit_log.root, "kill-fired", f"{point}-{batch_id}")
    if os.path.exists(marker):
        return
    _write_atomic(marker, str(time.time()).encode())
    jvm = _driver_jvm_pid()
    log.warning("test hook %s=%s: killing the driver JVM %s at %s of batch %d", KILL_ENV,
                spec, jvm, point, batch_id)
    if jvm is not None:
        os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------ driver side


def check_limits_warning(interval_s: int = BROKER_CHECK_INTERVAL,
                         check_max: int = BROKER_CHECK_MAX) -> str:
    minutes = interval_s * check_max / 60
    return (f"rocketmq sink (exactlyOnce): a broker asks about an unsettled half message every "
            f"transactionCheckInterval ({interval_s} s on a default 4.x broker) and discards it "
            f"after transactionCheckMax ({check_max}) checks, about {minutes:.0f} minutes. If "
            "this query stays down longer than that after a crash between its commit record "
            "and its END_TRANSACTIONs, the unsettled rows of that batch are lost. Restart "
            "queries promptly, or raise transactionCheckMax on the brokers")


def commit_batch(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic,
                 record: BatchRecord) -> int:
    """Record, COMMIT, mark (or, for a batch already recorded, roll the new halves back).
    Returns how many END_TRANSACTION COMMITs were sent."""
    previous = commit_log.committed(record.batch_id)
    if previous is not None:
        fresh = [h for h in record.handles if h not in set(previous.handles)]
        rollback(remoting, record.group, fresh)
        log.warning("rocketmq sink micro-batch %d was already committed by an earlier run; "
                    "rolled back the %d half messages of its replay", record.batch_id,
                    len(fresh))
        settle_batch(commit_log, remoting, ops, record.batch_id)
        kill_point(commit_log, "after_commit", record.batch_id)
        return 0
    for address in sorted({h.address for h in record.handles}):
        record.op_start[address] = ops.max_offset(address)
    commit_log.record_commit(record)
    kill_point(commit_log, "after_record", record.batch_id)
    handles = record.handles
    half = len(handles) // 2
    sent = end_transactions(remoting, record.group, handles[:half], Outcome.COMMIT)
    kill_point(commit_log, "mid_end", record.batch_id)
    sent += end_transactions(remoting, record.group, handles[half:], Outcome.COMMIT)
    commit_log.mark_ended(record.batch_id)
    kill_point(commit_log, "after_commit", record.batch_id)
    return sent


def rollback(remoting: RemotingClient, group: str, handles: Iterable[HalfHandle]) -> int:
    """ROLLBACK for every handle (best effort: a check-back settles what this misses)."""
    handles = list(handles)
    if not handles:
        return 0
    try:
        return end_transactions(remoting, group, handles, Outcome.ROLLBACK)
    except RocketMQError as exc:
        log.warning("rolling back %d half messages failed (%s); the brokers' check-backs "
                    "will roll them back", len(handles), exc)
        return 0


def settle_batch(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic,
                 batch_id: int) -> int:
    """COMMIT the rows of a recorded batch that no END_TRANSACTION has reached (the op topic
    says which), then mark it. Returns how many COMMITs were sent."""
    if commit_log.ended_at(batch_id) is not None:
        return 0
    record = commit_log.committed(batch_id)
    if record is None:
        return 0
    todo: List[HalfHandle] = []
    by_address: Dict[str, List[HalfHandle]] = {}
    for h in record.handles:
        by_address.setdefault(h.address, []).append(h)
    for address, items in by_address.items():
        settled = ops.settled(address, record.op_start.get(address, 0))
        todo.extend(h for h in items if h.queue_offset not in settled)
    sent = end_transactions(remoting, record.group, todo, Outcome.COMMIT) if todo else 0
    commit_log.mark_ended(batch_id)
    log.warning("rocketmq sink: settled micro-batch %d left pending by an earlier run: %d of "
                "its %d rows had not been committed; committed them now", batch_id, sent,
                len(record.handles))
    return sent


def settle(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic) -> int:
    """Settle every batch the last run recorded but did not finish (restart)."""
    return sum(settle_batch(commit_log, remoting, ops, b) for b in commit_log.pending())


# ------------------------------------------------------------------------------ responder


def ensure_responder(commit_log: CommitLog, raw_options: Mapping[str, str], group: str,
                     query_id: str) -> None:
    """Start the query's check-back responder unless one runs for this checkpoint.

    It is a process of its own (``python -m rocketmq_spark.sink.responder``), detached from
    Spark's worker, that lives while the driver JVM does (and not longer than an idle limit
    after the last commit), so the brokers always have someone of the group to ask. Options
    reach it on stdin, never on its command line (they may hold a secret key)."""
    os.makedirs(commit_log.root, exist_ok=True)
    lock_path = os.path.join(commit_log.root, "responder.lock")
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # running
        fcntl.flock(f, fcntl.LOCK_UN)
    config = {"root": commit_log.root, "options": dict(raw_options), "group": group,
              "queryId": query_id, "jvmPid": _driver_jvm_pid() or os.getppid()}
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.sink.responder"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(commit_log.root, "responder.log"), "ab"),
                            start_new_session=True, close_fds=True)
    proc.stdin.write(json.dumps(config).encode())
    proc.stdin.close()
