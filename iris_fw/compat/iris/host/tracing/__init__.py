"""Iris's ``iris.host.tracing``: :class:`Tracing` (``shmem.tracing``), :class:`TraceEvent` and
``EVENT_NAMES``, mapped onto iris-fw's tracing (:mod:`iris_fw.trace_session`, :mod:`iris_fw.trace`)."""

from .core import Tracing
from .events import EVENT_IDS, EVENT_NAMES, TraceEvent

__all__ = ["EVENT_IDS", "EVENT_NAMES", "TraceEvent", "Tracing"]
