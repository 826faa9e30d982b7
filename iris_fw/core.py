"""The context's core: what one rank's context keeps of its own — its symmetric heap, its peers'
heaps, ``barrier``, ``agree``, the host collectives and the bounded waits (:class:`ContextCore`).

:class:`iris_fw.Context` (:mod:`iris_fw.context`, where :func:`~iris_fw.init` builds it) is this
core with the tensor factories (:mod:`iris_fw.factories`) and the trace sessions
(:mod:`iris_fw.trace_session`) as further base classes; the core imports neither. What higher
layers keep per context (the call path's caches of ops and collectives, the GEMM's split-K
counters) hangs off ``ctx.extensions``; the decoding of device-side errors is the watchdog's
(:mod:`iris_fw.watchdog`). What outlives one context — the process's live contexts, the wait
calibration, the clean-up of a context never closed — is :mod:`iris_fw.lifecycle`'s.
"""

from __future__ import annotations

import atexit
import math
import operator
import time
import weakref
from typing import Any, Self

import torch

from . import bootstrap_base as _bootstrap
from . import call_identity as _calls
from .interpreter import interpreting
from . import device as dev
from . import watchdog as _watchdog
from ._kernels import _device_barrier_kernel, _wait_probe_kernel
from .errors import (ArgumentError, ArgumentTypeError, CollectiveMismatch, ContextClosed, IrisError, NotOnHeapError,
                     PeerFailure, SymmetryError, WaitTimeout, bad_type)
from .heap import Block, SymmetricHeap, span_bytes
from .lifecycle import AtExit, process, release_unclosed, watch_uncaught
from .registry import Registries, load_registries
from .transport_base import Transport

#: Polls the wait-bound calibration makes, per transport kind (compiled vs interpreted).
_PROBE_POLLS = {False: 200_000, True: 300}
_MIN_WAIT_POLLS = 1000
_N_ERR_SLOTS = dev.HDR_WAIT_BOUND.value  # slots [0, HDR_WAIT_BOUND) form the error record


def header_bytes(world_size: int) -> int:
    """Bytes reserved at the start of every heap for the header (see :mod:`iris_fw.device`;
    the cause records after the barrier slots: :mod:`iris_fw.watchdog`; then the call board:
    :mod:`iris_fw.call_identity`)."""
    slots = _watchdog.header_slots(world_size) + _calls.BOARD_SLOTS
    align = dev.HEAP_BASE_ALIGN.value
    return (slots * dev.HDR_SLOT_BYTES.value + align - 1) // align * align



def check_int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int (anything with ``__index__`` but a bool) in ``[low, high)``, else an
    :class:`ArgumentTypeError` / :class:`ArgumentError` naming ``name``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise bad_type(name, "an int", value)
    value = operator.index(value)
    if (low is not None and value < low) or (high is not None and value >= high):
        bounds = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ArgumentError(f"{name} must be in {bounds}, got {value}")
    return value


#: Polls of a wait bound are an int64 on the device; longer bounds are cut to this.
_MAX_WAIT_POLLS = 1 << 62


