"""Option parsing shared by the source and the sink: one error class, and the checks both use
(booleans, bounded integers, unknown names, credentials, TLS). Every error names the option."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from .client.acl import Credentials


class OptionError(ValueError):
    """A missing, unknown or malformed option; the message names it."""


def lower_keys(raw: Mapping[str, str]) -> Dict[str, str]:
    """Options by lower-case name (Spark's options are case-insensitive)."""
    return {str(k).lower(): str(v) for k, v in raw.items()}


def reject_unknown(raw: Mapping[str, str], known: Mapping[str, str], what: str,
                   hint: str = "") -> None:
    """Raise naming every option of ``raw`` that ``known`` (lower-case name -> spelling)
    does not list."""
    unknown = [name for name in raw if str(name).lower() not in known]
    if unknown:
        raise OptionError(f"unknown option(s) for {what}: {', '.join(map(str, unknown))}. "
                          f"{hint}Known options: {', '.join(sorted(set(known.values())))}")


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(f"option {name} must be true or false, got {value!r}")


def parse_int(name: str, value: str, minimum: int = 1, maximum: Optional[int] = None) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(f"option {name} must be a whole number, got {value!r}") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise OptionError(f"option {name} must be {bound}, got {number}")
    return number


def parse_credentials(opts: Mapping[str, str]) -> Optional[Credentials]:
    """``accessKey`` and ``secretKey`` (lower-cased ``opts``), both or neither."""
    has_ak, has_sk = "accesskey" in opts, "secretkey" in opts
    if has_ak != has_sk:
        raise OptionError("options accessKey and secretKey go together; only "
                          + ("accessKey" if has_ak else "secretKey") + " was set")
    if not has_ak:
        return None
    if not opts["accesskey"] or not opts["secretkey"]:
        raise OptionError("options accessKey and secretKey must not be empty")
    return Credentials(opts["accesskey"], opts["secretkey"])


def parse_tls(opts: Mapping[str, str], default: bool = False
              ) -> Tuple[bool, Optional[str], bool]:
    """(tls, tlsCaFile, tlsVerify) from lower-cased ``opts``."""
    tls = parse_bool("tls", opts["tls"]) if "tls" in opts else default
    verify = parse_bool("tlsVerify", opts["tlsverify"]) if "tlsverify" in opts else True
    ca_file = opts.get("tlscafile") or None
    return tls, ca_file, verify
