"""The contract between *pattern* plugins and *scheduler* plugins, and the kernel skeletons
the built-in schedulers are made of.

A **pattern** (GEMM + all-scatter, …) is split into tile-level ``@triton.jit`` *pieces* that
all take the pattern's runtime ``args`` tuple and its constexpr ``CFG`` tuple:

============================================  =================================================
``produce(args, tile, CFG, STAGED) -> value``  compute output tile ``tile`` (a register tile).
                                               ``STAGED``: operands that live on peers were
                                               already fetched into local staging by ``fetch``;
                                               otherwise read them from the peers directly.
``consume(args, tile, value, CFG, FROM_STASH)`` deliver the tile: the communication of
                                               compute-first patterns (stores into peers), the
                                               local epilogue of communicate-first ones.
                                               ``FROM_STASH``: ``value`` came from ``reload``
                                               (``stash`` already wrote the local part).
``stash(args, tile, value, CFG)``              keep a produced tile in HBM (unfused schedules).
``reload(args, tile, CFG) -> value``           read a stashed tile back.
``fetch(args, chunk, CFG)``                    communicate-first patterns: copy operand chunk
                                               ``chunk`` from its owner into local staging.
``depends(args, tile, CFG) -> chunk``          the chunk a tile's ``produce(STAGED=True)`` needs.
============================================  =================================================

``args[0]`` and ``args[1]`` may be TMA tensor descriptors (see :func:`kernel_args`); the other
arguments are pointers (tensors) and scalars. Tiles are numbered ``0 .. num_tiles-1`` in the order the pattern wants them produced, chunks
``0 .. num_chunks-1`` in the order they are needed. A compute-first pattern has no chunks.

A **scheduler** provides kernel skeletons that call those pieces plus the host orchestration
(streams, barriers). It never knows what a tile is. The skeletons below are the building
blocks of the four built-ins; a third-party scheduler can use them or write its own.

Synchronization inside a rank uses per-item flags in a scheduler workspace: a producer
releases ``flags[item] = epoch`` after its tile/chunk is in memory; a consumer acquires
``flags[item] >= epoch`` with :func:`iris_fw.device.wait_until` (bounded: a lost producer
becomes a :class:`~iris_fw.WaitTimeout` naming the flag, never a hang). The epoch grows by one
per call, so flags are never reset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from . import device as dv
from .errors import IrisError

# ---- workspace layout (int64 slots) ----------------------------------------------------------
QUEUE_SLOT = tl.constexpr(0)  # dynamic tile queue: a counter that only grows
FENCE_SLOT = tl.constexpr(1)  # target of the end-of-program release fence
FIRST_ITEM_SLOT = tl.constexpr(2)  # per-tile / per-chunk flags from here

_GPU = tl.constexpr("gpu")


# ---- pieces a compute-first pattern does not need ------------------------------------------------


@triton.jit
def no_fetch(args, chunk, CFG: tl.constexpr):
    """``fetch`` of a pattern with no operand chunks: does nothing."""
    pass


@triton.jit
def no_depends(args, tile, CFG: tl.constexpr):
    """``depends`` of a pattern with no operand chunks: chunk 0 (never waited for)."""
    return 0


# ---- synchronization -------------------------------------------------------------------------


@triton.jit
def release(flags, item, epoch, rank, heap_bases):
    """Publish item ``item`` of this call (epoch ``epoch``): every store this program made
    before is visible to a program that acquires it."""
    dv.signal(flags + FIRST_ITEM_SLOT + item, epoch, rank, rank, heap_bases, op="set", sem="release", scope=_GPU)


@triton.jit
def acquire(flags, item, epoch, rank, heap_bases):
    """Wait (bounded) until item ``item`` of this call is published; returns 1, or 0 on timeout."""
    return dv.wait_until(flags + FIRST_ITEM_SLOT + item, ">=", epoch, rank, rank, heap_bases, sem="acquire", scope=_GPU)


@triton.jit
def release_fence(flags):
    """Order every store this program made (to any rank) before what follows the kernel: a
    system-scope release by one thread after all threads arrive."""
    tl.debug_barrier()
    tl.atomic_add(flags + FENCE_SLOT, 0, sem="release", scope="sys")


@triton.jit
def next_tile(flags, queue_base):
    """The next tile of the dynamic queue (tiles are handed out in order), as an int32 like
    the static loops' tile indices."""
    return (tl.atomic_add(flags + QUEUE_SLOT, 1, sem="relaxed", scope="gpu") - queue_base).to(tl.int32)


