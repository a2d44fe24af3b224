"""RocketMQ's transactional messages from the producer's side.

A transactional message is sent twice over: first as a *half* (prepared) message, which the
broker parks in ``RMQ_SYS_TRANS_HALF_TOPIC`` where no consumer sees it, then settled by
END_TRANSACTION (oneway): COMMIT writes the real message to its topic, ROLLBACK drops it.
A half message left unsettled for ``transactionTimeout`` is asked about: the broker sends
CHECK_TRANSACTION_STATE to one connection registered (by HEART_BEAT) under the message's
producer group, and the answer is an END_TRANSACTION with ``fromTransactionCheck=true``.

What this module holds: the flags and properties of a half message (:func:`half_properties`),
the :class:`HalfHandle` END_TRANSACTION needs, :func:`end_transactions` (many per write),
the :class:`CheckRequest` a broker sends, and :class:`CheckResponder`, a registered producer
connection that answers check-backs through a callback.

Facts from apache/rocketmq 4.9.8 this follows: a broker refuses transactional messages in a
SEND_BATCH_MESSAGE (each half is its own SEND_MESSAGE_V2); a second COMMIT of one half
message writes the real message again (nothing deduplicates), so a caller must never send
COMMIT for a half message that may already be committed.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..busy import BACKOFF_FIRST, BACKOFF_MAX, is_busy
from ..broker import SEND_STATUS_OF_CODE, BrokerClient, command
from ..connection import Connection, ResponseFuture
from ..errors import ProtocolError, RocketMQError
from ..protocol.message import MessageExt, commit_log_offset_of, decode_message
from ..protocol.properties import UNIQ_KEY
from ..protocol.codes import RequestCode
from ..protocol.frame import FLAG_ONEWAY, RemotingCommand
from ..responses import response_error
from ..remoting import RemotingClient

log = logging.getLogger(__name__)

END_TRANSACTION = 37
CHECK_TRANSACTION_STATE = int(RequestCode.CHECK_TRANSACTION_STATE)

# Transaction type bits of a message's sysFlag (MessageSysFlag).
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


class Outcome(enum.Enum):
    """What a check-back answer says (Java's LocalTransactionState)."""

    COMMIT = TRANSACTION_COMMIT_TYPE
    ROLLBACK = TRANSACTION_ROLLBACK_TYPE
    UNKNOWN = TRANSACTION_NOT_TYPE


def half_properties(group: str) -> Dict[str, str]:
    """The properties that make a message a half message of ``group``."""
    return {TRAN_MSG: "true", PGROUP: group}


class HalfHandle(NamedTuple):
    """What END_TRANSACTION needs about one stored half message (a tuple: a task returns
    one per row, so it must be cheap to make and to pickle).

    ``queue_offset``: its offset in the half topic (``tranStateTableOffset``);
    ``commit_log_offset``: where the broker stored it (from the broker's message id);
    ``uniq_key``: the message id clients see (``msgId``); ``transaction_id``: the send
    response's, or the uniq key."""

    broker_name: str
    address: str
    uniq_key: str
    queue_offset: int
    commit_log_offset: int
    transaction_id: str = ""

    def to_tuple(self) -> Tuple[str, str, str, int, int, str]:
        return tuple.__new__(tuple, self)

    @classmethod
    def from_tuple(cls, t: Sequence) -> "HalfHandle":
        """From a tuple as :meth:`to_tuple` or a JSON record gives it (types checked)."""
        return cls(str(t[0]), str(t[1]), str(t[2]), int(t[3]), int(t[4]), str(t[5]))


class HalfSent(NamedTuple):
    """The answer to one half-message send the broker stored: its send status and what
    END_TRANSACTION needs."""

    status: str
    handle: HalfHandle


HalfOutcome = Tuple[Optional[HalfSent], Optional[RocketMQError]]


def collect_half_answers(address: str, broker_name: str,
                         pending: Sequence[Tuple[Connection, ResponseFuture]],
                         ids: Sequence[str], timeout: float) -> List[HalfOutcome]:
    """The answers to a run of half-message sends (``ids``: their UNIQ_KEYs), in send order:
    ``(HalfSent, None)`` for a stored one, ``(None, error)`` for one refused (a busy answer
    among them), timed out or lost with its connection.

    Answers are matched by opaque, not by position: a busy broker's SYSTEM_BUSY answers
    overtake the successes of earlier requests on the same connection."""
    deadline = time.monotonic() + timeout
    if pending:  # one wait for the last answer: the others are almost always in by then
        conn, last = pending[-1]
        try:
            conn.wait(last, timeout)
        except RocketMQError:
            pass
    outcomes: List[HalfOutcome] = []
    status_of = SEND_STATUS_OF_CODE.get
    for (conn, future), uniq in zip(pending, ids):
        try:
            r = future.response if future.done and future.error is None else conn.wait(
                future, max(deadline - time.monotonic(), 0.0))
            status = status_of(r.code)
            if status is None:
                raise response_error(r, "SEND_MESSAGE", address)
            f = r.ext_fields
            msg_id = f["msgId"]
            outcomes.append((HalfSent(status, HalfHandle(
                broker_name, address, uniq, int(f["queueOffset"]),
                commit_log_offset_of(msg_id if len(msg_id) == 32 else msg_id.split(",")[0]),
                f.get("transactionId") or uniq)), None))
        except RocketMQError as exc:
            outcomes.append((None, exc))
        except (KeyError, ValueError, TypeError) as exc:
            outcomes.append((None, ProtocolError(
                f"send response from {address} lacks a usable {exc} field", None, "header")))
    return outcomes


def end_transaction_command(group: str, handle: HalfHandle, outcome: Outcome,
                            from_check: bool = False) -> RemotingCommand:
    """END_TRANSACTION (EndTransactionRequestHeader) for one half message, naming its broker
    in ``bname`` when the handle knows it (as Java's client does in the first phase; a check
    names none)."""
    return command(END_TRANSACTION, {
        "producerGroup": group,
        "tranStateTableOffset": handle.queue_offset,
        "commitLogOffset": handle.commit_log_offset,
        "commitOrRollback": outcome.value,
        "fromTransactionCheck": from_check,
        "msgId": handle.uniq_key,
        "transactionId": handle.transaction_id or handle.uniq_key,
        "bname": handle.broker_name or None,
    })


def end_transactions(remoting: RemotingClient, group: str, handles: Iterable[HalfHandle],
                     outcome: Outcome, chunk: int = 4096) -> int:
    """Send END_TRANSACTION (oneway) for every handle, up to ``chunk`` per write, broker by
    broker. Returns how many were written to sockets; raises when a broker cannot be reached
    (the ones already written stay sent)."""
    sent = 0
    for address, items in _by_address(handles).items():
        conn = remoting.connection(address)
        for start in range(0, len(items), chunk):
            part = items[start:start + chunk]
            _send_ends(conn, remoting.config.version, group, part, outcome, oneway=True)
            sent += len(part)
    return sent


def end_transactions_confirmed(remoting: RemotingClient, group: str,
                               handles: Iterable[HalfHandle], outcome: Outcome, timeout: float,
                               chunk: int = 4096) -> Tuple[int, List[HalfHandle]]:
    """END_TRANSACTION for every handle as requests the broker answers (not oneway), waiting
    up to ``timeout`` seconds; the ones a busy broker refused (not applied) are sent again
    after a pause. Returns how many the brokers applied and the handles not confirmed (no
    answer in time, a broker unreachable, or another refusal such as a half message already
    settled). For a caller that must know they arrived before it goes: a failing Spark task,
    whose process may close its connections, unread answers and all, at once."""
    deadline = time.monotonic() + timeout
    todo, unconfirmed, applied, pause = list(handles), [], 0, BACKOFF_FIRST
    while todo:
        waiting: List[Tuple[HalfHandle, Connection, ResponseFuture]] = []
        for address, items in _by_address(todo).items():
            try:
                conn = remoting.connection(address)
                for start in range(0, len(items), chunk):
                    part = items[start:start + chunk]
                    futures = _send_ends(conn, remoting.config.version, group, part, outcome,
                                         oneway=False)
                    waiting.extend((h, conn, f) for h, f in zip(part, futures))
            except RocketMQError as exc:
                log.warning("END_TRANSACTION to %s failed: %s", address, exc)
                sent = {id(h) for h, _, _ in waiting}
                unconfirmed.extend(h for h in items if id(h) not in sent)
        todo = []
        for _, conn, last in waiting[-1:]:  # one wait: the other answers are in by then
            try:
                conn.wait(last, max(deadline - time.monotonic(), 0.0))
            except RocketMQError:
                pass
        for handle, conn, future in waiting:
            try:
                answer = (future.response if future.done and future.error is None else
                          conn.wait(future, max(deadline - time.monotonic(), 0.0)))
            except RocketMQError:
                unconfirmed.append(handle)
                continue
            if answer.code == 0:
                applied += 1
            elif is_busy(response_error(answer, "END_TRANSACTION", conn.address)):
                todo.append(handle)
            else:
                unconfirmed.append(handle)
        left = deadline - time.monotonic()
        if todo and left <= 0:
            unconfirmed.extend(todo)
            break
        if todo:
            time.sleep(min(pause, left))
            pause = min(2 * pause, BACKOFF_MAX)
    return applied, unconfirmed


def _by_address(handles: Iterable[HalfHandle]) -> Dict[str, List[HalfHandle]]:
    by_address: Dict[str, List[HalfHandle]] = {}
    for h in handles:
        by_address.setdefault(h.address, []).append(h)
    return by_address


def _send_ends(conn: Connection, version: int, group: str, handles: Sequence[HalfHandle],
               outcome: Outcome, oneway: bool) -> List[Optional[ResponseFuture]]:
    if conn.credentials is None:
        return _send_ends_spliced(conn, version, group, handles, outcome, oneway)
    commands = [end_transaction_command(group, h, outcome) for h in handles]
    for c in commands:  # a signing connection: each request signed on its own
        c.version = version
    return conn.send_requests(commands, oneway=oneway)


_END_COLUMNS = ("tranStateTableOffset", "commitLogOffset", "msgId", "transactionId", "bname")


def _send_ends_spliced(conn: Connection, version: int, group: str,
                       handles: Sequence[HalfHandle], outcome: Outcome, oneway: bool
                       ) -> List[Optional[ResponseFuture]]:
    """END_TRANSACTIONs of ``handles`` in one write, spliced into one template command."""
    if not all(h.broker_name for h in handles):  # a handle without its broker's name
        named = [h for h in handles if h.broker_name]
        unnamed = [h for h in handles if not h.broker_name]
        futures = dict(zip(map(id, named), _send_ends_template(
            conn, version, group, named, outcome, oneway, _END_COLUMNS) if named else []))
        futures.update(zip(map(id, unnamed), _send_ends_template(
            conn, version, group, unnamed, outcome, oneway, _END_COLUMNS[:-1])))
        return [futures[id(h)] for h in handles]
    return _send_ends_template(conn, version, group, handles, outcome, oneway, _END_COLUMNS)


def _send_ends_template(conn: Connection, version: int, group: str,
                        handles: Sequence[HalfHandle], outcome: Outcome, oneway: bool,
                        keys: Sequence[str]) -> List[Optional[ResponseFuture]]:
    import numpy as np
    import pyarrow as pa

    from ..protocol.spliced_requests import RequestTemplate, buffer_of

    named = "bname" in keys
    template = end_transaction_command(
        group, HalfHandle("b" if named else "", "", "0", 0, 0, "0"), outcome)
    template.version = version
    if oneway:
        template.flag |= FLAG_ONEWAY
    columns = RequestTemplate(template, keys)
    values = [pa.array(np.fromiter((h.queue_offset for h in handles), np.int64, len(handles))
                       ).cast(pa.string()),
              pa.array(np.fromiter((h.commit_log_offset for h in handles), np.int64,
                                   len(handles))).cast(pa.string()),
              pa.array([h.uniq_key for h in handles], pa.string()),
              pa.array([h.transaction_id or h.uniq_key for h in handles], pa.string())]
    if named:
        values.append(pa.array([h.broker_name for h in handles], pa.string()))
    return conn.send_encoded(len(handles),
                             lambda opaques: buffer_of(columns.frames(opaques, values)),
                             "END_TRANSACTION", oneway=oneway)


@dataclass
class CheckRequest:
    """A broker's CHECK_TRANSACTION_STATE: the header and the half message it asks about."""

    address: str
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    transaction_id: str
    offset_msg_id: str
    message: Optional[MessageExt]

    @property
    def properties(self) -> Dict[str, str]:
        return self.message.properties if self.message is not None else {}

    @property
    def uniq_key(self) -> str:
        return self.properties.get(UNIQ_KEY) or self.msg_id

    @property
    def group(self) -> str:
        return self.properties.get(PGROUP, "")

    def handle(self) -> HalfHandle:
        """The handle of the copy asked about (a broker asks about its latest copy)."""
        return HalfHandle("", self.address, self.uniq_key, self.queue_offset,
                          self.commit_log_offset, self.transaction_id or self.uniq_key)


def parse_check_request(address: str, cmd: RemotingCommand) -> CheckRequest:
    """Decode CHECK_TRANSACTION_STATE; the body is the stored half message."""
    f = cmd.fields
    message = None
    if cmd.body:
        try:
            message = decode_message(cmd.body, 0, len(cmd.body), verify_crc=False,
                                       decompress=False)[0]
        except Exception as exc:  # a bad body: answer from the header alone
            log.warning("CHECK_TRANSACTION_STATE from %s has an undecodable message: %s",
                        address, exc)

    def number(key: str) -> int:
        try:
            return int(f.get(key) or -1)
        except ValueError:
            return -1

    return CheckRequest(address, number("tranStateTableOffset"), number("commitLogOffset"),
                        f.get("msgId") or "", f.get("transactionId") or "",
                        f.get("offsetMsgId") or "", message)


Decide = Callable[[CheckRequest], Outcome]


class CheckResponder:
    """A producer registered under ``group`` on every broker it is told about, answering the
    brokers' CHECK_TRANSACTION_STATE with ``decide(request)``.

    A broker asks one registered connection of the group; it registers connections by
    HEART_BEAT (sent every ``heartbeat_interval`` seconds, as Java's producers do every 30).
    A thread reads the connections, since nothing else waits on them. UNKNOWN answers send
    nothing (a genuine broker ignores an END_TRANSACTION of type 0 and asks again later)."""

    def __init__(self, remoting: RemotingClient, group: str, decide: Decide,
                 heartbeat_interval: float = 20.0, poll_interval: float = 0.05):
        self.group = group
        self.decide = decide
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self.remoting = remoting
        self.brokers = BrokerClient(remoting)
        self.answered: Dict[str, int] = {o.name: 0 for o in Outcome}
        self._addresses: List[str] = []
        self._retried: Dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @classmethod
    def create(cls, config, group: str, decide: Decide, **kw) -> "CheckResponder":
        """A responder with its own connections (``config``: a ClientConfig)."""
        holder: List["CheckResponder"] = []
        remoting = RemotingClient(config, request_handler=lambda c, cmd: holder[0].handle(c, cmd))
        responder = cls(remoting, group, decide, **kw)
        holder.append(responder)
        return responder

    def register(self, addresses: Iterable[str]) -> None:
        """Register on these brokers now (and keep registering)."""
        new = []
        with self._lock:
            for a in addresses:
                if a not in self._addresses:
                    self._addresses.append(a)
                    new.append(a)
        for a in new:
            self._heartbeat(a)

    def start(self) -> "CheckResponder":
        self._thread = threading.Thread(target=self._run, name=f"check-responder-{self.group}",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for a in list(self._addresses):
            try:
                self.brokers.unregister_client(a, producer_group=self.group, timeout=2)
            except RocketMQError:
                pass
        self.remoting.close()

    # ------------------------------------------------------------------ internals

    def _heartbeat(self, address: str) -> None:
        try:
            self.brokers.heart_beat(address, producer_group=self.group, timeout=3)
        except RocketMQError as exc:
            log.warning("producer group %s: heartbeat to %s failed: %s", self.group, address,
                        exc)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last >= self.heartbeat_interval:
                last = time.monotonic()
                for a in list(self._addresses):
                    self._heartbeat(a)
            for a in list(self._addresses):
                conn = self.remoting.existing_connection(a)
                if conn is None or conn.closed:
                    # reconnect and register again, at most once a second per broker
                    if time.monotonic() - self._retried.get(a, 0.0) >= 1.0:
                        self._retried[a] = time.monotonic()
                        self._heartbeat(a)
                    continue
                conn.poll()
            self._stop.wait(self.poll_interval)

    def handle(self, conn: Connection, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        """The connection's request handler: answers CHECK_TRANSACTION_STATE."""
        if cmd.code != CHECK_TRANSACTION_STATE:
            return None
        request = parse_check_request(conn.address, cmd)
        try:
            outcome = self.decide(request)
        except Exception:
            log.exception("deciding a check-back for %s failed; answering UNKNOWN",
                          request.uniq_key)
            outcome = Outcome.UNKNOWN
        self.answered[outcome.name] += 1
        log.debug("check-back from %s for %s (half offset %d): %s", conn.address,
                 request.uniq_key, request.queue_offset, outcome.name)
        if outcome is not Outcome.UNKNOWN:
            answer = end_transaction_command(request.group or self.group, request.handle(),
                                             outcome, from_check=True)
            answer.version = self.remoting.config.version
            try:
                conn.send_request(answer, oneway=True)
            except RocketMQError as exc:
                log.warning("answering a check-back on %s failed: %s", conn.address, exc)
        return None
