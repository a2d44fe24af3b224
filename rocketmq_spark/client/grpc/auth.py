"""Request metadata for the 5.x proxy, and its ACL signature (both sides of it).

Every call carries who the client is (``x-mq-client-id``, language, protocol, namespace) and,
with credentials, an ``authorization`` header::

    MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is the hex HMAC-SHA1 of the ``x-mq-date-time`` value (``yyyyMMddTHHmmssZ``)
under the secret key; a security token travels as ``x-mq-session-token``. The secret never
leaves :class:`~rocketmq_spark.client.acl.Credentials`; the access key goes on the wire only.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
import socket
import time
import uuid
from typing import Callable, List, Mapping, Optional, Tuple

from ..acl import Credentials

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
SESSION_TOKEN = "x-mq-session-token"
CLIENT_ID = "x-mq-client-id"
REQUEST_ID = "x-mq-request-id"
LANGUAGE = "x-mq-language"
CLIENT_VERSION = "x-mq-client-version"
PROTOCOL = "x-mq-protocol"
NAMESPACE = "x-mq-namespace"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"

_client_index = itertools.count()


def new_client_id() -> str:
    """``host@pid@index@time``: unique per client object, readable in the proxy's logs."""
    return (f"{socket.gethostname()}@{os.getpid()}@{next(_client_index)}@"
            f"{_base36(time.time_ns())}")


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def date_time(now: Optional[float] = None) -> str:
    return time.strftime(DATE_TIME_FORMAT, time.gmtime(time.time() if now is None else now))


def hex_signature(credentials: Credentials, content: str) -> str:
    """Hex HMAC-SHA1 of ``content`` under the credentials' secret."""
    return base64.b64decode(credentials.signature(content.encode("utf-8"))).hex()


def _signed(client_id: str, namespace: str, version: str, credentials: Optional[Credentials],
            stamp: str) -> List[Tuple[str, str]]:
    """Every header but the request id, for the date-time ``stamp``."""
    md = [(LANGUAGE, "PYTHON"), (PROTOCOL, "v2"), (CLIENT_VERSION, version),
          (DATE_TIME, stamp), (CLIENT_ID, client_id), (NAMESPACE, namespace)]
    if credentials is not None:
        if credentials.security_token:
            md.append((SESSION_TOKEN, credentials.security_token))
        md.append((AUTHORIZATION, f"{ALGORITHM} Credential={credentials.access_key}, "
                                  f"SignedHeaders={DATE_TIME}, "
                                  f"Signature={hex_signature(credentials, stamp)}"))
    return md


def request_metadata(client_id: str, namespace: str, version: str,
                     credentials: Optional[Credentials] = None,
                     now: Optional[float] = None) -> List[Tuple[str, str]]:
    """The metadata of one call (a fresh date-time and request id each time)."""
    md = _signed(client_id, namespace, version, credentials, date_time(now))
    md.insert(4, (REQUEST_ID, str(uuid.uuid4())))
    return md


class CallMetadata:
    """Per-call metadata at the cost of a counter: what :func:`request_metadata` gives, with
    the signed headers made once per second.

    ``x-mq-date-time`` has one-second resolution and the signature covers only it, so every
    call within a second carries the same date-time and signature whether it is computed per
    call or once; only the request id changes per call (a per-client prefix and a counter).
    Not thread-safe: one event loop calls it."""

    def __init__(self, client_id: str, namespace: str, version: str,
                 credentials: Optional[Credentials] = None,
                 clock: Callable[[], float] = time.time):
        self._args = (client_id, namespace, version, credentials)
        self._clock = clock
        self._second = -1
        self._signed: Tuple[Tuple[str, str], ...] = ()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:16] + "-"

    def __call__(self) -> Tuple[Tuple[str, str], ...]:
        now = self._clock()
        second = int(now)
        if second != self._second:
            self._signed = tuple(_signed(*self._args, date_time(second)))
            self._second = second
        return self._signed + ((REQUEST_ID, f"{self._prefix}{next(self._ids)}"),)


# ----------------------------------------------------------------------------- the server side


class AuthFailure(Exception):
    """Why a call's credentials were refused; the text never holds a secret or the access key."""


def parse_authorization(value: str) -> Tuple[str, str]:
    """(access key, hex signature) from an ``authorization`` header, as the proxy reads it."""
    scheme, _, rest = (value or "").partition(" ")
    if scheme != ALGORITHM or not rest:
        raise AuthFailure(f"the authorization header is not {ALGORITHM}")
    access_key = signature = ""
    for item in rest.split(","):
        name, sep, val = item.strip().partition("=")
        if not sep:
            raise AuthFailure("the authorization header has an item without '='")
        if name == "Credential":
            access_key = val.split("/")[0]
        elif name == "Signature":
            signature = val
    if not access_key or not signature:
        raise AuthFailure("the authorization header lacks Credential or Signature")
    return access_key, signature


def verify_metadata(metadata: Mapping[str, str], secrets: Mapping[str, str]) -> str:
    """Check a call's signature against ``secrets`` (access key -> secret key); returns the
    access key, or raises :class:`AuthFailure`."""
    authorization = metadata.get(AUTHORIZATION)
    if not authorization:
        raise AuthFailure("the call carries no authorization header")
    stamp = metadata.get(DATE_TIME)
    if not stamp:
        raise AuthFailure(f"the call carries no {DATE_TIME} header")
    access_key, signature = parse_authorization(authorization)
    secret = secrets.get(access_key)
    if secret is None:
        raise AuthFailure("unknown access key")
    expected = hmac.new(secret.encode("utf-8"), stamp.encode("utf-8"), hashlib.sha1).hexdigest()
    if not hmac.compare_digest(signature.lower().encode("ascii", "replace"), expected.encode()):
        raise AuthFailure("the signature does not match")
    return access_key
