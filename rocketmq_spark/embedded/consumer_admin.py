"""A broker's consumer and producer management requests (AdminBrokerProcessor,
ClientManageProcessor and RebalanceLockManager in 4.9.8): heartbeats, unregistering, group
members, consume stats, a member's running info and the orderly consumers' queue locks.

They take a :class:`~.context.BrokerContext`, never the broker, as the other handler modules.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Dict, Optional

from ..client.protocol.codes import RequestCode, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.route import dumps_fastjson
from .context import BrokerContext
from .headers import req_str
from .send_back import create_retry_topic_on_heartbeat

log = logging.getLogger(__name__)


class ConsumerAdmin:
    """The client-management handlers of one broker, and its queue locks."""

    def __init__(self, context: BrokerContext):
        self.context = context
        self.name = context.name
        self.options = context.options
        self.store = context.store
        self.clients = context.clients
        self.locks: Dict[tuple, tuple] = {}

    def handlers(self) -> Dict[int, object]:
        """Request code -> handler, for the broker's dispatch table."""
        return {
            RequestCode.HEART_BEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.GET_CONSUME_STATS: self._consume_stats,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self._consumer_connections,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self._consumer_running_info,
            RequestCode.LOCK_BATCH_MQ: self._lock_batch,  # orderly consumers
            RequestCode.UNLOCK_BATCH_MQ: self._unlock_batch,
        }

    def _reply(self, cmd: RemotingCommand, code: int, ext: Optional[Dict[str, str]] = None,
               remark: Optional[str] = None, body: bytes = b"") -> RemotingCommand:
        return cmd.make_response(code, ext, remark, body=body, version=self.options.version)

    def _consume_stats(self, conn, cmd):
        f = cmd.fields
        group = req_str(f, "consumerGroup")
        topic = f.get("topic")
        topics = [topic] if topic and topic.strip() else self.store.topics_of_group(group)
        info = self.clients.consumers.get(group)
        table = {}
        for t in dict.fromkeys(topics):
            config = self.store.topics.get(t)
            if config is None:
                continue
            if info is not None and info.subscriptions and t not in info.subscriptions:
                continue
            for qid in range(config.read_queue_nums):
                queue = self.store.existing_queue(t, qid)
                broker_offset = queue.max_offset if queue else 0
                consumer_offset = max(self.store.query_offset(group, t, qid), 0)
                last = 0
                if consumer_offset > 0 and queue is not None:
                    last = queue.store_time(consumer_offset - 1) or 0
                key = dumps_fastjson({"brokerName": self.name, "queueId": qid, "topic": t})
                table[key.decode()] = {"brokerOffset": broker_offset,
                                       "consumerOffset": consumer_offset, "lastTimestamp": last}
        entries = ",".join(f"{k}:{json.dumps(v, separators=(',', ':'))}"
                           for k, v in table.items())
        body = ('{"consumeTps":0.0,"offsetTable":{' + entries + "}}").encode()
        return self._reply(cmd, ResponseCode.SUCCESS, None, body=body)

    def _heartbeat(self, conn, cmd):
        try:
            data = json.loads(cmd.body.decode("utf-8") or "{}")
            if not isinstance(data, dict):
                raise ValueError("heartbeat body is not a JSON object")
        except (UnicodeDecodeError, ValueError) as exc:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None,
                               f"com.alibaba.fastjson.JSONException: {exc}")
        self.clients.register_heartbeat(
            conn, cmd, data, lambda group, consumer: create_retry_topic_on_heartbeat(
                self.context, group, consumer.get("unitMode") is True))
        return self._reply(cmd, ResponseCode.SUCCESS)

    def _unregister_client(self, conn, cmd):
        f = cmd.fields
        req_str(f, "clientID")
        producer_group = f.get("producerGroup")
        consumer_group = f.get("consumerGroup")
        if producer_group is not None:
            self.clients.unregister_producer(producer_group, conn)
        if consumer_group is not None:
            self.clients.unregister_consumer(consumer_group, conn)
        return self._reply(cmd, ResponseCode.SUCCESS, {})

    def _consumer_list(self, conn, cmd):
        group = req_str(cmd.fields, "consumerGroup")
        info = self.clients.consumers.get(group)
        ids = info.client_ids() if info else []
        if not ids:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, {},
                               f"no consumer for this group, {group}")
        body = json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode()
        return self._reply(cmd, ResponseCode.SUCCESS, {}, body=body)

    def _consumer_connections(self, conn, cmd):
        """GET_CONSUMER_CONNECTION_LIST (what ``mqadmin consumerConnection`` prints): each
        member's client id, address, language and version, and the group's subscriptions."""
        group = req_str(cmd.fields, "consumerGroup")
        info = self.clients.consumers.get(group)
        if info is None:
            return self._reply(cmd, ResponseCode.CONSUMER_NOT_ONLINE, None,
                               f"the consumer group[{group}] not online")
        connections = [{"clientAddr": getattr(c, "peer", ""), "clientId": ch.client_id,
                        "language": ch.language, "version": ch.version}
                       for c, ch in info.channels.items()]
        subscriptions = {
            topic: {"classFilterMode": False, "codeSet": sorted(sub.codes),
                    "expressionType": sub.expression_type, "subString": sub.sub_string,
                    "subVersion": sub.sub_version,
                    "tagsSet": [] if sub.match_all or sub.expression_type.upper() != "TAG"
                    else [t.strip() for t in sub.sub_string.split("||")],
                    "topic": topic}
            for topic, sub in info.subscriptions.items()}
        body = json.dumps({"connectionSet": connections, "consumeFromWhere":
                           info.consume_from_where, "consumeType": info.consume_type,
                           "messageModel": info.message_model,
                           "subscriptionTable": subscriptions},
                          separators=(",", ":")).encode()
        return self._reply(cmd, ResponseCode.SUCCESS, None, body=body)

    def _consumer_running_info(self, conn, cmd):
        """GET_CONSUMER_RUNNING_INFO (``mqadmin consumerProgress`` and ``consumerStatus``):
        passed on to the member's own connection, its answer passed back as it is
        (AdminBrokerProcessor.callConsumer)."""
        f = cmd.fields
        group, client_id = req_str(f, "consumerGroup"), req_str(f, "clientId")
        member = self.clients.find_channel(group, client_id)
        if member is None:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None,
                               f"The Consumer <{group}> <{client_id}> not online")
        asked = member.call(RequestCode.GET_CONSUMER_RUNNING_INFO, dict(cmd.ext_fields or {}),
                            cmd.body)

        def relay(future) -> None:
            try:
                answer = future.result()
            except TimeoutError as exc:
                conn.send(self._reply(cmd, ResponseCode.CONSUME_MSG_TIMEOUT, None,
                                      f"consumer <{group}> <{client_id}> Timeout: {exc}"))
                return
            except Exception as exc:
                conn.send(self._reply(cmd, ResponseCode.SYSTEM_ERROR, None,
                                      f"invoke consumer <{group}> <{client_id}> Exception: "
                                      f"{exc}"))
                return
            conn.send(self._reply(cmd, answer.code, answer.ext_fields, answer.remark,
                                  body=answer.body))

        asked.add_done_callback(relay)
        return None  # answered when the member answers

    def _lock_batch(self, conn, cmd):
        """LOCK_BATCH_MQ (RebalanceLockManager.tryLockBatch): grant the queues that are free,
        already this client's or whose holder has not renewed within the lock's live time;
        granting renews. Locks are kept by (group, queue), not by connection."""
        try:
            group, client, queues = self._lock_request(cmd)
        except ValueError as exc:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None, str(exc))
        now = time.monotonic()
        expiry = self.options.rebalance_lock_max_live_seconds
        granted = []
        for mq in queues:
            holder = self.locks.get((group, mq))
            if holder is None or holder[0] == client or now - holder[1] > expiry:
                if holder is not None and holder[0] != client:
                    log.info("%s: lock of %s for %s expired; %s takes it from %s", self.name,
                             mq, group, client, holder[0])
                self.locks[(group, mq)] = (client, now)
                granted.append(mq)
        payload = json.dumps({"lockOKMQSet": [{"brokerName": b, "queueId": q, "topic": t}
                                              for t, b, q in sorted(granted)]},
                             separators=(",", ":")).encode()
        return self._reply(cmd, ResponseCode.SUCCESS, None, body=payload)

    def _unlock_batch(self, conn, cmd):
        """UNLOCK_BATCH_MQ: drop this client's locks; another client's lock stays."""
        try:
            group, client, queues = self._lock_request(cmd)
        except ValueError as exc:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None, str(exc))
        for mq in queues:
            if self.locks.get((group, mq), (None,))[0] == client:
                del self.locks[(group, mq)]
        return self._reply(cmd, ResponseCode.SUCCESS)

    @staticmethod
    def _lock_request(cmd):
        """(group, client id, [(topic, broker name, queue id)]) of a (un)lock request body."""
        try:
            body = json.loads(cmd.body or b"{}")
            queues = [(str(q["topic"]), str(q["brokerName"]), int(q["queueId"]))
                      for q in body.get("mqSet") or []]
            return str(body.get("consumerGroup") or ""), str(body.get("clientId") or ""), queues
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"com.alibaba.fastjson.JSONException: {exc}") from None

    def lock_holders(self, group: str) -> Dict[tuple, str]:
        """(topic, broker name, queue id) -> client id of the unexpired locks of ``group``."""
        now = time.monotonic()
        expiry = self.options.rebalance_lock_max_live_seconds
        return {mq: holder[0] for (g, mq), holder in self.locks.items()
                if g == group and now - holder[1] <= expiry}

