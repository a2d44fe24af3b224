"""The embedded broker's optional C fast paths (``native/embedded/``), imported once.

``rocketmq_spark.embedded._native`` answers plain pulls (``serve_pulls``) and the frames of an
exactly-once write (``serve_tx``) as the broker's Python does, through the store's fast-path
interface (:mod:`.store`, :mod:`.queue`). It serves the test broker only; the connector never
loads it. ``ROCKETMQ_SPARK_PURE_PYTHON`` switches it off with the client's C
(:mod:`rocketmq_spark.client.accelerator` reads the variable).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..client.accelerator import FORCE_PURE_PYTHON

try:
    from . import _native as _built
except ImportError:  # pragma: no cover - depends on the build
    _built = None


def native_function(name: str) -> Optional[Callable]:
    """The C module's ``name``, or ``None`` when it lacks it, is not built or is switched off."""
    return None if FORCE_PURE_PYTHON else getattr(_built, name, None)
