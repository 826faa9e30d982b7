"""Expert parallelism: MoE dispatch and combine as device-side exchanges on the symmetric heap.

``moe_dispatch(x, topk_idx, topk_weights, num_experts, *, max_tokens_per_rank, capacity=None,
dtype=None, mode="auto", ctx=None) -> Dispatched(x, counts, handle, scales)`` and
``moe_combine(expert_out, handle) -> [tokens, hidden]`` — shapes::

    x            [T, H]             this rank's tokens (T <= max_tokens_per_rank; T may differ per rank, 0 included)
    topk_idx     [T, K] int32/int64 global expert ids, -1: no expert for this slot (skipped)
    topk_weights [T, K] float       the router's weights (combine's weighted sum)
    -> x         [L, C, H]          rows received by each local expert (the first counts[l] of expert l valid)
       counts    [L] int32          rows received per local expert (on the device; at most C)
       scales    [L, C, H/128] fp32 fp8 only: each row's per-128-channel scales (x = q * scale)
    expert_out   [L, C, H]          the experts' outputs for those rows (x's dtype; rows past counts ignored)
    -> out       [T, H]             sum over k of topk_weights[t, k] * expert_out[row of (t, k)], in token order

**Placement.** ``num_experts`` ``E`` must be a multiple of the world size ``W``; rank ``r`` holds
the ``L = E / W`` experts ``r*L … r*L+L-1`` (contiguous blocks; local expert ``l`` of rank ``r``
is global expert ``r*L + l``).

**Capacity.** Each local expert has ``C`` row slots (``capacity``, default
``max_tokens_per_rank * W``: a token sends at most one row to an expert when its top-k experts are
distinct, as ``torch.topk`` gives, so nothing is dropped). A row's slot is taken with an atomic
add on the destination's per-expert counter; rows past ``C`` are *dropped*: never written, counted
(``handle.stats()``, ``handle.overflow``), and contribute zero to the combine (their source
knows: ``handle.src_slot[t, k] == -1``, complete when the dispatch has run on the stream: in
``throughput`` mode the receivers' scatter writes it and ends with a done barrier). Rows arrive
in no fixed order: slot order differs from call to call; ``handle.src_info`` says, per received
row, its source rank, token and k.

**Modes.** ``"low_latency"``: every (token, k) row is pushed straight into its expert's slot on
the destination rank (one remote atomic and one row per (token, k)). ``"throughput"``: each token
crosses once per destination *rank* (into a receive area packed by source rank and token, with
its routing row and weights), then the receiver scatters it into its experts' slots locally (two
launches); its combine sums a token's rows on each expert rank and sends one row per (token,
rank) back.
``"auto"``: by ``max_tokens_per_rank`` from ``iris_fw/tuning/moe.json``.

**fp8.** ``dtype=torch.float8_e4m3fn`` (``x`` bf16/fp16/fp32): the dispatch kernel quantizes each
token per 128-channel group (``scale = max(amax, MIN_AMAX) / 448``, ``q = x / scale`` to e4m3) and
sends the fp32 scales along (``Dispatched.scales``); the combine stays in ``x``'s dtype
(:func:`quantize_reference` is the torch reference of the same quantization).

**Synchronization.** Per call, on the device: a per-program epoch
(:func:`iris_fw.tilecomm.program_epoch`); an *entry* barrier (every program arrives, then waits,
bounded, for every rank's arrival: a rank's buffers are free once it entered the next call) and a
*done* barrier made by the last program of each rank to finish (:func:`iris_fw.tilecomm.last_program`:
no program waits for another program of its own launch, so the kernels are correct under Triton's
CPU interpreter). The done barrier's last program publishes the counts and resets the counters.
The combine pushes each received row (``low_latency``) or each token's weighted partial sum of a
rank (``throughput``) back to its source (entry and done barriers likewise), then a local kernel
sums them per token (in k order, resp. rank order: deterministic). Nothing goes through the
host, shapes are static: a dispatch/combine pair is capturable in a CUDA graph and replays with
new routing (the same tensors refilled).

**Calls.** Collective over every rank of the context. The first call of a shape class (``H``,
``K``, ``x``/``topk_idx``/``topk_weights`` dtypes, ``E``, ``max_tokens_per_rank``, ``C``, dtype,
mode: what the ranks agree on — never ``T`` or a row stride, which differ per rank and per call,
so every rank takes the same path on every call) is validated across ranks (the world group's
exchange, :meth:`iris_fw.ccl.Group.exchange`, bounded by the context's ``wait_timeout``): a
mismatch, or a rank's bad argument — a routing index outside ``[-1, E)`` included (checked on
the host on this first call) — raises on every rank. It then allocates the plan's symmetric
buffers (one exchange of the world group: a rank failing before it fails its peers there at once);
later calls are a dictionary look-up, the local checks that depend on
``T`` (:func:`check_tokens`; the combine's ``out`` rows) and one or two launches. Every call goes
through the library's one call path (:func:`iris_fw.callpath.call` /
:func:`~iris_fw.callpath.plan_call`): a host failure on a rank after the ranks agreed — planning
(allocating, launchers), a local check failing on a later call, a launch — raises on that rank
and aborts the peers' waits at once (they raise :class:`~iris_fw.PeerFailure` naming it;
``ctx.barrier()`` re-arms the job). On later calls the kernel counts invalid routing indices
(``handle.stats()["bad_indices"]``, rows skipped); in a debug context (``ctx.debug``:
``iris_fw.init(debug=True)`` or ``IRIS_FW_DEBUG=1``) that count is checked after every call on
every rank (except while a CUDA graph is captured). The returned tensors are the
plan's buffers: overwritten by its next call (a handle is valid until the next dispatch with
the same plan; :func:`moe_combine` refuses an older one).

:func:`moe_reference` (float64, from every rank's tokens, ``all_to_all`` semantics) sits beside
the op.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import triton
import triton.language as tl

from . import callpath
from . import context as _context
from . import core as _core
from . import device as dv
from . import devinfo
from . import tilecomm as tc
from . import tuning
from .engine.contract import PatternError, check_tensor
from .kernel_launcher import KernelLauncher
from .errors import ArgumentError, ArgumentTypeError

__all__ = ["MODES", "Dispatched", "MoeHandle", "MoePlan", "auto_mode", "moe_combine", "moe_dispatch", "moe_reference", "plan",
           "quantize_reference"]

#: ``mode=`` values (``"auto"`` chooses one of them by ``max_tokens_per_rank``).
MODES = ("low_latency", "throughput")
#: Token dtypes.
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Channels per fp8 scale.
FP8_GROUP = 128
#: Largest finite e4m3 value.
FP8_MAX = 448.0
#: Smallest amax a scale is made from (an all-zero group gets a tiny positive scale).
MIN_AMAX = 1e-10
#: ``handle.overflow`` slots.
STAT_DROPPED, STAT_BAD = 0, 1
#: Elements of one row chunk a program moves at a time (not fp8).
ROW_BLOCK = 1024
#: Warps of the MoE kernels.
NUM_WARPS = 4
#: Elements of a counter array one program zeroes or marks at a time.
RESET_BLOCK = 1024
#: Added to every tile counter of a fused expert GEMM's plan once a dispatch's counts are final
#: (larger than any tile's row count): see :func:`_finish_tiles`.
TILES_FINAL = 1 << 24

_FP8_MAX = tl.constexpr(FP8_MAX)
_MIN_AMAX = tl.constexpr(MIN_AMAX)
_STAT_DROPPED = tl.constexpr(STAT_DROPPED)
_STAT_BAD = tl.constexpr(STAT_BAD)
_RELAXED = tl.constexpr("relaxed")
_RELEASE = tl.constexpr("release")
_SYS = tl.constexpr("sys")
_TILES_FINAL = tl.constexpr(TILES_FINAL)
_RESET_BLOCK = tl.constexpr(RESET_BLOCK)


# ---- tuning (data) --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    return tuning.load("moe")


def auto_mode(device: torch.device, max_tokens_per_rank: int) -> str:
    """The mode ``"auto"`` picks for ``max_tokens_per_rank`` on ``device``: the device name's
    rows of ``iris_fw/tuning/moe.json``, else the device type's defaults; a row
    ``[max tokens per rank (null: any), mode]`` applies up to its bound."""
    dev = devinfo.info(device)
    return tuning.bounded(tuning.device_rows(_table(), dev.name, dev.type), max_tokens_per_rank)


# ---- device functions -----------------------------------------------------------------------------


@triton.jit
def _push_row(src, dst, scale_dst, rank, peer, heap_bases, H: tl.constexpr, BH: tl.constexpr,
              QUANT: tl.constexpr, GROUP: tl.constexpr):
    """Copy the local row ``src [H]`` to ``dst [H]`` (symmetric) on ``peer``; ``QUANT``: quantized
    to ``dst``'s fp8 type per ``GROUP`` channels, each group's fp32 scale to ``scale_dst + g``
    (symmetric) on ``peer``."""
    if QUANT:
        offs = tl.arange(0, GROUP)
        for g in range(0, tl.cdiv(H, GROUP)):
            m = g * GROUP + offs < H
            v = tl.load(src + g * GROUP + offs, mask=m, other=0.0).to(tl.float32)
            # IEEE-rounded divisions (Triton's fp32 `/` is approximate on GPUs): the scales and the
            # fp8 values are bit-for-bit torch's (`quantize_reference`)
            scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(v), axis=0), _MIN_AMAX), _FP8_MAX)
            q = tl.math.div_rn(v, tl.full(v.shape, 0, tl.float32) + scale)
            dv.store(dst + g * GROUP + offs, q.to(dst.dtype.element_ty), rank, peer, heap_bases, mask=m)
            dv.store(scale_dst + g, scale, rank, peer, heap_bases)
    else:
        offs = tl.arange(0, BH)
        for h in range(0, H, BH):
            m = h + offs < H
            dv.store(dst + h + offs, tl.load(src + h + offs, mask=m), rank, peer, heap_bases, mask=m)


@triton.jit
def _copy_row(src, dst, src_scale, dst_scale, H: tl.constexpr, BH: tl.constexpr, QUANT: tl.constexpr,
              NG: tl.constexpr, NGP: tl.constexpr):
    """Local copy of a row ``src [H]`` to ``dst [H]`` and, ``QUANT``, its ``NG`` scales."""
    offs = tl.arange(0, BH)
    for h in range(0, H, BH):
        m = h + offs < H
        tl.store(dst + h + offs, tl.load(src + h + offs, mask=m), mask=m)
    if QUANT:
        gs = tl.arange(0, NGP)
        tl.store(dst_scale + gs, tl.load(src_scale + gs, mask=gs < NG), mask=gs < NG)


@triton.jit
def _publish_counts(counters, recv_counts, stats, bad_acc, L: tl.constexpr, C: tl.constexpr, NL: tl.constexpr):
    """The last program of a dispatch: this call's counts (at most ``C``) and dropped rows from
    the per-expert ``counters`` (then zeroed for the next call), and the call's bad indices."""
    ls = tl.arange(0, NL)
    lm = ls < L
    cnt = tl.load(counters + ls, mask=lm, other=0, volatile=True)
    tl.store(recv_counts + ls, tl.minimum(cnt, C), mask=lm)
    tl.store(stats + _STAT_DROPPED, tl.sum(tl.maximum(cnt - C, 0), axis=0))
    tl.store(counters + ls, tl.zeros_like(cnt), mask=lm)
    tl.store(stats + _STAT_BAD, tl.load(bad_acc, volatile=True))
    tl.store(bad_acc, 0)


