"""The options of ``format("rocketmq")``, declared once: each :class:`Option` says its name, how
its text becomes a value (and the bounds it must keep), its default and one line of doc.

The source (:mod:`.source.options`), the sink (:mod:`.sink.options`) and the lag listener
(:mod:`.source.lag`) build their tables from these parts and parse into frozen dataclasses;
the README's option tables are held to them by ``tests/test_option_tables.py``. Every error
names the option at fault.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from .client.acl import Credentials
from .client.config import parse_name_servers
from .client.namespace import namespace_problem
from .client.settings import ConnectionSettings


class OptionError(ValueError):
    """A missing, unknown or malformed option; the message names it."""


Parser = Callable[[str, str], Any]  # (option name, its text) -> value; raises OptionError

# Topic and group names as RocketMQ's clients check them (Validators.java).
NAME_CHARS = "%|a-zA-Z0-9_-"
TOPIC_NAME = re.compile(rf"^[{NAME_CHARS}]{{1,127}}$")
GROUP_NAME = re.compile(rf"^[{NAME_CHARS}]{{1,255}}$")


@dataclass(frozen=True)
class Option:
    """One option. ``field``: the attribute of the parsed options it fills (None: a rule of
    the source or sink reads it, or it is a connection option, whose ``setting`` names the
    :class:`ConnectionSettings` attribute it fills). ``shown_default``: the README's default
    column, where the value alone does not say it ("required", "unlimited")."""

    name: str
    field: Optional[str]
    parse: Parser
    default: Any
    doc: str
    shown_default: Optional[str] = None
    setting: Optional[str] = None  # the ConnectionSettings attribute a connection option fills

    @property
    def default_text(self) -> str:
        """The default as the README's tables show it."""
        if self.shown_default is not None:
            return self.shown_default
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if self.default is None or self.default == ():
            return ""
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default))
        return str(self.default)


class OptionTable:
    """The options one reader or writer accepts. Names are case-insensitive, as Spark's are;
    ``passed_through`` names options Spark adds that are known but not parsed here."""

    def __init__(self, what: str, options: Iterable[Option],
                 passed_through: Sequence[str] = ()):
        self.what = what
        self.options: Tuple[Option, ...] = tuple(options)
        self._by_lower = {o.name.lower(): o for o in self.options}
        self._known = {**{o.name.lower(): o.name for o in self.options},
                       **{n.lower(): n for n in passed_through}}

    def __getitem__(self, name: str) -> Option:
        return self._by_lower[name.lower()]

    def given(self, raw: Mapping[str, str], hint: str = "") -> Dict[str, str]:
        """The options of ``raw`` by lower-case name; raises naming every unknown one."""
        unknown = [str(name) for name in raw if str(name).lower() not in self._known]
        if unknown:
            raise OptionError(f"unknown option(s) for {self.what}: {', '.join(unknown)}. "
                              f"{hint}Known options: "
                              f"{', '.join(sorted(set(self._known.values())))}")
        return {str(k).lower(): str(v) for k, v in raw.items()}

    def parse(self, given: Mapping[str, str]) -> Dict[str, Any]:
        """Every option of ``given`` (from :meth:`given`) parsed alone, by name."""
        return {o.name: o.parse(o.name, given[o.name.lower()]) for o in self.options
                if o.name.lower() in given}

    def fields(self, values: Mapping[str, Any]) -> Dict[str, Any]:
        """The options dataclass's keyword arguments: each field's default, then the values
        given (an option without a field is left to the caller's rules)."""
        out = {o.field: o.default for o in self.options if o.field and o.default is not None}
        out.update((self[name].field, value) for name, value in values.items()
                   if self[name].field)
        return out


# ---------------------------------------------------------------------------------- parsers


def boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(f"option {name} must be true or false, got {text!r}")


def parse_int(name: str, text: str, minimum: int = 1, maximum: Optional[int] = None) -> int:
    try:
        number = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name} must be a whole number, got {text!r}") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise OptionError(f"option {name} must be {bound}, got {number}")
    return number


def integer(minimum: int = 1, maximum: Optional[int] = None) -> Parser:
    """A whole number within ``minimum``..``maximum``."""
    return lambda name, text: parse_int(name, text, minimum, maximum)


def choice(*values: str) -> Parser:
    """One of ``values``, in any case; gives its spelling here."""
    by_lower = {v.lower(): v for v in values}

    def parse(name: str, text: str) -> str:
        found = by_lower.get(text.strip().lower())
        if found is None:
            raise OptionError(f"option {name} must be one of {', '.join(values)}, "
                              f"got {text!r}")
        return found
    return parse


def text(name: str, value: str) -> str:
    return value


def optional_text(name: str, value: str) -> Optional[str]:
    return value or None


def comma_list(name: str, value: str) -> Tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def check_topic(name: str, topic: str) -> str:
    if not TOPIC_NAME.match(topic):
        raise OptionError(f"option {name}: {topic!r} is not a valid topic name (letters, "
                          "digits, %, |, _ and -, at most 127)")
    return topic


def topic_name(name: str, value: str) -> str:
    return check_topic(name, value.strip())


def group_name(name: str, value: str) -> str:
    group = value.strip()
    if not GROUP_NAME.match(group):
        raise OptionError(f"option {name} {group!r} is not a valid group name (letters, "
                          "digits, %, |, _ and -, at most 255)")
    return group


