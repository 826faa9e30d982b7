"""Iris's host-side tracing, ``shmem.tracing`` (:class:`Tracing`), over iris-fw's trace sessions
(:mod:`iris_fw.trace_session`).

``enable(max_events)`` opens an iris-fw trace session on the host object's context (collective,
like every session: every rank enables; the ranks' clocks are aligned) and makes one trace
buffer for Iris's device events: ``ctx.tracing.record_event_start/end`` of kernels that call
``DeviceContext.initialize(…, tracing=True)``. Its handle goes into the device context tensor
(``get_device_context()``'s last element). While the session is open, iris-fw's own collectives
and ops (``shmem.ccl``, ``shmem.ops``) record too, in their own buffers.

Differences from Iris, all from iris-fw's trace format: the buffer has one ring per program
(``rings`` = the device's SM/CU count, ``ceil(max_events / rings)`` records each; a program
beyond the rings or a ring that overflows loses events, which are counted — in
``trace_counter`` and in the exported files — never dropped silently); an event is written when
it ends; times are ns on one clock aligned across ranks (Iris: raw cycles per rank); an event
keeps ``pid_m`` as its item and not ``pid_n``. ``export`` is collective (it closes the session,
gathers and aligns every rank's events, and opens a new one: what it exported is not exported
again), and the files are iris-fw's Chrome-trace / Perfetto JSON.
"""

from __future__ import annotations

import json
import math
import os

import torch

from iris_fw import devinfo
from iris_fw import trace as _tr

from .events import kind_names

#: Iris's default buffer size (events).
DEFAULT_MAX_EVENTS = 1_000_000


class Tracing:
    """``shmem.tracing``: ``enable``, ``reset``, ``export``, ``trace_counter``, ``enabled``,
    ``max_events``."""

    def __init__(self, shmem):
        self._shmem = shmem
        self.enabled = False
        self.max_events = 0
        self._session = None
        self._region = None

    # ---- switching on ------------------------------------------------------------------------------
    def enable(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        """Start recording (collective: every rank calls it). Enabling again starts afresh."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events <= 0:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        if self.enabled:
            self._close()
        self.max_events = max_events
        self._open()
        self.enabled = True
        self._shmem.info(f"Device tracing enabled with max {max_events} events")

    def _open(self) -> None:
        ctx = self._shmem.ctx
        self._session = ctx.trace(None, label="iris", kinds=kind_names())
        self._session.__enter__()
        rings = max(1, devinfo.num_sms(ctx.device))
        capacity = max(1, math.ceil(self.max_events / rings))
        handle = ctx.tracer.handle(("iris", "device events"), rings, "iris kernels", capacity=capacity)
        self._region = ctx.tracer.regions[-1]
        self._shmem._set_trace_handle(handle)

    def _close(self):
        """Close the session (collective); its per-rank trace and merged trace are returned."""
        session, self._session, self._region = self._session, None, None
        self._shmem._set_trace_handle(0)
        session.__exit__(None, None, None)
        return session

    def disable(self) -> None:
        """Stop recording (collective); what was recorded and not exported is discarded."""
        if self.enabled:
            self._close()
            self.enabled = False

    # ---- counters -----------------------------------------------------------------------------------
    @property
    def trace_counter(self) -> torch.Tensor:
        """Events Iris kernels recorded since ``enable``/``reset`` (lost ones included), as an
        int32 ``[1]`` tensor like Iris's counter."""
        ctx = self._shmem.ctx
        if self._region is None:
            return torch.zeros(1, dtype=torch.int32, device=ctx.device)
        ctx.transport.synchronize()
        data = self._region.tensor
        head = _tr.HEADER_WORDS.value
        stride = _tr.RING_HEADER.value + self._region.capacity * _tr.EVENT_WORDS.value
        counts = data[head:head + self._region.programs * stride].view(self._region.programs, stride)[:, 0]
        total = counts.sum() + data[_tr.H_LOST.value]
        return total.to(torch.int32).reshape(1)

    def reset(self) -> None:
        """Forget the events recorded so far (keeps the buffer)."""
        if not self.enabled:
            self._shmem.warning("Tracing not enabled. Call tracing.enable() first.")
            return
        data = self._region.tensor
        head = _tr.HEADER_WORDS.value
        stride = _tr.RING_HEADER.value + self._region.capacity * _tr.EVENT_WORDS.value
        data[head:head + self._region.programs * stride].view(self._region.programs, stride)[:, 0].zero_()
        data[_tr.H_LOST.value] = 0

    # ---- export -------------------------------------------------------------------------------------
    def export(self, filename: str = "trace.json", merge: bool = False) -> dict:
        """Write this rank's events to ``<filename stem>_rank<r>.json`` (Iris's name) and, with
        ``merge``, every rank's on one time axis to ``filename`` on rank 0. Collective. Returns
        this rank's trace, or with ``merge`` the merged one on rank 0 and ``{}`` elsewhere.
        Recording goes on afterwards, into a new session."""
        if not self.enabled:
            self._shmem.warning("Tracing not enabled. Call tracing.enable() first.")
            return {}
        session = self._close()
        try:
            stem, ext = os.path.splitext(os.fspath(filename))
            rank = self._shmem.cur_rank
            _write(f"{stem}_rank{rank}{ext or '.json'}", session.trace)
            self._shmem.info(f"Exported rank {rank} trace to {stem}_rank{rank}{ext or '.json'}")
            if not merge:
                return session.trace
            if rank == 0:
                _write(os.fspath(filename), session.merged)
                return session.merged
            return {}
        finally:
            self._open()


def _write(path: str, data: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
