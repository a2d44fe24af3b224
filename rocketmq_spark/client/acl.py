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
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .secret_repr import described

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# Fields a 4.9 broker leaves out of the signed content besides Signature itself.
UNSIGNED_FIELDS = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


class Credentials:
    """An access key and its secret (and maybe a security token). Safe to log: ``repr``
    shows none of them (:mod:`.secret_repr`)."""

    __slots__ = ("access_key", "_secret", "security_token")

    def __init__(self, access_key: str, secret_key: str, security_token: Optional[str] = None):
        if not access_key or not secret_key:
            raise ValueError("both an access key and a secret key are required")
        self.access_key = access_key
        self._secret = _secret_bytes(secret_key)
        self.security_token = security_token

    def __repr__(self) -> str:
        return described("Credentials", (("access_key", self.access_key, True),
                                         ("secret_key", self._secret, True),
                                         ("security_token", self.security_token, True)))

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

    def identify(self, ext_fields: Dict[str, str]) -> Dict[str, str]:
        """Add AccessKey (and SecurityToken) to ``ext_fields``, drop any Signature: the
        fields a signature covers, before it is computed. Returns them."""
        ext_fields[ACCESS_KEY] = self.access_key
        if self.security_token:
            ext_fields[SECURITY_TOKEN] = self.security_token
        ext_fields.pop(SIGNATURE, None)
        return ext_fields

    def template_signer(self, ext_fields: Mapping[str, str], first: str, second: str
                        ) -> Tuple[bytes, bytes, bytes, bytes, bool]:
        """What the native pull loop needs to sign requests built from ``ext_fields`` (already
        :meth:`identify`-ed) plus two fields it fills in per request, ``first`` and
        ``second``: ``(secret, head, mid, tail, second_first)``, the signed content being
        ``head + value + mid + value + tail`` with the values in sorted-key order
        (``second_first`` when ``second`` sorts before ``first``).

        The tuple carries the secret: it goes straight to the C signer, which keeps only the
        HMAC's padded-key states; never log or keep it."""
        parts, order = signed_parts(ext_fields, (first, second))
        head, mid, tail = parts
        return self._secret, head, mid, tail, order[0] == second


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


def signed_parts(ext_fields: Mapping[str, str], patched: Sequence[str]
                 ) -> Tuple[List[bytes], List[str]]:
    """The signed content of ``ext_fields`` plus the fields ``patched`` (whose values change
    per request), cut around those values: ``(parts, order)`` such that the content with
    values ``v[k]`` is ``parts[0] + v[order[0]] + parts[1] + ... + parts[-1]``. Lets a
    request template be signed per request without sorting its fields again."""
    keys = sorted({k for k in ext_fields if k not in UNSIGNED_FIELDS} | set(patched),
                  key=_java_key_order)
    parts: List[bytes] = []
    order: List[str] = []
    values: List[str] = []
    for key in keys:
        if key in patched:
            parts.append("".join(values).encode("utf-8"))
            order.append(key)
            values = []
        else:
            values.append(ext_fields[key])
    parts.append("".join(values).encode("utf-8"))
    return parts, order


def verify(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """Server side: does the request's Signature match the one ``secret_key`` gives?"""
    given = ext_fields.get(SIGNATURE, "")
    expected = base64.b64encode(hmac.new(_secret_bytes(secret_key),
                                         signed_content(ext_fields, body),
                                         hashlib.sha1).digest())
    # Compare bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
    return hmac.compare_digest(str(given).encode("utf-8", "surrogatepass"), expected)