@triton.jit
def _dispatch_begin(epochs, slots, rank, world_size, heap_bases):
    """The opening every dispatch kernel shares: this program's call epoch
    (:func:`~iris_fw.tilecomm.program_epoch`), its arrival at the entry barrier ``slots`` int64
    ``[world_size]`` (symmetric) and the bounded wait for every rank's. Returns ``(epoch,
    live)``: ``live`` 0 if the wait gave up (the token loop then runs no iteration)."""
    epoch = tc.program_epoch(epochs)
    tc.arrive(slots, epoch, rank, world_size, heap_bases)
    live = tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)
    return epoch, live


@triton.jit
def _routing_row(topk_idx, topk_weights, weights, t64, stride_it, stride_wt, E: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr):
    """Token ``t64``'s routing row, read by every dispatch kernel's token loop: ``(e, w, bad)``
    with ``e [KP]`` int32 its expert ids (-1: none, an invalid id, or a lane past ``K``), ``w
    [KP]`` fp32 its weights (also copied to ``weights[t64] [K]`` for the combine) and ``bad``
    the number of invalid ids (outside ``[-1, E)``: counted, skipped)."""
    ks = tl.arange(0, KP)
    km = ks < K
    e = tl.load(topk_idx + t64 * stride_it + ks, mask=km, other=-1).to(tl.int32)
    ok = (e >= 0) & (e < E)
    bad = tl.sum(((~ok) & (e != -1) & km).to(tl.int32), axis=0)
    w = tl.load(topk_weights + t64 * stride_wt + ks, mask=km, other=0.0).to(tl.float32)
    tl.store(weights + t64 * K + ks, w, mask=km)
    return tl.where(ok, e, -1), w, bad


@triton.jit
def _signal_tile(arrived, le, slot, rank, dst, heap_bases, NT: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``TILE_ROWS > 0`` (a fused expert GEMM waits on the rows): after row ``slot`` of local
    expert ``le`` was written on ``dst``, count it in ``dst``'s ``arrived [L, NT]`` int32
    (symmetric) at the tile ``slot // TILE_ROWS``, with release order (every thread's row stores
    first): a full tile is ready when its count reaches ``TILE_ROWS``."""
    if TILE_ROWS > 0:
        tl.debug_barrier()
        dv.atomic_add(arrived + le * NT + slot // TILE_ROWS, 1, rank, dst, heap_bases, sem=_RELEASE)


@triton.jit
def _finish_tiles(arrived, L: tl.constexpr, NT: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``TILE_ROWS > 0``: after the counts of the call were published, add
    :data:`TILES_FINAL` to every local tile counter (release): a waiting GEMM tile then knows
    the call's counts are final and reads its row count from them (partial and empty tiles)."""
    if TILE_ROWS > 0:
        offs = tl.arange(0, _RESET_BLOCK)
        tl.debug_barrier()
        for i in range(0, L * NT, _RESET_BLOCK):
            tl.atomic_add(arrived + i + offs, _TILES_FINAL, mask=i + offs < L * NT, sem=_RELEASE, scope=_SYS)


# ---- kernels --------------------------------------------------------------------------------------


