"""``checkpointStorage.<key>`` options: passed through to the store's ``pyarrow.fs`` class.

Keys are the library's own keyword arguments (``endpoint_override``, ``region``,
``access_key``...; case-insensitive, since Spark lower-cases option names), plus a few short
names users know from Hadoop (``endpoint``, ``pathStyleAccess``). ``location`` is ours: where
the record goes instead of under ``checkpointLocation``. Credentials not given here come from
each library's standard chain (AWS environment and profiles, GCP application-default
credentials, Azure's environment). Values of secret keys never appear in a repr or a message.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from .errors import StorageConfigError

PREFIX = "checkpointstorage."
LOCATION_KEY = "location"

_STR, _BOOL, _FLOAT, _INT = "text", "true/false", "a number", "an integer"
# kind -> {option key (lower case): (library keyword, value type)}
KEYS: Dict[str, Dict[str, Tuple[str, str]]] = {
    "s3": {k: (k, t) for k, t in (
        ("access_key", _STR), ("secret_key", _STR), ("session_token", _STR),
        ("region", _STR), ("endpoint_override", _STR), ("scheme", _STR),
        ("force_virtual_addressing", _BOOL), ("anonymous", _BOOL), ("role_arn", _STR),
        ("session_name", _STR), ("external_id", _STR), ("connect_timeout", _FLOAT),
        ("request_timeout", _FLOAT), ("tls_ca_file_path", _STR))},
    "gcs": {k: (k, t) for k, t in (
        ("anonymous", _BOOL), ("access_token", _STR), ("target_service_account", _STR),
        ("endpoint_override", _STR), ("scheme", _STR), ("project_id", _STR),
        ("retry_time_limit", _FLOAT))},
    "azure": {k: (k, t) for k, t in (
        ("account_name", _STR), ("account_key", _STR), ("sas_token", _STR),
        ("client_id", _STR), ("client_secret", _STR), ("tenant_id", _STR),
        ("blob_storage_authority", _STR), ("dfs_storage_authority", _STR),
        ("blob_storage_scheme", _STR), ("dfs_storage_scheme", _STR))},
    "hdfs": {k: (k, t) for k, t in (
        ("user", _STR), ("kerb_ticket", _STR), ("replication", _INT),
        ("buffer_size", _INT), ("default_block_size", _INT))},
    "local": {},
}
# Short names; accessKey and secretKey are the ones Spark's redaction (spark.redaction.regex)
# hides in plans and the UI, so the documentation gives those.
ALIASES = {"endpoint": "endpoint_override", "pathstyleaccess": "path_style_access",
           "accesskey": "access_key", "secretkey": "secret_key", "sessiontoken": "session_token",
           "accountkey": "account_key", "sastoken": "sas_token", "clientsecret": "client_secret",
           "projectid": "project_id", "accountname": "account_name"}
SECRET_KEYS = frozenset({"access_key", "secret_key", "session_token", "access_token",
                         "account_key", "sas_token", "client_secret"})


def is_secret(key: str) -> bool:
    """Whether the value of option ``key`` must be kept out of every message."""
    return ALIASES.get(key.lower(), key.lower()) in SECRET_KEYS


class StorageOptions:
    """The ``checkpointStorage.*`` options of a query, keys lower-cased, without the prefix.
    Its repr shows the keys only."""

    def __init__(self, values: Optional[Mapping[str, str]] = None):
        self.values: Dict[str, str] = {str(k).lower(): str(v) for k, v in (values or {}).items()}

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> "StorageOptions":
        """The ``checkpointStorage.*`` entries of a reader's or writer's options."""
        return cls({str(k)[len(PREFIX):]: v for k, v in raw.items()
                    if str(k).lower().startswith(PREFIX)})

    @property
    def location(self) -> Optional[str]:
        value = self.values.get(LOCATION_KEY, "").strip()
        return value or None

    def secrets(self) -> Tuple[str, ...]:
        """The secret values given (to scrub from a library's message)."""
        return tuple(v for k, v in self.values.items() if is_secret(k) and v)

    def library_kwargs(self, kind: str, scheme: str) -> Dict[str, Any]:
        """The library's keyword arguments for a store of ``kind``; an option that kind does
        not take fails, naming it and the keys it takes."""
        allowed = KEYS[kind]
        out: Dict[str, Any] = {}
        for key, text in self.values.items():
            if key == LOCATION_KEY:
                continue
            key = ALIASES.get(key, key)
            if key == "path_style_access" and kind == "s3":
                out["force_virtual_addressing"] = not _parse(key, text, _BOOL)
                continue
            if key not in allowed:
                short = sorted(a for a, k in ALIASES.items() if k in allowed)
                names = ", ".join(["location"] + sorted(allowed) + short
                                  + (["pathstyleaccess"] if kind == "s3" else []))
                raise StorageConfigError(
                    f"option checkpointStorage.{key} is not known for a {scheme}:// store; "
                    f"it takes checkpointStorage.<key> with a key among: {names}")
            name, kind_of_value = allowed[key]
            out[name] = _parse(key, text, kind_of_value)
        return out

    def __repr__(self) -> str:
        return f"StorageOptions(keys={sorted(self.values)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorageOptions) and other.values == self.values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.values)))


def _parse(key: str, text: str, kind_of_value: str) -> Any:
    value = text.strip()
    shown = "(hidden)" if is_secret(key) else repr(text)
    if kind_of_value == _BOOL:
        if value.lower() not in ("true", "false"):
            raise StorageConfigError(f"option checkpointStorage.{key} must be true or false, "
                                     f"got {shown}")
        return value.lower() == "true"
    if kind_of_value in (_FLOAT, _INT):
        try:
            return float(value) if kind_of_value == _FLOAT else int(value)
        except ValueError:
            raise StorageConfigError(f"option checkpointStorage.{key} must be "
                                     f"{kind_of_value}, got {shown}") from None
    return text
