"""The Triton kernels of distributed flash-decode (:mod:`iris_fw.flash_decode`): the split-KV
attention kernel of one rank's slice (``_flash_decode_kernel``: its splits combined per unit
by the unit's last split, then — ``FUSED`` — pushed to and combined across the ranks, else
stored locally as the rank's packed partial) and the combine of every rank's gathered partials
(``_combine_kernel``), with the device functions they share.

The host side — checks, planning, tuning, the call path — is :mod:`iris_fw.flash_decode`; the
algorithms that launch these kernels (``flash_decode.fused``, ``flash_decode.bulk_sync``) are
:mod:`iris_fw.collectives.flash_decode`. Every launch names its arguments
(:meth:`iris_fw.kernel_launcher.KernelLauncher.bind`).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import cuda as _cuda

from . import dsmem
from . import gemm_tiles as tiles
from . import tilecomm as tc
from . import trace as tr

__all__ = ["LOG2E", "SLOT_GROUP", "cluster_region_bytes"]

#: log2(e): scores are kept in base 2 (``qk_scale`` includes it).
LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)  # the kernels' copy (a global a kernel reads must be a constexpr)
#: Ranks' slots whose partials the combine across ranks loads as one tile (:func:`_combine_partials`;
#: more ranks: groups one after another).
SLOT_GROUP = 4
_SLOT_GROUP = tl.constexpr(SLOT_GROUP)


def cluster_region_bytes(cluster: int, crows: int, bdv: int) -> int:
    """Dynamic shared memory a program of the attention kernel's cluster combine (``CLUSTER`` =
    ``cluster`` splits, ``CROWS``, ``BDV``) needs beyond Triton's own: each split's ``o [CROWS,
    BDV]`` and ``lse [CROWS]``, fp32 (:func:`_cluster_exchange`)."""
    return cluster * crows * (bdv + 1) * 4


# ---- device functions -------------------------------------------------------------------------------


@triton.jit
def _unit(u, HQ: tl.constexpr, HKV: tl.constexpr, ROWS: tl.constexpr):
    """Unit ``u`` → (sequence b, kv head, first query head, query heads in the unit)."""
    G: tl.constexpr = HQ // HKV
    HB: tl.constexpr = (G + ROWS - 1) // ROWS
    b = u // (HKV * HB)
    kvh = (u // HB) % HKV
    hb = u % HB
    return b, kvh, kvh * G + hb * ROWS, tl.minimum(G - hb * ROWS, ROWS)


@triton.jit
def _split_attention(q_ptr, k_ptr, v_ptr, table, first, last, rows_valid, stride_qh, stride_qd, stride_kp, stride_ks,
                     stride_kd, stride_vp, stride_vs, stride_vd, qk_scale, D: tl.constexpr, DV: tl.constexpr,
                     ROWS: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr,
                     PAGE: tl.constexpr, EXACT: tl.constexpr):
    """Online softmax of the ``rows_valid`` query heads at ``q_ptr`` (``[ROWS, D]`` rows
    ``stride_qh`` apart) over tokens ``first … last-1`` of one kv head of one sequence's slice.
    ``PAGE == 0``: token ``t``'s ``[D]`` key at ``k_ptr + t * stride_ks``; ``PAGE > 0`` (paged
    KV): in page ``table[t // PAGE]``, row ``t % PAGE``: ``k_ptr + page * stride_kp + (t % PAGE)
    * stride_ks``; values likewise (``[Dv]``). Scores are ``q·k · qk_scale`` in base-2 units
    (``qk_scale`` includes log2(e)). Returns ``(acc [ROWS, BDV], m [ROWS], l [ROWS])`` in fp32:
    ``acc / l`` is the attention output, ``m + log2(l)`` the base-2 log-sum-exp."""
    rows = tl.arange(0, ROWS)
    dq = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    qt = tl.load(q_ptr + rows[:, None] * stride_qh + dq[None, :] * stride_qd,
                 mask=(rows[:, None] < rows_valid) & (dq[None, :] < D), other=0.0)
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BDV], dtype=tl.float32)
    tok = tl.arange(0, BLOCK_N)
    if PAGE == 0:  # contiguous: the tiles' pointers advance by BLOCK_N tokens
        k_tile = k_ptr + first.to(tl.int64) * stride_ks + dq[:, None] * stride_kd + tok[None, :] * stride_ks
        v_tile = v_ptr + first.to(tl.int64) * stride_vs + tok[:, None] * stride_vs + dv[None, :] * stride_vd
    for n0 in range(first, last, BLOCK_N):
        valid = (n0 + tok) < last
        if PAGE > 0:  # paged: each token's row from the block table
            t = n0 + tok
            page = tl.load(table + t // PAGE, mask=valid, other=0).to(tl.int64)
            k_tile = k_ptr + (page * stride_kp + (t % PAGE) * stride_ks)[None, :] + dq[:, None] * stride_kd
            v_tile = v_ptr + (page * stride_vp + (t % PAGE) * stride_vs)[:, None] + dv[None, :] * stride_vd
        kt = tl.load(k_tile, mask=valid[None, :] & (dq[:, None] < D), other=0.0)  # [BD, BLOCK_N]: Kᵀ
        s = tiles.dot(qt, kt, None, EXACT) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_tile, mask=valid[:, None] & (dv[None, :] < DV), other=0.0)  # [BLOCK_N, BDV]
        acc = tiles.dot(p.to(vt.dtype), vt, acc * alpha[:, None], EXACT)
        m = m_new
        if PAGE == 0:
            k_tile += BLOCK_N * stride_ks
            v_tile += BLOCK_N * stride_vs
    return acc, m, l


@triton.jit
def _split_attention_swapped(q_ptr, k_ptr, v_ptr, table, first, last, rows_valid, stride_qh, stride_qd, stride_kp,
                             stride_ks, stride_kd, stride_vp, stride_vs, stride_vd, qk_scale, D: tl.constexpr,
                             DV: tl.constexpr, ROWS: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                             BLOCK_N: tl.constexpr, PAGE: tl.constexpr, EXACT: tl.constexpr):
    """:func:`_split_attention` with the products' operands swapped ("swap AB"): the tokens
    (``BLOCK_N``) and the value dims (``BDV``) on the MMA's M side, the ``ROWS`` query heads
    on its N side — ``Sᵀ [BLOCK_N, ROWS] = K · Qᵀ``, ``Oᵀ [BDV, ROWS] += Vᵀ · Pᵀ``. On Hopper
    (M >= 64 a warpgroup) that is ``wgmma`` reading K and V from shared memory, not ``mma.sync``
    with each warp holding its K/V fragments in registers; the K/V tile's addresses come from the
    tile's first token each step (a scalar carried, not two tiles of pointers). Same inputs,
    same returns (``acc [ROWS, BDV]``, ``m [ROWS]``, ``l [ROWS]``)."""
    rows = tl.arange(0, ROWS)
    dq = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    qt = tl.load(q_ptr + rows[None, :] * stride_qh + dq[:, None] * stride_qd,
                 mask=(rows[None, :] < rows_valid) & (dq[:, None] < D), other=0.0)  # [BD, ROWS]: Qᵀ
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([BDV, ROWS], dtype=tl.float32)  # Oᵀ
    tok = tl.arange(0, BLOCK_N)
    if PAGE == 0:  # contiguous: a tile's offsets from its first token
        k_first = k_ptr + first.to(tl.int64) * stride_ks
        v_first = v_ptr + first.to(tl.int64) * stride_vs
        k_off = tok[:, None] * stride_ks + dq[None, :] * stride_kd
        v_off = tok[None, :] * stride_vs + dv[:, None] * stride_vd
    for n0 in range(first, last, BLOCK_N):
        valid = (n0 + tok) < last
        if PAGE == 0:  # (n0 - first: within the split, 32 bits)
            k_tile = k_first + (n0 - first) * stride_ks + k_off
            v_tile = v_first + (n0 - first) * stride_vs + v_off
        else:  # paged: each token's row from the block table
            t = n0 + tok
            page = tl.load(table + t // PAGE, mask=valid, other=0).to(tl.int64)
            k_tile = k_ptr + (page * stride_kp + (t % PAGE) * stride_ks)[:, None] + dq[None, :] * stride_kd
            v_tile = v_ptr + (page * stride_vp + (t % PAGE) * stride_vs)[None, :] + dv[:, None] * stride_vd
        kk = tl.load(k_tile, mask=valid[:, None] & (dq[None, :] < D), other=0.0)  # [BLOCK_N, BD]
        s = tiles.dot(kk, qt, None, EXACT) * qk_scale  # [BLOCK_N, ROWS]: Sᵀ
        s = tl.where(valid[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[None, :])
        l = l * alpha + tl.sum(p, axis=0)
        vt = tl.load(v_tile, mask=valid[None, :] & (dv[:, None] < DV), other=0.0)  # [BDV, BLOCK_N]: Vᵀ
        acc = tiles.dot(vt, p.to(vt.dtype), acc * alpha[None, :], EXACT)
        m = m_new
    return tl.trans(acc), m, l


@triton.jit
def _partials_group(o_ptr, lse_ptr, o_stride, lse_stride, first, count, rows_valid, LSE_TO_LOG2: tl.constexpr,
                    GROUP: tl.constexpr, DV: tl.constexpr, ROWS: tl.constexpr, BDV: tl.constexpr):
    """Partials ``first … first + GROUP - 1`` (those below ``count``) of
    :func:`_combine_partials` as one tile: ``(lse [GROUP, ROWS]`` in base 2, ``-inf`` past
    ``count`` or ``rows_valid``; ``o [GROUP, ROWS, BDV]``, 0 there``)``. One tile, so its loads
    are all in flight at once. Loads go to L2 (``.cg``): other programs or ranks wrote them."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BDV)
    i = first + tl.arange(0, GROUP)
    live = (i[:, None] < count) & (rows[None, :] < rows_valid)  # [GROUP, ROWS]
    x = tl.load(lse_ptr + i[:, None] * lse_stride + rows[None, :], mask=live, other=float("-inf"),
                cache_modifier=".cg")
    o = tl.load(o_ptr + i[:, None, None] * o_stride + rows[None, :, None] * DV + cols[None, None, :],
                mask=live[:, :, None] & (cols[None, None, :] < DV), other=0.0, cache_modifier=".cg")
    return x * LSE_TO_LOG2, o


@triton.jit
def _combine_partials(o_ptr, lse_ptr, o_stride, lse_stride, count, rows_valid, LSE_TO_LOG2: tl.constexpr,
                      MAX_COUNT: tl.constexpr, GROUP: tl.constexpr, DV: tl.constexpr, ROWS: tl.constexpr,
                      BDV: tl.constexpr):
    """Combine ``count`` partials of ``rows_valid`` heads — a unit's splits (written by programs
    of this launch) or the ranks' slots: partial ``i``'s normalized outputs at ``o_ptr + i *
    o_stride`` (``[ROWS, DV]``, rows ``DV`` apart) and log-sum-exps at ``lse_ptr + i *
    lse_stride`` (``[ROWS]``; times ``LSE_TO_LOG2`` in base 2; ``-inf``: no tokens). Returns
    ``(o [ROWS, BDV], lse [ROWS] in base 2)`` in fp32; heads without any token get ``o = 0``,
    ``lse = -inf``. Deterministic (every rank combining the same slots gets bitwise the same);
    the sums run over the partials in a fixed tree's order.

    The partials come in groups of ``GROUP`` (a power of two), each group one tile
    (:func:`_partials_group`: its loads in flight together, its weights broadcast once, the
    partial axis summed after the last group). ``MAX_COUNT`` (a power of two; 0: unbounded) is a
    bound on ``count``: where one group holds that many, one pass over the one tile (the
    maximum from the tile itself); else two passes — the log-sum-exps' maximum first (one
    ``[MAX_COUNT, ROWS]`` tile, or groups of ``GROUP`` unbounded), then the weights ``2^(lse -
    max)`` and the weighted outputs. (Run 55's SASS of the loop this replaces: each partial's
    weight went through shared memory between two barriers, one L2 round trip a partial —
    3.6-4.1 us for a unit's 16 splits.) The count stays a runtime value: a constexpr count
    compiles a kernel per batch size or world size."""
    if MAX_COUNT > 0 and GROUP >= MAX_COUNT:  # one tile holds every partial: one pass
        x, o = _partials_group(o_ptr, lse_ptr, o_stride, lse_stride, 0, count, rows_valid, LSE_TO_LOG2, GROUP, DV,
                               ROWS, BDV)
        return _combine_tile(x, o)
    else:
        top = tl.full([ROWS], float("-inf"), dtype=tl.float32)
        if MAX_COUNT > 0:  # every log-sum-exp in one tile
            every, _ = _partials_group(o_ptr, lse_ptr, o_stride, lse_stride, 0, count, rows_valid, LSE_TO_LOG2,
                                       MAX_COUNT, DV, ROWS, BDV)  # (the o tile unused: the compiler drops its loads)
            top = tl.max(every, axis=0)
        else:
            for first in range(0, count, GROUP):
                some, _ = _partials_group(o_ptr, lse_ptr, o_stride, lse_stride, first, count, rows_valid,
                                          LSE_TO_LOG2, GROUP, DV, ROWS, BDV)
                top = tl.maximum(top, tl.max(some, axis=0))
        base = tl.where(top == float("-inf"), 0.0, top)
        totals = tl.zeros([GROUP, ROWS], dtype=tl.float32)
        accs = tl.zeros([GROUP, ROWS, BDV], dtype=tl.float32)
        for first in range(0, count, GROUP):
            x, o = _partials_group(o_ptr, lse_ptr, o_stride, lse_stride, first, count, rows_valid, LSE_TO_LOG2, GROUP,
                                   DV, ROWS, BDV)
            w = tl.exp2(x - base[None, :])
            totals += w
            accs += w[:, :, None] * o
        total = tl.sum(totals, axis=0)  # (the partial axis summed once, after every group)
        acc = tl.sum(accs, axis=0)
        return _normalized(acc, total, base)


@triton.jit
def _combine_tile(x, o):
    """The combine of partials given as one tile — ``x [N, ROWS]`` their base-2 log-sum-exps
    (``-inf``: none there), ``o [N, ROWS, BDV]`` their normalized outputs (0 there) — in one
    pass, the maximum from the tile itself: ``(o [ROWS, BDV], lse [ROWS] in base 2)``, as
    :func:`_combine_partials` returns them."""
    top = tl.max(x, axis=0)
    base = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(x - base[None, :])  # [N, ROWS]; 0 where x is -inf
    return _normalized(tl.sum(w[:, :, None] * o, axis=0), tl.sum(w, axis=0), base)


@triton.jit
def _normalized(acc, total, base):
    """``(acc / total, base + log2(total))`` of weighted sums ``acc [ROWS, BDV]`` and weights'
    ``total [ROWS]`` relative to ``base``; ``(0, -inf)`` where the total is 0 (no token)."""
    safe = tl.where(total > 0, total, 1.0)
    return acc / safe[:, None], tl.where(total > 0, base + tl.log2(safe), float("-inf"))


@triton.jit
def _cluster_exchange(o, lse2, s, rows_valid, base, CLUSTER: tl.constexpr, ROWS: tl.constexpr,
                      CROWS: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr):
    """Split ``s``'s partial — ``o [ROWS, BDV]`` (normalized) and ``lse2 [ROWS]`` (base 2) of
    its ``rows_valid`` heads — stored into the shared memory of its cluster's program 0 (the
    unit's ``CLUSTER`` splits are one thread-block cluster: :mod:`iris_fw.dsmem`), slot ``s`` of
    the region :func:`cluster_region_bytes` sizes: ``o [CLUSTER, CROWS, BDV]`` then ``lse
    [CLUSTER, CROWS]``, fp32. Then the cluster's barrier (release; acquire): after it, program 0
    holds every split's partial. ``base``: the region's address (:func:`iris_fw.dsmem.region`).
    (Phase 0 of the barrier, arrived on at the kernel's start, is waited for first: every program
    of the cluster has started.)"""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BDV)
    dsmem.wait()
    dsmem.store_remote(base + ((s * CROWS + rows[:, None]) * BDV + cols[None, :]) * 4, o, 0,
                       (rows[:, None] < rows_valid) & (cols[None, :] < DV))
    dsmem.store_remote(base + (CLUSTER * CROWS * BDV + s * CROWS + rows) * 4, lse2, 0, rows < rows_valid)
    dsmem.arrive(False)
    dsmem.wait()