@triton.jit
def _dispatch_ll_kernel(x, topk_idx, topk_weights, recv_x, recv_scales, recv_src, counters, src_slot, weights,
                        recv_counts, stats, bad_acc, slots, epochs, state, arrived,
                        tokens, stride_xt, stride_it, stride_wt, rank, world_size, heap_bases,
                        H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, E: tl.constexpr, L: tl.constexpr,
                        C: tl.constexpr, TMAX: tl.constexpr, BH: tl.constexpr, QUANT: tl.constexpr,
                        GROUP: tl.constexpr, NL: tl.constexpr, NT: tl.constexpr, TILE_ROWS: tl.constexpr):
    """Low-latency dispatch: each (token, k) row straight into its expert's slot.

    ``x [tokens, H]`` (rows ``stride_xt`` apart), ``topk_idx [tokens, K]``, ``topk_weights
    [tokens, K]`` (rows ``stride_it``/``stride_wt`` apart). Symmetric: ``recv_x [L, C, H]``,
    ``recv_scales [L, C, NG]`` fp32 (``QUANT``), ``recv_src [L, C]`` int32 (``(src_rank * TMAX +
    t) * K + k`` per received row), ``counters [L]`` int32, ``slots`` int64 ``[2, world_size]``
    (entry, done), ``arrived [L, NT]`` int32 (``TILE_ROWS > 0``: rows per GEMM tile, see
    :func:`_signal_tile`). Local: ``src_slot [TMAX, K]`` int32 (the slot each of this rank's rows
    got, -1 none), ``weights [TMAX, K]`` fp32 (a copy for the combine), ``recv_counts [L]``
    int32, ``stats [2]`` int32, ``bad_acc [1]`` int32, ``epochs [programs]``, ``state [1]``
    int64."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NG: tl.constexpr = (H + GROUP - 1) // GROUP
    epoch, live = _dispatch_begin(epochs, slots, rank, world_size, heap_bases)
    ks = tl.arange(0, KP)
    bad = 0
    for t in range(pid, tokens * live, nprog):
        t64 = tl.cast(t, tl.int64)
        erow, wrow, nbad = _routing_row(topk_idx, topk_weights, weights, t64, stride_it, stride_wt, E, K, KP)
        bad += nbad
        for k in range(0, K):
            e = tl.sum(tl.where(ks == k, erow, 0), axis=0)
            slot = -1
            if e >= 0:
                dst = e // L
                le = e % L
                got = dv.atomic_add(counters + le, 1, rank, dst, heap_bases, sem=_RELAXED)
                if got < C:
                    slot = got
                    row = le.to(tl.int64) * C + got
                    _push_row(x + t64 * stride_xt, recv_x + row * H, recv_scales + row * NG, rank, dst, heap_bases,
                              H, BH, QUANT, GROUP)
                    dv.store(recv_src + row, (rank * TMAX + t) * K + k, rank, dst, heap_bases)
                    _signal_tile(arrived, le, got, rank, dst, heap_bases, NT, TILE_ROWS)
            tl.store(src_slot + t64 * K + k, slot)
    if bad > 0:
        tl.atomic_add(bad_acc, bad, sem="relaxed")
    if tc.last_program(state, nprog, epoch):
        tc.arrive(slots + world_size, epoch, rank, world_size, heap_bases)
        if tc.wait_arrivals(slots + world_size, epoch, rank, world_size, heap_bases):
            _publish_counts(counters, recv_counts, stats, bad_acc, L, C, NL)
            _finish_tiles(arrived, L, NT, TILE_ROWS)


@triton.jit
def _dispatch_pack_kernel(x, topk_idx, topk_weights, pack_x, pack_scales, pack_idx, pack_w, pack_tokens, src_slot,
                          weights, bad_acc, slots, epochs, state,
                          tokens, stride_xt, stride_it, stride_wt, rank, world_size, heap_bases,
                          H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, E: tl.constexpr, L: tl.constexpr,
                          TMAX: tl.constexpr, BH: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr):
    """Throughput dispatch, step 1: every token crosses once per destination rank that holds
    one of its experts, into ``pack_x [world_size, TMAX, H]`` (slot ``[rank, t]``; scales into
    ``pack_scales [world_size, TMAX, NG]``), its routing row into ``pack_idx [world_size, TMAX,
    K]`` (and its weights into ``pack_w``, fp32, the same shape) of *every* rank and this rank's
    token count into ``pack_tokens [world_size]`` of every
    rank (all symmetric). Rows this rank does not route (-1, or a bad index: counted) get
    ``src_slot = -1`` here; the others are set by their receiver (step 2)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NG: tl.constexpr = (H + GROUP - 1) // GROUP
    epoch, live = _dispatch_begin(epochs, slots, rank, world_size, heap_bases)
    ks = tl.arange(0, KP)
    km = ks < K
    bad = 0
    for t in range(pid, tokens * live, nprog):
        t64 = tl.cast(t, tl.int64)
        e, wrow, nbad = _routing_row(topk_idx, topk_weights, weights, t64, stride_it, stride_wt, E, K, KP)
        bad += nbad
        tl.store(src_slot + t64 * K + ks, tl.full([KP], -1, tl.int32), mask=km & (e < 0))
        dst_of = tl.where(e >= 0, e // L, -1)
        for i in range(0, world_size):
            p = (rank + i) % world_size
            at = (rank * TMAX + t64)
            dv.store(pack_idx + at * K + ks, e, rank, p, heap_bases, mask=km)
            dv.store(pack_w + at * K + ks, wrow, rank, p, heap_bases, mask=km)
            if tl.sum((dst_of == p).to(tl.int32), axis=0) > 0:
                _push_row(x + t64 * stride_xt, pack_x + at * H, pack_scales + at * NG, rank, p, heap_bases,
                          H, BH, QUANT, GROUP)
    if bad > 0:
        tl.atomic_add(bad_acc, bad, sem="relaxed")
    if tc.last_program(state, nprog, epoch):
        for i in range(0, world_size):
            dv.store(pack_tokens + rank, tokens, rank, (rank + i) % world_size, heap_bases)
        tc.arrive(slots + world_size, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(slots + world_size, epoch, rank, world_size, heap_bases)


@triton.jit
def _dispatch_scatter_kernel(pack_x, pack_scales, pack_idx, pack_tokens, recv_x, recv_scales, recv_src, counters,
                             src_slot, tok_slot, recv_counts, stats, bad_acc, slots, epochs, state, arrived, rank,
                             world_size, heap_bases,
                             H: tl.constexpr, K: tl.constexpr, L: tl.constexpr, C: tl.constexpr, TMAX: tl.constexpr,
                             BH: tl.constexpr, QUANT: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
                             NL: tl.constexpr, NT: tl.constexpr, TILE_ROWS: tl.constexpr):
    """Throughput dispatch, step 2 (local, after step 1 on this rank): every packed row of
    every source rank into its local experts' slots (a local atomic per row), its slot (or -1:
    dropped) written into the source's ``src_slot [TMAX, K]`` (symmetric) and into the local
    ``tok_slot [world_size, TMAX, K]`` (the combine's map). The last program publishes the
    counts, then makes the *done* barrier on ``slots`` int64 ``[world_size]`` (symmetric): when
    the launch ends, every peer's scatter has ended too, so this rank's ``src_slot`` (written by
    the peers) is complete. No other waits (the pack's done barrier came before). ``arrived [L,
    NT]``, ``TILE_ROWS``: as in :func:`_dispatch_ll_kernel` (local signals)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(epochs)
    for item in range(pid, world_size * TMAX, nprog):
        p = item // TMAX
        t = item % TMAX
        if t < tl.load(pack_tokens + p, volatile=True):
            at = tl.cast(item, tl.int64)
            for k in range(0, K):
                e = tl.load(pack_idx + at * K + k, volatile=True)
                if (e >= 0) & (e // L == rank):
                    le = e % L
                    got = tl.atomic_add(counters + le, 1, sem="relaxed")
                    slot = -1
                    if got < C:
                        slot = got
                        row = le.to(tl.int64) * C + got
                        _copy_row(pack_x + at * H, recv_x + row * H, pack_scales + at * NG, recv_scales + row * NG,
                                  H, BH, QUANT, NG, NGP)
                        tl.store(recv_src + row, (p * TMAX + t) * K + k)
                        _signal_tile(arrived, le, got, rank, rank, heap_bases, NT, TILE_ROWS)
                    tl.store(tok_slot + at * K + k, slot)
                    dv.store(src_slot + t * K + k, slot, rank, p, heap_bases)
    if tc.last_program(state, nprog, epoch):
        _publish_counts(counters, recv_counts, stats, bad_acc, L, C, NL)
        _finish_tiles(arrived, L, NT, TILE_ROWS)
        tc.arrive(slots, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)



@triton.jit
def _combine_push_kernel(expert_out, recv_src, recv_counts, comb, slots, epochs, state,
                         stride_el, stride_ec, rank, world_size, heap_bases,
                         H: tl.constexpr, K: tl.constexpr, L: tl.constexpr, C: tl.constexpr, TMAX: tl.constexpr,
                         BH: tl.constexpr):
    """Combine, step 1: every valid received row ``expert_out[l, s]`` (rows ``stride_ec`` apart,
    experts ``stride_el``) back to its source's slot ``(t, k)`` of ``comb [TMAX, K, H]``
    (symmetric); entry and done barriers on ``slots`` int64 ``[2, world_size]`` (symmetric)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(epochs)
    tc.arrive(slots, epoch, rank, world_size, heap_bases)
    live = tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)
    offs = tl.arange(0, BH)
    # the programs stride over every (expert, slot) pair, not over the slots of one expert at a
    # time: at decode an expert holds a few rows, so a per-expert loop left all but a few
    # programs idle (one H100, DeepSeek-V3-like decode at W = 1: low_latency 763 us vs
    # throughput 47 us per dispatch + combine, docs/performance.md 2026-11-27)
    for i in range(pid, L * C * live, nprog):
        le = i // C
        s = i % C
        if s < tl.load(recv_counts + le):
            s64 = tl.cast(s, tl.int64)
            le64 = tl.cast(le, tl.int64)
            meta = tl.load(recv_src + le64 * C + s64)
            src = meta // (TMAX * K)
            tk = (meta % (TMAX * K)).to(tl.int64)
            row = expert_out + le64 * stride_el + s64 * stride_ec
            for h in range(0, H, BH):
                m = h + offs < H
                dv.store(comb + tk * H + h + offs, tl.load(row + h + offs, mask=m), rank, src, heap_bases, mask=m)
    if tc.last_program(state, nprog, epoch):
        tc.arrive(slots + world_size, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(slots + world_size, epoch, rank, world_size, heap_bases)


@triton.jit
def _combine_reduce_kernel(comb, src_slot, weights, out, tokens, stride_ot,
                           H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr):
    """Combine, step 2 (local, after step 1): ``out[t] = sum_k weights[t, k] * comb[t, k]``
    over the rows that were not dropped (``src_slot[t, k] >= 0``), in fp32, k in one fixed
    order; ``out [tokens, H]`` rows ``stride_ot`` apart."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ks = tl.arange(0, KP)
    km = ks < K
    offs = tl.arange(0, BH)
    for t in range(pid, tokens, nprog):
        t64 = tl.cast(t, tl.int64)
        got = tl.load(src_slot + t64 * K + ks, mask=km, other=-1, volatile=True) >= 0
        w = tl.where(got, tl.load(weights + t64 * K + ks, mask=km, other=0.0), 0.0)
        for h in range(0, H, BH):
            m = h + offs < H
            rows = tl.load(comb + (t64 * K + ks)[:, None] * H + (h + offs)[None, :], mask=got[:, None] & m[None, :],
                           other=0.0)
            acc = tl.sum(rows.to(tl.float32) * w[:, None], axis=0)
            tl.store(out + t64 * stride_ot + h + offs, acc.to(out.dtype.element_ty), mask=m)


# ---- the call -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoeCall:
    """A dispatch's shape class as validated across the ranks (every field agrees)."""

    hidden: int
    topk: int
    x_dtype: torch.dtype
    idx_dtype: torch.dtype
    weights_dtype: torch.dtype
    num_experts: int
    max_tokens: int
    capacity: int
    dtype: torch.dtype
    mode: str
    world: int
    #: rows of a fused expert GEMM's tile (:mod:`iris_fw.moe_gemm`): the dispatch counts the rows
    #: of each tile as they arrive; 0: a plain dispatch
    tile_rows: int = 0
    #: at most this many programs for the dispatch kernels (0: one per SM, as the work allows)
    programs: int = 0

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.world

    @property
    def quant(self) -> bool:
        return self.dtype != self.x_dtype

    @property
    def groups(self) -> int:
        return triton.cdiv(self.hidden, FP8_GROUP)

    def fields(self, device_type: str, tokens_ok: bool) -> dict:
        return {"hidden size (x.shape[1])": self.hidden, "topk (topk_idx.shape[1])": self.topk,
                "x dtype": self.x_dtype, "topk_idx dtype": self.idx_dtype, "topk_weights dtype": self.weights_dtype,
                "num_experts": self.num_experts, "max_tokens_per_rank": self.max_tokens, "capacity": self.capacity,
                "dtype": self.dtype, "mode": self.mode, "device type": device_type,
                "fused GEMM tile rows": self.tile_rows, "dispatch programs": self.programs}


class Dispatched(NamedTuple):
    """What :func:`moe_dispatch` returns (views of the plan's buffers, overwritten by its next
    call): ``x [L, C, H]`` the rows each local expert received (the first ``counts[l]`` valid),
    ``counts [L]`` int32, ``handle`` (:class:`MoeHandle`, for :func:`moe_combine`), ``scales``
    ``[L, C, ceil(H/128)]`` fp32 (fp8 dispatch; else None): row ``x[l, s]`` is
    ``x[l, s, g*128:(g+1)*128] * scales[l, s, g]``."""

    x: torch.Tensor
    counts: torch.Tensor
    handle: "MoeHandle"
    scales: torch.Tensor | None


@dataclass
class MoeHandle:
    """The routing of one dispatch, on the device, for :func:`moe_combine`.

    ``src_info [L, C]`` int32: per received row, ``(src_rank * max_tokens_per_rank + token) *
    topk + k`` (:meth:`sources` decodes it; rows past ``counts`` are stale); ``src_slot [T, K]``
    int32: the slot each of this rank's rows got at its expert, -1 for a row not sent (index -1,
    or dropped past capacity; complete when the dispatch has run on the stream); ``weights [T,
    K]`` fp32 (the router's, copied); ``overflow [2]`` int32: rows this rank's experts dropped
    in the call (past capacity), invalid routing indices this rank passed (skipped). ``tokens``: this rank's T."""

    plan: "MoePlan"
    generation: int
    tokens: int
    counts: torch.Tensor
    src_info: torch.Tensor
    src_slot: torch.Tensor
    weights: torch.Tensor
    overflow: torch.Tensor

    def sources(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rank, token, k)`` int64 ``[L, C]`` each, of every received row (stale past counts)."""
        c = self.plan.call
        info = self.src_info.to(torch.int64)
        return info // (c.max_tokens * c.topk), info // c.topk % c.max_tokens, info % c.topk

    def stats(self) -> dict:
        """Host copy of the counters (synchronizes): ``dropped`` rows at this rank's experts,
        ``bad_indices`` this rank passed, ``received`` rows per local expert."""
        over = self.overflow.tolist()
        return {"dropped": over[STAT_DROPPED], "bad_indices": over[STAT_BAD], "received": self.counts.tolist()}


def _check_tensor(ctx, t, name: str, dims: int) -> torch.Tensor:
    """``t`` a ``dims``-d tensor on this rank's device with contiguous rows (stride 1 in its last
    dim, unless empty), else an error naming ``name``."""
    try:
        check_tensor(t, name, dims, ctx.device)
    except (ArgumentTypeError, PatternError) as exc:
        raise (ArgumentTypeError if isinstance(exc, TypeError) else ArgumentError)(f"moe_dispatch: {exc}") from None
    if t.numel() and t.stride(-1) != 1:
        raise ArgumentError(f"moe_dispatch: {name} must have contiguous rows (stride 1 in its last dim), got strides "
                            f"{list(t.stride())}")
    return t


def _positive_int(value, name: str) -> int:
    try:
        return _core.check_int(value, name, low=1)
    except (ArgumentTypeError, ArgumentError) as exc:
        raise type(exc)(f"moe_dispatch: {exc}") from None


def check_tokens(ctx, x, topk_idx, topk_weights, max_tokens: int) -> int:
    """This call's local checks that depend on the token count ``T`` (which differs per rank and
    per call, so no exchange can cover it): the three tensors ``[T, *]`` on this rank's device
    with contiguous rows, ``T <= max_tokens``. Returns ``T``."""
    _check_tensor(ctx, x, "x", 2)
    _check_tensor(ctx, topk_idx, "topk_idx", 2)
    _check_tensor(ctx, topk_weights, "topk_weights", 2)
    tokens = x.shape[0]
    if topk_idx.shape[0] != tokens or topk_weights.shape != topk_idx.shape or topk_idx.shape[1] < 1:
        raise ArgumentError(f"moe_dispatch: topk_idx and topk_weights must both be [T, K] with x's T = {tokens} and "
                            f"K >= 1, got {list(topk_idx.shape)} and {list(topk_weights.shape)}")
    if tokens > max_tokens:
        raise ArgumentError(f"moe_dispatch: x has {tokens} tokens, more than max_tokens_per_rank = {max_tokens}")
    return tokens


def check_args(ctx, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode,
               tile_rows: int = 0, programs: int = 0) -> MoeCall:
    """Validate one rank's dispatch arguments locally; the :class:`MoeCall` they describe."""
    for t, name in ((x, "x"), (topk_idx, "topk_idx"), (topk_weights, "topk_weights")):
        _check_tensor(ctx, t, name, 2)
    if x.dtype not in X_DTYPES:
        raise ArgumentTypeError(f"moe_dispatch: x has dtype {x.dtype}; supported: {', '.join(map(str, X_DTYPES))}")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        raise ArgumentTypeError(f"moe_dispatch: topk_idx must be int32 or int64, got {topk_idx.dtype}")
    if not topk_weights.dtype.is_floating_point:
        raise ArgumentTypeError(f"moe_dispatch: topk_weights must be a floating tensor, got {topk_weights.dtype}")
    hidden = x.shape[1]
    if hidden < 1:
        raise ArgumentError(f"moe_dispatch: x must have a positive hidden size, got shape {list(x.shape)}")
    world = ctx.world_size
    num_experts = _positive_int(num_experts, "num_experts")
    if num_experts % world:
        raise ArgumentError(f"moe_dispatch: num_experts ({num_experts}) must be a multiple of the world size "
                            f"({world}): each rank holds num_experts / world_size experts in one contiguous block")
    max_tokens = _positive_int(max_tokens_per_rank, "max_tokens_per_rank")
    check_tokens(ctx, x, topk_idx, topk_weights, max_tokens)
    cap = max_tokens * world if capacity is None else _positive_int(capacity, "capacity")
    if dtype is None:
        dtype = x.dtype
    if dtype not in (x.dtype, torch.float8_e4m3fn):
        raise ArgumentTypeError(f"moe_dispatch: dtype must be None (x's {x.dtype}) or torch.float8_e4m3fn, got {dtype}")
    if not isinstance(mode, str) or mode not in ("auto", *MODES):
        raise ArgumentError(f"moe_dispatch: mode must be 'auto' or one of {MODES}, got {mode!r}")
    if mode == "auto":
        mode = auto_mode(ctx.device, max_tokens)
    bad = ((topk_idx < -1) | (topk_idx >= num_experts)) if topk_idx.numel() else None
    if bad is not None and bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ArgumentError(f"moe_dispatch: topk_idx holds expert ids outside [-1, {num_experts}) (num_experts = "
                            f"{num_experts}; -1 means no expert), e.g. {int(topk_idx[where[0], where[1]])} at {where}")
    return MoeCall(hidden, topk_idx.shape[1], x.dtype, topk_idx.dtype, topk_weights.dtype, num_experts, max_tokens,
                   cap, dtype, mode, world, tile_rows, programs)


