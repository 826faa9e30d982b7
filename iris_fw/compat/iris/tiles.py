"""Iris's object-style device API: ``iris.DeviceContext`` (alias ``iris.Context``), ``iris.Tile``,
``iris.TileView``, ``iris.TensorView``, ``iris.make_tensor_view``, ``iris.AllReduceConfig``.

Triton aggregates, as in Iris. Host side, ``shmem.get_device_context()`` encodes
``[rank, world_size, heap_base_0 … heap_base_{W-1}]`` (int64 on the device); in a kernel::

    ctx = iris.DeviceContext.initialize(context_tensor, rank, world_size)   # rank, world_size constexpr
    x = ctx.load(buf + offs, from_rank=1, mask=m)
    ctx.store(buf + offs, x, to_rank=1, mask=m)

Every method maps onto :mod:`iris_fw.device` (and the tile collectives onto
:mod:`iris_fw.tilecomm`'s reduction helpers) with ``rank = ctx.rank``. Lock waits are iris-fw's
bounded waits (:func:`iris_fw.device.wait_until`): a rank that never signals becomes an
:class:`iris_fw.WaitTimeout` at the next synchronization instead of a hang. Tile collectives
use iris-fw's default memory order (``acq_rel``, ``scope="sys"``) for their atomics.
``initialize(…, tracing=True)`` gives ``ctx.tracing`` (:class:`DeviceTracing`): Iris's
``record_event_start``/``record_event_end`` recorded into iris-fw's trace buffers
(:mod:`iris_fw.trace`) when the host enabled tracing (``shmem.tracing.enable()``).
"""

import triton
import triton.language as tl

from iris_fw import device as _dv
from iris_fw import tilecomm as _tc
from iris_fw import trace as _tr

from ._aggregate import aggregate


@triton.jit
def _tensor(x):
    """``x`` (an int, a constexpr or a tensor) as a tensor (int32, or wider if ``x`` is)."""
    return x + tl.zeros((), tl.int32)


