"""The option rules of ``sendBack``: which options it needs, and which make no sense with it.

``sendBack=<group>`` turns the sink into what a Java push consumer does with a message it
could not process (``sendMessageBack``): the rows are messages as our source read them, and
each goes back to the group's retry topic; nothing is written to a topic of the user's."""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..client.namespace import retry_topic, wrap, wrapped_name_problem
from ..options import OptionError


def check_send_back_options(given: Mapping[str, str], kw: Dict[str, Any]) -> None:
    """Raise :class:`OptionError` for ``sendBack`` combined with an option it cannot honour,
    or ``maxReconsumeTimes`` without it (``given``: the raw options by lower-case name;
    ``kw``: the parsed fields)."""
    group = kw.get("send_back")
    if group is None:
        if "maxreconsumetimes" in given:
            raise OptionError("option maxReconsumeTimes works with sendBack only (it is how "
                              "often a message sent back is delivered again before it goes to "
                              "the group's dead-letter topic)")
        return
    if kw.get("topic"):
        raise OptionError("option topic has no meaning with sendBack: each row goes back to "
                          "the retry topic of the sendBack group (%RETRY%<group>), and the "
                          "row's own topic column names where it was read. Drop the option")
    if kw.get("delivery_guarantee") == "exactlyOnce":
        raise OptionError("option deliveryGuarantee=exactlyOnce cannot be used with sendBack: "
                          "RocketMQ stores a message sent back (CONSUMER_SEND_MSG_BACK) at "
                          "once, outside any transaction, so a task Spark runs again sends "
                          "its rows back again (at least once)")
    if kw["connection"].endpoints:
        raise OptionError("option sendBack works over RocketMQ's remoting protocol "
                          "(nameServer) only: a 5.x proxy's gRPC API has no "
                          "CONSUMER_SEND_MSG_BACK. Use nameServer")
    namespace = kw["connection"].namespace
    for name, kind in ((wrap(namespace, group), "group"),
                       (retry_topic(namespace, group), "topic")):
        problem = wrapped_name_problem(name, kind)
        if problem:
            raise OptionError(f"option sendBack: in namespace {namespace!r}, {problem}")