class MoePlan:
    """A dispatch/combine pair prepared for one :class:`MoeCall` (made on every rank alike after
    the validation): its symmetric buffers, local scratch and launchers. ``plan.dispatch(x,
    topk_idx, topk_weights) -> Dispatched``; ``plan.combine(expert_out, handle) -> out``."""

    def __init__(self, group, call: MoeCall):
        ctx = group.ctx
        self.ctx, self.group, self.call = ctx, group, call
        dev = ctx.device
        c = call
        L, C, H, K, W, T = c.local_experts, c.capacity, c.hidden, c.topk, c.world, c.max_tokens
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        self.generation = 0
        self.debug = bool(ctx.debug)
        # symmetric (the same sequence of allocations on every rank)
        self.recv_x = ctx.zeros(L, C, H, dtype=c.dtype)
        self.recv_scales = ctx.zeros(L, C, c.groups, dtype=f32) if c.quant else None
        self.recv_src = ctx.zeros(L, C, dtype=i32)
        self.counters = ctx.zeros(L, dtype=i32)
        # combine rows back at the source: one per (token, k), or (throughput) one per (token, rank)
        self.comb = ctx.zeros(T, K if c.mode == "low_latency" else W, H, dtype=c.x_dtype)
        self.src_slot = ctx.zeros(T, K, dtype=i32)
        # Barrier slots: dispatch entry, done; combine entry, done; scatter done. A slot holds the epoch
        # of its rank's last arrival and a wait passes at ">= epoch", so a slot array must have exactly
        # one epoch counter (two would let the call with the lower count pass at once on an older,
        # higher arrival). Here each row belongs to one kernel of this plan with one grid and one
        # counter: rows 0-1 the dispatch (low_latency's kernel or throughput's pack: one mode per plan,
        # epochs["dispatch"]), 2-3 the combine push (epochs["combine"]), 4 the scatter
        # (epochs["scatter"]). Plans never share slots: each agreed MoeCall (shapes, mode, fused tile
        # rows and programs: everything a kernel's constexprs or grid depend on) gets its own plan and
        # its own allocation, so two plans alive at once — two sizes alternating — each count their
        # own calls. The fused GEMM -> combine of iris_fw.moe_gemm has slots of its own per plan.
        self.slots = ctx.zeros(5, W, dtype=i64)
        self.tiles = triton.cdiv(C, c.tile_rows) if c.tile_rows else 1
        # rows arrived per fused-GEMM tile (peers add to it); a plain dispatch passes counters instead (unused)
        self.arrived = ctx.zeros(L, self.tiles, dtype=i32) if c.tile_rows else self.counters
        self.dispatch_slots, self.combine_slots, self.scatter_slots = self.slots[0], self.slots[2], self.slots[4]
        if c.mode == "throughput":
            self.pack_x = ctx.zeros(W, T, H, dtype=c.dtype)
            self.pack_scales = ctx.zeros(W, T, c.groups, dtype=f32) if c.quant else None
            self.pack_idx = ctx.zeros(W, T, K, dtype=i32)
            self.pack_w = ctx.zeros(W, T, K, dtype=f32)
            self.tok_slot = torch.zeros(W, T, K, dtype=i32, device=dev)
            self.pack_tokens = ctx.zeros(W, dtype=i32)
        # local
        self.weights = torch.zeros(T, K, dtype=f32, device=dev)
        self.recv_counts = torch.zeros(L, dtype=i32, device=dev)
        self.stats = torch.zeros(2, dtype=i32, device=dev)
        self.bad_acc = torch.zeros(1, dtype=i32, device=dev)
        cap = c.programs or W * T
        self.nprog = devinfo.persistent_programs(dev, min(T, cap))
        self.nprog_scatter = devinfo.persistent_programs(dev, min(W * T, cap))
        self.nprog_combine = devinfo.persistent_programs(dev, L * C if c.mode == "low_latency" else W * T)
        self.epochs = {name: torch.zeros(n, dtype=i64, device=dev) for name, n in
                       (("dispatch", self.nprog), ("scatter", self.nprog_scatter), ("combine", self.nprog_combine))}
        self.states = {name: torch.zeros(1, dtype=i64, device=dev) for name in ("dispatch", "scatter", "combine")}
        # the combine's prepared calls by expert_out's shape class (validated across ranks when made)
        self.combines = callpath.CallCache(callpath.MAX_CACHED_CALLS)
        # the fused expert GEMMs' calls on this plan (iris_fw.moe_gemm): the dispatch GEMMs by (N, weight
        # dtype, device, schedule); the GEMM -> combine buffers (made once) and its calls by (I, dtypes)
        self.gemm_calls = callpath.CallCache(callpath.MAX_CACHED_CALLS)
        self.gemm_combine = None
        self.gemm_combines = callpath.CallCache(callpath.MAX_CACHED_CALLS)
        quant = dict(QUANT=c.quant, GROUP=FP8_GROUP)
        block = min(ROW_BLOCK, triton.next_power_of_2(H))
        nl = max(2, triton.next_power_of_2(L))
        kp = max(2, triton.next_power_of_2(K))
        common = dict(H=H, K=K, TMAX=T, BH=block)
        signal = dict(NT=self.tiles, TILE_ROWS=c.tile_rows)
        opts = dict(num_warps=NUM_WARPS)
        if c.mode == "low_latency":
            self._dispatch = KernelLauncher(_dispatch_ll_kernel, (self.nprog,), constexprs=dict(
                **common, KP=kp, E=c.num_experts, L=L, C=C, NL=nl, **quant, **signal), **opts)
        else:
            self._pack = KernelLauncher(_dispatch_pack_kernel, (self.nprog,), constexprs=dict(
                **common, KP=kp, E=c.num_experts, L=L, **quant), **opts)
            self._scatter = KernelLauncher(_dispatch_scatter_kernel, (self.nprog_scatter,), constexprs=dict(
                **common, L=L, C=C, QUANT=c.quant, NG=c.groups, NGP=max(2, triton.next_power_of_2(c.groups)), NL=nl,
                **signal), **opts)
        if c.mode == "low_latency":
            self._push = KernelLauncher(_combine_push_kernel, (self.nprog_combine,),
                                        constexprs=dict(**common, L=L, C=C), **opts)
            self._reduce = KernelLauncher(_combine_reduce_kernel, (self.nprog,),
                                          constexprs=dict(H=H, K=K, KP=kp, BH=block), **opts)
        else:
            self._push = KernelLauncher(_combine_tp_push_kernel, (self.nprog_combine,),
                                        constexprs=dict(**common, KP=kp, L=L), **opts)
            self._reduce = KernelLauncher(_combine_tp_reduce_kernel, (self.nprog,), constexprs=dict(
                H=H, K=K, KP=kp, L=L, TMAX=T, WP=max(2, triton.next_power_of_2(W)), BH=block), **opts)

    # ---- dispatch -------------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 stream=None) -> Dispatched:
        """One dispatch call on the plan (the entry :func:`moe_dispatch` caches,
        :func:`iris_fw.callpath.call`): this call's token-count checks (:func:`check_tokens`: ``T``
        differs per rank and per call, no exchange covers it), then the launch. Run under the call
        path, so a host failure in either aborts the peers (they raise
        :class:`~iris_fw.PeerFailure` naming this rank)."""
        check_tokens(self.ctx, x, topk_idx, topk_weights, self.call.max_tokens)
        return self.dispatch(x, topk_idx, topk_weights, stream)

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 stream=None) -> Dispatched:
        """Launch the dispatch on ``stream`` (a ``torch.cuda.Stream``; None: the current one)."""
        c, ctx = self.call, self.ctx
        tokens = x.shape[0]
        scales = self.recv_scales if c.quant else self.recv_x
        if c.mode == "low_latency":
            self._dispatch.launch_on(stream, x, topk_idx, topk_weights, self.recv_x, scales, self.recv_src, self.counters, self.src_slot,
                           self.weights, self.recv_counts, self.stats, self.bad_acc, self.dispatch_slots,
                           self.epochs["dispatch"], self.states["dispatch"], self.arrived, tokens, x.stride(0),
                           topk_idx.stride(0), topk_weights.stride(0), ctx.rank, ctx.world_size, ctx.heap_bases)
        else:
            pack_scales = self.pack_scales if c.quant else self.pack_x
            self._pack.launch_on(stream, x, topk_idx, topk_weights, self.pack_x, pack_scales, self.pack_idx, self.pack_w,
                       self.pack_tokens, self.src_slot, self.weights, self.bad_acc, self.dispatch_slots,
                       self.epochs["dispatch"],
                       self.states["dispatch"], tokens, x.stride(0), topk_idx.stride(0), topk_weights.stride(0),
                       ctx.rank, ctx.world_size, ctx.heap_bases)
            self._scatter.launch_on(stream, self.pack_x, pack_scales, self.pack_idx, self.pack_tokens, self.recv_x, scales,
                          self.recv_src, self.counters, self.src_slot, self.tok_slot, self.recv_counts, self.stats,
                          self.bad_acc, self.scatter_slots,
                          self.epochs["scatter"], self.states["scatter"], self.arrived, ctx.rank, ctx.world_size,
                          ctx.heap_bases)
        self.generation += 1
        handle = MoeHandle(self, self.generation, tokens, self.recv_counts, self.recv_src, self.src_slot[:tokens],
                           self.weights[:tokens], self.stats)
        if self.debug and not (ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            # the kernel's count of invalid indices, checked on every rank after every call (not
            # while a CUDA graph is captured: the check synchronizes)
            ctx.synchronize()
            bad = int(self.stats[STAT_BAD])
            error = None if not bad else ArgumentError(
                f"moe_dispatch: topk_idx held {bad} expert ids outside [-1, {c.num_experts}) (found by the dispatch "
                f"kernel in a debug context (IRIS_FW_DEBUG=1); those rows were skipped)")
            try:
                self.group.exchange("iris_fw.moe_dispatch routing check", {}, error)
            except Exception as exc:
                exc._iris_fw_told = True  # raised by every rank alike (the exchange): no abort for it
                raise
        return Dispatched(self.recv_x, self.recv_counts, handle, self.recv_scales)

    # ---- combine --------------------------------------------------------------------------------
    def combine(self, expert_out: torch.Tensor, handle: MoeHandle, out: torch.Tensor | None = None) -> torch.Tensor:
        """One combine call through the call path (:func:`iris_fw.callpath.call`): the first call
        of an ``expert_out`` shape class (or with a handle of an older dispatch) is validated
        across ranks (a rank's bad argument raises on every rank); later calls check locally
        (``out``'s rows follow this rank's token count, which differs per rank and per call) and
        launch — a host failure there, after the ranks agreed, aborts the peers' waits at once
        (they raise :class:`~iris_fw.PeerFailure` naming this rank), then raises."""
        key = ((tuple(expert_out.shape), expert_out.dtype, expert_out.device)
               if isinstance(expert_out, torch.Tensor) and handle.generation == self.generation else None)
        return callpath.call(self.ctx, self.combines, key, lambda _: self._prepare_combine(expert_out, handle, out),
                             None, "iris_fw.moe_combine", expert_out, handle, out)

    def _prepare_combine(self, expert_out, handle, out) -> Callable:
        """The miss path of a combine (:func:`iris_fw.callpath.plan_call`): checked locally, then
        the world group's exchange; the entry is :meth:`_combine`."""
        label = "iris_fw.moe_combine"

        def check():
            self._check_combine(expert_out, handle, out)
            return {}, None, None

        return callpath.plan_call(self.ctx, label, check, lambda fields, error, _: self.group.exchange(label, fields, error),
                                  lambda _state, _agreed: self._combine)

    def _check_combine(self, expert_out, handle, out) -> None:
        c, ctx = self.call, self.ctx
        if handle.generation != self.generation:
            raise ArgumentError(f"moe_combine: the handle is from dispatch #{handle.generation} of this plan, "
                                f"which was overwritten by dispatch #{self.generation} (a handle is valid until "
                                f"the next moe_dispatch with the same shapes)")
        if not isinstance(expert_out, torch.Tensor):
            raise ArgumentTypeError(f"moe_combine: expert_out must be a torch.Tensor, got {type(expert_out).__name__}")
        shape = (c.local_experts, c.capacity, c.hidden)
        if (tuple(expert_out.shape) != shape or expert_out.dtype != c.x_dtype or expert_out.device != ctx.device
                or expert_out.stride(-1) != 1):
            raise ArgumentError(f"moe_combine: expert_out must be a {list(shape)} tensor (local experts, capacity, "
                                f"hidden) of x's dtype {c.x_dtype} on {ctx.device} with contiguous rows, got "
                                f"{list(expert_out.shape)} {expert_out.dtype} on {expert_out.device} strides "
                                f"{list(expert_out.stride())}")
        if out is not None:
            want = (handle.tokens, c.hidden)
            if (not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != c.x_dtype
                    or out.device != ctx.device or (out.numel() and out.stride(-1) != 1)):
                got = (f"{list(out.shape)} {out.dtype} on {out.device} strides {list(out.stride())}"
                       if isinstance(out, torch.Tensor) else type(out).__name__)
                raise ArgumentError(f"moe_combine: out must be a {list(want)} tensor (tokens, hidden) of x's "
                                    f"dtype {c.x_dtype} on {ctx.device} with contiguous rows, got {got}")

    def _combine(self, expert_out: torch.Tensor, handle: MoeHandle, out: torch.Tensor | None = None) -> torch.Tensor:
        """The combine's cached entry: this call's local checks, then the launches."""
        c, ctx = self.call, self.ctx
        self._check_combine(expert_out, handle, out)
        if out is None:
            out = torch.empty(handle.tokens, c.hidden, dtype=c.x_dtype, device=ctx.device)
        if c.mode == "low_latency":
            self._push(expert_out, self.recv_src, self.recv_counts, self.comb, self.combine_slots,
                       self.epochs["combine"], self.states["combine"], expert_out.stride(0), expert_out.stride(1),
                       ctx.rank, ctx.world_size, ctx.heap_bases)
            self._reduce(self.comb, self.src_slot, self.weights, out, handle.tokens, out.stride(0))
        else:
            self._push(expert_out, self.pack_idx, self.pack_w, self.pack_tokens, self.tok_slot, self.comb,
                       self.combine_slots, self.epochs["combine"], self.states["combine"], expert_out.stride(0),
                       expert_out.stride(1), ctx.rank, ctx.world_size, ctx.heap_bases)
            self._reduce(self.comb, self.pack_idx, out, handle.tokens, out.stride(0), ctx.rank, ctx.world_size)
        return out

    def __repr__(self) -> str:
        c = self.call
        return (f"<MoePlan {c.mode} E={c.num_experts} L={c.local_experts} C={c.capacity} H={c.hidden} K={c.topk} "
                f"{c.x_dtype}->{c.dtype} programs={self.nprog}>")


def _key(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode, tile_rows=0,
         programs=0):
    """The cache key of a call: only what every rank of a correct program agrees on — never the
    token count ``T`` or the row strides, which differ per rank and per call (a key holding them
    would send one rank into the validation exchange while a peer hits its cache and launches).
    None: an argument the full checks must look at."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (x, topk_idx, topk_weights)):
        return None
    return ("moe", x.shape[1], x.dtype, x.device, topk_idx.shape[1], topk_idx.dtype, topk_idx.device,
            topk_weights.shape[1], topk_weights.dtype, topk_weights.device, num_experts, max_tokens_per_rank,
            capacity, dtype, mode, tile_rows, programs)


def _prepare(ctx, g, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode, tile_rows,
             programs, rejected: BaseException | None = None) -> MoePlan:
    """The miss path of a dispatch (:func:`iris_fw.callpath.plan_call`): the arguments checked
    locally and agreed across ranks (the world group's exchange: a rank's bad argument raises on
    every rank), then the plan made — or the group's plan of the same agreed call. A failure
    while making it (allocating, building the launchers), after every rank agreed, aborts the
    peers. ``rejected``: the caller's rejection of an argument of its own (reported like this
    rank's bad argument)."""
    label = "iris_fw.moe_dispatch"

    def check():
        call = check_args(ctx, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode,
                          tile_rows, programs)
        if rejected is not None:
            raise rejected
        return call.fields(ctx.device.type, True), call, None

    def make(call, _agreed) -> MoePlan:
        made = g.configs.get(("moe", call))
        if made is None:
            made = MoePlan(g, call)
            # every rank's buffers and slots are zeroed before any peer writes into them: the group's
            # exchange (it synchronizes this rank's device work first), not ctx.barrier() — a rank that
            # failed while making its plan (plan_call aborts the job: callpath.fail) never comes, and a
            # barrier, which is also how a job recovers, would wait for it and then pair with that rank's
            # re-arming ctx.barrier(); the exchange sees the failure (the rank's call board, or the
            # abort's record once the board moved on) and raises PeerFailure naming it at once
            g.sync(f"{label}: the plan's buffers zeroed")
            g.configs[("moe", call)] = made  # kept once every rank has made it
        return made

    return callpath.plan_call(ctx, label, check, lambda fields, error, _: g.exchange(label, fields, error), make)


def plan(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
         max_tokens_per_rank: int, capacity: int | None = None, dtype: torch.dtype | None = None,
         ctx: Any = None, mode: str = "auto", tile_rows: int = 0, programs: int = 0,
         rejected: BaseException | None = None) -> MoePlan:
    """The :class:`MoePlan` :func:`moe_dispatch` runs for such arguments (collective on a cache
    miss: validated across ranks, then allocated; a hit checks nothing — calling the plan,
    ``plan(x, topk_idx, topk_weights)``, checks the call's token count). ``tile_rows`` and
    ``programs`` (internal, :mod:`iris_fw.moe_gemm`): the fused expert GEMM's tile rows (0:
    none) and a cap on the dispatch kernels' programs (0: none). ``rejected`` (internal): the
    caller rejected an argument of its own (:mod:`iris_fw.moe_gemm`'s ``schedule``) — on a miss
    it goes into the validation exchange with this rank's checks (every rank raises); the caller
    passes it only where :func:`cached_plan` found no plan."""
    from .ccl import api

    ctx = _context.resolve(ctx)
    ctx._check_open()
    g = api.group_of(ctx, None)
    key = _key(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode, tile_rows,
               programs)
    made = g.calls.get(key)
    if made is None:
        made = g.calls.put(key, _prepare(ctx, g, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank,
                                         capacity, dtype, mode, tile_rows, programs, rejected))
    return made


def cached_plan(ctx, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode,
                tile_rows: int = 0, programs: int = 0) -> MoePlan | None:
    """The :class:`MoePlan` :func:`plan` has cached for these arguments, or None (a look-up:
    nothing planned, no group made)."""
    from .ccl import api

    g = api.made_world_group(ctx)
    if g is None:
        return None
    return g.calls.get(_key(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode,
                            tile_rows, programs))


def moe_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
                 max_tokens_per_rank: int, capacity: int | None = None, dtype: torch.dtype | None = None,
                 ctx: Any = None, mode: str = "auto") -> Dispatched:
    """Send each token's rows to its top-k experts (collective over every rank): returns
    :class:`Dispatched` ``(x [L, C, H], counts [L] int32, handle, scales)``. ``x [T, H]`` this rank's
    tokens (``T <= max_tokens_per_rank``, may differ per rank), ``topk_idx [T, K]`` global expert
    ids (-1: none), ``topk_weights [T, K]``; ``num_experts`` a multiple of the world size (rank
    ``r`` holds experts ``r*L … r*L+L-1``); ``capacity``: rows per local expert (default
    ``max_tokens_per_rank * world_size``; rows past it are dropped and counted); ``dtype``: None or
    ``torch.float8_e4m3fn`` (per-token-per-128-channel scales in ``scales``); ``mode``:
    ``"low_latency"``, ``"throughput"`` or ``"auto"``. See the module docstring."""
    from .ccl import api

    ctx = _context.resolve(ctx)
    ctx._check_open()
    g = api.group_of(ctx, None)
    key = _key(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank, capacity, dtype, mode)
    return callpath.call(ctx, g.calls, key,
                         lambda _: _prepare(ctx, g, x, topk_idx, topk_weights, num_experts, max_tokens_per_rank,
                                            capacity, dtype, mode, 0, 0),
                         None, "iris_fw.moe_dispatch", x, topk_idx, topk_weights)