def namespace_option(name: str, value: str) -> str:
    """The option ``namespace``: "" for none, else a name RocketMQ can put topics into."""
    namespace = value.strip()
    problem = namespace_problem(namespace)
    if problem:
        raise OptionError(f"option {name} {namespace!r} {problem}")
    return namespace


def name_server_list(name: str, value: str) -> Tuple[str, ...]:
    try:
        return tuple(parse_name_servers(value))
    except ValueError as exc:
        raise OptionError(f"option {name}: {exc}") from None


def endpoint_list(name: str, value: str) -> str:
    endpoints = value.strip()
    for item in endpoints.replace(",", ";").split(";"):
        host, sep, port = item.strip().rpartition(":")
        if item.strip() and (not sep or not host or not port.isdigit()):
            raise OptionError(f"option {name}: {item.strip()!r} is not host:port")
    return endpoints


# ------------------------------------------------------------------------- the connection
# Declared once for the source, the sink and the lag listener; parsed into one
# ConnectionSettings by connection_settings (accessKey and secretKey: parse_credentials).

NAME_SERVER = Option("nameServer", None, name_server_list, (),
                     "name server(s), host:port;host:port, tried in turn",
                     shown_default="required", setting="name_servers")
ACCESS_KEY = Option("accessKey", None, text, None, "ACL access key (with secretKey)")
SECRET_KEY = Option("secretKey", None, text, None, "ACL secret key; never logged or shown")
TLS = Option("tls", None, boolean, False, "TLS to name servers and brokers", setting="tls")
TLS_CA_FILE = Option("tlsCaFile", None, optional_text, None,
                     "CA certificates (PEM) to trust", shown_default="system CAs",
                     setting="tls_ca_file")
TLS_VERIFY = Option("tlsVerify", None, boolean, True,
                    "false trusts any certificate, like RocketMQ's test mode",
                    setting="tls_verify")
NAMESPACE = Option("namespace", None, namespace_option, "",
                   "the namespace of topics and groups (namespace%name on the wire)",
                   setting="namespace")
CONNECTION = (NAME_SERVER, ACCESS_KEY, SECRET_KEY, TLS, TLS_CA_FILE, TLS_VERIFY, NAMESPACE)
# The sink's alternative to nameServer (the source reads through name servers only).
ENDPOINTS = Option("endpoints", None, endpoint_list, None,
                   "a 5.x proxy's gRPC endpoint instead of nameServer", setting="endpoints")
CONNECTION_TABLE = OptionTable("a rocketmq connection", CONNECTION)


class ConnectionFields:
    """The connection settings' fields read through parsed options (``options.tls``...);
    the options dataclass holds them once, as its ``connection``."""

    connection: ConnectionSettings

    @property
    def name_servers(self) -> Tuple[str, ...]:
        return self.connection.name_servers

    @property
    def endpoints(self) -> Optional[str]:
        return self.connection.endpoints

    @property
    def credentials(self) -> Optional[Credentials]:
        return self.connection.credentials

    @property
    def tls(self) -> bool:
        return self.connection.tls

    @property
    def tls_ca_file(self) -> Optional[str]:
        return self.connection.tls_ca_file

    @property
    def tls_verify(self) -> bool:
        return self.connection.tls_verify

    @property
    def namespace(self) -> str:
        return self.connection.namespace


def require_name_server(given: Mapping[str, str], what: str = "") -> None:
    if not given.get("nameserver", "").strip():
        raise OptionError(f"option nameServer is required, e.g. \"host:9876;host2:9876\"{what}")


def parse_credentials(given: Mapping[str, str]) -> Optional[Credentials]:
    """``accessKey`` and ``secretKey`` (``given``: lower-case names), both or neither."""
    has_ak, has_sk = "accesskey" in given, "secretkey" in given
    if has_ak != has_sk:
        raise OptionError("options accessKey and secretKey go together; only "
                          + ("accessKey" if has_ak else "secretKey") + " was set")
    if not has_ak:
        return None
    if not given["accesskey"] or not given["secretkey"]:
        raise OptionError("options accessKey and secretKey must not be empty")
    return Credentials(given["accesskey"], given["secretkey"])


def connection_settings(values: Mapping[str, Any], given: Mapping[str, str], timeout: float,
                        tls_default: bool = False) -> ConnectionSettings:
    """The connection options among ``values`` (parsed, by option name) and ``given`` (the
    raw ones, by lower-case name: the credentials) as settings; ``timeout`` in seconds."""
    kw = {o.setting: values[o.name] for o in CONNECTION + (ENDPOINTS,)
          if o.setting and o.name in values}
    kw.setdefault("tls", tls_default)
    return ConnectionSettings(credentials=parse_credentials(given), timeout=timeout, **kw)


def parse_connection_settings(raw: Mapping[str, str], what: str = "") -> ConnectionSettings:
    """The connection options of ``raw`` (any others are left alone) as settings."""
    names = {o.name.lower() for o in CONNECTION}
    given = {k: v for k, v in ((str(k).lower(), str(v)) for k, v in raw.items()) if k in names}
    require_name_server(given, what)
    return connection_settings(CONNECTION_TABLE.parse(given), given,
                               ConnectionSettings.timeout)