# ---- roles ------------------------------------------------------------------------------------


@triton.jit
def produce_role(args, first, count, step, flags, epoch, rank, heap_bases,
                 PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr,
                 COMM_FIRST: tl.constexpr, SYNC: tl.constexpr):
    """Items ``first, first+step, …`` below ``count``: fetch chunks (communicate-first) or
    produce and stash tiles (compute-first); with ``SYNC``, release each one."""
    for item in range(first, count, step):
        if COMM_FIRST:
            FETCH(args, item, CFG)
        else:
            STASH(args, item, PRODUCE(args, item, CFG, False), CFG)
        if SYNC:
            release(flags, item, epoch, rank, heap_bases)


@triton.jit
def consume_tile(args, tile, flags, epoch, rank, heap_bases,
                 PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                 CFG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr):
    """The consumer's work on one tile: compute from staged operands and deliver it
    (communicate-first), or reload a stashed tile and send it (compute-first)."""
    if COMM_FIRST:
        if SYNC:
            acquire(flags, DEPENDS(args, tile, CFG), epoch, rank, heap_bases)
        CONSUME(args, tile, PRODUCE(args, tile, CFG, True), CFG, False)
    else:
        if SYNC:
            acquire(flags, tile, epoch, rank, heap_bases)
        CONSUME(args, tile, RELOAD(args, tile, CFG), CFG, True)


@triton.jit
def consume_role(args, first, num_tiles, step, flags, epoch, queue_base, rank, heap_bases,
                 PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                 CFG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr, QUEUE: tl.constexpr):
    """Tiles ``first, first+step, …`` (or, with ``QUEUE``, whatever the dynamic queue hands
    out) through :func:`consume_tile`."""
    if QUEUE:
        tile = next_tile(flags, queue_base)
        while tile < num_tiles:
            consume_tile(args, tile, flags, epoch, rank, heap_bases, PRODUCE, CONSUME, RELOAD, DEPENDS, CFG, COMM_FIRST, SYNC)
            tile = next_tile(flags, queue_base)
    else:
        for tile in range(first, num_tiles, step):
            consume_tile(args, tile, flags, epoch, rank, heap_bases, PRODUCE, CONSUME, RELOAD, DEPENDS, CFG, COMM_FIRST, SYNC)


# ---- kernel skeletons ---------------------------------------------------------------------------


@triton.jit
def _fused_kernel(op0, op1, rest, num_tiles, flags,
                  PRODUCE: tl.constexpr, CONSUME: tl.constexpr, CFG: tl.constexpr, NPROG: tl.constexpr):
    """Persistent: each program computes a tile and delivers it at once (it stays in registers)."""
    args = (op0, op1) + rest
    for tile in range(tl.program_id(0), num_tiles, NPROG):
        CONSUME(args, tile, PRODUCE(args, tile, CFG, False), CFG, False)
    release_fence(flags)


@triton.jit
def _producer_kernel(op0, op1, rest, count, flags, epoch, rank, heap_bases,
                     PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr,
                     NPROG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr):
    args = (op0, op1) + rest
    produce_role(args, tl.program_id(0), count, NPROG, flags, epoch, rank, heap_bases,
                 PRODUCE, STASH, FETCH, CFG, COMM_FIRST, SYNC)


@triton.jit
def _consumer_kernel(op0, op1, rest, num_tiles, flags, epoch, queue_base, rank, heap_bases,
                     PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                     CFG: tl.constexpr, NPROG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr,
                     QUEUE: tl.constexpr):
    args = (op0, op1) + rest
    consume_role(args, tl.program_id(0), num_tiles, NPROG, flags, epoch, queue_base, rank, heap_bases,
                 PRODUCE, CONSUME, RELOAD, DEPENDS, CFG, COMM_FIRST, SYNC, QUEUE)
    release_fence(flags)


