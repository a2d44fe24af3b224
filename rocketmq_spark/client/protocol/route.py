"""Route data (TopicRouteData, ClusterInfo) and the MessageQueue, with fastjson's quirks.

Name servers answering old client versions write map keys as bare integers (``{0:"host:port"}``),
which is not JSON. :func:`loads_lenient` quotes such keys with a small scanner that knows when it
is inside a string, so a topic or address that contains ``{0:`` is left alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import ProtocolError
from .codes import PERM_READ, PERM_WRITE

MASTER_ID = 0


@dataclass(frozen=True, order=True)
class MessageQueue:
    """A queue of a topic on one broker; ordered by topic, broker name, queue id (as Java sorts)."""

    topic: str
    broker_name: str
    queue_id: int

    @property
    def key(self) -> str:
        """``"topic/brokerName/queueId"``: the one place this key format is decided."""
        return f"{self.topic}/{self.broker_name}/{self.queue_id}"

    @classmethod
    def from_key(cls, key: str) -> "MessageQueue":
        """Inverse of :attr:`key`; topic and broker names cannot contain '/'."""
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"not a queue key 'topic/brokerName/queueId': {key!r}")
        return cls(parts[0], parts[1], int(parts[2]))

    def __str__(self) -> str:
        return self.key


@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        """Whether its perm lets consumers read (READ, 4)."""
        return bool(self.perm & PERM_READ)


@dataclass
class BrokerData:
    broker_name: str
    broker_addrs: Dict[int, str]
    cluster: str = "DefaultCluster"

    @property
    def master_addr(self) -> Optional[str]:
        return self.broker_addrs.get(MASTER_ID)

    def nodes(self) -> List[Tuple[int, str]]:
        """Every node of this broker as ``(brokerId, address)``: the master (id 0) first, then
        the slaves by id. Any of them serves reads and offset lookups; only the master takes
        sends and queue locks."""
        return sorted(self.broker_addrs.items())

    def select_addr(self, broker_id: int = MASTER_ID) -> Optional[str]:
        """Java's choice: the suggested id, else the next id, else any address of this broker."""
        addr = self.broker_addrs.get(broker_id)
        if addr is None and broker_id != MASTER_ID:
            addr = self.broker_addrs.get(broker_id + 1)
        if addr is None and self.broker_addrs:
            addr = self.broker_addrs[min(self.broker_addrs)]
        return addr


@dataclass
class TopicRouteData:
    queue_datas: List[QueueData] = field(default_factory=list)
    broker_datas: List[BrokerData] = field(default_factory=list)
    order_topic_conf: Optional[str] = None

    def broker(self, broker_name: str) -> Optional[BrokerData]:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None

    def readable_queues(self, topic: str) -> List[MessageQueue]:
        """Queues a consumer reads: READ permission and a broker with at least one address."""
        named = {b.broker_name for b in self.broker_datas if b.broker_addrs}
        out = [MessageQueue(topic, q.broker_name, i) for q in self.queue_datas
               if q.perm & PERM_READ and q.broker_name in named for i in range(q.read_queue_nums)]
        return sorted(out)

    def writable_queues(self, topic: str) -> List[MessageQueue]:
        """Queues a producer writes: WRITE permission and a broker with a master."""
        masters = {b.broker_name for b in self.broker_datas if b.master_addr}
        out = [MessageQueue(topic, q.broker_name, i) for q in self.queue_datas
               if q.perm & PERM_WRITE and q.broker_name in masters
               for i in range(q.write_queue_nums)]
        return sorted(out)

    def unwritable_reason(self, topic: str) -> str:
        """Why ``topic`` has no writable queue, for the error a send raises: the brokers whose
        master is not routed (their slaves take no sends), or the permissions."""
        headless = sorted(b.broker_name for b in self.broker_datas
                          if b.broker_addrs and b.master_addr is None)
        if headless:
            return (f"topic {topic!r} has no writable queue: no master of "
                    f"{', '.join(headless)} is in the route (a master is down, and its "
                    f"slaves take no sends)")
        return f"topic {topic!r} has no writable queue (no queue with write permission)"

    # ---------------------------------------------------------------- JSON

    @classmethod
    def from_json(cls, data: bytes) -> "TopicRouteData":
        obj = loads_lenient(data)
        try:
            return cls(
                queue_datas=[QueueData(q["brokerName"], int(q["readQueueNums"]),
                                       int(q["writeQueueNums"]), int(q.get("perm", 6)),
                                       int(q.get("topicSysFlag", 0)))
                             for q in obj.get("queueDatas") or []],
                broker_datas=[_broker_from_json(b) for b in obj.get("brokerDatas") or []],
                order_topic_conf=obj.get("orderTopicConf"))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise ProtocolError(f"route JSON lacks or mistypes a field: {exc!r}", 0, "route body",
                                data) from None

    def to_json(self, standard: bool = True, acting_master: bool = False) -> bytes:
        """The name server's body; ``standard=False`` writes bare integer keys like fastjson;
        ``acting_master`` adds 5.x's ``enableActingMaster`` (false) to every broker."""
        obj: Dict[str, object] = {
            "brokerDatas": [_broker_to_obj(b, acting_master) for b in self.broker_datas],
            "filterServerTable": {},
        }
        if self.order_topic_conf is not None:
            obj["orderTopicConf"] = self.order_topic_conf
        obj["queueDatas"] = [
            {"brokerName": q.broker_name, "perm": q.perm, "readQueueNums": q.read_queue_nums,
             "topicSysFlag": q.topic_sys_flag, "writeQueueNums": q.write_queue_nums}
            for q in self.queue_datas]
        return dumps_fastjson(obj, standard)


