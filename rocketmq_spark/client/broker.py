"""Typed broker calls: one method per request code, each with a timeout.

Every method takes the broker's address (``"host:port"``) and, where the request concerns a queue,
the broker name too, sent as ``bname`` (required by a 5.x proxy, ignored by 4.x brokers).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .connection import Connection, ResponseFuture
from .errors import ProtocolError, RocketMQError
from .protocol.codes import DEFAULT_TOPIC, SEND_V2_KEYS, RequestCode, ResponseCode
from .protocol.frame import RemotingCommand
from .protocol.properties import java_string_hash, split_tags_expression
from .protocol.route import MessageQueue, json_object
from .pull import PullRequest, PullResult, pull_result
from .responses import response_error
from .remoting import RemotingClient

# Codes a send may answer with when the message was stored (with a durability warning).
SEND_STATUS_OF_CODE = {  # send response codes that mean stored, and their SendStatus
    ResponseCode.SUCCESS: "SEND_OK",
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}

_OFFSET_LOOKUPS = {
    "max": (RequestCode.GET_MAX_OFFSET, "offset", "GET_MAX_OFFSET"),
    "min": (RequestCode.GET_MIN_OFFSET, "offset", "GET_MIN_OFFSET"),
    "committed": (RequestCode.QUERY_CONSUMER_OFFSET, "offset", "QUERY_CONSUMER_OFFSET"),
    "timestamp": (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, "offset", "SEARCH_OFFSET_BY_TIMESTAMP"),
}



@dataclass
class SendResponse:
    status: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str = ""  # prepared (half) messages


@dataclass(frozen=True)
class Subscription:
    """A topic and its expression (TAG, or SQL92 with the time it was built, in ms), as a
    heartbeat announces it."""

    topic: str
    expression: str = "*"
    expression_type: str = "TAG"
    sub_version: int = 0


def command(code: int, fields: Optional[Dict[str, object]] = None, body: bytes = b""
            ) -> RemotingCommand:
    """A request whose header fields are written as Java's clients write them: ``None`` left
    out, booleans as ``true``/``false``, anything else as its ``str``."""
    ext = {}
    for key, value in (fields or {}).items():
        if value is None:
            continue
        ext[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return RemotingCommand(code=code, ext_fields=ext, body=body)


def send_command(broker_name: str, producer_group: str, topic: str, queue_id: int,
                 body: bytes, properties: str = "", sys_flag: int = 0, flag: int = 0,
                 born_timestamp: int = 0, default_topic_queue_nums: int = 4,
                 batch: bool = False, use_v2: bool = True) -> RemotingCommand:
    """SEND_MESSAGE_V2 / SEND_MESSAGE / SEND_BATCH_MESSAGE (SendMessageRequestHeader)."""
    fields: Dict[str, object] = {
        "producerGroup": producer_group, "topic": topic, "defaultTopic": DEFAULT_TOPIC,
        "defaultTopicQueueNums": default_topic_queue_nums, "queueId": queue_id,
        "sysFlag": sys_flag, "bornTimestamp": born_timestamp, "flag": flag,
        "properties": properties, "reconsumeTimes": 0, "unitMode": False, "batch": batch,
        "bname": broker_name,
    }
    if batch or use_v2:
        # The short header carries the broker name twice: a 5.1+ proxy's remoting port reads
        # ``n`` for SEND_MESSAGE_V2 but ``bname`` for SEND_BATCH_MESSAGE (brokers read neither)
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        fields = {SEND_V2_KEYS[k]: v for k, v in fields.items()}
        fields["bname"] = broker_name
    else:
        code = RequestCode.SEND_MESSAGE
    return command(code, fields, body)


class BrokerClient:
    """Requests to brokers, over a shared :class:`RemotingClient`."""

    def __init__(self, remoting: RemotingClient):
        self.remoting = remoting

    # ------------------------------------------------------------------ plumbing

    def _call(self, address: str, cmd: RemotingCommand, name: str,
              timeout: Optional[float] = None, ok=(ResponseCode.SUCCESS,)) -> RemotingCommand:
        response = self.remoting.invoke(address, cmd, timeout)
        if response.code not in ok:
            raise response_error(response, name, address)
        return response

    @staticmethod
    def _offset(response: RemotingCommand, key: str, address: str, name: str) -> int:
        value = response.fields.get(key)
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ProtocolError(f"{name} response from {address} has no numeric {key!r} "
                                f"field", None, "header") from None

    # ------------------------------------------------------------------ pull

    def pull_async(self, address: str, request: PullRequest
                   ) -> Tuple[Connection, ResponseFuture]:
        """Send a pull without waiting; finish it with :meth:`pull_wait`."""
        return self.remoting.send(address, command(RequestCode.PULL_MESSAGE, request.ext_fields()))

    def pull_many_async(self, address: str, requests: Sequence[PullRequest]
                        ) -> List[Tuple[Connection, ResponseFuture]]:
        """Send several pulls to one broker in a single write."""
        return self.remoting.send_many(address, [command(RequestCode.PULL_MESSAGE, r.ext_fields())
                                                 for r in requests])

    def pull_wait(self, address: str, pending: Tuple[Connection, ResponseFuture],
                  timeout: float) -> PullResult:
        return pull_result(self.remoting.wait(pending, timeout), "PULL_MESSAGE", address)

    def pull(self, address: str, request: PullRequest, timeout: Optional[float] = None
             ) -> PullResult:
        """One pull. The wait covers the broker's long-poll hold plus ``timeout``."""
        base = self.remoting.config.request_timeout if timeout is None else timeout
        return self.pull_wait(address, self.pull_async(address, request),
                              base + request.suspend_timeout_ms / 1000.0)

    # ------------------------------------------------------------------ offsets

    def _one_offset(self, kind: str, address: str, mq: MessageQueue, **kw) -> Optional[int]:
        result = self.queue_offsets(kind, [(address, mq)], **kw)[mq]
        if isinstance(result, RocketMQError):
            raise result
        return result

    def get_max_offset(self, address: str, mq: MessageQueue,
                       timeout: Optional[float] = None) -> int:
        """The next offset to be written (number of messages ever stored in the queue)."""
        return self._one_offset("max", address, mq, timeout=timeout)

    def get_min_offset(self, address: str, mq: MessageQueue,
                       timeout: Optional[float] = None) -> int:
        """The oldest offset still retained."""
        return self._one_offset("min", address, mq, timeout=timeout)

    def search_offset_by_timestamp(self, address: str, mq: MessageQueue, timestamp_ms: int,
                                   timeout: Optional[float] = None) -> int:
        """The broker's offset for a store timestamp (semantics vary by broker version)."""
        return self._one_offset("timestamp", address, mq, timestamp_ms=timestamp_ms,
                                timeout=timeout)

    def get_earliest_msg_store_time(self, address: str, mq: MessageQueue,
                                    timeout: Optional[float] = None) -> int:
        """Store time (ms) of the message at the min offset; -1 for an empty queue."""
        r = self._call(address, command(RequestCode.GET_EARLIEST_MSG_STORETIME, {
            "topic": mq.topic, "queueId": mq.queue_id, "bname": mq.broker_name}),
            "GET_EARLIEST_MSG_STORETIME", timeout)
        return self._offset(r, "timestamp", address, "GET_EARLIEST_MSG_STORETIME")

    def queue_offsets(self, kind: str, targets: Sequence[Tuple[str, MessageQueue]],
                      group: Optional[str] = None, timestamp_ms: Optional[int] = None,
                      timeout: Optional[float] = None
                      ) -> Dict[MessageQueue, Union[int, None, RocketMQError]]:
        """Look up many queues at once: every request is sent before any answer is awaited.

        ``kind`` is ``"max"``, ``"min"``, ``"committed"`` (needs ``group``; ``None`` when the
        group has no offset) or ``"timestamp"`` (needs ``timestamp_ms``). ``targets`` pairs a
        broker address with a queue. A queue whose broker fails maps to the error, so one
        unreachable broker does not hide the others' answers.
        """
        code, key, name = _OFFSET_LOOKUPS[kind]
        sent: List[Tuple[MessageQueue, str, object]] = []
        out: Dict[MessageQueue, Union[int, None, RocketMQError]] = {}
        by_address: Dict[str, List[MessageQueue]] = {}
        for address, mq in targets:
            by_address.setdefault(address, []).append(mq)
        for address, queues in by_address.items():
            commands = []
            for mq in queues:
                fields: Dict[str, object] = {"topic": mq.topic, "queueId": mq.queue_id,
                                             "bname": mq.broker_name}
                if kind == "committed":
                    fields.update(consumerGroup=group, setZeroIfNotFound=False)
                elif kind == "timestamp":
                    fields["timestamp"] = int(timestamp_ms)
                commands.append(command(code, fields))
            try:  # one write per broker for all of its queues
                pending = self.remoting.send_many(address, commands)
            except RocketMQError as exc:
                out.update((mq, exc) for mq in queues)
                continue
            sent.extend((mq, address, p) for mq, p in zip(queues, pending))
        for mq, address, pending in sent:
            try:
                r = self.remoting.wait(pending, timeout)
                if kind == "committed" and r.code == ResponseCode.QUERY_NOT_FOUND:
                    out[mq] = None
                    continue
                if r.code != ResponseCode.SUCCESS:
                    raise response_error(r, name, address)
                out[mq] = self._offset(r, key, address, name)
            except RocketMQError as exc:
                out[mq] = exc
        return out

    # ------------------------------------------------------------------ clients and groups

    def heart_beat(self, address: str, consumer_group: Optional[str] = None,
                   subscriptions: Iterable[Subscription] = (), producer_group: Optional[str] = None,
                   consume_from_where: str = "CONSUME_FROM_FIRST_OFFSET",
                   timeout: Optional[float] = None) -> None:
        """Announce this client (as a pull consumer and/or producer) to one broker."""
        body = heartbeat_body(self.remoting.config.client_id, consumer_group, subscriptions,
                              producer_group, consume_from_where)
        self._call(address, command(RequestCode.HEART_BEAT, body=body), "HEART_BEAT", timeout)

    def unregister_client(self, address: str, consumer_group: Optional[str] = None,
                          producer_group: Optional[str] = None,
                          timeout: Optional[float] = None) -> None:
        self._call(address, command(RequestCode.UNREGISTER_CLIENT, {
            "clientID": self.remoting.config.client_id, "consumerGroup": consumer_group,
            "producerGroup": producer_group}), "UNREGISTER_CLIENT", timeout)

    def get_consumer_list_by_group(self, address: str, group: str,
                                   timeout: Optional[float] = None) -> List[str]:
        """Client ids of the group's live members; ``[]`` when the broker knows none (a 4.x
        broker says "no consumer for this group"; a 5.x proxy's remoting port fails on the
        group it does not know: SYSTEM_ERROR with no remark, or on Java 14+ the
        NullPointerException's text naming ``consumerGroupInfo``)."""
        r = self._call(address, command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {
            "consumerGroup": group}), "GET_CONSUMER_LIST_BY_GROUP", timeout,
            ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if r.code == ResponseCode.SYSTEM_ERROR:
            remark = r.remark or ""
            if not remark or "no consumer" in remark or "consumerGroupInfo" in remark:
                return []
            raise response_error(r, "GET_CONSUMER_LIST_BY_GROUP", address)
        return [str(c) for c in json_object(r.body, "consumer list").get("consumerIdList")
                or []]

    def get_consumer_connection_list(self, address: str, group: str,
                                     timeout: Optional[float] = None) -> Dict[str, object]:
        """The group's members as ``mqadmin consumerConnection`` shows them: the
        ConsumerConnection JSON (``connectionSet`` of clientId/clientAddr/language/version,
        ``subscriptionTable``, ``consumeType``, ...)."""
        r = self._call(address, command(RequestCode.GET_CONSUMER_CONNECTION_LIST, {
            "consumerGroup": group}), "GET_CONSUMER_CONNECTION_LIST", timeout)
        return json_object(r.body, "consumer connection list")

    def get_consumer_running_info(self, address: str, group: str, client_id: str,
                                  timeout: Optional[float] = None) -> bytes:
        """GET_CONSUMER_RUNNING_INFO: the broker asks member ``client_id`` of ``group`` and
        passes its ConsumerRunningInfo on (fastjson text: its ``mqTable`` has queues as object
        keys, so it is returned as bytes)."""
        r = self._call(address, command(RequestCode.GET_CONSUMER_RUNNING_INFO, {
            "consumerGroup": group, "clientId": client_id, "jstackEnable": False}),
            "GET_CONSUMER_RUNNING_INFO", timeout)
        return r.body

    def lock_batch_mq(self, address: str, group: str, queues: Iterable[MessageQueue],
                      client_id: Optional[str] = None, timeout: Optional[float] = None
                      ) -> List[MessageQueue]:
        """LOCK_BATCH_MQ: take or renew the broker's locks on ``queues`` for this client in
        ``group`` (as RocketMQ's orderly consumers do). Returns the queues now locked by this
        client; the others are held by another client whose lock has not expired."""
        body = lock_batch_body(group, client_id or self.remoting.config.client_id, queues)
        r = self._call(address, command(RequestCode.LOCK_BATCH_MQ, body=body), "LOCK_BATCH_MQ",
                       timeout)
        granted = json_object(r.body, "LOCK_BATCH_MQ answer").get("lockOKMQSet") or []
        try:
            return sorted(MessageQueue(str(q["topic"]), str(q["brokerName"]), int(q["queueId"]))
                          for q in granted)
        except (KeyError, TypeError, ValueError):
            raise ProtocolError(f"LOCK_BATCH_MQ answer from {address} lists a malformed queue",
                                0, "LOCK_BATCH_MQ body", r.body) from None

    def unlock_batch_mq(self, address: str, group: str, queues: Iterable[MessageQueue],
                        client_id: Optional[str] = None, oneway: bool = False,
                        timeout: Optional[float] = None) -> None:
        """UNLOCK_BATCH_MQ: release this client's locks on ``queues`` (a queue locked by another
        client stays locked)."""
        cmd = command(RequestCode.UNLOCK_BATCH_MQ,
                   body=lock_batch_body(group, client_id or self.remoting.config.client_id,
                                        queues))
        if oneway:
            self.remoting.invoke_oneway(address, cmd)
        else:
            self._call(address, cmd, "UNLOCK_BATCH_MQ", timeout)

    # ------------------------------------------------------------------ sending

    def send_message_async(self, address: str, broker_name: str, *, producer_group: str,
                           topic: str, queue_id: int, body: bytes, properties: str = "",
                           sys_flag: int = 0, flag: int = 0, born_timestamp: int = 0,
                           default_topic_queue_nums: int = 4, batch: bool = False,
                           use_v2: bool = True) -> Tuple[Connection, ResponseFuture]:
        """SEND_MESSAGE_V2 (or 10 with ``use_v2=False``), or SEND_BATCH_MESSAGE with ``batch``
        (``body`` from :func:`~.protocol.message.encode_batch`); finish with :meth:`send_wait`."""
        return self.remoting.send(address, send_command(
            broker_name, producer_group, topic, queue_id, body, properties, sys_flag, flag,
            born_timestamp, default_topic_queue_nums, batch, use_v2))

    def send_messages_async(self, address: str, broker_name: str, *, producer_group: str,
                            topic: str, queue_id: int,
                            messages: Sequence[Tuple[bytes, str, int, int]],
                            born_timestamp: int = 0, default_topic_queue_nums: int = 4
                            ) -> List[Tuple[Connection, ResponseFuture]]:
        """Several single messages (``(body, properties, sysFlag, flag)`` each) to one queue,
        one SEND_MESSAGE_V2 each, written to the socket together: for messages a broker
        refuses in a batch (half messages), without a system call per message."""
        return self.remoting.send_many(address, [send_command(
            broker_name, producer_group, topic, queue_id, body, properties, sys_flag, flag,
            born_timestamp, default_topic_queue_nums) for body, properties, sys_flag, flag
            in messages])

    def send_wait(self, address: str, pending: Tuple[Connection, ResponseFuture],
                  timeout: Optional[float] = None) -> SendResponse:
        r = self.remoting.wait(pending, timeout)
        status = SEND_STATUS_OF_CODE.get(r.code)
        if status is None:
            raise response_error(r, "SEND_MESSAGE", address)
        f = r.fields
        try:
            return SendResponse(status, f.get("msgId", ""), int(f.get("queueId", -1)),
                                int(f.get("queueOffset", -1)), f.get("transactionId") or "")
        except ValueError:
            raise ProtocolError(f"send response from {address} has non-numeric queue fields",
                                None, "header") from None

    # ------------------------------------------------------------------ admin

    def create_topic(self, address: str, topic: str, read_queue_nums: int = 4,
                     write_queue_nums: Optional[int] = None, perm: int = 6,
                     timeout: Optional[float] = None) -> None:
        """UPDATE_AND_CREATE_TOPIC on one broker (create, or change queue counts / perm)."""
        self._call(address, command(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": read_queue_nums,
            "writeQueueNums": read_queue_nums if write_queue_nums is None else write_queue_nums,
            "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}),
            "UPDATE_AND_CREATE_TOPIC", timeout)


def update_offset_command(mq: MessageQueue, group: str, offset: int) -> RemotingCommand:
    """UPDATE_CONSUMER_OFFSET: ``offset`` is the group's next offset to consume in ``mq``."""
    return command(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id,
        "commitOffset": offset, "bname": mq.broker_name})