@triton.jit
def _specialized_kernel(op0, op1, rest, num_tiles, num_items, flags, epoch, queue_base, rank, heap_bases,
                        PRODUCE: tl.constexpr, CONSUME: tl.constexpr, STASH: tl.constexpr, RELOAD: tl.constexpr,
                        FETCH: tl.constexpr, DEPENDS: tl.constexpr, CFG: tl.constexpr,
                        NPROG: tl.constexpr, PRODUCERS: tl.constexpr, COMM_FIRST: tl.constexpr):
    """One kernel, two roles: programs below ``PRODUCERS`` produce and release, the others
    acquire and consume. Communicate-first: the fetching programs join the (dynamic) compute
    queue once their chunks are fetched."""
    args = (op0, op1) + rest
    pid = tl.program_id(0)
    if pid < PRODUCERS:
        produce_role(args, pid, num_items, PRODUCERS, flags, epoch, rank, heap_bases,
                     PRODUCE, STASH, FETCH, CFG, COMM_FIRST, True)
        if COMM_FIRST:
            consume_role(args, 0, num_tiles, 1, flags, epoch, queue_base, rank, heap_bases,
                         PRODUCE, CONSUME, RELOAD, DEPENDS, CFG, COMM_FIRST, True, True)
    else:
        consume_role(args, pid - PRODUCERS, num_tiles, NPROG - PRODUCERS, flags, epoch, queue_base, rank,
                     heap_bases, PRODUCE, CONSUME, RELOAD, DEPENDS, CFG, COMM_FIRST, True, COMM_FIRST)
    release_fence(flags)


# ---- host side ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pieces:
    """A pattern's ``@triton.jit`` pieces (signatures in the module docstring)."""

    produce: Any
    consume: Any
    stash: Any
    reload: Any
    fetch: Any = no_fetch
    depends: Any = no_depends


@dataclass(frozen=True)
class Copy:
    """A host-side copy that feeds a communicate-first plan's chunks (for schedulers that move
    data with the copy engine instead of ``fetch``): ``dst.copy_(src)``, where ``src`` may be a
    peer's tensor (:meth:`~iris_fw.Context.peer_view`). Once it and every earlier copy of
    :attr:`Plan.copies` are done, chunks ``0 .. ready-1`` are complete."""

    dst: torch.Tensor
    src: torch.Tensor
    ready: int


@dataclass
class Plan:
    """One call of a pattern, ready for a scheduler.

    ``args`` (runtime tuple) and ``cfg`` (constexpr tuple) go to every piece. ``num_chunks``
    is 0 for compute-first patterns. ``comm_bytes`` (bytes this rank moves to or from peers)
    and ``flops`` feed the default SM split. ``finish`` (optional) runs on the host after the
    closing barrier (a local reduction, …). ``result`` is what the op returns. ``copies``
    (optional, communicate-first): the same chunks as ``fetch`` delivers, as :class:`Copy`
    steps in order.
    """

    pattern: str
    pieces: Pieces
    args: tuple
    cfg: tuple
    num_tiles: int
    num_chunks: int
    num_warps: int
    num_stages: int
    comm_bytes: int
    flops: int
    result: Any
    finish: Callable[[], Any] | None = None
    copies: list[Copy] | None = None

    @property
    def comm_first(self) -> bool:
        return self.num_chunks > 0