def _broker_from_json(b) -> BrokerData:
    return BrokerData(broker_name=b["brokerName"],
                      broker_addrs={int(k): v for k, v in (b.get("brokerAddrs") or {}).items()},
                      cluster=b.get("cluster", ""))


def _broker_to_obj(b: BrokerData, acting_master: bool = False) -> dict:
    obj = {"brokerAddrs": {int(k): v for k, v in sorted(b.broker_addrs.items())},
           "brokerName": b.broker_name, "cluster": b.cluster}
    if acting_master:  # 5.x's BrokerData: enableActingMaster, false unless slave acting master
        obj["enableActingMaster"] = False
    return obj


@dataclass
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO body: brokers by name, broker names by cluster."""

    broker_addr_table: Dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: Dict[str, List[str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes) -> "ClusterInfo":
        obj = loads_lenient(data)
        try:
            return cls(
                broker_addr_table={name: _broker_from_json(b) for name, b in
                                   (obj.get("brokerAddrTable") or {}).items()},
                cluster_addr_table={c: list(names) for c, names in
                                    (obj.get("clusterAddrTable") or {}).items()})
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise ProtocolError(f"cluster JSON lacks or mistypes a field: {exc!r}", 0,
                                "cluster body", data) from None

    def to_json(self, acting_master: bool = False) -> bytes:
        """Always fastjson's non-standard form, as genuine name servers answer this request
        (``acting_master``: with 5.x's ``enableActingMaster``)."""
        return dumps_fastjson({
            "brokerAddrTable": {n: _broker_to_obj(b, acting_master)
                                for n, b in self.broker_addr_table.items()},
            "clusterAddrTable": self.cluster_addr_table}, standard=False)


# --------------------------------------------------------------------------------------------
# fastjson-compatible JSON


def dumps_fastjson(obj, standard: bool = True) -> bytes:
    """Compact JSON; with ``standard=False`` integer map keys are written bare (``{0:"a"}``)."""
    return _dump(obj, standard).encode("utf-8")


def _dump(obj, standard: bool) -> str:
    if isinstance(obj, dict):
        parts = []
        for k, v in obj.items():
            key = str(k) if (isinstance(k, int) and not standard) else json.dumps(str(k))
            parts.append(f"{key}:{_dump(v, standard)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_dump(v, standard) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=standard)


def quote_bare_keys(text: str) -> str:
    """Quote bare integer object keys outside strings; everything else is copied unchanged."""
    return _quote_bare_keys(text)[0]


def _quote_bare_keys(text: str) -> Tuple[str, List[int]]:
    """:func:`quote_bare_keys`, plus the positions in ``text`` of the keys it quoted."""
    quoted: List[int] = []
    out: List[str] = []
    stack: List[str] = []
    in_string = False
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
            continue
        if c == '"':
            in_string = True
            expect_key = False
            out.append(c)
            i += 1
            continue
        if c in "{[":
            stack.append(c)
            expect_key = c == "{"
            out.append(c)
            i += 1
            continue
        if c in "}]":
            if stack:
                stack.pop()
            expect_key = False
            out.append(c)
            i += 1
            continue
        if c == ",":
            expect_key = bool(stack) and stack[-1] == "{"
            out.append(c)
            i += 1
            continue
        if expect_key and not c.isspace():
            j = i + 1 if c == "-" else i
            k = j
            while k < n and text[k].isdigit():
                k += 1
            m = k
            while m < n and text[m].isspace():
                m += 1
            if k > j and m < n and text[m] == ":":
                quoted.append(i)
                out.append('"' + text[i:k] + '"')
                i = k
                expect_key = False
                continue
            expect_key = False
        out.append(c)
        i += 1
    return "".join(out), quoted


def loads_lenient(data) -> dict:
    """Parse standard JSON, or fastjson's output with bare integer keys."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"body is not UTF-8: {exc.reason}", exc.start, "JSON body",
                                bytes(data)) from None
    else:
        text = data
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:
        raise ProtocolError("body is nested too deeply", 0, "JSON body",
                            text.encode("utf-8", "replace")) from None
    fixed, quoted = _quote_bare_keys(text)
    try:
        return json.loads(fixed)
    except ValueError as exc:
        pos = getattr(exc, "pos", None)
        if pos is not None:  # back to a byte position in the text as received
            shift = 0  # quote characters inserted before the error
            for key_pos in quoted:
                if key_pos + shift < pos:
                    shift += 2
            pos = len(text[:pos - shift].encode("utf-8", "replace"))
        raise ProtocolError(f"body is not JSON, even allowing integer keys: {exc}", pos,
                            "JSON body", text.encode("utf-8", "replace")) from None
    except RecursionError:
        raise ProtocolError("body is nested too deeply", 0, "JSON body",
                            text.encode("utf-8", "replace")) from None


def split_address(addr: str) -> Tuple[str, int]:
    """``"host:port"`` split at the last colon (route addresses write IPv6 without brackets)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


def json_object(body: bytes, what: str) -> dict:
    """A reply body that must be a JSON object (``{}`` when empty); anything else is a
    :class:`ProtocolError` naming ``what``."""
    if not body:
        return {}
    try:
        obj = loads_lenient(body)
    except ProtocolError:
        raise ProtocolError(f"{what} body is not JSON", 0, f"{what} body", body) from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} body is not a JSON object", 0, f"{what} body", body)
    return obj
