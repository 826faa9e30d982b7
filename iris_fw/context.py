"""The context: one rank's view of the job — its symmetric heap, its peers' heaps, and the
host-side collectives around them. Created by :func:`init`."""

from __future__ import annotations

import atexit
import inspect
import os
import time
import weakref
from typing import Any

import torch

from . import bootstrap as _bootstrap
from . import interpreting
from . import device as dev
from . import watchdog as _watchdog
from ._kernels import _device_barrier_kernel, _wait_probe_kernel
from .errors import IrisError, NotOnHeapError, PeerFailure, SymmetryError, WaitTimeout
from .heap import ALIGN, Block, SymmetricHeap, span_bytes
from .registry import Registries, load_registries

DEFAULT_HEAP_SIZE = 1 << 30
DEFAULT_WAIT_TIMEOUT_S = 30.0
#: Polls the wait-bound calibration makes, per transport kind (compiled vs interpreted).
_PROBE_POLLS = {False: 200_000, True: 300}
_MIN_WAIT_POLLS = 1000
_N_ERR_SLOTS = dev.HDR_WAIT_BOUND.value  # slots [0, HDR_WAIT_BOUND) form the error record


def header_bytes(world_size: int) -> int:
    """Bytes reserved at the start of every heap for the header (see :mod:`iris_fw.device`;
    the cause records after the barrier slots: :mod:`iris_fw.watchdog`)."""
    slots = _watchdog.header_slots(world_size)
    align = dev.HEAP_BASE_ALIGN.value
    return (slots * dev.HDR_SLOT_BYTES.value + align - 1) // align * align


def choose_transport(registry, requested: str | None = None):
    """The transport class: ``requested`` (or ``IRIS_FW_TRANSPORT``) if given; otherwise
    ``host_shm`` under the interpreter, ``gpu_ipc`` when GPUs are present, else ``host_shm``."""
    requested = requested or os.environ.get("IRIS_FW_TRANSPORT") or None
    if requested in (None, "auto"):
        if not interpreting() and "gpu_ipc" in registry and registry.entry("gpu_ipc").availability()[0]:
            requested = "gpu_ipc"
        else:
            requested = "host_shm"
    return registry.require_available(requested)


def _check_int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value >= high):
        bounds = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bounds}, got {value}")
    return value


def check_reports(label: str, reports: list, error: BaseException | None = None, ranks=None) -> None:
    """Raise if the reports of a collective call's ranks disagree. ``reports``: per rank, in
    order, ``(rejected, fields)``: why that rank rejected its arguments (or ``None``) and its
    fields (name → comparable value); ``error``: the caller's own rejection, re-raised as it is;
    ``ranks``: the ranks' names in messages (default ``0 … len-1``). Otherwise raises
    :class:`~iris_fw.engine.contract.CollectiveMismatch` naming the ranks and the argument that
    differ. Shared by :meth:`Context.agree` and the groups of :mod:`iris_fw.ccl`."""
    from .engine.contract import CollectiveMismatch

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


