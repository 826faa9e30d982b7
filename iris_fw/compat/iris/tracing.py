"""Iris's ``iris.tracing``: ``Tracing``, ``TraceEvent``, ``EVENT_NAMES`` and ``DeviceTracing`` (see
:mod:`iris_fw.compat.iris.host.tracing`; the device side is
:class:`iris_fw.compat.iris.tiles.DeviceTracing`)."""

from .host.tracing import EVENT_IDS, EVENT_NAMES, TraceEvent, Tracing  # noqa: F401
from .tiles import DeviceTracing  # noqa: F401

__all__ = ["DeviceTracing", "EVENT_IDS", "EVENT_NAMES", "TraceEvent", "Tracing"]