#: Estimates behind the default SM split (H100/H200 class): what one SM moves over NVLink with
#: plain loads/stores, and the bf16 tensor-core rate of one SM.
PER_SM_LINK_BYTES_PER_S = 25e9
PER_SM_FLOPS_PER_S = 5.5e12
#: On the CPU interpreter: programs per kernel (they run one after another).
CPU_PROGRAMS = 4


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`CPU_PROGRAMS` on the CPU)."""
    if device.type == "cpu":
        return CPU_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def persistent_programs(device: torch.device, work: int) -> int:
    """Programs of a persistent kernel over ``work`` items: at most one per SM, at least one."""
    return max(1, min(work, num_sms(device)))


def default_comm_sms(plan: Plan, sms: int) -> int:
    """Enough communication SMs to move ``plan.comm_bytes`` while the others compute, at least
    1 and at most half the SMs."""
    if sms <= 2:
        return 1
    compute_s = plan.flops / (sms * PER_SM_FLOPS_PER_S)
    need = plan.comm_bytes / max(compute_s, 1e-9) / PER_SM_LINK_BYTES_PER_S
    return int(min(max(1, math.ceil(need)), sms // 2))


@dataclass
class Workspace:
    """Per-op scheduler state: the flag array on the heap, the epoch and the queue base, and a
    side stream for schedulers that use two."""

    flags: torch.Tensor
    epoch: int = 0
    queue_base: int = 0
    side_stream: Any = None
    extra: dict = field(default_factory=dict)


class Scheduler:
    """Base of the built-in schedulers: ``run`` = barrier, :meth:`launch`, barrier, finish.

    The opening barrier makes every rank's inputs ready and its outputs free to overwrite;
    the closing one makes every rank's deliveries complete. Both are device-side (stream
    ordered, no host synchronization). Subclasses set ``name``/``description`` and implement
    :meth:`launch`.
    """

    name = ""
    description = ""
    #: whether the schedule keeps produced tiles in HBM (patterns allocate stash space)
    uses_stash = False

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, plan: Plan) -> tuple[bool, str]:
        """Whether this scheduler can run ``plan`` (and if not, why): all built-in ones run
        every pattern except ``copy_engine``, which needs :attr:`Plan.copies`."""
        return True, ""

    def workspace(self, ctx, num_items: int) -> Workspace:
        """Flags for ``num_items`` tiles or chunks (allocated on ``ctx``'s heap, zeroed)."""
        return Workspace(flags=ctx.zeros(FIRST_ITEM_SLOT.value + max(num_items, 1), dtype=torch.int64))

    def run(self, ctx, plan: Plan, ws: Workspace, comm_sms: int | None = None):
        ws.epoch += 1
        ctx.device_barrier()
        self.launch(ctx, plan, ws, comm_sms)
        ctx.device_barrier()
        if plan.finish is not None:
            plan.finish()
        return plan.result

    def launch(self, ctx, plan: Plan, ws: Workspace, comm_sms: int | None) -> None:
        raise NotImplementedError

    @staticmethod
    def split(ctx, plan: Plan, comm_sms: int | None) -> tuple[int, int]:
        """``(compute programs, communication programs)`` for the two-role schedules."""
        sms = num_sms(ctx.device)
        comm = default_comm_sms(plan, sms) if comm_sms is None else comm_sms
        if not isinstance(comm, int) or isinstance(comm, bool) or not 1 <= comm < sms:
            raise ValueError(f"comm_sms must be an int in [1, {sms - 1}] on this device ({sms} SMs), got {comm_sms!r}")
        return sms - comm, comm

    @staticmethod
    def grid_for(ctx, work: int) -> int:
        """Persistent programs for ``work`` items: at most one per SM."""
        return persistent_programs(ctx.device, work)


def launch_options(plan: Plan) -> dict:
    return {"num_warps": plan.num_warps, "num_stages": plan.num_stages}


def launch_producer(ctx, plan: Plan, ws: Workspace, nprog: int, sync: bool) -> None:
    """:func:`_producer_kernel` over the plan's chunks (communicate-first) or tiles, ``nprog``
    programs, releasing each item when ``sync``."""
    p = plan.pieces
    items = plan.num_chunks if plan.comm_first else plan.num_tiles
    _producer_kernel[(nprog,)](*kernel_args(plan), items, ws.flags, ws.epoch, ctx.rank, ctx.heap_bases,
                               PRODUCE=p.produce, STASH=p.stash, FETCH=p.fetch, CFG=plan.cfg, NPROG=nprog,
                               COMM_FIRST=plan.comm_first, SYNC=sync, **launch_options(plan))


def launch_consumer(ctx, plan: Plan, ws: Workspace, nprog: int, sync: bool, queue: bool) -> None:
    """:func:`_consumer_kernel` over the plan's tiles, ``nprog`` programs, acquiring each
    tile's item when ``sync``, taking tiles from the dynamic queue when ``queue``."""
    p = plan.pieces
    _consumer_kernel[(nprog,)](*kernel_args(plan), plan.num_tiles, ws.flags, ws.epoch, ws.queue_base, ctx.rank,
                               ctx.heap_bases, PRODUCE=p.produce, CONSUME=p.consume, RELOAD=p.reload,
                               DEPENDS=p.depends, CFG=plan.cfg, NPROG=nprog, COMM_FIRST=plan.comm_first,
                               SYNC=sync, QUEUE=queue, **launch_options(plan))


def kernel_args(plan: Plan) -> tuple:
    """``(op0, op1, rest)``: how ``plan.args`` reaches a skeleton kernel. Triton 3.6's launcher
    takes TMA descriptors only as top-level parameters, not inside a tuple, so the first two
    arguments (a pattern's two GEMM operands, descriptors or pointers) travel on their own and
    the kernel rebuilds ``args = (op0, op1) + rest``."""
    return plan.args[0], plan.args[1], tuple(plan.args[2:])


def check_tensor(t: Any, name: str, ndim: int, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` as a torch tensor with ``ndim`` dims on ``device`` (and ``dtype``), else a
    ``ValueError``/``TypeError`` naming ``name`` and what was expected."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (this rank's device), got {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype} like the other operand, got {t.dtype}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must have dtype float16, bfloat16 or float32, got {t.dtype}")
    return t


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class PatternError(IrisError, ValueError):
    """Inputs a pattern cannot run on (the message names the argument and what was expected)."""