def init(
    heap_size: int = DEFAULT_HEAP_SIZE,
    transport: str | None = None,
    bootstrap: str | None = None,
    *,
    wait_timeout: float | None = None,
    debug: bool | None = None,
    registries: Registries | None = None,
    liveness_timeout: float | None = None,
) -> "Context":
    """Create this rank's context. Collective: every rank calls it with the same arguments.

    :param heap_size: bytes of symmetric heap per rank.
    :param transport: a transport name (``"gpu_ipc"``, ``"host_shm"``, a plugin's), or
        ``None``/``"auto"``: ``IRIS_FW_TRANSPORT``, else GPUs present → ``gpu_ipc``, otherwise
        ``host_shm``.
    :param bootstrap: a bootstrap name (``"mpi"``, ``"torch"``, ``"single"``, a plugin's), or
        ``None``/``"auto"``: ``IRIS_FW_BOOTSTRAP``, else chosen from the environment.
    :param wait_timeout: seconds a device-side wait polls before it gives up and the host
        raises :class:`WaitTimeout` (default ``IRIS_FW_WAIT_TIMEOUT`` or 30).
    :param debug: check every allocation's offset across ranks (``IRIS_FW_DEBUG=1``).
    :param registries: use these registries instead of loading the installed plugins.
    :param liveness_timeout: seconds after which a rank that stopped, hangs without a heartbeat
        or never arrived is reported lost by the others (default ``IRIS_FW_LIVENESS_TIMEOUT`` or
        10; a rank that dies or exits is noticed at once). See :mod:`iris_fw.watchdog`.

    A set-up failure on one rank calls the bootstrap's ``abort`` (MPI: ``Abort``; torch: the
    reason is published in the rendezvous store and the group torn down), so the other ranks
    fail within seconds instead of waiting in a collective.
    """
    _check_int(heap_size, "heap_size", 1)
    if wait_timeout is None:
        wait_timeout = float(os.environ.get("IRIS_FW_WAIT_TIMEOUT", DEFAULT_WAIT_TIMEOUT_S))
    if not wait_timeout > 0:
        raise ValueError(f"wait_timeout must be a positive number of seconds, got {wait_timeout!r}")
    if debug is None:
        debug = os.environ.get("IRIS_FW_DEBUG", "0") not in ("", "0")
    liveness = _watchdog.liveness_timeout(liveness_timeout)
    regs = registries if registries is not None else load_registries()
    transport_cls = choose_transport(regs.transport, transport)
    boot_cls = _bootstrap.choose(regs.bootstrap, bootstrap)
    accepts = "arrival_timeout" in inspect.signature(boot_cls).parameters
    boot = boot_cls(arrival_timeout=_watchdog.arrival_timeout(liveness)) if accepts else boot_cls()
    try:
        watchdog = _watchdog.Watchdog(boot, liveness)
    except BaseException:
        boot.close()
        raise
    try:
        need = header_bytes(boot.world_size) + ALIGN
        if heap_size < need:
            raise ValueError(
                f"heap_size={heap_size} is too small: {boot.world_size} ranks need at least {need} "
                f"bytes ({need - ALIGN} of header plus one {ALIGN}-byte block)"
            )
        tr = transport_cls(boot, heap_size)
    except BaseException as exc:
        _abort_setup(boot, watchdog, exc)
        raise
    try:
        return Context(tr, boot, heap_size, wait_timeout=wait_timeout, debug=debug, registries=regs,
                       watchdog=watchdog)
    except BaseException as exc:
        _abort_setup(boot, watchdog, exc)
        raise


def _abort_setup(boot, watchdog, exc: BaseException) -> None:
    """A set-up failure on this rank: unless every rank failed the same way (a collective
    failure) or a peer is already lost, make the others stop waiting for this rank (the
    bootstrap's abort), then release the bootstrap."""
    watchdog.stop()
    if not getattr(exc, "everywhere", False) and not isinstance(exc, PeerFailure) and not watchdog.lost:
        try:
            boot.abort(f"rank {boot.rank} failed during iris_fw.init: {type(exc).__name__}: {exc}")
        except Exception:
            pass
    try:
        boot.close()
    except Exception:
        pass


#: The errors a barrier re-raises by name (the first failing rank's class).
_ERROR_CLASSES = {cls.__name__: cls for cls in (WaitTimeout, NotOnHeapError, PeerFailure)}


class _AtExit:
    """At interpreter exit, a context that was not closed tells its peers (its heartbeat says it
    left) and stops its watchdog; a job left broken by a lost peer is aborted through the
    bootstrap (MPI would otherwise wait for the lost rank in ``MPI_Finalize``). Holds the
    context weakly."""

    def __init__(self, ctx: "Context"):
        self._ctx = weakref.ref(ctx)

    def __call__(self) -> None:
        ctx = self._ctx()
        if ctx is None or ctx._closed:
            return
        lost = ctx.watchdog.lost
        ctx.watchdog.stop(heartbeat=_watchdog.HEARTBEAT_EXITED)
        if lost:
            ctx.bootstrap.abort(f"rank {ctx.rank} exits after losing rank(s) {sorted(lost)}")


