"""The topic's message type, checked on the driver before anything is sent.

5.x topics carry a message type (``+message.type``), and a 5.x proxy refuses every send whose
type differs (MESSAGE_ILLEGAL "TopicMessageType validate failed, the expected type is ...").
Where the brokers publish the type (GET_TOPIC_CONFIG, :mod:`..client.topic_types`), the sink
checks it first, so the write fails at once with what to change rather than with a broker's
remark from deep inside a task: exactly once sends transactional messages (TRANSACTION), a
``delayLevel`` column delayed ones (DELAY), a ``shardingKey`` column FIFO ones. MIXED takes all.
Where no type is published (4.x brokers, a topic without the attribute, or a 5.x proxy's
remoting port, which does not serve the request) nothing is checked here.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

from ..client.errors import ResponseError, RocketMQError
from ..client.namespace import wrap
from ..client.nameserver import NameServerClient
from ..client.remoting import RemotingClient
from ..client.topic_types import published_types
from ..options import OptionError
from .options import SinkOptions
from .schema import ColumnPlan

MIXED = "MIXED"
# the 5.x proxy's refusal (DefaultTopicMessageTypeValidator), MESSAGE_ILLEGAL (13)
_REFUSAL = re.compile(r"TopicMessageType validate failed, the expected type is (\w+), but "
                      r"actual type is (\w+)")


def required_type(options: SinkOptions, plan: ColumnPlan) -> Optional[Tuple[str, str]]:
    """(the topic type the write needs, why), or None when any type will do here."""
    if options.exactly_once:
        return "TRANSACTION", "deliveryGuarantee=exactlyOnce sends transactional messages"
    if plan.delay_level:
        return "DELAY", f"column {plan.delay_level} sends delayed messages"
    if plan.sharding_key:
        return "FIFO", f"column {plan.sharding_key} sends FIFO messages (with a sharding key)"
    return None


def check_topic_type(options: SinkOptions, plan: ColumnPlan) -> None:
    """Raise :class:`OptionError` when the brokers publish the ``topic`` option's topic with a
    message type the write's messages do not have. Rows routed by a ``topic`` column to other
    topics are not checked (their topics are known only in the tasks)."""
    if options.send_back or options.transport != "remoting" or not options.topic:
        return
    need = required_type(options, plan)
    if need is None or not options.name_servers:
        return
    wanted, why = need
    topic = wrap(options.namespace, options.topic)
    remoting = RemotingClient(options.connection.client_config())
    try:
        names = NameServerClient(list(options.name_servers), remoting)
        types = published_types(remoting, names, topic)
        cluster = next((b.cluster for b in names.route(topic).broker_datas), "DefaultCluster")
    except RocketMQError:
        return  # no route now: the write itself will say so
    finally:
        remoting.close()
    wrong = sorted((t, b) for b, t in types.items() if t is not None and t not in (wanted, MIXED))
    if not wrong:
        return
    published = ", ".join(f"{t} on {b}" for t, b in wrong)
    raise OptionError(
        f"topic {topic!r} is published as {published}, but {why}: a {wanted} topic is needed "
        f"(a 5.x proxy refuses them with MESSAGE_ILLEGAL \"TopicMessageType validate failed, "
        f"the expected type is {wrong[0][0]}, but actual type is {wanted}\"). Nothing was "
        f"sent. Change the topic's type with: mqadmin updateTopic -n <nameServer> -c {cluster} "
        f"-t {topic} -a +message.type={wanted}   (or write to a {wanted} topic)")


def type_refusal_hint(error: Optional[BaseException], topic: Optional[str]) -> str:
    """What to do about a send a 5.x proxy refused for the topic's message type (where the
    type could not be read before sending: through the proxy's remoting port); "" for any
    other error."""
    found = None
    seen = set()
    while error is not None and id(error) not in seen and found is None:
        seen.add(id(error))  # the send's failure may wrap the proxy's answer
        if isinstance(error, ResponseError) and error.code == 13:
            found = _REFUSAL.search(error.remark)
        elif "MESSAGE_ILLEGAL (13)" in str(error):
            found = _REFUSAL.search(str(error))
        error = error.__cause__ or error.__context__
    if not found:
        return ""
    expected, actual = found.groups()
    name = topic or "<topic>"
    if expected == "UNSPECIFIED":
        return (f" The proxy finds no topic {name}: create it with mqadmin updateTopic -n "
                f"<nameServer> -c <cluster> -t {name} -a +message.type={actual}.")
    return (f" The topic is {expected} and these messages are {actual}: change its type with "
            f"mqadmin updateTopic -n <nameServer> -c <cluster> -t {name} -a "
            f"+message.type={actual}, or write to a {actual} topic.")