def moe_combine(expert_out: torch.Tensor, handle: MoeHandle, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' outputs back to their tokens (collective): ``expert_out [L, C, H]`` (x's
    dtype; row ``[l, s]`` the output for the dispatch's ``x[l, s]``) → ``[T, H]`` in token order,
    ``out[t] = sum_k topk_weights[t, k] * expert_out[row of (t, k)]`` over the rows not dropped.
    ``out``: a ``[T, H]`` tensor of x's dtype to write (default a new one)."""
    if not isinstance(handle, MoeHandle):
        raise ArgumentTypeError(f"moe_combine: handle must be the MoeHandle moe_dispatch returned, got "
                                f"{type(handle).__name__}")
    return handle.plan.combine(expert_out, handle, out)


# ---- torch references -----------------------------------------------------------------------------


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dispatch's fp8 quantization in torch: ``x [N, H]`` → ``(q [N, H] float8_e4m3fn,
    scales [N, ceil(H/128)] fp32)``, per token and 128-channel group ``scale = max(amax,
    MIN_AMAX) / 448``, ``q = x / scale``."""
    n, h = x.shape
    groups = triton.cdiv(h, FP8_GROUP)
    padded = torch.zeros(n, groups * FP8_GROUP, dtype=torch.float32, device=x.device)
    padded[:, :h] = x.float()
    g = padded.view(n, groups, FP8_GROUP)
    scales = g.abs().amax(dim=2).clamp_min(MIN_AMAX) / FP8_MAX
    q = (g / scales[:, :, None]).to(torch.float8_e4m3fn).view(n, groups * FP8_GROUP)[:, :h]
    return q, scales


def moe_reference(xs: list, idxs: list, weights: list, num_experts: int,
                  expert_fn: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
                  dtype: torch.dtype = torch.float64) -> tuple[list, list]:
    """What dispatch + combine compute, in torch (``dtype``, default float64), from every rank's
    ``xs[r] [T_r, H]``, ``idxs[r] [T_r, K]``, ``weights[r] [T_r, K]`` (all_to_all semantics, no
    capacity limit). Returns ``(received, outs)``: ``received[e]`` the list of ``(rank, token,
    k)`` rows expert ``e`` gets, in (rank, token, k) order — the rows ``all_to_all_single`` with
    per-rank splits of the rows sorted by expert would deliver —, and ``outs[r] [T_r, H]`` =
    ``sum_k weights[r][t, k] * expert_fn(e, xs[r][t])`` (``expert_fn`` default: identity)."""
    fn = expert_fn or (lambda e, row: row)
    received: list = [[] for _ in range(num_experts)]
    outs = []
    for r, (x, idx, w) in enumerate(zip(xs, idxs, weights)):
        out = torch.zeros(x.shape, dtype=dtype)
        for t in range(x.shape[0]):
            for k in range(idx.shape[1]):
                e = int(idx[t, k])
                if e < 0:
                    continue
                received[e].append((r, t, k))
                out[t] += float(w[t, k]) * fn(e, x[t].to("cpu", dtype))
        outs.append(out)
    return received, outs


@triton.jit
def _combine_tp_push_kernel(expert_out, pack_idx, pack_w, pack_tokens, tok_slot, comb, slots, epochs, state,
                            stride_el, stride_ec, rank, world_size, heap_bases,
                            H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, L: tl.constexpr, TMAX: tl.constexpr,
                            BH: tl.constexpr):
    """Throughput combine, step 1: for every token ``t`` of every source rank ``p`` with an
    expert here, the weighted sum (fp32, in k order) of its rows' outputs here goes back as one
    row into ``p``'s ``comb [TMAX, world_size, H]`` (symmetric) at ``(t, rank)``: each token
    crosses once per rank, as in the dispatch. Routing, weights and slots from the dispatch
    (``pack_idx``, ``pack_w``, ``pack_tokens``, local ``tok_slot``); entry and done barriers on
    ``slots`` int64 ``[2, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(epochs)
    tc.arrive(slots, epoch, rank, world_size, heap_bases)
    live = tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)
    ks = tl.arange(0, KP)
    km = ks < K
    offs = tl.arange(0, BH)
    for item in range(pid, world_size * TMAX * live, nprog):
        p = item // TMAX
        t = item % TMAX
        if t < tl.load(pack_tokens + p, volatile=True):
            at = tl.cast(item, tl.int64)
            e = tl.load(pack_idx + at * K + ks, mask=km, other=-1)
            mine = km & (e >= 0) & (e // L == rank)
            if tl.sum(mine.to(tl.int32), axis=0) > 0:
                sl = tl.load(tok_slot + at * K + ks, mask=mine, other=-1)
                use = mine & (sl >= 0)
                w = tl.where(use, tl.load(pack_w + at * K + ks, mask=use, other=0.0), 0.0)
                rows = (expert_out + tl.where(use, e % L, 0).to(tl.int64) * stride_el
                        + tl.where(use, sl, 0).to(tl.int64) * stride_ec)
                dst = comb + (tl.cast(t, tl.int64) * world_size + rank) * H
                for h in range(0, H, BH):
                    m = h + offs < H
                    tile = tl.load(rows[:, None] + (h + offs)[None, :], mask=use[:, None] & m[None, :], other=0.0)
                    acc = tl.sum(tile.to(tl.float32) * w[:, None], axis=0)
                    dv.store(dst + h + offs, acc.to(comb.dtype.element_ty), rank, p, heap_bases, mask=m)
    if tc.last_program(state, nprog, epoch):
        tc.arrive(slots + world_size, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(slots + world_size, epoch, rank, world_size, heap_bases)


@triton.jit
def _combine_tp_reduce_kernel(comb, pack_idx, out, tokens, stride_ot, rank, world_size,
                              H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, L: tl.constexpr,
                              TMAX: tl.constexpr, WP: tl.constexpr, BH: tl.constexpr):
    """Throughput combine, step 2 (local): ``out[t]`` = the sum, in rank order, of the rows
    ``comb[t, r]`` of the ranks ``r`` holding one of token ``t``'s experts (its routing row is
    this rank's own row of ``pack_idx``)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ks = tl.arange(0, KP)
    km = ks < K
    rs = tl.arange(0, WP)
    offs = tl.arange(0, BH)
    for t in range(pid, tokens, nprog):
        t64 = tl.cast(t, tl.int64)
        e = tl.load(pack_idx + (rank * TMAX + t64) * K + ks, mask=km, other=-1)
        hit = (e[None, :] >= 0) & (e[None, :] // L == rs[:, None]) & km[None, :]
        sent = (tl.sum(hit.to(tl.int32), axis=1) > 0) & (rs < world_size)
        for h in range(0, H, BH):
            m = h + offs < H
            tile = tl.load(comb + (t64 * world_size + rs)[:, None] * H + (h + offs)[None, :],
                           mask=sent[:, None] & m[None, :], other=0.0)
            tl.store(out + t64 * stride_ot + h + offs, tl.sum(tile.to(tl.float32), axis=0).to(out.dtype.element_ty),
                     mask=m)
