"""Transactions through the embedded proxy's remoting port, as a genuine Apache RocketMQ 5.1.4
proxy handles them (seen on the wire: captures/rocketmq-5.1.4-proxy-remoting, observations 6
and 7; the classes are TransactionActivity, AbstractTransactionService,
ClusterTransactionService and ProxyClientRemotingProcessor).

* A prepared send over remoting is NOT kept (only the gRPC path records sends). The proxy's
  table of transactions, by (producer group, transaction id), is filled only when it passes a
  broker's check-back on, so every first-phase END_TRANSACTION (COMMIT, ROLLBACK or UNKNOWN)
  is answered SUCCESS and dropped; the half message is settled by the client's answer to the
  broker's check, about one ``transactionCheckInterval`` later. An entry older than
  ``transactionDataExpireMillis`` (30 s) is gone: an answer after that reaches no broker.
* A group that sent a transactional message is announced to every broker of its cluster as a
  producer (HEART_BEAT, client id ``rmq-proxy-producer-client``) every
  ``transactionHeartbeatPeriodSecond`` (20 s), so the brokers send their check-backs to the
  proxy. The proxy passes a check-back on to one connection of a client that heartbeated as a
  producer of the group, as a request (flag 0, the proxy's opaque, nobody answers it) with
  only ``commitLogOffset``, ``msgId``, ``tranStateTableOffset`` and ``transactionId`` and the
  broker's body unchanged.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable, Dict, Optional, Tuple

from ..client.protocol.codes import FLAG_ONEWAY, RequestCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import decode_message
from ..client.protocol.properties import decode_properties

log = logging.getLogger(__name__)

TX_HEARTBEAT_CLIENT_ID = "rmq-proxy-producer-client"
# the fields of a check-back the proxy passes on to its client
RELAYED_CHECK_FIELDS = ("commitLogOffset", "msgId", "tranStateTableOffset", "transactionId")
# how long a group with no producer connection is still announced (not read from the source)
GROUP_OFFLINE_TIMEOUT = 60.0

Kept = Tuple[str, int, int, float]  # broker name, queue offset, commit log offset, kept at


class ProxyTransactions:
    """What the proxy keeps of transactions, and its producer heartbeats to the brokers."""

    def __init__(self, links, namesrv, clients, *, heartbeat_period: float = 20.0,
                 data_expire: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.links = links
        self.namesrv = namesrv
        self.clients = clients  # the proxy's ClientRegistry
        self.heartbeat_period = heartbeat_period
        self.data_expire = data_expire
        self._clock = clock
        self.kept: Dict[Tuple[str, str], Kept] = {}
        self.groups: Dict[str, float] = {}  # producer group -> last transactional send
        self.relayed = 0  # check-backs passed on to a client (for tests)

    # ---------------------------------------------------------------- sends and ends

    def note_send(self, cmd: RemotingCommand) -> None:
        """A send passes through: a transactional message's group is announced to the brokers
        from now on (addTransactionSubscription). Nothing of the send itself is kept."""
        f = cmd.fields
        v1 = cmd.code == RequestCode.SEND_MESSAGE
        properties = decode_properties(f.get("properties" if v1 else "i", ""))
        if properties.get("TRAN_MSG") == "true":
            self.groups[f.get("producerGroup" if v1 else "a", "")] = self._clock()

    def take(self, group: str, transaction_id: str) -> Optional[Kept]:
        """The kept data of a transaction (pollNoExpireTransactionData), or None."""
        kept = self.kept.pop((group, transaction_id), None)
        if kept is None or self._clock() - kept[3] > self.data_expire:
            return None
        return kept

    # ---------------------------------------------------------------- check-backs

    def check_back(self, link, cmd: RemotingCommand) -> None:
        """A broker's CHECK_TRANSACTION_STATE on the proxy's connection: pass it to a
        producer connection of the half message's group, keeping what its answer needs."""
        try:
            message, _ = decode_message(cmd.body, 0, len(cmd.body), verify_crc=False)
        except Exception:  # MessageDecoder.decode gives null: nothing is passed on
            return
        group = message.properties.get("PGROUP")
        if not group:
            return
        f = cmd.fields
        table = self.clients.producers.get(group) or {}
        conn = next((c for c in table if not c.closed), None)
        if conn is None:
            log.warning("proxy: check-back for group %s but no producer is connected", group)
            return
        broker = self._broker_name(link.address)
        try:
            if broker is not None:  # kept as the check is passed on, for the answer
                self.kept[(group, f["transactionId"])] = (
                    broker, int(f["tranStateTableOffset"]), int(f["commitLogOffset"]),
                    self._clock())
        except (KeyError, ValueError):
            return
        self.relayed += 1
        conn.send(RemotingCommand(
            code=RequestCode.CHECK_TRANSACTION_STATE,
            ext_fields={k: f[k] for k in RELAYED_CHECK_FIELDS if k in f}, body=cmd.body,
            opaque=next(conn.server._opaque), language="JAVA", version=conn.server.version))

    def _broker_name(self, address: str) -> Optional[str]:
        for data in self.namesrv.cluster_info().broker_addr_table.values():
            if address in data.broker_addrs.values():
                return data.broker_name
        return None

    # ---------------------------------------------------------------- producer heartbeats

    async def heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_period)
            try:
                await self.heartbeat_once()
            except Exception:  # pragma: no cover - the next round tries again
                log.exception("proxy: transaction heartbeat failed")

    async def heartbeat_once(self) -> None:
        """scanProducerHeartBeat: announce the transactional groups to every broker."""
        now = self._clock()
        for group, added in list(self.groups.items()):
            if not self.clients.producers.get(group) and now - added > GROUP_OFFLINE_TIMEOUT:
                del self.groups[group]
        if not self.groups:
            return
        body = json.dumps({"clientID": TX_HEARTBEAT_CLIENT_ID, "consumerDataSet": [],
                           "producerDataSet": [{"groupName": g} for g in sorted(self.groups)]},
                          separators=(",", ":")).encode()
        for data in self.namesrv.cluster_info().broker_addr_table.values():
            address = data.master_addr
            if address is None:
                continue
            try:
                link = await self.links.link(address)
            except ConnectionError as exc:
                log.warning("proxy: transaction heartbeat to %s failed: %s", address, exc)
                continue
            link.oneway(RemotingCommand(code=RequestCode.HEART_BEAT, body=body, flag=FLAG_ONEWAY,
                                        language="JAVA"))