@triton.jit
def _cluster_partials(rows_valid, base, CLUSTER: tl.constexpr, CROWS: tl.constexpr, DV: tl.constexpr,
                      BDV: tl.constexpr):
    """Program 0's view of the partials :func:`_cluster_exchange` gathered in its region at
    ``base``, as the tile :func:`_combine_tile` takes: ``(lse [CLUSTER, CROWS]`` in base 2,
    ``-inf`` past ``rows_valid``; ``o [CLUSTER, CROWS, BDV]``, 0 there``)``."""
    i = tl.arange(0, CLUSTER)
    rows = tl.arange(0, CROWS)
    cols = tl.arange(0, BDV)
    live = (i[:, None] < CLUSTER) & (rows[None, :] < rows_valid)
    x = dsmem.load_local(base + (CLUSTER * CROWS * BDV + i[:, None] * CROWS + rows[None, :]) * 4, tl.float32)
    o = dsmem.load_local(base + ((i[:, None, None] * CROWS + rows[None, :, None]) * BDV + cols[None, None, :]) * 4,
                         tl.float32)
    return tl.where(live, x, float("-inf")), tl.where(live[:, :, None] & (cols[None, None, :] < DV), o, 0.0)


@triton.jit
def _deliver_unit(o, lse2, b, h0, u, rows_valid, live, out, mine, buf, slots, epoch, rank, world_size, heap_bases,
                  pack, lse_at, trace, t0, HQ: tl.constexpr, DV: tl.constexpr, R: tl.constexpr, BDV: tl.constexpr,
                  FUSED: tl.constexpr, TRACE: tl.constexpr):
    """Deliver unit ``u``'s combined partial — ``o [R, BDV]`` (normalized) and ``lse2 [R]``
    (base 2) of its ``rows_valid`` query heads from ``h0`` of sequence ``b``, ``R`` rows a
    tile: ``FUSED``, pushed to every rank's receive buffer ``buf`` (the packed layout), the
    unit's slot arrived, the peers' partials waited for (while ``live``: after one timed-out
    wait no more waiting) and combined into ``out``; else stored into ``mine``, this rank's
    packed partial. Traced from ``t0`` (the splits' combine before it): ``reduce``, and
    ``FUSED`` a ``push``, the ``arrivals`` wait and the ranks' ``reduce``. Returns ``live``.
    (The ranks' combine runs on ``R``-row tiles — the unit's heads where its splits were
    combined, the products' padded rows where it had one split — so ranks get bitwise the same
    ``out`` where they planned the same split count: the same tuning row and SM count.)"""
    rows = tl.arange(0, R)
    cols = tl.arange(0, BDV)
    omask = (rows[:, None] < rows_valid) & (cols[None, :] < DV)
    o_off = (b * HQ + h0) * DV + rows[:, None] * DV + cols[None, :]
    lse_off = lse_at + b * HQ + h0 + rows
    lse = lse2 / _LOG2E
    if FUSED:
        if TRACE:
            tr.record_end(trace, TRACE, t0, tr.REDUCE, tr.COMPUTE, u)
            t0 = tr.record_start(trace, TRACE)
        tc.tile_store_all(buf + rank * pack + o_off, o, rank, world_size, heap_bases, mask=omask)
        tc.tile_store_all(buf + rank * pack + lse_off, lse, rank, world_size, heap_bases, mask=rows < rows_valid)
        tc.arrive(slots + u * world_size, epoch, rank, world_size, heap_bases)
        if TRACE:  # the unit's rows of o and lse, fp32, to every other rank
            tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                           tr.as_i64(rows_valid) * (DV + 1) * 4 * (world_size - 1), u)
            t0 = tr.record_start(trace, TRACE)
        if live:  # after one timed-out wait, no more waiting: one missing peer costs one timeout
            live = tc.wait_arrivals(slots + u * world_size, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, slots + u * world_size, rank, heap_bases, u)
            t0 = tr.record_start(trace, TRACE)
        if live:
            o, lse2 = _combine_partials(buf + (b * HQ + h0) * DV, buf + lse_at + b * HQ + h0, pack, pack, world_size,
                                        rows_valid, _LOG2E, 0, _SLOT_GROUP, DV, R, BDV)
            tl.store(out + o_off, o.to(out.dtype.element_ty), mask=omask)
    else:
        tl.store(mine + o_off, o, mask=omask)
        tl.store(mine + lse_off, lse, mask=rows < rows_valid)
    if TRACE:
        tr.record_end(trace, TRACE, t0, tr.REDUCE, tr.COMPUTE, u)
    return live