def check_seconds(value: Any, name: str) -> float:
    """``value`` as a finite positive number of seconds, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_type(name, "a finite number of seconds > 0", value)
    if not (math.isfinite(value) and value > 0):
        raise ArgumentError(f"{name} must be a finite number of seconds > 0 (every wait is bounded; for slow "
                            f"debugging pass a large value such as 3600), got {value!r}")
    return float(value)



def check_reports(label: str, reports: list, error: BaseException | None = None, ranks=None) -> None:
    """Raise if the reports of a collective call's ranks disagree. ``reports``: per rank, in
    order, ``(rejected, fields)``: why that rank rejected its arguments (or ``None``) and its
    fields (name → comparable value); ``error``: the caller's own rejection, re-raised as it is;
    ``ranks``: the ranks' names in messages (default ``0 … len-1``). Otherwise raises
    :class:`~iris_fw.engine.contract.CollectiveMismatch` naming the ranks and the argument that
    differ. Shared by :meth:`ContextCore.agree` and the groups of :mod:`iris_fw.ccl`."""
    ranks = list(range(len(reports))) if ranks is None else list(ranks)
    failed = [(r, why) for r, (why, _) in zip(ranks, reports) if why]
    if failed:
        if error is not None:
            raise error
        raise CollectiveMismatch(f"{label}: " + "; ".join(f"rank {r} rejected its arguments ({why})"
                                                           for r, why in failed))
    for name in reports[0][1] if reports else ():
        values = [f.get(name) for _, f in reports]
        if any(v != values[0] for v in values[1:]):
            groups: dict = {}
            for r, v in zip(ranks, values):
                groups.setdefault(repr(v), []).append(r)
            detail = "; ".join(f"ranks {', '.join(map(str, rs))}: {v}" for v, rs in groups.items())
            raise CollectiveMismatch(f"{label}: argument {name!r} differs across ranks ({detail})")



#: The errors a barrier re-raises by name (the first failing rank's class).
_ERROR_CLASSES = {cls.__name__: cls for cls in (WaitTimeout, NotOnHeapError, PeerFailure)}


class ContextCore:
    """What one rank's context keeps of its own: the heap and the peers' heaps, the call identity,
    the watchdog, ``barrier``, ``agree``, the host collectives and the bounded waits. Users hold
    an :class:`iris_fw.Context` (this core with the tensor factories and the trace sessions; its
    attributes are listed there), made by :func:`iris_fw.init`.
    """

    def __init__(self, transport: Transport, bootstrap: _bootstrap.Bootstrap, heap_size: int, *, wait_timeout: float,
                 debug: bool, registries: Registries | None = None, watchdog=None):
        self.transport = transport
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.world_size = bootstrap.world_size
        self.local_rank = bootstrap.local_rank
        self.device = transport.device
        self.heap_bases = dev.device_heaps(transport.heap_bases, check_pointers=interpreting() or debug,
                                           nvshmem_calls=transport.call_mode)
        self.heap_size = heap_size
        self.debug = debug
        self.registries = registries if registries is not None else load_registries()
        self._closed = False
        hdr_bytes = header_bytes(self.world_size)
        self._hdr = transport.heap[:hdr_bytes].view(torch.int64)
        self._hdr.zero_()
        self._hdr[dev.HDR_HEAP_SIZE.value] = heap_size
        self._hdr[dev.HDR_WORLD_SIZE.value] = self.world_size
        #: liveness and abort causes (iris_fw.watchdog); set up by init()
        self.watchdog = watchdog if watchdog is not None else _watchdog.Watchdog(bootstrap, _watchdog.liveness_timeout())
        # A context never closed (Iris-style programs) still stops its watchdog and releases what
        # its bootstrap created (a process group) when it goes or at interpreter exit; local
        # only, never a collective.
        self._exit_cleanup = weakref.finalize(self, release_unclosed, self.watchdog, bootstrap)
        self.heap = SymmetricHeap(
            transport.bases[self.rank],
            heap_size,
            hdr_bytes,
            transport.wrap,
            on_alloc=self._check_alloc_symmetric if debug else None,
        )
        self._polls_per_s = self._calibrate_wait()
        #: call identity: the host-call number, the call board, the epoch counters (iris_fw.call_identity)
        self.calls = _calls.Calls(self, _watchdog.header_slots(self.world_size))
        #: what higher layers keep per context (the call path's op and collective caches,
        #: :mod:`iris_fw.callpath`), by their module's name; each object's ``rearm()`` runs when
        #: the job is re-armed after an abort, its ``close()`` when the context closes. The
        #: context imports none of them.
        self.extensions: dict = {}
        #: how many aborts the job was re-armed after (ops planned before the last one refuse calls)
        self.abort_epoch = 0
        self.wait_timeout = wait_timeout
        self.watchdog.attach(self)
        self._at_exit = AtExit(self)
        atexit.register(self._at_exit)
        watch_uncaught()
        self.barrier()
        process().make_current(self)

    # ---- lifecycle ----------------------------------------------------------------------------
    def make_current(self) -> None:
        """Make this the context that calls without ``ctx=`` use (:func:`current`), as if it had
        been created last. Local to this process."""
        if self._closed:
            raise IrisError("make_current: this context is closed")
        process().make_current(self)

    def close(self) -> None:
        """Free the heap and unmap peers. Collective; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._exit_cleanup.detach()
        atexit.unregister(self._at_exit)
        for ext in list(self.extensions.values()):
            ext.close()
        try:
            self.transport.synchronize()
            self.watchdog.closing()
            self.calls.host_call("Context.close")
        finally:
            self.watchdog.stop()
            self.heap.closed = True
            self._hdr = None
            self.transport.close()
            self.bootstrap.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        # On an exception the other ranks may not reach a collective close: leave the
        # mappings to process exit (segments are already unlinked) rather than hang here, and
        # make the others' waits give up now, naming this exception, unless the job is already
        # aborted (the exception is then most likely that abort's report).
        if not self._closed and not self.watchdog.aborted:
            self.abort(f"{exc_type.__name__}: {exc} (raised inside its `with iris_fw.init(...)` block)")

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"<iris_fw.Context rank={self.rank}/{self.world_size} device={self.device} "
            f"transport={self.transport.name} bootstrap={self.bootstrap.name} heap={self.heap_size}>"
        )

    # ---- bounded waits --------------------------------------------------------------------------
    def _calibrate_wait(self) -> float:
        key = (self.transport.name, str(self.device))
        rates = process().poll_rates
        if key in rates:
            return rates[key]
        polls = _PROBE_POLLS[self.transport.interpreted]
        self._hdr[dev.HDR_WAIT_BOUND.value] = polls
        _wait_probe_kernel[(1,)](self.rank, self.heap_bases)  # compile / warm up
        self.transport.synchronize()
        self._hdr[dev.HDR_ABORT.value] = 0  # the probe's timeout set it
        start = time.perf_counter()
        _wait_probe_kernel[(1,)](self.rank, self.heap_bases)
        self.transport.synchronize()
        elapsed = time.perf_counter() - start
        self._hdr[:_N_ERR_SLOTS] = 0
        self._hdr[dev.HDR_ABORT.value] = 0  # the probe's timeout set it
        rates[key] = polls / max(elapsed, 1e-9)
        return rates[key]

    @property
    def wait_timeout(self) -> float:
        """Seconds (approximately: converted to a poll count at init) a device-side wait polls
        before it gives up. Set it between kernels, never while one runs."""
        return self._wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, seconds: float) -> None:
        self._check_open()
        seconds = check_seconds(seconds, "wait_timeout")
        self._wait_timeout = seconds
        self.transport.synchronize()
        polls = min(float(_MAX_WAIT_POLLS), seconds * self._polls_per_s)
        self._hdr[dev.HDR_WAIT_BOUND.value] = max(_MIN_WAIT_POLLS, int(polls))

    def synchronize(self) -> None:
        """Wait for this rank's queued device work; raise if a device-side wait on this rank
        gave up (:class:`WaitTimeout` for its own, or the job's first cause when it gave up
        because the job was aborted) or a pointer failed its check (:class:`NotOnHeapError`)."""
        self._check_open()
        self.transport.synchronize()
        self.watchdog.sync_point()
        error = self.watchdog.failure()
        if error is not None:
            raise error

    def abort(self, reason: str) -> None:
        """Abort the job's device work: set the abort word on this rank and every peer with
        ``reason`` as the cause; every device wait gives up at once and each rank's host raises
        at its next synchronization (:class:`~iris_fw.PeerFailure` naming this rank). Called
        for a host failure inside a call other ranks take part in; ``barrier()`` re-arms."""
        self.watchdog.abort(reason)

    def barrier(self) -> None:
        """Synchronize this rank's device work, then wait for every rank. Heap blocks freed on
        every rank become reusable here. If a device-side wait gave up on any rank, every rank
        raises :class:`WaitTimeout` saying which."""
        self._check_open()
        self.transport.synchronize()
        self.watchdog.sync_point()  # this rank's device cause reaches every peer before the exchange
        failure = self.watchdog.failure()
        mine = None if failure is None else (type(failure).__name__, str(failure))
        aborted = self.watchdog.aborted
        reports = self.calls.host_call(
            "Context.barrier",
            (mine, self.heap.pending_offsets(), (self.heap.free_list_digest(), self.heap.sequence_digest(restart=True)),
             [(b.seq, b.offset, b.size, b.what, b.site) for b in self.heap.recent()], aborted,
             self.watchdog.generation)
        )
        # every rank reported: re-arm the job (causes sent from now on carry the next generation)
        self.watchdog.clear(max(r[5] for r in reports))
        if any(r[4] for r in reports):
            self._rearm()
        reports = [r[:4] for r in reports]
        if len({digest for _, _, digest, _ in reports}) > 1:
            lines = [
                f"rank {r}: recent allocations " + ", ".join(f"#{q} {w} ({n} B at {o:#x}, {site})" for q, o, n, w, site in recent)
                for r, (_, _, _, recent) in enumerate(reports)
            ]
            raise SymmetryError(
                "the symmetric heap diverged across ranks before this barrier (every rank must "
                "allocate the same sizes, dtypes and offsets in the same order; ctx.check_symmetry() "
                "or IRIS_FW_DEBUG=1 finds the first difference):\n  " + "\n  ".join(lines)
            )
        # Blocks freed on every rank become reusable, identically everywhere (see heap.py).
        self.heap.reclaim_freed_everywhere(pending for _, pending, _, _ in reports)
        errors = [error for error, _, _, _ in reports if error]
        if errors:
            cls = _ERROR_CLASSES.get(errors[0][0], WaitTimeout)
            raise cls("; ".join(text for _, text in errors))

    def _rearm(self) -> None:
        """After an abort (every rank, in the barrier that reports it): a call that was in flight
        left per-call device state (epochs, arrivals, queues) unequal across ranks, so ops and
        collective configurations start afresh — cached ops are dropped, ops held by the user
        refuse further calls, every group's workspace is zeroed — and the ranks meet once more
        before any of them uses a group again."""
        self.abort_epoch += 1
        self.calls.rearm()
        for ext in list(self.extensions.values()):
            ext.rearm()
        self.calls.host_call("Context.barrier (re-arming the job after an abort)")

    def device_barrier(self) -> None:
        """Queue a cross-rank barrier on the current stream: device work after it starts once
        every rank's work before it has finished. Host-asynchronous and CUDA-graph-capturable
        (the epoch lives on the heap); a barrier that times out reports at the next
        :meth:`synchronize` or :meth:`barrier`."""
        self._check_open()
        _device_barrier_kernel[(1,)](self.rank, self.world_size, self.heap_bases)

    # ---- checks -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ContextClosed(
                f"this iris_fw context (rank {self.rank} of {self.world_size}) is closed: create a new one with "
                "iris_fw.init(); its heap tensors stay readable but are no longer shared with other ranks")

    def check_rank(self, value: Any, name: str = "rank") -> int:
        """``value`` if it is a valid rank, else a ValueError/TypeError naming ``name``."""
        return check_int(value, name, 0, self.world_size)

    def is_symmetric(self, t: Any) -> bool:
        """Whether ``t`` is a tensor that lies on this rank's symmetric heap."""
        self._check_open()
        return (
            isinstance(t, torch.Tensor)
            and t.device == self.device
            and self.heap.offset_of(t) is not None
        )

    def check_symmetric(self, t: Any, name: str = "tensor") -> torch.Tensor:
        """``t`` if it lies on this rank's heap, else :class:`NotOnHeapError` naming ``name``."""
        self._check_open()
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor on the symmetric heap, got {type(t).__name__}")
        if t.device != self.device:
            raise NotOnHeapError(f"{name} must be on {self.device} (this rank's heap), got a tensor on {t.device}")
        if self.heap.offset_of(t) is None:
            raise NotOnHeapError(
                f"{name} must lie on the symmetric heap (allocate it with ctx.empty/zeros/… or "
                f"copy it with ctx.as_symmetric); its data at {t.data_ptr():#x} is outside the heap "
                f"[{self.heap.base + self.heap.start:#x}, {self.heap.base + self.heap_size:#x})"
            )
        return t

    def offset_of(self, t: torch.Tensor) -> int:
        """Byte offset of a symmetric tensor in the heap (the same on every rank)."""
        return self.heap.offset_of(self.check_symmetric(t))

    def peer_view(self, t: torch.Tensor, peer: int) -> torch.Tensor:
        """``peer``'s copy of the symmetric tensor ``t``, as a tensor over the peer's heap mapped
        in this process (same shape, strides, dtype; does not own the memory)."""
        offset = self.offset_of(t)  # checks the context is open
        self.check_rank(peer, "peer")
        raw = self.transport.wrap(self.transport.bases[peer] + offset, max(span_bytes(t), t.element_size()))[0]
        return torch.as_strided(raw.view(t.dtype), t.shape, t.stride())

    # ---- symmetry ------------------------------------------------------------------------------
    def _check_alloc_symmetric(self, block: Block) -> None:
        records = self.calls.host_call(f"the allocation check of IRIS_FW_DEBUG=1 (allocation #{block.seq})",
                                       (block.seq, block.offset, block.size, block.what, block.site))
        if len({r[:3] for r in records}) > 1:
            lines = [
                f"rank {r}: allocation #{seq} at offset {off:#x}, {size} bytes, {what} from {site}"
                for r, (seq, off, size, what, site) in enumerate(records)
            ]
            raise SymmetryError("symmetric heap diverged across ranks:\n  " + "\n  ".join(lines))

    def check_symmetry(self) -> None:
        """Collective: raise :class:`SymmetryError` describing the first live allocation whose
        offset or size differs between ranks."""
        self._check_open()
        tables = self.calls.host_call("Context.check_symmetry",
                                      [(b.offset, b.size, b.what, b.site) for b in self.heap.blocks()])
        longest = max(len(t) for t in tables)
        for i in range(longest):
            rows = [t[i] if i < len(t) else None for t in tables]
            if len({r[:2] if r else None for r in rows}) > 1:
                lines = [
                    f"rank {r}: " + (f"offset {row[0]:#x}, {row[1]} bytes, {row[2]} from {row[3]}" if row else "no allocation")
                    for r, row in enumerate(rows)
                ]
                raise SymmetryError(f"live allocation #{i} differs across ranks:\n  " + "\n  ".join(lines))

    # ---- collective validation -------------------------------------------------------------------
    def agree(self, label: str, fields: dict, error: BaseException | None = None, detail: str | None = None) -> None:
        """Collective, one small exchange: every rank's ``fields`` (name → a comparable value, e.g.
        shapes and dtypes of a collective call) must be equal, and no rank may have rejected
        its arguments (``error``). Otherwise every rank raises: the rank that rejected its
        arguments re-raises ``error``, the others :class:`~iris_fw.engine.contract.CollectiveMismatch`
        naming the ranks and the argument that differ. The same exchange reclaims heap blocks
        freed on every rank (as :meth:`barrier` does), so loops of collective calls do not
        accumulate freed memory. The exchange carries the call's identity (``label``; ``detail``
        says more in messages): ranks in different calls raise :class:`~iris_fw.CallMismatch`
        naming each rank's (see :mod:`iris_fw.call_identity`)."""
        self._check_open()
        rejected = None if error is None else f"{type(error).__name__}: {error}"
        reports = self.calls.host_call(label, (rejected, fields, self.heap.pending_offsets()),
                                       detail=detail or _calls.describe_call(label, fields))
        self.heap.reclaim_freed_everywhere(pending for _, _, pending in reports)
        check_reports(label, [(why, f) for why, f, _ in reports], error)

    # ---- host collectives ----------------------------------------------------------------------
    def broadcast(self, value: Any, src: int = 0) -> Any:
        """``src``'s ``value`` on every rank. A tensor is overwritten in place with ``src``'s
        data and returned (a symmetric tensor is copied straight from ``src``'s heap);
        anything else is pickled through the bootstrap and returned."""
        self._check_open()
        self.check_rank(src, "src")
        if not isinstance(value, torch.Tensor):
            return self.calls.host_call(f"Context.broadcast (src {src})", value if self.rank == src else None)[src]
        meta = self.calls.host_call(f"Context.broadcast (src {src})",
                                    (tuple(value.shape), str(value.dtype), self.is_symmetric(value)))
        if len({m[:2] for m in meta}) > 1:
            raise ArgumentError(
                "broadcast: value must have the same shape and dtype on every rank, got "
                + ", ".join(f"rank {r}: {m[1]}{list(m[0])}" for r, m in enumerate(meta))
            )
        if all(m[2] for m in meta) and self.transport.bases[src]:  # (0: src's heap is not mapped here)
            self.barrier()
            if self.rank != src:
                value.copy_(self.peer_view(value, src))
            self.barrier()
            return value
        data = self.calls.host_call(f"Context.broadcast (src {src}, data)",
                                    value.detach().cpu() if self.rank == src else None)[src]
        if self.rank != src:
            value.copy_(data)
        return value