@triton.jit
def tile_layout(pid_m, pid_n, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Rows ``rm [BM]``, columns ``rn [BN]`` of tile ``(pid_m, pid_n)`` of an ``[M, N]`` matrix and
    the in-bounds mask ``[BM, BN]``."""
    rm = tl.max_contiguous(tl.multiple_of(pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), BLOCK_SIZE_M),
                           BLOCK_SIZE_M)
    rn = tl.max_contiguous(tl.multiple_of(pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N), BLOCK_SIZE_N),
                           BLOCK_SIZE_N)
    return rm, rn, (rm[:, None] < M) & (rn[None, :] < N)


@aggregate
class TileView:
    """A tile's place: coordinates ``pid_m``, ``pid_n`` (tensors) and block sizes (constexpr)."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)

    @triton.jit
    def layout(self, M, N):
        """``(rm, rn, mask)`` of this tile in an ``[M, N]`` matrix."""
        return tile_layout(self.pid_m, self.pid_n, M, N, self.block_m, self.block_n)

    @triton.jit
    def indices(self):
        """``(rm [BM], rn [BN])`` without bounds checks."""
        return (self.pid_m * self.block_m + tl.arange(0, self.block_m),
                self.pid_n * self.block_n + tl.arange(0, self.block_n))


@aggregate
class Tile:
    """A :class:`TileView` with the tile's values ``data [BM, BN]`` (e.g. a GEMM result)."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data

    @triton.jit
    def layout(self, M, N):
        """``(rm, rn, mask)`` of this tile in an ``[M, N]`` matrix."""
        return tile_layout(self.pid_m, self.pid_n, M, N, self.block_m, self.block_n)

    @triton.jit
    def indices(self):
        """``(rm [BM], rn [BN])`` without bounds checks."""
        return (self.pid_m * self.block_m + tl.arange(0, self.block_m),
                self.pid_n * self.block_n + tl.arange(0, self.block_n))


@aggregate
class TensorView:
    """A strided ``[M, N]`` matrix at ``ptr`` (sizes and strides are tensors); make one in a
    kernel with :func:`make_tensor_view`."""

    ptr: tl.tensor
    M: tl.tensor
    N: tl.tensor
    stride_m: tl.tensor
    stride_n: tl.tensor

    @triton.constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = M
        self.N = N
        self.stride_m = stride_m
        self.stride_n = stride_n

    @triton.jit
    def tile_ptr_from_indices(self, rm, rn, block_m: tl.constexpr, block_n: tl.constexpr):
        """Pointers ``[BM, BN]`` at rows ``rm``, columns ``rn`` and their in-bounds mask."""
        rm = tl.max_contiguous(tl.multiple_of(rm, block_m), block_m)
        rn = tl.max_contiguous(tl.multiple_of(rn, block_n), block_n)
        mask = (rm[:, None] < self.M) & (rn[None, :] < self.N)
        return self.ptr + rm[:, None] * self.stride_m + rn[None, :] * self.stride_n, mask

    @triton.jit
    def tile_ptr(self, tile):
        """Pointers to ``tile`` (a :class:`Tile` or :class:`TileView`) and its mask."""
        rm, rn = tile.indices()
        return self.tile_ptr_from_indices(rm, rn, tile.block_m, tile.block_n)

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m=0, offset_n=0, src_mask=None):
        """Like :meth:`tile_ptr` with rows shifted by ``offset_m`` and columns by ``offset_n``;
        ``src_mask`` (optional) is and-ed into the mask."""
        rm, rn = tile.indices()
        ptrs, mask = self.tile_ptr_from_indices(rm + offset_m, rn + offset_n, tile.block_m, tile.block_n)
        if src_mask is not None:
            mask = mask & src_mask
        return ptrs, mask

    @triton.jit
    def offset(self, offset_m=0, offset_n=0):
        """The same view with its pointer moved by ``offset_m`` rows and ``offset_n`` columns."""
        return TensorView(self.ptr + offset_m * self.stride_m + offset_n * self.stride_n, self.M, self.N,
                          self.stride_m, self.stride_n)

    @triton.jit
    def number_of_tiles(self, block_m, block_n):
        """Tiles of ``block_m x block_n`` covering the matrix."""
        return tl.cdiv(self.M, block_m) * tl.cdiv(self.N, block_n)


@triton.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """A :class:`TensorView` of the ``[M, N]`` matrix at ``ptr`` with the given strides
    (ints, constexprs or tensors)."""
    return TensorView(ptr, _tensor(M), _tensor(N), _tensor(stride_m), _tensor(stride_n))


@aggregate
class AllReduceConfig:
    """Device-side all-reduce choice: ``variant_code`` (0 atomic, 1 ring, 2 one-shot, 3 two-shot,
    4 spinlock; constexpr) and ``locks_ptr``."""

    variant_code: tl.constexpr
    locks_ptr: tl.tensor

    @triton.constexpr_function
    def __init__(self, variant_code, locks_ptr):
        self.variant_code = tl.constexpr(variant_code)
        self.locks_ptr = locks_ptr


def _clock_code(_semantic=None):
    """iris-fw's ``TRACE`` constexpr for the target compiling the kernel (as
    :func:`iris_fw.trace_session.clock_mode` chooses it for a context's device): ``s_memrealtime`` for
    AMD targets, ``%globaltimer`` for NVIDIA ones, the host clock under Triton's interpreter. A
    builtin, so that the compile target — not the machine — decides (a kernel compiled for
    gfx942 on an NVIDIA host reads the AMD clock)."""
    if _semantic is None:  # the interpreter calls it as Python
        return tl.constexpr(_tr.HOST.value)
    arch = str(getattr(_semantic.builder.options, "arch", "") or "")
    return tl.constexpr(_tr.MEMREALTIME.value if arch.startswith("gfx") else _tr.GLOBALTIMER.value)


_clock_code.__triton_builtin__ = True


def _event_kind(event_id, _semantic=None):
    """The iris-fw trace kind of Iris event ``event_id`` (``iris_fw.trace.USER + event_id``); a
    builtin, like :func:`_event_role` (the compilers' dependency scan reads constexpr functions'
    bodies, and these look values up)."""
    return tl.constexpr(_tr.USER.value + tl.core._unwrap_if_constexpr(event_id))


def _event_role(event_id, _semantic=None):
    """The iris-fw role of Iris event ``event_id`` (by Iris's id ranges)."""
    from .host.tracing.events import role_of

    return tl.constexpr(role_of(tl.core._unwrap_if_constexpr(event_id)))


_event_kind.__triton_builtin__ = True
_event_role.__triton_builtin__ = True


@aggregate
class DeviceTracing:
    """``ctx.tracing``: Iris's device-side event recording over iris-fw's trace buffers.
    ``mode`` is iris-fw's ``TRACE`` constexpr (0: off, every call compiles to nothing);
    ``trace`` the buffer handle the host put into the device context (0 until
    ``shmem.tracing.enable()``: events are then dropped)."""

    mode: tl.constexpr
    trace: tl.tensor
    rank: tl.constexpr
    heap_bases: tl.tensor

    @triton.constexpr_function
    def __init__(self, mode, trace, rank, heap_bases):
        self.mode = tl.constexpr(mode)
        self.trace = trace
        self.rank = tl.constexpr(rank)
        self.heap_bases = heap_bases

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n, mask=None):
        """Start an event of Iris kind ``event_id`` (``iris.TraceEvent().put`` …) towards
        ``target_rank`` on the block of pointers ``address`` (its lowest address is kept, as a
        byte offset in this rank's heap; the payload is the lanes of ``mask`` times the element
        size). Returns the handle for :meth:`record_event_end`; nothing is written until then.
        ``pid_m`` is kept as the event's item; ``pid_n`` is not kept (one item per record)."""
        start = _tr.record_start(self.trace, self.mode)
        aux = _tr.as_i64(-1)
        nbytes = _tr.as_i64(0)
        if self.mode:
            lowest = tl.min(address.to(tl.int64))
            aux = lowest - tl.load(_dv.bases(self.heap_bases) + self.rank)
            if mask is None:
                lanes = tl.sum(tl.full(address.shape, 1, tl.int64))
            else:
                lanes = tl.sum(tl.broadcast_to(mask, address.shape).to(tl.int64))
            nbytes = lanes * (address.dtype.element_ty.primitive_bitwidth // 8)
        return (start, _tr.as_i64(_event_kind(event_id)), _tr.as_i64(_event_role(event_id)), _tr.as_i64(pid_m),
                _tr.as_i64(target_rank), nbytes, aux)

    @triton.jit
    def record_event_end(self, handle):
        """End the event ``handle`` (from :meth:`record_event_start`) now and record it."""
        if self.mode:
            start, kind, role, item, peer, nbytes, aux = handle
            if self.trace != 0:
                _tr.event(self.trace, self.mode, start, _tr.now(self.mode), kind, role, item, peer, nbytes, aux)


@aggregate
class DeviceContext:
    """This rank (``rank``, ``world_size``: constexpr) and every rank's heap base
    (``heap_bases``, an int64 pointer)."""

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing=None):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        # off: mode 0 (every record compiles to nothing); the handle field holds any tensor
        self.tracing = tracing if tracing is not None else DeviceTracing(0, heap_bases, rank, heap_bases)

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank, world_size, tracing: tl.constexpr = False):
        """The context from ``shmem.get_device_context()`` (``[rank, W, heap bases…, trace
        handle]``; ``rank``/``world_size`` constexpr). ``tracing=True``: ``ctx.tracing`` records
        into the buffer ``shmem.tracing.enable()`` made."""
        heap_bases = context_tensor + 2
        if tracing:
            handle = tl.load(context_tensor + 2 + world_size)
            events = DeviceTracing(_clock_code(), handle, rank, heap_bases)
        else:
            events = DeviceTracing(0, heap_bases, rank, heap_bases)
        return DeviceContext(rank, world_size, heap_bases, events)

    # ---- remote memory access, the caller being ``self.rank`` -------------------------------
    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = None,
             volatile: tl.constexpr = False, hint: tl.constexpr = None):
        return _dv.load(pointer, self.rank, from_rank, self.heap_bases, mask=mask, other=other,
                        cache_modifier=cache_modifier, volatile=volatile, hint=hint)

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier: tl.constexpr = None,
              hint: tl.constexpr = None):
        _dv.store(pointer, value, self.rank, to_rank, self.heap_bases, mask=mask, cache_modifier=cache_modifier,
                  hint=hint)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        _dv.get(from_ptr, to_ptr, self.rank, from_rank, self.heap_bases, mask=mask, other=other,
                load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier, hint=hint)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        _dv.put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask=mask, other=other,
                load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier, hint=hint)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
             hint: tl.constexpr = None):
        _dv.copy(src_ptr, dst_ptr, self.rank, from_rank, to_rank, self.heap_bases, mask=mask, other=other,
                 load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier, hint=hint)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                    hint: tl.constexpr = None):
        return _dv.atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                               hint=hint)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                  hint: tl.constexpr = None):
        return _dv.atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                             hint=hint)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        return _dv.atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask=mask, sem=sem, scope=scope,
                              hint=hint)

    # ---- tile collectives ---------------------------------------------------------------------
    @triton.jit
    def _tile_id(self, tile, dst_view):
        return tile.pid_m * tl.cdiv(dst_view.N, tile.block_n) + tile.pid_n

    @triton.jit
    def _wait_lock(self, lock_ptr, value, peer):
        """Wait (bounded) until ``peer``'s lock at ``lock_ptr`` equals ``value``; 1 if it did."""
        return _dv.wait_until(lock_ptr, "==", value, self.rank, peer, self.heap_bases)

    @triton.jit
    def _reduce_from_peers(self, tile, src_ptrs, mask, locks, tile_id, generation):
        """``tile.data`` plus every other rank's ``src_ptrs`` (each read once that rank's lock
        ``locks[tile_id]`` equals ``generation``), in the accumulator type of
        :func:`iris_fw.tilecomm.widen`; and 1 if every rank was ready."""
        acc = _tc.widen(tile.data)
        ready = 1
        for i in range(1, self.world_size):
            peer = (self.rank + i) % self.world_size
            ok = self._wait_lock(locks + tile_id, generation, peer)
            ready = ready & ok
            acc = _tc.combine(acc, _tc.widen(self.load(src_ptrs, peer, mask=mask)), "sum")
        return acc, ready

    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        """Add ``tile.data`` into ``dst_view``'s tile on every rank (atomics; ``dst`` starts at 0)."""
        ptrs, mask = dst_view.tile_ptr(tile)
        for i in range(0, self.world_size):
            _dv.atomic_add(ptrs, tile.data, self.rank, (self.rank + i) % self.world_size, self.heap_bases, mask=mask)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        """Read-add-write ``tile.data`` into ``dst_view``'s tile on every rank under that rank's
        lock ``locks[tile_id]`` (acquired with a bounded compare-and-swap loop)."""
        tile_id = self._tile_id(tile, dst_view)
        ptrs, mask = dst_view.tile_ptr(tile)
        bound = tl.load(_dv.heap_header(self.rank, self.heap_bases) + _dv.HDR_WAIT_BOUND)
        for i in range(0, self.world_size):
            peer = (self.rank + i) % self.world_size
            old = _dv.atomic_cas(locks + tile_id, 0, 1, self.rank, peer, self.heap_bases, sem="acquire")
            spins = bound * 0
            while (old != 0) & (spins < bound):
                old = _dv.atomic_cas(locks + tile_id, 0, 1, self.rank, peer, self.heap_bases, sem="acquire")
                spins += 1
            if old == 0:
                current = self.load(ptrs, peer, mask=mask)
                total = _tc.combine(_tc.widen(current), _tc.widen(tile.data), "sum")
                self.store(ptrs, total.to(tile.data.dtype), peer, mask=mask)
                tl.debug_barrier()
                _dv.atomic_xchg(locks + tile_id, 0, self.rank, peer, self.heap_bases, sem="release")
            else:
                _dv.record_timeout(locks + tile_id, "==", 0, old, spins, self.rank, peer, self.heap_bases)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks, generation=1):
        """``dst`` tile = ``tile.data`` + every other rank's ``src`` tile, each read once that
        rank's ``locks[tile_id]`` equals ``generation`` (its ``src`` tile is written)."""
        src_ptrs, mask = src_view.tile_ptr(tile)
        dst_ptrs, _ = dst_view.tile_ptr(tile)
        acc, _ = self._reduce_from_peers(tile, src_ptrs, mask, locks, self._tile_id(tile, dst_view), generation)
        tl.store(dst_ptrs, acc.to(tile.data.dtype), mask=mask)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks, generation=1):
        """Like :meth:`all_reduce_one_shot`, done only by the tile's owner (``tile_id % world_size``),
        which stores the sum into ``dst`` on every rank."""
        tile_id = self._tile_id(tile, dst_view)
        if tile_id % self.world_size == self.rank:
            src_ptrs, mask = src_view.tile_ptr(tile)
            dst_ptrs, _ = dst_view.tile_ptr(tile)
            acc, _ = self._reduce_from_peers(tile, src_ptrs, mask, locks, tile_id, generation)
            _tc.tile_store_all(dst_ptrs, acc.to(tile.data.dtype), self.rank, self.world_size, self.heap_bases,
                               mask=mask)

    @triton.jit
    def all_reduce_ring(self, tile, src_view, dst_view):
        """``dst`` tile = the sum of every rank's ``src`` tile (read from each rank; no flags:
        every rank's ``src`` must be complete before the kernel, as in Iris)."""
        src_ptrs, mask = src_view.tile_ptr(tile)
        dst_ptrs, _ = dst_view.tile_ptr(tile)
        acc = _tc.tile_reduce(src_ptrs, self.rank, self.world_size, self.heap_bases, mask=mask)
        tl.store(dst_ptrs, acc.to(dst_ptrs.dtype.element_ty), mask=mask)

    @triton.jit
    def all_gather(self, tile, dst_view, dim: tl.constexpr):
        """Store ``tile.data`` on every rank into ``dst_view`` (the gathered matrix) at this rank's
        block along ``dim`` (0: rows ``rank * M/W …``, 1: columns ``rank * N/W …``). Lanes outside
        this rank's block (a ragged last tile) are not written."""
        rm, rn = tile.indices()
        if dim == 0:
            rows = dst_view.M // self.world_size
            own = (rm[:, None] < rows) & (rn[None, :] < dst_view.N)
            ptrs, mask = dst_view.offset_tile_ptr(tile, offset_m=self.rank * rows, src_mask=own)
        else:
            cols = dst_view.N // self.world_size
            own = (rm[:, None] < dst_view.M) & (rn[None, :] < cols)
            ptrs, mask = dst_view.offset_tile_ptr(tile, offset_n=self.rank * cols, src_mask=own)
        _tc.tile_store_all(ptrs, tile.data, self.rank, self.world_size, self.heap_bases, mask=mask)

    @triton.jit
    def gather(self, tile, src_view, source_rank: tl.constexpr, hint: tl.constexpr = None):
        """``source_rank``'s ``src_view`` tile (masked-off lanes 0)."""
        ptrs, mask = src_view.tile_ptr(tile)
        return self.load(ptrs, source_rank, mask=mask, other=0, hint=hint)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank: tl.constexpr):
        """Column-chunked all-to-all of one output tile: output column ``c`` comes from rank
        ``c // N_per_rank``, from its input column ``rank * N_per_rank + c % N_per_rank``."""
        rm, rn = tile.indices()
        owner = rn // N_per_rank
        src_cols = self.rank * N_per_rank + rn % N_per_rank
        in_bounds = (rm[:, None] < dst_view.M) & (rn[None, :] < dst_view.N) & (rm[:, None] < src_view.M)
        src_ptrs = src_view.ptr + rm[:, None] * src_view.stride_m + src_cols[None, :] * src_view.stride_n
        dst_ptrs = dst_view.ptr + rm[:, None] * dst_view.stride_m + rn[None, :] * dst_view.stride_n
        for i in range(0, self.world_size):
            peer = (self.rank + i) % self.world_size
            mask = in_bounds & (owner[None, :] == peer)
            tl.store(dst_ptrs, self.load(src_ptrs, peer, mask=mask), mask=mask)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks):
        """Reduce-scatter by tile ranges: rank ``r`` owns tiles ``[r*T/W, (r+1)*T/W)`` of the
        ``T`` tiles (the last rank also the remainder); for an owned tile, ``dst`` = ``tile.data``
        + every other rank's ``src`` tile, each read once that rank's ``locks[tile_id]`` is 1."""
        total = tl.cdiv(dst_view.M, tile.block_m) * tl.cdiv(dst_view.N, tile.block_n)
        per_rank = total // self.world_size
        tile_id = self._tile_id(tile, dst_view)
        first = self.rank * per_rank
        last = first + per_rank
        if self.rank == self.world_size - 1:
            last = total
        if (tile_id >= first) & (tile_id < last):
            src_ptrs, mask = src_view.tile_ptr(tile)
            dst_ptrs, _ = dst_view.tile_ptr(tile)
            acc, _ = self._reduce_from_peers(tile, src_ptrs, mask, locks, tile_id, 1)
            tl.store(dst_ptrs, acc.to(tile.data.dtype), mask=mask)


#: Iris's current name for the device context.
Context = DeviceContext