# ---- kernels ----------------------------------------------------------------------------------------


# (batch and split count unspecialized: one compile serves every batch size, Triton's ``== 1`` and
# divisibility-by-16 variants of them would each compile anew for ~nothing saved per work item)
@triton.jit(do_not_specialize=["batch", "n_split"])
def _flash_decode_kernel(q, k, v, kv_lens, block_table, out, partials, partial_lse, unit_counters, mine, recv, slots,
                         epochs, batch, seq, n_split,
                         stride_qb, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                         stride_vb, stride_vs, stride_vh, stride_vd, stride_tb,
                         qk_scale, rank, world_size, heap_bases,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                         ROWS: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr,
                         MAX_SPLITS: tl.constexpr, HAS_LENS: tl.constexpr, PAGE: tl.constexpr, FUSED: tl.constexpr,
                         EXACT: tl.constexpr, trace, TRACE: tl.constexpr = 0, SWAP_AB: tl.constexpr = False,
                         CROWS: tl.constexpr = 16, COMBINE_UNROLL: tl.constexpr = 8, CLUSTER: tl.constexpr = 0,
                         PDL: tl.constexpr = False):
    """Split-KV decode attention of this rank's slice, its splits combined per unit by the
    unit's last split, then (``FUSED``) combined across ranks, else stored locally.

    ``q [B, HQ, D]``, ``k [B, seq, HKV, D]``, ``v [B, seq, HKV, DV]`` (strides given), or with
    ``PAGE > 0`` (paged KV) ``k [pages, PAGE, HKV, D]``, ``v [pages, PAGE, HKV, DV]`` and
    ``block_table`` int32 ``[B, seq / PAGE]`` (rows ``stride_tb`` apart) naming each sequence's
    pages in order; ``kv_lens`` int32 ``[B]`` (read if ``HAS_LENS``); ``out``: contiguous ``[B, HQ, DV]``
    (``FUSED``). Arguments a variant does not read are passed as None (``kv_lens`` without
    ``HAS_LENS``, ``block_table`` unpaged, ``out``/``recv``/``slots``/``epochs`` not ``FUSED``,
    ``mine`` ``FUSED``); the launches name every argument (:meth:`FlashDecode._launches`).
    ``SWAP_AB``: the split's attention as :func:`_split_attention_swapped` (tokens on the MMA's
    M side: Hopper's ``wgmma``, fewer registers), else :func:`_split_attention` (the tuning row's
    ``swap_ab``).
    ``n_split``: splits per unit, at most ``MAX_SPLITS`` (a power of two: the splits' combine,
    :func:`_combine_partials`, takes their maximum from one tile and loads ``COMBINE_UNROLL``
    splits' partials at once). ``CROWS``: the rows of a unit's combined tiles — its query heads,
    not the ``ROWS`` padded for the products (``min(ROWS, next_power_of_2(HQ // HKV))``).
    ``CLUSTER > 0`` (NVIDIA sm_90+, launched in thread-block clusters of ``CLUSTER`` programs with
    :func:`cluster_region_bytes` of shared memory beyond Triton's: ``n_split == CLUSTER``, one
    work item a program, item = program): the unit's splits are one cluster, and instead of the
    scratch, counter and loads below each split stores its partial into the shared memory of
    the cluster's program 0, which combines them after the cluster's barrier
    (:func:`_cluster_exchange`) — no L2 round trip in series. ``PDL`` (NVIDIA sm_90+, launched
    as a programmatic dependent launch): every program waits for the kernel before it in the
    stream (``griddepcontrol.wait``: done, its writes visible) before its first read, and lets
    the next kernel launch once it has read its last work item's tokens. Local scratch: ``partials`` fp32
    ``[units, n_split, CROWS, DV]``, ``partial_lse`` fp32 ``[units, n_split, CROWS]``,
    ``unit_counters`` int64 ``[units]`` (zero between calls). A rank's
    partial is *packed* as ``pack = B·HQ·(DV+1)`` fp32: ``o [B, HQ, DV]`` then natural-log
    ``lse [B, HQ]``; not ``FUSED``: stored into ``mine [pack]``. ``FUSED``:
    ``recv`` symmetric fp32 ``[2, world_size, pack]``, ``slots`` symmetric int64
    ``[units, world_size]``, ``epochs`` int64 ``[programs]``.

    Traced (:mod:`iris_fw.trace`): per program its span (item: the call's epoch, ``FUSED``;
    else -1); per work item an ``attention`` event (item: ``unit * n_split + split``); the
    unit's last split also a ``reduce`` (the splits' combine, item: the unit) and, ``FUSED``,
    a ``push`` of the partial to the peers, the ``arrivals`` wait on the unit's slots and a
    ``reduce`` of the ranks' partials."""
    if PDL:  # a programmatic dependent launch: the kernel before it done (its writes visible)
        _cuda.gdc_wait()
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    G: tl.constexpr = HQ // HKV
    HB: tl.constexpr = (G + ROWS - 1) // ROWS
    units = batch * HKV * HB
    pack = batch * HQ * (DV + 1)
    lse_at = batch * HQ * DV
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BDV)
    if FUSED:
        epoch = tc.program_epoch(epochs)
        buf = recv + (epoch % 2) * world_size * pack
    else:
        epoch = 0
        buf = recv  # None
    if TRACE:
        started = tr.record_start(trace, TRACE)
    if CLUSTER > 0:  # launched in clusters of CLUSTER (else: trap); phase 0 of the barrier: started
        dsmem.require_cluster(CLUSTER)
        dsmem.arrive(True)
    live = 1
    n_items = units * n_split
    for item in range(pid, n_items, nprog):
        if TRACE:
            t0 = tr.record_start(trace, TRACE)
        else:
            t0 = 0
        u = item // n_split
        s = item % n_split
        b = u // (HKV * HB)  # as _unit (inlined: the interpreter pays per nested call)
        kvh = (u // HB) % HKV
        h0 = kvh * G + (u % HB) * ROWS
        rows_valid = tl.minimum(G - (u % HB) * ROWS, ROWS)
        length = seq
        if HAS_LENS:
            length = tl.minimum(tl.maximum(tl.load(kv_lens + b), 0), seq)
        chunk = ((length + n_split - 1) // n_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        start = tl.minimum(s * chunk, length)
        b64 = b.to(tl.int64)
        k_ptr = k + kvh.to(tl.int64) * stride_kh  # (64 bits: a head-major cache's head stride is S·D)
        v_ptr = v + kvh.to(tl.int64) * stride_vh
        table = block_table  # None unless paged
        if PAGE == 0:
            k_ptr += b64 * stride_kb
            v_ptr += b64 * stride_vb
        else:
            table = block_table + b64 * stride_tb
        if SWAP_AB:
            acc, m, l = _split_attention_swapped(
                q + b64 * stride_qb + h0 * stride_qh, k_ptr, v_ptr, table, start,
                tl.minimum(start + chunk, length), rows_valid, stride_qh, stride_qd, stride_kb, stride_ks, stride_kd,
                stride_vb, stride_vs, stride_vd, qk_scale, D, DV, ROWS, BD, BDV, BLOCK_N, PAGE, EXACT)
        else:
            acc, m, l = _split_attention(
                q + b64 * stride_qb + h0 * stride_qh, k_ptr, v_ptr, table, start,
                tl.minimum(start + chunk, length), rows_valid, stride_qh, stride_qd, stride_kb, stride_ks, stride_kd,
                stride_vb, stride_vs, stride_vd, qk_scale, D, DV, ROWS, BD, BDV, BLOCK_N, PAGE, EXACT)
        # this split's partial, normalized, and its base-2 log-sum-exp
        safe = tl.where(l > 0, l, 1.0)
        o = acc / safe[:, None]
        lse2 = tl.where(l > 0, m + tl.log2(safe), float("-inf"))
        if CLUSTER == 0 and n_split > 1:  # (CROWS rows a slot: rows past rows_valid <= CROWS are not stored)
            slot = u * n_split + s
            tl.store(partials + slot * CROWS * DV + rows[:, None] * DV + cols[None, :], o,
                     mask=(rows[:, None] < rows_valid) & (cols[None, :] < DV))
            tl.store(partial_lse + slot * CROWS + rows, lse2, mask=rows < rows_valid)
        if PDL and item + nprog >= n_items:  # its last item's tokens read: the next kernel may launch
            _cuda.gdc_launch_dependents()
        if TRACE:
            tr.record_end(trace, TRACE, t0, tr.ATTENTION, tr.COMPUTE, item)
            t0 = tr.record_start(trace, TRACE)
        # one split: its partial is the unit's (the values the combine of one split gives) — no
        # scratch, no counter, no combine; else the unit's last split to get here combines them
        # (every thread's stores before the release) in tiles of the unit's CROWS heads
        if CLUSTER > 0:  # the unit's splits are this cluster: program 0 combines them
            region = dsmem.region(CLUSTER * CROWS * (BDV + 1) * 4)  # (cluster_region_bytes)
            _cluster_exchange(o, lse2, s, rows_valid, region, CLUSTER, ROWS, CROWS, DV, BDV)
            if s == 0:
                x, parts = _cluster_partials(rows_valid, region, CLUSTER, CROWS, DV, BDV)
                oc, lc = _combine_tile(x, parts)
                live = _deliver_unit(oc, lc, b, h0, u, rows_valid, live, out, mine, buf, slots, epoch, rank,
                                     world_size, heap_bases, pack, lse_at, trace, t0, HQ, DV, CROWS, BDV, FUSED, TRACE)
        elif n_split > 1:
            tl.debug_barrier()
            done = tl.atomic_add(unit_counters + u, 1, sem="acq_rel", scope="gpu")
            tl.debug_barrier()
            if done == n_split - 1:
                tl.store(unit_counters + u, 0)
                oc, lc = _combine_partials(partials + u * n_split * CROWS * DV, partial_lse + u * n_split * CROWS,
                                           CROWS * DV, CROWS, n_split, rows_valid, 1.0, MAX_SPLITS, COMBINE_UNROLL,
                                           DV, CROWS, BDV)
                live = _deliver_unit(oc, lc, b, h0, u, rows_valid, live, out, mine, buf, slots, epoch, rank,
                                     world_size, heap_bases, pack, lse_at, trace, t0, HQ, DV, CROWS, BDV, FUSED, TRACE)
        else:
            live = _deliver_unit(o, lse2, b, h0, u, rows_valid, live, out, mine, buf, slots, epoch, rank, world_size,
                                 heap_bases, pack, lse_at, trace, t0, HQ, DV, ROWS, BDV, FUSED, TRACE)
    if TRACE:
        if FUSED:
            tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)
        else:
            tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, -1)


