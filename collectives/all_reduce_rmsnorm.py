"""Fused all-reduce + residual add + RMSNorm (``ccl.all_reduce_rmsnorm``): ``lamport``, ``one_shot``.

What every tensor-parallel transformer layer runs after its row-parallel GEMM, in ONE kernel
per call (no separate all-reduce launch)::

    h        = all_reduce(x) + residual          # x, residual: [T, H]; summed in fp32
    residual = h                                 # in place: the new residual (vLLM / TRT-LLM)
    out      = h * rsqrt(mean(h^2, -1) + eps) * weight       # weight: [H]; fp32, stored as x

**Work decomposition.** A row is ``H`` elements; its columns are cut into tiles of ``BLOCK``
elements (the next power of two of ``H``, at least one element a thread, at most one 4 KiB tile:
:func:`column_block`). A *work item* is a segment of ``seg`` columns (whole tiles) of one row;
each row has ``segments`` of them (``segments * seg >= H``). The host picks ``segments = 1`` when
there are enough rows to keep every program busy, and splits the hidden dim otherwise (``T`` of 1
… a few tokens, ``H`` large): about ``programs / T`` segments per row, so a decode step's push is
spread over as many programs as an all-reduce of the same bytes would use. Programs take the items
``pid, pid + programs, …`` (the same mapping on every rank):

1. push: each item's slice of ``x`` goes to every rank's receive slot of this rank
   (``recv``: symmetric ``[2, W, CAP]`` by call parity, row ``r`` at ``r * H``);
2. wait — ``lamport``: the data is its own flag (:func:`iris_fw.tilecomm.lamport_reduce`
   polls and clears it); ``one_shot``: one arrival per program and epoch (works for any
   dtype; the fallback) — then reduce in rank order (bitwise the same on every rank), add the
   residual, store the new residual and accumulate the item's sum of squares (fp32);
3. norm: with one segment per row the program normalizes its row itself; with several, each
   stores its partial sum of squares and counts itself done on the row's counter (a local
   atomic); the *last* segment of the row to finish adds the partials in segment order
   (deterministic) and normalizes the whole row, re-reading ``h`` from ``residual``. No
   program ever waits for another program of the same launch (they need not run together).

When the row fits one tile (``H <= BLOCK``, e.g. ``H`` up to 1024 in fp32), ``h`` stays in
registers and the row is normalized without the re-read.

**Trade-off of the split.** Splitting a row over ``segments`` programs spreads the push and
the reduction (what bounds latency at 1 … few tokens) at the price of a second pass over the
row by one program (``H`` elements re-read from ``residual``, ``H`` written to ``out``), a
local atomic and ``segments`` partials per row. Without it, one program would push all ``H``
elements of a decode token to every rank alone. With many rows nothing is split and each
program does its rows in one pass (two when ``H > BLOCK``: the re-read comes from L2).

**Numerics.** The all-reduce sum (rank order) and ``+ residual`` are fp32 (fp32 inputs: fp32
throughout), with no rounding between them; ``residual`` stores ``h`` rounded to its dtype; the
sum of squares is of the unrounded fp32 ``h``, and ``out`` is the *stored* residual times
``rsqrt(mean + eps) * weight`` in fp32, rounded once to ``out``'s dtype (what vLLM's
``fused_add_rms_norm`` computes, without its rounding of the all-reduce result). Every rank's
``out`` and ``residual`` are bitwise equal when the ranks' ``residual`` and ``weight`` are.

Rows beyond one capacity class of the workspace (``CAP // H`` rows) go in several launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_fw import devinfo
from iris_fw import tilecomm as tc
from iris_fw import trace as tr
from iris_fw.ccl import algorithm as al
from iris_fw.ccl.group import WorkspaceFull
from iris_fw.collectives import all_reduce as _ar
from iris_fw.hookspecs import hookimpl

#: dtypes of ``x`` (and of ``out``): the norm is a floating-point op.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def column_block(hidden: int, dtype: torch.dtype) -> int:
    """Elements of a column tile: the next power of two of ``hidden``, at most one
    :data:`~iris_fw.ccl.algorithm.TILE_BYTES` tile of ``dtype``, and at least as many as the
    program has threads on any GPU (:data:`~iris_fw.ccl.algorithm.NUM_WARPS` warps of
    :data:`~iris_fw.devinfo.WIDEST_WARP`; a shorter row masked): the Lamport poll's tile must
    give each lane to one thread (:mod:`iris_fw.tilecomm`)."""
    threads = al.NUM_WARPS * devinfo.WIDEST_WARP
    return min(max(triton.next_power_of_2(max(hidden, 1)), threads), al.block_elems(dtype))


def split(rows: int, hidden: int, block: int, nprog: int) -> tuple[int, int]:
    """``(segments, seg)``: items per row and columns per item (whole tiles, no empty
    segment). One segment per row unless fewer rows than programs: then about
    ``nprog // rows`` per row, at most one per tile."""
    tiles = triton.cdiv(hidden, block)
    want = max(1, min(tiles, nprog // max(rows, 1)))
    per = triton.cdiv(tiles, want)
    return triton.cdiv(tiles, per), per * block


# ---- device helpers -------------------------------------------------------------------------------


@triton.jit
def _add_residual(acc, res_ptrs, mask):
    """``h = acc + residual`` in fp32 (``acc``: the reduced tile in the accumulator type);
    returns ``(h rounded to the residual's dtype, the sum of squares of h)``."""
    h = acc.to(tl.float32) + tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
    h = tl.where(mask, h, 0.0)
    return h.to(res_ptrs.dtype.element_ty), tl.sum(h * h, axis=0)


@triton.jit
def _rstd(ssq, hidden, eps):
    """``rsqrt(ssq / hidden + eps)`` in fp32."""
    return 1.0 / tl.sqrt(ssq / hidden + eps)


@triton.jit
def _normalize_row(res_row, weight, out_row, ssq, hidden, eps, BLOCK: tl.constexpr):
    """``out_row[:hidden]`` = ``res_row[:hidden]`` (the new residual ``h``, re-read past L1:
    other programs of this launch may have written it) ``* rsqrt(ssq / hidden + eps) * weight``."""
    rstd = _rstd(ssq, hidden, eps)
    for c in range(0, hidden, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        mask = offs < hidden
        h = tl.load(res_row + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        w = tl.load(weight + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + offs, (h * rstd * w).to(out_row.dtype.element_ty), mask=mask)


@triton.jit
def _finish_segment(res_row, weight, out_row, partials, row_counters, row, s, segments, ssq, ok,
                    hidden, eps, BLOCK: tl.constexpr):
    """Segment ``s`` of row ``row`` has stored its part of the new residual, with sum of
    squares ``ssq``: normalize the row if it is the row's only segment, else record ``ssq``
    (NaN if a wait timed out) in ``partials[row * segments + s]`` and, if it is the row's last
    segment to get here, add the partials in segment order and normalize the row. The row's
    counter (local int64, 0 between calls) is reset by that last segment."""
    if segments == 1:
        tl.debug_barrier()  # every thread's residual stores before the re-read
        if ok:
            _normalize_row(res_row, weight, out_row, ssq, hidden, eps, BLOCK)
    else:
        tl.store(partials + row * segments + s, tl.where(ok != 0, ssq, float("nan")))
        tl.debug_barrier()  # every thread's stores before the release
        done = tl.atomic_add(row_counters + row, 1, sem="acq_rel", scope="gpu")
        tl.debug_barrier()
        if done == segments - 1:
            tl.store(row_counters + row, 0)
            total = tl.load(partials + row * segments, volatile=True)
            for p in range(1, segments):
                total += tl.load(partials + row * segments + p, volatile=True)
            _normalize_row(res_row, weight, out_row, total, hidden, eps, BLOCK)


@triton.jit
def _one_tile_row(acc, ok, res_row, weight, out_row, hidden, eps, BLOCK: tl.constexpr):
    """A row that fits one tile (``hidden <= BLOCK``), reduced into ``acc``: add the residual,
    store it, normalize in registers, store ``out``."""
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    stored, ssq = _add_residual(acc, res_row + offs, mask)
    w = tl.load(weight + offs, mask=mask, other=0.0).to(tl.float32)
    y = stored.to(tl.float32) * _rstd(ssq, hidden, eps) * w
    if ok:
        tl.store(res_row + offs, stored, mask=mask)
        tl.store(out_row + offs, y.to(out_row.dtype.element_ty), mask=mask)


# ---- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _lamport_rmsnorm_kernel(x, weight, out, residual, recv, partials, row_counters, counters,
                            rows, hidden, segments, seg, eps, rank, world_size, heap_bases, trace,
                            BLOCK: tl.constexpr, CAP: tl.constexpr, ONE_TILE: tl.constexpr,
                            TRACE: tl.constexpr = 0):
    """``x``, ``residual``, ``out``: ``[T, H]`` with ``T = rows``, ``H = hidden`` (contiguous,
    local); ``weight``: ``[H]``. ``recv``: symmetric ``[2, world_size, CAP]`` holding the empty
    pattern wherever no data is in flight (``rows * hidden <= CAP``); ``partials``: local fp32
    ``[rows * segments]``; ``row_counters``: local int64 ``[rows]``, zero; ``counters``: int64
    ``[programs]``. ``segments`` items of ``seg`` columns per row (see the module docstring)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * world_size * CAP
    items = rows * segments
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for item in range(pid, items, nprog):
        row = item // segments
        lo = (item % segments) * seg
        hi = tl.minimum(lo + seg, hidden)
        for c in range(lo, hi, BLOCK):
            offs = row * hidden + c + tl.arange(0, BLOCK)
            mask = c + tl.arange(0, BLOCK) < hi
            tc.lamport_put_all(x + offs, buf + rank * CAP + offs, rank, world_size, heap_bases, mask=mask)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                       _share(rows, hidden, segments, seg) * (world_size - 1) * (x.dtype.element_ty.primitive_bitwidth // 8))
        t0 = tr.record_start(trace, TRACE)
    for item in range(pid, items, nprog):
        row = item // segments
        s = item % segments
        res_row = residual + row * hidden
        out_row = out + row * hidden
        if ONE_TILE:
            offs = tl.arange(0, BLOCK)
            acc, ok = tc.lamport_reduce(buf + row * hidden + offs, CAP, buf, rank, world_size, heap_bases,
                                        mask=offs < hidden)
            _one_tile_row(acc, ok, res_row, weight, out_row, hidden, eps, BLOCK)
        else:
            lo = s * seg
            hi = tl.minimum(lo + seg, hidden)
            ssq = 0.0
            ok = 1
            for c in range(lo, hi, BLOCK):
                cols = c + tl.arange(0, BLOCK)
                mask = cols < hi
                acc, got = tc.lamport_reduce(buf + row * hidden + cols, CAP, buf, rank, world_size, heap_bases,
                                             mask=mask)
                ok = ok & got
                stored, sq = _add_residual(acc, res_row + cols, mask)
                ssq += sq
                if got:
                    tl.store(res_row + cols, stored, mask=mask)
            _finish_segment(res_row, weight, out_row, partials, row_counters, row, s, segments, ssq, ok,
                            hidden, eps, BLOCK)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.RECEIVE, buf, rank, heap_bases)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _share(rows, hidden, segments, seg):
    """Elements of this program's items (row segments ``pid, pid + programs, …`` of ``seg``
    columns), for traces."""
    share = tr.as_i64(0)
    for item in range(tl.program_id(0), rows * segments, tl.num_programs(0)):
        lo = (item % segments) * seg
        share += tl.minimum(lo + seg, hidden) - lo
    return share


@triton.jit
def _one_shot_rmsnorm_kernel(x, weight, out, residual, recv, slots, partials, row_counters, counters,
                             rows, hidden, segments, seg, eps, rank, world_size, heap_bases, trace,
                             BLOCK: tl.constexpr, CAP: tl.constexpr, ONE_TILE: tl.constexpr,
                             TRACE: tl.constexpr = 0):
    """As :func:`_lamport_rmsnorm_kernel` with an arrival instead of data as flag: ``recv``:
    symmetric ``[2, world_size, CAP]``; ``slots``: symmetric int64 ``[programs, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * world_size * CAP
    items = rows * segments
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for item in range(pid, items, nprog):
        row = item // segments
        lo = (item % segments) * seg
        hi = tl.minimum(lo + seg, hidden)
        for c in range(lo, hi, BLOCK):
            offs = row * hidden + c + tl.arange(0, BLOCK)
            mask = c + tl.arange(0, BLOCK) < hi
            tc.tile_put_all(x + offs, buf + rank * CAP + offs, rank, world_size, heap_bases, mask=mask)
    tc.arrive(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                       _share(rows, hidden, segments, seg) * (world_size - 1) * (x.dtype.element_ty.primitive_bitwidth // 8))
        t0 = tr.record_start(trace, TRACE)
    ok = tc.wait_arrivals(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, slots + pid * world_size, rank, heap_bases)
        t0 = tr.record_start(trace, TRACE)
    for item in range(pid, items, nprog):
        row = item // segments
        s = item % segments
        res_row = residual + row * hidden
        out_row = out + row * hidden
        if ONE_TILE:
            offs = tl.arange(0, BLOCK)
            acc = tc.tile_reduce_rows(buf + row * hidden + offs, CAP, world_size, mask=offs < hidden)
            _one_tile_row(acc, ok, res_row, weight, out_row, hidden, eps, BLOCK)
        else:
            lo = s * seg
            hi = tl.minimum(lo + seg, hidden)
            ssq = 0.0
            for c in range(lo, hi, BLOCK):
                cols = c + tl.arange(0, BLOCK)
                mask = cols < hi
                acc = tc.tile_reduce_rows(buf + row * hidden + cols, CAP, world_size, mask=mask)
                stored, sq = _add_residual(acc, res_row + cols, mask)
                ssq += sq
                if ok:
                    tl.store(res_row + cols, stored, mask=mask)
            _finish_segment(res_row, weight, out_row, partials, row_counters, row, s, segments, ssq, ok,
                            hidden, eps, BLOCK)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


# ---- algorithms -----------------------------------------------------------------------------------


class _AllReduceRMSNorm(al.Algorithm):
    """Plans a call (an :class:`iris_fw.ccl.fused.NormCall`): ``run((x, weight), (out,
    residual))`` launches one kernel per ``CAP // H`` rows."""

    collective = "all_reduce_rmsnorm"
    kernel = None
    needs_slots = True

    def supports(self, call):
        if call.dtype not in DTYPES:
            return False, f"dtype {call.dtype} is not one of {', '.join(map(str, DTYPES))}"
        return True, ""

    def fill(self, buffers: list) -> bool:
        return False

    def plan(self, group, call):
        hidden = call.hidden
        row_bytes = hidden * call.element_size
        if row_bytes > al.max_chunk(group, self):
            raise WorkspaceFull(f"all_reduce_rmsnorm: a row of {hidden} elements ({row_bytes} bytes) exceeds the "
                                f"largest receive buffer of the group's workspace ({al.max_chunk(group, self)} "
                                f"bytes); create the group with a larger workspace_bytes")
        cap = al.capacity(group, self, call.nbytes) // call.element_size
        block = column_block(hidden, call.dtype)
        nprog = al.programs(group, cap, al.block_elems(call.dtype))
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), self.kernel, nprog=nprog,
            constexprs=dict(BLOCK=block, CAP=cap, ONE_TILE=hidden <= block),
            buffers=[(2 * group.size * cap, call.dtype, "receive buffer")],
            slots=group.size if self.needs_slots else 0, fill=self.fill)
        recv, *sync, counters = bufs
        rows_total = call.numel // hidden
        per_launch = cap // hidden
        launches = []  # (first row, rows, segments, seg)
        for first in range(0, rows_total, per_launch):
            rows = min(per_launch, rows_total - first)
            launches.append((first, rows, *split(rows, hidden, block, nprog)))
        dev = group.ctx.device
        partials = torch.zeros(max([r * s for _, r, s, _ in launches] or [1]), dtype=torch.float32, device=dev)
        row_counters = torch.zeros(max([r for _, r, _, _ in launches] or [1]), dtype=torch.int64, device=dev)
        head = (recv, *sync, partials, row_counters, counters)
        rank, world, bases, eps = group.rank, group.size, group.heap_bases, float(call.eps)

        if len(launches) == 1:  # the common case: one launch, no slicing
            _, rows, segments, seg = launches[0]
            tail = (rows, hidden, segments, seg, eps, rank, world, bases)
            return lambda src, dst: launch(src[0], src[1], dst[0], dst[1], *head, *tail)

        def run(src, dst):
            x, weight = src
            out, residual = dst
            for first, rows, segments, seg in launches:
                if first:
                    o = first * hidden
                    x_, out_, res_ = x.view(-1)[o:], out.view(-1)[o:], residual.view(-1)[o:]
                else:
                    x_, out_, res_ = x, out, residual
                launch(x_, weight, out_, res_, *head, rows, hidden, segments, seg, eps, rank, world, bases)

        return run


class OneShot(_AllReduceRMSNorm):
    name = "one_shot"
    kernel = _one_shot_rmsnorm_kernel


class Lamport(_AllReduceRMSNorm):
    name = "lamport"
    kernel = _lamport_rmsnorm_kernel
    needs_slots = False
    fill = _ar.Lamport.fill  # the receive buffer holds the empty pattern


@hookimpl
def iris_fw_register_algorithms(registry):
    for algo in (OneShot(), Lamport()):
        registry.register(algo, algo.key)
