"""Iris's host object, ``iris.iris(heap_size)`` → :class:`Iris`, over an :class:`iris_fw.Context`.

Factories follow torch's calling conventions where Iris's do (a size as ``*ints``, one tuple/list
or a nested one; ``out=``, ``dtype=``, ``layout=``, ``device=``, ``requires_grad=``,
``memory_format=``), with Iris's error types: a device other than this rank's heap device, or
an ``out=`` tensor of the wrong size/dtype or off the heap, raise ``RuntimeError``; a layout
other than ``torch.strided`` and an empty or inconsistent ``arange`` range raise ``ValueError``.

**Creating and dropping.** Iris programs and Iris's tests make one ``iris.iris()`` per test and
drop it (``del shmem``) without closing. Closing an iris-fw context is collective, so a dropped
host object is not closed from the garbage collector (whose timing differs between ranks); it
is marked dropped, and the next ``iris.iris()`` — collective on every rank, in program order —
closes, once its own context exists, the contexts every rank has dropped, in creation order
(agreed in one small exchange over the oldest open context). Nothing accumulates over create/drop cycles: heaps, peer
mappings, /dev/shm segments, file descriptors (``scripts/probe_context_cycle.py``).
"""

from __future__ import annotations

import logging as _logging
import os
import weakref
from typing import Any

import numpy as np
import torch

import iris_fw
from iris_fw import devinfo as _devinfo
from iris_fw.compat.state import state as _state

from .. import logging as _log

#: Allocators Iris offers: ``None`` — served by iris-fw's heap; a string — why not.
#: ``vmem`` is served for what its API shares with ``torch`` (allocation, queries, RMA on the
#: heap); what only HIP's virtual-memory calls do — ``as_symmetric`` importing an external
#: tensor so that both share storage (DMA-BUF) — raises (see :data:`_VMEM_IMPORT`).
_ALLOCATORS = {
    "torch": None,
    "vmem": None,
    "vmem_chunked": "HIP virtual-memory heap grown in chunks on demand (hipMemCreate/hipMemMap, DMA-BUF export of "
                    "each chunk) — AMD-only; iris-fw's heaps have a fixed size: pass heap_size",
}
_VMEM_IMPORT = ("allocator_type='vmem': as_symmetric would import the external tensor's memory into the heap so that "
                "both share storage (HIP virtual-memory mapping of a DMA-BUF) — AMD-only and not provided by iris-fw; "
                "use allocator_type='torch', whose as_symmetric copies onto the heap")


def _mark_dropped(number: int) -> None:
    _state().dropped.add(number)


def close_dropped() -> None:
    """Close, in creation order, every context whose host object was dropped on every rank.
    Collective: called by every rank at the same point (each ``iris.iris()``). The contexts
    and the dropped numbers are the compat layer's per-process state
    (:func:`iris_fw.compat.state.state`)."""
    kept = _state()
    opened, dropped = kept.open, kept.dropped
    for number in [n for n, ctx in opened.items() if ctx.closed]:
        del opened[number]
        dropped.discard(number)
    if not opened:
        return
    oldest = opened[min(opened)]
    everywhere = set.intersection(*(set(d) for d in oldest.bootstrap.all_gather(sorted(dropped))))
    for number in sorted(everywhere):
        ctx = opened.pop(number)
        dropped.discard(number)
        ctx.close()


def _device_ok(requested: Any, device: torch.device) -> bool:
    if requested is None:
        return True
    try:
        wanted = torch.device(requested)
    except (RuntimeError, TypeError):
        return False
    return wanted.type == device.type and (wanted.index is None or wanted.index == device.index)