@triton.jit
def _combine_kernel(gathered, out, batch, world_size, HQ: tl.constexpr, HKV: tl.constexpr, DV: tl.constexpr,
                    ROWS: tl.constexpr, BDV: tl.constexpr, trace, TRACE: tl.constexpr = 0):
    """``out [B, HQ, DV]`` (contiguous) from every rank's packed partial: ``gathered`` fp32
    ``[world_size, pack]`` (see :func:`_flash_decode_kernel`). One program per unit (traced:
    a ``reduce`` event, item: the unit)."""
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    b, kvh, h0, rows_valid = _unit(tl.program_id(0), HQ, HKV, ROWS)
    pack = batch * HQ * (DV + 1)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BDV)
    o, lse2 = _combine_partials(gathered + (b * HQ + h0) * DV, gathered + batch * HQ * DV + b * HQ + h0, pack,
                                pack, world_size, rows_valid, _LOG2E, 0, _SLOT_GROUP, DV, ROWS, BDV)
    omask = (rows[:, None] < rows_valid) & (cols[None, :] < DV)
    tl.store(out + (b * HQ + h0) * DV + rows[:, None] * DV + cols[None, :], o.to(out.dtype.element_ty), mask=omask)
    if TRACE:
        tr.record_end(trace, TRACE, t0, tr.REDUCE, tr.COMPUTE, tl.program_id(0))