def lock_batch_body(group: str, client_id: str, queues: Iterable[MessageQueue]) -> bytes:
    """LockBatchRequestBody / UnlockBatchRequestBody JSON (fastjson's field order)."""
    mq_set = [{"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}
              for mq in sorted(set(queues))]
    return json.dumps({"clientId": client_id, "consumerGroup": group, "mqSet": mq_set},
                      separators=(",", ":")).encode("utf-8")


def heartbeat_body(client_id: str, consumer_group: Optional[str],
                   subscriptions: Iterable[Subscription], producer_group: Optional[str],
                   consume_from_where: str = "CONSUME_FROM_FIRST_OFFSET") -> bytes:
    """HeartbeatData JSON: a CONSUME_ACTIVELY (pull) consumer and/or a producer."""
    data: Dict[str, object] = {"clientID": client_id}
    if consumer_group:
        subs = []
        for s in subscriptions:
            # Java's FilterAPI.build: tags only for TAG; a SQL92 subscription has none
            tags = split_tags_expression(s.expression) if s.expression_type == "TAG" else []
            subs.append({"classFilterMode": False, "codeSet": [java_string_hash(t) for t in tags],
                         "expressionType": s.expression_type, "subString": s.expression or "*",
                         "subVersion": s.sub_version, "tagsSet": tags, "topic": s.topic})
        data["consumerDataSet"] = [{
            "consumeFromWhere": consume_from_where, "consumeType": "CONSUME_ACTIVELY",
            "groupName": consumer_group, "messageModel": "CLUSTERING",
            "subscriptionDataSet": subs, "unitMode": False}]
    else:
        data["consumerDataSet"] = []
    data["producerDataSet"] = [{"groupName": producer_group}] if producer_group else []
    return json.dumps(data, separators=(",", ":")).encode("utf-8")