class Iris:
    """Iris's host object. ``Iris(heap_size)`` creates this rank's context (collective);
    ``Iris(context=ctx)`` wraps an existing :class:`iris_fw.Context` (not closed on drop).

    Attributes as in Iris: ``cur_rank``, ``num_ranks``, ``heap_size``, ``heap_bases``,
    ``gpu_id``, ``device`` (a string, ``"cuda:N"`` or ``"cpu"``), ``ccl``, ``ops``; ``ctx`` is the
    iris-fw context."""

    def __init__(self, heap_size: int = 1 << 30, allocator_type: str = "torch", *,
                 context: iris_fw.Context | None = None):
        allocator_type = os.environ.get("IRIS_ALLOCATOR", allocator_type)
        if allocator_type not in _ALLOCATORS:
            raise ValueError(f"allocator_type must be one of {sorted(_ALLOCATORS)}, got {allocator_type!r}")
        if allocator_type == "vmem" and _state().first_note("allocator_type=vmem"):
            _log.logger.info("allocator_type='vmem' is served by iris-fw's own heap allocator (allocation, queries, "
                             "RMA); as_symmetric's shared-storage import is not provided")
        if _ALLOCATORS[allocator_type]:
            raise ValueError(f"allocator_type={allocator_type!r} is not provided: {_ALLOCATORS[allocator_type]}; "
                             f"use 'torch'")
        if context is None:
            context = iris_fw.init(heap_size=heap_size, registries=_state().registries())
            # after the new context exists: a bootstrap that created the job's process group
            # hands it over instead of destroying it
            close_dropped()
            number = _state().add_context(context)
            self._finalizer = weakref.finalize(self, _mark_dropped, number)
            self._finalizer.atexit = False
        self.ctx = context
        self.cur_rank = context.rank
        self.num_ranks = context.world_size
        self.heap_size = context.heap_size
        # Iris hands out a tensor: the bare bases (kernels given it compile without the debug
        # pointer checks of a GPU context and without NVSHMEM calls, see iris_fw.device.DeviceHeaps)
        self.heap_bases = context.heap_bases.bases
        self.gpu_id = context.device.index if context.device.index is not None else 0
        self.device = str(context.device)
        self.allocator_type = allocator_type
        # [rank, W, heap bases…, trace buffer handle (0: tracing off)]
        self._device_context = torch.tensor([self.cur_rank, self.num_ranks] + context.transport.bases + [0],
                                            dtype=torch.int64, device=context.device)
        from ..ccl import CCL
        from .memory import SymmetricHeap
        from .tracing import Tracing

        # the namespaces refer back weakly: no reference cycle, so `del shmem` drops the object at once
        me = weakref.proxy(self)
        self.ccl = CCL(me)
        self._ops = None
        self.heap = SymmetricHeap(me)
        self.tracing = Tracing(me)
        #: device-barrier state by group (None: every rank), as Iris keeps it: the int64 arrival
        #: slots the barrier of that group advances on this rank's heap (filled by device_barrier)
        self._device_barrier_state: dict = {}
        self._log(_logging.DEBUG, f"init: heap_size={heap_size} rank={self.cur_rank}/{self.num_ranks} "
                                 f"allocator={allocator_type} device={self.device}")

    # ---- queries -----------------------------------------------------------------------------
    def get_rank(self) -> int:
        return self.cur_rank

    def get_num_ranks(self) -> int:
        return self.num_ranks

    def get_heap_bases(self) -> torch.Tensor:
        """Every rank's heap base as mapped here, int64 ``[num_ranks]`` on the device."""
        return self.heap_bases

    def get_device(self) -> torch.device:
        return self.ctx.device

    def get_device_id(self) -> int:
        return self.gpu_id

    def get_cu_count(self) -> int:
        """Compute units (SMs) of this rank's GPU; on CPU ranks the interpreter's program count."""
        return _devinfo.num_sms(self.ctx.device)

    def get_device_context(self) -> torch.Tensor:
        """``[rank, world_size, heap_base_0, …]`` (int64 on the device) for
        ``iris.DeviceContext.initialize``."""
        return self._device_context

    @property
    def ops(self):
        """Fused GEMM + collective operations (:mod:`iris.ops`) bound to this object."""
        if self._ops is None:
            from ..ops import OpsNamespace

            self._ops = OpsNamespace(weakref.proxy(self))
        return self._ops

    # ---- synchronization -----------------------------------------------------------------------
    def barrier(self, stream=None, group=None) -> None:
        """Wait for this rank's device work (``stream``'s only, if given), then for every rank
        (of ``group``, a torch ``ProcessGroup``, if given). Raises :class:`iris_fw.WaitTimeout`
        if a device-side wait gave up."""
        self._log(_logging.DEBUG, "barrier: start")
        if stream is not None:
            stream.synchronize()
        if group is None:
            self.ctx.barrier()
            return
        import torch.distributed as dist

        self.ctx.synchronize()
        dist.barrier(group=group)

    def device_barrier(self, group=None) -> None:
        """A device-side (graph-capturable) barrier of every rank, or of ``group``'s ranks.
        ``_device_barrier_state[group]`` is then the barrier's arrival slots on this rank's heap
        (int64, one per rank of the group; the same tensor on every call): iris-fw's world
        barrier keeps them in the heap header, a group's barrier in the group's workspace."""
        if group is None:
            self.ctx.device_barrier()
        else:
            iris_fw.ccl.barrier(group=group, async_op=True, ctx=self.ctx)
        if group not in self._device_barrier_state:
            self._device_barrier_state[group] = _barrier_slots(self.ctx, group)

    def _set_trace_handle(self, handle: int) -> None:
        """Put the trace buffer handle of Iris's device events into the device context."""
        self._device_context[2 + self.num_ranks] = handle

    def broadcast(self, value, src: int = 0, *, source_rank: int | None = None):
        """``src``'s value on every rank (other ranks may pass ``None``). As in Iris, tensors,
        arrays and numeric lists come back as numpy arrays; anything else as itself."""
        root = src if source_rank is None else source_rank
        self.ctx.check_rank(root, "src")
        payload = value
        if self.cur_rank == root:
            if isinstance(value, torch.Tensor):
                payload = value.detach().cpu().numpy()
            elif isinstance(value, (list, tuple)) and value and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in np.ravel(np.asarray(value, dtype=object))):
                payload = np.asarray(value)
        return self.ctx.calls.host_call(f"iris broadcast (src {root})", payload if self.cur_rank == root else None)[root]

    def broadcast_tensor(self, value, source_rank: int = 0):
        """Iris's earlier name: ``source_rank``'s tensor or array on every rank, as numpy."""
        root = self.ctx.check_rank(source_rank, "source_rank")
        payload = value.detach().cpu().numpy() if self.cur_rank == root and isinstance(value, torch.Tensor) else value
        return np.asarray(self.ctx.calls.host_call(f"iris broadcast (src {root})",
                                                   payload if self.cur_rank == root else None)[root])

    # ---- logging -------------------------------------------------------------------------------
    def _log(self, level: int, message: str) -> None:
        _log.log_with_rank(level, message, self.cur_rank, self.num_ranks)

    def debug(self, message: str) -> None:
        self._log(_logging.DEBUG, message)

    def info(self, message: str) -> None:
        self._log(_logging.INFO, message)

    def warning(self, message: str) -> None:
        self._log(_logging.WARNING, message)

    def error(self, message: str) -> None:
        self._log(_logging.ERROR, message)

    # ---- tensors: argument handling -------------------------------------------------------------
    @staticmethod
    def _parse_size(size) -> tuple[int, ...]:
        """``(2, 3)`` from ``(2, 3)``, ``((2, 3),)``, ``([2, 3],)``, ``(((2, 3),),)`` or a torch.Size."""
        while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = size[0]
        shape = tuple(int(d) if isinstance(d, (int, np.integer, torch.SymInt)) and not isinstance(d, bool) else d
                      for d in size)
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise ValueError(f"size must be non-negative ints, got {tuple(size)!r}")
        return shape

    def _check_device(self, device) -> None:
        if not _device_ok(device, self.ctx.device):
            raise RuntimeError(f"Device mismatch: requested device {device} but this rank's symmetric heap is on "
                               f"{self.ctx.device}; tensors can only be made on the heap's device")

    @staticmethod
    def _check_layout(layout) -> None:
        if layout not in (None, torch.strided):
            raise ValueError(f"Layout {layout} not supported: symmetric tensors are torch.strided")

    def _check_out(self, out, numel: int, dtype: torch.dtype) -> None:
        if not isinstance(out, torch.Tensor):
            raise RuntimeError(f"out must be a torch.Tensor on the symmetric heap, got {type(out).__name__}")
        if out.numel() != numel:
            raise RuntimeError(f"The output tensor has {out.numel()} elements, but {numel} are required")
        if out.dtype != dtype:
            raise RuntimeError(f"The output tensor has dtype {out.dtype}, but {dtype} is required")
        if not self.ctx.is_symmetric(out):
            raise RuntimeError("The output tensor is not on the symmetric heap")

    def _new(self, shape, dtype, device, out=None, memory_format=torch.contiguous_format, like=None) -> torch.Tensor:
        """A heap tensor (or ``out`` viewed as ``shape``) in ``memory_format`` (``like``'s for
        ``torch.preserve_format``); formats that do not fit the shape stay contiguous (Iris)."""
        self._check_device(device)
        numel = int(np.prod(shape, dtype=np.int64))
        if out is not None:
            self._check_out(out, numel, dtype)
            return out.view(shape)
        try:
            if memory_format == torch.preserve_format and like is not None:
                strides = torch.empty_like(like, device="meta", dtype=dtype).stride()
            else:
                strides = torch.empty(shape, device="meta", dtype=dtype, memory_format=memory_format).stride()
        except RuntimeError:  # e.g. channels_last for a tensor that is not 4-D
            strides = None
        t = self.ctx.empty(shape, dtype=dtype)
        if strides is not None and tuple(strides) != t.stride():
            t = torch.as_strided(t.view(-1), shape, strides)
        return t

    def _finish(self, t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        return self._settle(t.requires_grad_() if requires_grad else t)

    def _settle(self, t: torch.Tensor) -> torch.Tensor:
        """Iris's allocations are collective: each ends in a barrier of every rank (its heap
        refreshes peer access, ``torch.distributed.barrier()``), and Iris programs rely on it —
        e.g. a consumer zeroes its flags with ``shmem.zeros`` and the producer, on another rank,
        signals them right after its own ``shmem.zeros`` returns, with no barrier in between.
        iris-fw's allocations are local, so every factory here ends the same way, after the new
        tensor is initialized: this rank's device work is done, then every rank meets (a
        bounded host barrier). A signal sent after a factory returned can no longer be wiped
        by the receiver's initialization."""
        ctx = self.ctx
        if ctx.world_size > 1 and not (ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            ctx.transport.synchronize()
            ctx.calls.host_call("iris allocation")  # bounded, with the call's identity
        return t

    # ---- tensors: factories --------------------------------------------------------------------
    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
              pin_memory=False, memory_format=torch.contiguous_format):
        """Uninitialized symmetric tensor, like ``torch.empty``."""
        self._check_layout(layout)
        t = self._new(self._parse_size(size), dtype or torch.get_default_dtype(), device, out, memory_format)
        return self._finish(t, requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        t = self._new(self._parse_size(size), dtype or torch.get_default_dtype(), device, out)
        return self._finish(t.zero_(), requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        t = self._new(self._parse_size(size), dtype or torch.get_default_dtype(), device, out)
        return self._finish(t.fill_(1), requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False):
        """Like ``torch.full``: the dtype follows ``fill_value`` when not given (bool → bool,
        int → int64, float → the default dtype, complex → its complex counterpart)."""
        self._check_layout(layout)
        if dtype is None:
            dtype = torch.full((), fill_value).dtype
        t = self._new(self._parse_size((size,)), dtype, device, out)
        return self._finish(t.fill_(fill_value), requires_grad)

    def zeros_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        """Zeros shaped like ``input`` (its dtype and memory format unless given)."""
        self._check_layout(layout if layout is not None else input.layout)
        t = self._new(tuple(input.shape), dtype or input.dtype, device if device is not None else input.device,
                      memory_format=memory_format, like=input)
        return self._finish(t.zero_(), requires_grad)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False):
        self._check_layout(layout)
        t = self._new(self._parse_size(size), dtype or torch.get_default_dtype(), device, out)
        return self._finish(t.normal_(generator=generator), requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False):
        """Uniform on [0, 1), like ``torch.rand``."""
        self._check_layout(layout)
        t = self._new(self._parse_size(size), dtype or torch.get_default_dtype(), device, out)
        return self._finish(t.uniform_(0, 1, generator=generator), requires_grad)

    def randint(self, *args, low=None, high=None, size=None, generator=None, out=None, dtype=None,
                layout=torch.strided, device=None, requires_grad=False):
        """Like ``torch.randint``: ``randint(high, size)``, ``randint(low, high, size)`` (or the
        keywords); int64 unless ``dtype`` is given."""
        self._check_layout(layout)
        given = tuple(args) + tuple(v for v in (low, high, size) if v is not None)
        try:
            lo, hi, shape = iris_fw.Context.randint_args(given)
        except TypeError as exc:  # Iris raises ValueError for a wrong argument count
            raise ValueError(str(exc)) from None
        shape = self._parse_size(tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else (shape,))
        t = self._new(shape, dtype or torch.int64, device, out)
        return self._finish(t.random_(lo, hi, generator=generator), requires_grad)

    def uniform(self, size, low=0.0, high=1.0, dtype=torch.float):
        """Uniform on [low, high)."""
        shape = self._parse_size(size if isinstance(size, (tuple, list, torch.Size)) else (size,))
        return self._settle(self._new(shape, dtype, None).uniform_(low, high))

    def arange(self, start=0, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False):
        """``arange(end)`` or ``arange(start, end, step)`` (fractional and negative steps, dtype
        inferred as torch does). ``step == 0`` or a step pointing away from ``end`` raises
        ``ValueError``; ``start == end`` gives an empty tensor. With ``out=``, returns ``out``."""
        self._check_layout(layout)
        self._check_device(device)
        if end is None:
            start, end = 0, start
        if step == 0:
            raise ValueError("step must be non-zero")
        if (step > 0 and start > end) or (step < 0 and start < end):
            raise ValueError(f"Invalid range: start={start}, end={end} is inconsistent with step={step}")
        values = torch.arange(start, end, step, dtype=dtype, device=self.ctx.device)
        if out is not None:
            self._check_out(out, values.numel(), values.dtype)
            out.view(-1).copy_(values)
            return self._finish(out, requires_grad)
        t = self._new(tuple(values.shape), values.dtype, None)
        return self._finish(t.copy_(values), requires_grad)

    def linspace(self, start, end, steps, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False):
        """``steps`` points from ``start`` to ``end`` inclusive; ``steps`` may be an int or a
        (nested) one-element tuple/list (Iris). Complex bounds give a complex dtype."""
        self._check_layout(layout)
        while isinstance(steps, (tuple, list, torch.Size)):
            steps = int(np.prod(steps)) if len(steps) != 1 else steps[0]
        steps = int(steps)
        start, end = (v.item() if isinstance(v, torch.Tensor) else v for v in (start, end))
        if dtype is None:
            dtype = torch.linspace(start, end, 1 if steps else 0, device="meta").dtype
        t = self._new((steps,), dtype, device, out)
        torch.linspace(start, end, steps, out=t)
        return self._finish(t, requires_grad)

    # ---- symmetric memory ------------------------------------------------------------------------
    def as_symmetric(self, external_tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``external_tensor`` on the symmetric heap (Iris's torch allocator copies too;
        shared storage needs its HIP virtual-memory allocator: with ``allocator_type='vmem'``
        this raises ``NotImplementedError`` rather than copy)."""
        if self.allocator_type == "vmem":
            raise NotImplementedError(_VMEM_IMPORT)
        return self._settle(self.ctx.as_symmetric(external_tensor))

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        return self.ctx.is_symmetric(tensor)

    def allocate(self, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat uninitialized heap tensor of ``num_elements`` (Iris's earlier public name)."""
        return self._settle(self.ctx.empty(int(num_elements), dtype=dtype))

    # Iris's private names, used by Iris's own tests (``shmem._Iris__allocate`` …).
    def __allocate(self, num_elements, dtype):
        return self.allocate(num_elements, dtype)

    def __on_symmetric_heap(self, tensor) -> bool:
        return self.is_symmetric(tensor)

    def __deallocate(self, pointer) -> None:
        """Blocks return to the heap when their tensors die (collectively reclaimed)."""


def _barrier_slots(ctx, group) -> torch.Tensor:
    """The arrival slots the device barrier of ``group`` (None: the world) advances on this rank."""
    if group is None:
        from iris_fw import device as _dev
        from iris_fw.core import header_bytes

        first = _dev.HDR_BARRIER_SLOTS.value
        return ctx.transport.heap[:header_bytes(ctx.world_size)].view(torch.int64)[first:first + ctx.world_size]
    from iris_fw.ccl import algorithm as _al
    from iris_fw.ccl import api as _api

    g = _api.group_of(ctx, group)
    _, bufs = _al.kernel_config(g, ("barrier",), _api._barrier_kernel, nprog=1, constexprs={}, slots=g.size,
                                tracer=None)
    return bufs[0]


def iris(heap_size: int = 1 << 30, allocator_type: str = "torch") -> Iris:
    """Create the Iris host object (collective: every rank calls it)."""
    return Iris(heap_size, allocator_type)


def get_device_id_for_rank(rank: int) -> int:
    """The GPU of ``rank`` on its node: ``rank`` modulo the visible GPUs (0 without GPUs)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return rank % count if count else 0
