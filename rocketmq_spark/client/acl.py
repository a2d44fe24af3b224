"""ACL request signing (RocketMQ ACL 1.0, also accepted by ACL 2.0 brokers).

The signature is ``base64(HMAC-SHA1(secretKey, values of all ext fields sorted by key + body))``
and travels as the ext field ``Signature`` next to ``AccessKey``. Both keys stay inside
:class:`Credentials`: no repr, str or error message shows either (the access key goes on the
wire, but never into logs, errors or plans). Pickling keeps them (executors need them to sign),
so a pickled reader is as sensitive as the options it came from.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Dict, Mapping, Optional

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# Fields a 4.9 broker leaves out of the signed content besides Signature itself.
UNSIGNED_FIELDS = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


class Credentials:
    """An access key and its secret. Safe to log: ``repr`` shows neither."""

    __slots__ = ("access_key", "_secret", "security_token")

    def __init__(self, access_key: str, secret_key: str, security_token: Optional[str] = None):
        if not access_key or not secret_key:
            raise ValueError("both an access key and a secret key are required")
        self.access_key = access_key
        self._secret = _secret_bytes(secret_key)
        self.security_token = security_token

    def __repr__(self) -> str:
        return "Credentials(access_key=<hidden>, secret_key=<hidden>)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return (isinstance(other, Credentials) and other.access_key == self.access_key
                and hmac.compare_digest(other._secret, self._secret))

    def __hash__(self) -> int:
        return hash(self.access_key)

    def __reduce__(self):
        # Executors need the secret to sign; pickling keeps it out of any text form.
        return (_restore, (self.access_key, self._secret, self.security_token))

    def signature(self, content: bytes) -> str:
        return base64.b64encode(hmac.new(self._secret, content, hashlib.sha1).digest()).decode()

    def sign(self, ext_fields: Dict[str, str], body: bytes = b"") -> Dict[str, str]:
        """Add AccessKey (and SecurityToken) to ``ext_fields`` and sign them; returns them."""
        ext_fields[ACCESS_KEY] = self.access_key
        if self.security_token:
            ext_fields[SECURITY_TOKEN] = self.security_token
        ext_fields.pop(SIGNATURE, None)
        ext_fields[SIGNATURE] = self.signature(signed_content(ext_fields, body))
        return ext_fields


def _restore(access_key: str, secret: bytes, token: Optional[str]) -> Credentials:
    return Credentials(access_key, secret.decode("utf-8"), token)


def _secret_bytes(secret_key: str) -> bytes:
    try:
        return secret_key.encode("utf-8")
    except UnicodeEncodeError:  # its repr would carry the whole secret
        raise ValueError("the secret key is not valid Unicode text") from None


def _java_key_order(key: str) -> bytes:
    """Java's TreeMap order compares UTF-16 code units, not code points."""
    return key.encode("utf-16-be", "surrogatepass")


def signed_content(ext_fields: Mapping[str, str], body: bytes = b"") -> bytes:
    """What the signature covers: values of every field but the unsigned ones, by sorted key."""
    values = "".join(ext_fields[k] for k in sorted(ext_fields, key=_java_key_order)
                     if k not in UNSIGNED_FIELDS)
    return values.encode("utf-8") + (body or b"")


def verify(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """Server side: does the request's Signature match the one ``secret_key`` gives?"""
    given = ext_fields.get(SIGNATURE, "")
    expected = base64.b64encode(hmac.new(_secret_bytes(secret_key),
                                         signed_content(ext_fields, body),
                                         hashlib.sha1).digest())
    # Compare bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
    return hmac.compare_digest(str(given).encode("utf-8", "surrogatepass"), expected)