#: Contexts of this process in creation order (weak references), for APIs whose ``ctx``
#: argument is optional. Filled by :class:`Context`, never at import.
_created: "list[weakref.ref[Context]]" = []


def current() -> "Context":
    """The most recently created context of this process that is still open."""
    if _created:
        last = _created[-1]()
        if last is not None and not last._closed:
            return last  # the common case, on every collective call without ctx=
    _created[:] = [ref for ref in _created if ref() is not None and not ref().closed]
    if not _created:
        raise IrisError("no open iris_fw context in this process: call iris_fw.init() first or pass ctx=")
    return _created[-1]()


class Context:
    """One rank's handle on the job. Use :func:`init` to create it; it is also a context
    manager, and :meth:`close` is idempotent.

    Attributes: ``rank``, ``world_size``, ``local_rank``, ``device``, ``heap_bases`` (int64
    ``[world_size]`` on ``device``: every rank's heap base as mapped in this process, the
    argument every device primitive takes), ``heap_size``, ``transport``, ``bootstrap``,
    ``registries`` (the plugins this context was created with).
    """

    def __init__(self, transport, bootstrap, heap_size: int, *, wait_timeout: float, debug: bool,
                 registries: Registries | None = None, watchdog=None):
        self.transport = transport
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.world_size = bootstrap.world_size
        self.local_rank = bootstrap.local_rank
        self.device = transport.device
        self.heap_bases = transport.heap_bases
        self.heap_size = heap_size
        self.debug = debug
        self.registries = registries if registries is not None else load_registries()
        self._closed = False
        # A context never closed (Iris-style programs) still releases what its bootstrap
        # created (a process group) at interpreter exit; local only, never a collective.
        self._exit_cleanup = weakref.finalize(self, bootstrap.close)
        hdr_bytes = header_bytes(self.world_size)
        self._hdr = transport.heap[:hdr_bytes].view(torch.int64)
        self._hdr.zero_()
        self._hdr[dev.HDR_HEAP_SIZE.value] = heap_size
        self._hdr[dev.HDR_WORLD_SIZE.value] = self.world_size
        #: liveness and abort causes (iris_fw.watchdog); set up by init()
        self.watchdog = watchdog if watchdog is not None else _watchdog.Watchdog(bootstrap, _watchdog.liveness_timeout())
        self.heap = SymmetricHeap(
            transport.bases[self.rank],
            heap_size,
            hdr_bytes,
            transport.wrap,
            on_alloc=self._check_alloc_symmetric if debug else None,
        )
        self._polls_per_s = self._calibrate_wait()
        from .engine.op import OpCache

        #: ops of ``iris_fw.ops.<name>(...)`` calls, by their arguments (bounded; see OpCache)
        self.op_cache = OpCache()
        #: communication groups of :mod:`iris_fw.ccl` by their ranks (``ccl.new_group``)
        self.comm_groups: dict = {}
        #: how many aborts the job was re-armed after (ops planned before the last one refuse calls)
        self.abort_epoch = 0
        self.wait_timeout = wait_timeout
        self.watchdog.attach(self)
        self._at_exit = _AtExit(self)
        atexit.register(self._at_exit)
        self.barrier()
        _created.append(weakref.ref(self))

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the heap and unmap peers. Collective; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._exit_cleanup.detach()
        atexit.unregister(self._at_exit)
        self.op_cache.clear()
        self.comm_groups.clear()
        try:
            self.transport.synchronize()
            self.watchdog.closing()
            self.bootstrap.barrier()
        finally:
            self.watchdog.stop()
            self.heap.closed = True
            self._hdr = None
            self.transport.close()
            self.bootstrap.close()

    def __enter__(self) -> "Context":
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
        self._hdr[dev.HDR_ABORT.value] = 0
        return polls / max(elapsed, 1e-9)

    @property
    def wait_timeout(self) -> float:
        """Seconds (approximately: converted to a poll count at init) a device-side wait polls
        before it gives up. Set it between kernels, never while one runs."""
        return self._wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"wait_timeout must be a positive number of seconds, got {seconds!r}")
        self._wait_timeout = float(seconds)
        self.transport.synchronize()
        self._hdr[dev.HDR_WAIT_BOUND.value] = max(_MIN_WAIT_POLLS, int(seconds * self._polls_per_s))

    def _describe_timeout(self, record: list) -> str:
        """The message for this rank's timeout record (the header's first ``HDR_WAIT_BOUND``
        slots, as read by the watchdog)."""
        rank, peer, offset = (record[s.value] for s in (dev.HDR_ERR_RANK, dev.HDR_ERR_PEER, dev.HDR_ERR_OFFSET))
        expected, seen, cmp, spins = (
            record[s.value] for s in (dev.HDR_ERR_EXPECTED, dev.HDR_ERR_SEEN, dev.HDR_ERR_CMP, dev.HDR_ERR_SPINS)
        )
        where = self._describe_offset(offset)
        cmp_op = dev.CMP_OPS[cmp] if 0 <= cmp < len(dev.CMP_OPS) else f"<cmp {cmp}>"
        return (
            f"rank {rank} gave up waiting for the flag at {where} in rank {peer}'s heap to become "
            f"{cmp_op} {expected}: last saw {seen} after {spins} polls (wait_timeout "
            f"{self._wait_timeout:g}s); {record[dev.HDR_ERR_COUNT.value]} wait(s) timed out on rank {self.rank}"
        )

    def _describe_offset(self, offset: int) -> str:
        block = self.heap.block_at(offset)
        where = f"offset {offset:#x}"
        if block is not None:
            where += f" ({block.what} allocated at {block.site}, +{offset - block.offset} bytes)"
        elif 0 <= offset < header_bytes(self.world_size):
            where += " (heap header)"
        return where

    def _describe_bad_pointer(self, state: list) -> str:
        """The message for this rank's pointer-check record (the header's fixed slots)."""
        rank, peer, offset, program, count = (state[s.value] for s in (
            dev.HDR_PTR_RANK, dev.HDR_PTR_PEER, dev.HDR_PTR_OFFSET, dev.HDR_PTR_PROGRAM, dev.HDR_PTR_COUNT))
        what = []
        if not 0 <= peer < self.world_size:
            what.append(f"peer rank {peer} is outside the world [0, {self.world_size})")
        if not 0 <= offset < self.heap_size:
            what.append(f"the pointer is at offset {offset:#x} ({offset}) from rank {self.rank}'s heap base, "
                        f"outside the heap of {self.heap_size} bytes (not a symmetric tensor of this rank?)")
        if not what:
            what.append(f"the pointer at {self._describe_offset(offset)} or peer {peer} is not in a group's heaps")
        return (f"rank {self.rank}: a device primitive of program {program} (rank argument {rank}, peer {peer}) "
                f"was given an invalid address: " + "; ".join(what) + f"; {count} lane(s) failed the check and "
                "were not accessed (the job's waits were aborted)")

    def synchronize(self) -> None:
        """Wait for this rank's queued device work; raise if a device-side wait on this rank
        gave up (:class:`WaitTimeout` for its own, or the job's first cause when it gave up
        because the job was aborted) or a pointer failed its check (:class:`NotOnHeapError`)."""
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
        reports = self.bootstrap.all_gather(
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
        self.op_cache.clear()
        for group in {id(g): g for g in self.comm_groups.values()}.values():
            group.reset()
        self.bootstrap.barrier()

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
            raise IrisError("this iris_fw context is closed")

    def check_rank(self, value: Any, name: str = "rank") -> int:
        """``value`` if it is a valid rank, else a ValueError/TypeError naming ``name``."""
        return _check_int(value, name, 0, self.world_size)

    def is_symmetric(self, t: Any) -> bool:
        """Whether ``t`` is a tensor that lies on this rank's symmetric heap."""
        return (
            isinstance(t, torch.Tensor)
            and t.device == self.device
            and self.heap.offset_of(t) is not None
        )

    def check_symmetric(self, t: Any, name: str = "tensor") -> torch.Tensor:
        """``t`` if it lies on this rank's heap, else :class:`NotOnHeapError` naming ``name``."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor on the symmetric heap, got {type(t).__name__}")
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
        offset = self.offset_of(t)
        self.check_rank(peer, "peer")
        raw = self.transport.wrap(self.transport.bases[peer] + offset, max(span_bytes(t), t.element_size()))[0]
        return torch.as_strided(raw.view(t.dtype), t.shape, t.stride())

    # ---- symmetry ------------------------------------------------------------------------------
    def _check_alloc_symmetric(self, block: Block) -> None:
        records = self.bootstrap.all_gather((block.seq, block.offset, block.size, block.what, block.site))
        if len({r[:3] for r in records}) > 1:
            lines = [
                f"rank {r}: allocation #{seq} at offset {off:#x}, {size} bytes, {what} from {site}"
                for r, (seq, off, size, what, site) in enumerate(records)
            ]
            raise SymmetryError("symmetric heap diverged across ranks:\n  " + "\n  ".join(lines))

    def check_symmetry(self) -> None:
        """Collective: raise :class:`SymmetryError` describing the first live allocation whose
        offset or size differs between ranks."""
        tables = self.bootstrap.all_gather([(b.offset, b.size, b.what, b.site) for b in self.heap.blocks()])
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
    def agree(self, label: str, fields: dict, error: BaseException | None = None) -> None:
        """Collective, one small exchange: every rank's ``fields`` (name → a comparable value, e.g.
        shapes and dtypes of a collective call) must be equal, and no rank may have rejected
        its arguments (``error``). Otherwise every rank raises: the rank that rejected its
        arguments re-raises ``error``, the others :class:`~iris_fw.engine.contract.CollectiveMismatch`
        naming the ranks and the argument that differ. The same exchange reclaims heap blocks
        freed on every rank (as :meth:`barrier` does), so loops of collective calls do not
        accumulate freed memory."""
        self._check_open()
        rejected = None if error is None else f"{type(error).__name__}: {error}"
        reports = self.bootstrap.all_gather((rejected, fields, self.heap.pending_offsets()))
        self.heap.reclaim_freed_everywhere(pending for _, _, pending in reports)
        check_reports(label, [(why, f) for why, f, _ in reports], error)

    # ---- host collectives ----------------------------------------------------------------------
    def broadcast(self, value: Any, src: int = 0) -> Any:
        """``src``'s ``value`` on every rank. A tensor is overwritten in place with ``src``'s
        data and returned (a symmetric tensor is copied straight from ``src``'s heap);
        anything else is pickled through the bootstrap and returned."""
        self.check_rank(src, "src")
        if not isinstance(value, torch.Tensor):
            return self.bootstrap.broadcast(value, src)
        meta = self.bootstrap.all_gather((tuple(value.shape), str(value.dtype), self.is_symmetric(value)))
        if len({m[:2] for m in meta}) > 1:
            raise ValueError(
                "broadcast: value must have the same shape and dtype on every rank, got "
                + ", ".join(f"rank {r}: {m[1]}{list(m[0])}" for r, m in enumerate(meta))
            )
        if all(m[2] for m in meta):
            self.barrier()
            if self.rank != src:
                value.copy_(self.peer_view(value, src))
            self.barrier()
            return value
        data = self.bootstrap.broadcast(value.detach().cpu() if self.rank == src else None, src)
        if self.rank != src:
            value.copy_(data)
        return value

    # ---- factories (torch's conventions) -------------------------------------------------------
    def _check_device(self, device: Any) -> None:
        if device is None:
            return
        wanted = torch.device(device)
        if wanted.type != self.device.type or (wanted.index is not None and wanted != self.device):
            raise ValueError(f"device must be {self.device} (this rank's heap lives there), got {device!r}")

    @staticmethod
    def _size(size: tuple) -> tuple[int, ...]:
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        for d in size:
            if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                raise ValueError(f"size must be non-negative ints, got {tuple(size)!r}")
        return tuple(size)

    def _new(self, shape, dtype, device, requires_grad=False) -> torch.Tensor:
        self._check_open()
        self._check_device(device)
        t = self.heap.tensor(shape, dtype if dtype is not None else torch.get_default_dtype())
        return t.requires_grad_() if requires_grad else t

    def empty(self, *size, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        """Uninitialized symmetric tensor, like :func:`torch.empty`."""
        return self._new(self._size(size), dtype, device, requires_grad)

    def zeros(self, *size, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device)
        return t.zero_().requires_grad_(requires_grad)

    def ones(self, *size, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device)
        return t.fill_(1).requires_grad_(requires_grad)

    def full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        """Like :func:`torch.full`: the dtype follows ``fill_value`` when not given."""
        dtype = dtype if dtype is not None else torch.tensor(fill_value).dtype
        t = self._new(self._size((size,)), dtype, device)
        return t.fill_(fill_value).requires_grad_(requires_grad)

    def _from(self, ref: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        t = self._new(tuple(ref.shape), ref.dtype, None)
        return t.copy_(ref).requires_grad_(requires_grad)

    def arange(self, start, end=None, step=1, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        """Like :func:`torch.arange` (``arange(end)`` or ``arange(start, end, step)``)."""
        self._check_device(device)
        if end is None:
            start, end = 0, start
        return self._from(torch.arange(start, end, step, dtype=dtype, device=self.device), requires_grad)

    def linspace(self, start, end, steps, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        self._check_device(device)
        return self._from(torch.linspace(start, end, steps, dtype=dtype, device=self.device), requires_grad)

    def rand(self, *size, generator=None, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        """Uniform on [0, 1), like :func:`torch.rand`."""
        t = self._new(self._size(size), dtype, device)
        return t.uniform_(0, 1, generator=generator).requires_grad_(requires_grad)

    def randn(self, *size, generator=None, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device)
        return t.normal_(generator=generator).requires_grad_(requires_grad)

    def randint(self, *args, generator=None, dtype=torch.int64, device=None, requires_grad=False) -> torch.Tensor:
        """Like :func:`torch.randint`: ``randint(high, size)`` or ``randint(low, high, size)``."""
        if len(args) == 2:
            low, (high, size) = 0, args
        elif len(args) == 3:
            low, high, size = args
        else:
            raise TypeError(f"randint takes (high, size) or (low, high, size), got {len(args)} positional arguments")
        if not high > low:
            raise ValueError(f"randint: high must be greater than low, got low={low}, high={high}")
        t = self._new(self._size((size,)), dtype, device)
        return t.random_(low, high, generator=generator).requires_grad_(requires_grad)

    def empty_like(self, t: torch.Tensor, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        return self._new(tuple(t.shape), dtype or t.dtype, device, requires_grad)

    def zeros_like(self, t: torch.Tensor, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        return self.zeros(tuple(t.shape), dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def ones_like(self, t: torch.Tensor, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        return self.ones(tuple(t.shape), dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def full_like(self, t: torch.Tensor, fill_value, *, dtype=None, device=None, requires_grad=False) -> torch.Tensor:
        return self.full(tuple(t.shape), fill_value, dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def as_symmetric(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` (any device) on the symmetric heap, same shape and dtype."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"as_symmetric takes a torch.Tensor, got {type(t).__name__}")
        return self._from(t.detach(), False)
