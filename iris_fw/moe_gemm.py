"""Fused expert GEMMs for expert parallelism: the dispatch's grouped GEMM starting on each tile
of tokens as soon as it has arrived, and a grouped GEMM whose output rows go straight back to
their tokens' owners (the combine without an ``expert_out`` pass).

``moe_dispatch_gemm(x, topk_idx, topk_weights, weight, num_experts, *, max_tokens_per_rank,
capacity=None, dtype=None, mode="auto", schedule="auto", out=None, ctx=None) ->
DispatchedGemm(y, x, counts, handle, scales)`` and ``moe_gemm_combine(h, weight, handle, *,
out=None) -> [T, H]`` — shapes (``L = E / W`` local experts, ``C`` capacity)::

    x, topk_idx, topk_weights    as for iris_fw.moe.moe_dispatch: [T, H], [T, K], [T, K]
    weight       [L, H, N]       this rank's experts' first weights (x's dtype), any strides
    -> y         [L, C, N]       y[l, s] = x_received[l, s] @ weight[l] for s < counts[l] (rows past: not written)
       x         [L, C, H]       the received rows (as moe_dispatch returns them), counts [L], handle, scales
    h            [L, C, I]       the experts' hidden rows (e.g. act(y)), x's dtype, rows past counts ignored
    weight       [L, I, H]       this rank's experts' second weights (x's dtype)
    -> out       [T, H]          out[t] = sum_k topk_weights[t, k] * (h[row of (t, k)] @ weight[e_k])

**Dispatch → GEMM.** The dispatch (either mode of :mod:`iris_fw.moe`) counts, on the rows'
destination, the rows of every GEMM tile — ``block_m`` consecutive slots of one local expert —
as they land (``arrived [L, C / block_m]`` int32 on the heap, one release-ordered atomic per
row); once its counts are final (its done barrier) it adds :data:`iris_fw.moe.TILES_FINAL` to
every tile counter. A GEMM tile ``(slot block, expert, column block)`` waits (bounded) until its
counter reaches the rows the tile can hold, or the final mark — then it reads its row count from
the published counts (a partial tile; an empty one does nothing). Slots are taken in arrival
order, so the first tiles of every expert fill first, and the GEMM's tiles are visited slot
block by slot block. The GEMM's last program zeroes the counters; the next dispatch's peers
write into them only after this rank entered it (its entry barrier), which the stream orders
after the GEMM. All of it on the device, static shapes: a call replays from a CUDA graph with
new routing.

**Schedules.** ``"producer_consumer"`` (CUDA): the dispatch kernel(s) on a side stream, the GEMM
on the current one, forked and joined by events (:class:`iris_fw.engine.scheduler.SideStream`,
the ``producer_consumer`` scheduler's mechanism): GEMM tiles run while later rows are still on
their way. The dispatch gets ``dispatch_programs`` programs and the GEMM the rest of the SMs,
so both grids are resident together and no GEMM program spins on an SM a dispatch program needs.
``"bulk_sync"``: one stream, the dispatch kernel then the GEMM kernel, as the ``bulk_sync``
scheduler runs its kernels (the GEMM still skips empty tiles).
``"auto"``: ``producer_consumer`` on CUDA devices, ``bulk_sync`` elsewhere (CPU ranks run
launches one after another anyway). Tiles and programs are data:
``iris_fw/tuning/moe_gemm.json`` (``block_m`` by the mean rows per expert of a full call,
:func:`tile_config`).

**GEMM → combine.** ``moe_gemm_combine`` computes each tile of ``h[l] @ weight[l]`` and stores
its rows straight into their sources' combine buffers (``[T, K, H]`` at the token's owner, slot
``(t, k)``: one row per received row, as the ``low_latency`` combine pushes them; any dispatch
mode), with the combine's entry and done barriers; then a local kernel at the owner weights and
sums each token's ``K`` rows (fp32, k order: deterministic). ``expert_out`` is never written and
no separate combine push pass runs.

**fp8.** With ``dtype=torch.float8_e4m3fn`` the GEMM dequantizes each received row's 128-channel
groups with their scales as it loads them (``block_k`` divides 128) and multiplies in
``weight``'s dtype.

**Calls.** Collective, validated like :mod:`iris_fw.moe`'s calls: the dispatch's shape class
through its plan (the fused plan is its own: its dispatch signals tiles), the weight's shape,
dtype and the schedule across ranks on the first call of a class (a mismatch or a rank's bad
argument raises on every rank); later calls check locally. A bad ``schedule=`` is bad input like
the others: checked with the arguments before the ranks agree on a first call (every rank
raises), and on a cached call raised with the peers aborted (they raise
:class:`~iris_fw.PeerFailure` naming the rank and the error; :func:`_reject_schedule`). Both calls
take the library's one call path (:mod:`iris_fw.callpath`): a host failure on a rank after the
ranks agreed — a local check, allocating, a launch — aborts the peers' waits (they raise
:class:`~iris_fw.PeerFailure` naming it). The returned ``y`` and the dispatch's buffers are
overwritten by the plan's next call. A plan's GEMM → combine calls of every ``I`` share its one
set of barrier slots with one epoch sequence (:class:`_CombineState`).

Why not an :mod:`iris_fw.engine` pattern: the engine's communicate-first patterns fetch chunks
into local staging and release *local* per-chunk flags that a tile waits for; here a tile's rows
are pushed by every rank, in an order only the device knows (atomic slots), so its readiness is
a count that the peers raise. The pieces are the engine's: the kernels use
:mod:`iris_fw.tilecomm` (epochs, barriers, last program), :mod:`iris_fw.gemm_tiles` (the tile dot)
and the engine's launcher and side stream.

:func:`moe_gemm_reference` (float64, from every rank's tokens) sits beside the ops.
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
from . import device as dv
from . import devinfo
from . import moe
from . import tilecomm as tc
from . import tuning
from . import gemm_tiles as tiles
from .kernel_launcher import KernelLauncher
from .errors import ArgumentError, ArgumentTypeError

#: Channels per fp8 scale group (the dispatch's; ``block_k`` divides it).
FP8_GROUP = moe.FP8_GROUP

__all__ = ["SCHEDULES", "DispatchedGemm", "moe_dispatch_gemm", "moe_gemm_combine", "moe_gemm_reference",
           "tile_config"]

#: ``schedule=`` values (``"auto"`` picks ``producer_consumer`` on CUDA devices).
SCHEDULES = ("producer_consumer", "bulk_sync")

_TILES_FINAL = tl.constexpr(moe.TILES_FINAL)
_RESET_BLOCK = tl.constexpr(moe.RESET_BLOCK)


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    return tuning.load("moe_gemm")


@dataclass(frozen=True)
class TileConfig:
    """A fused expert GEMM's tiles (``iris_fw/tuning/moe_gemm.json``)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    dispatch_programs: int


def tile_config(device: torch.device, mean_rows: float | None = None) -> TileConfig:
    """The tiles for ``device``: its name's entry of ``iris_fw/tuning/moe_gemm.json``, else its
    type's default; ``block_m`` by ``mean_rows`` (rows per expert of a full, uniformly routed
    call; None: the last row)."""
    data = _table()
    dev = devinfo.info(device)
    row = tuning.fields(data["devices"].get(dev.name) or data["defaults"]["cpu" if dev.type == "cpu" else "cuda"])
    by_load = row.pop("block_m")
    row["block_m"] = next((bm for bound, bm in by_load
                           if bound is None or (mean_rows is not None and mean_rows <= bound)), by_load[-1][1])
    cfg = TileConfig(**row)
    if FP8_GROUP % cfg.block_k:
        raise ValueError(f"iris_fw/tuning/moe_gemm.json: block_k {cfg.block_k} must divide {FP8_GROUP}")
    return cfg


# ---- kernels --------------------------------------------------------------------------------------


@triton.jit
def _tile_coords(tile, L: tl.constexpr, NB):
    """Tile ``tile`` -> ``(slot block, local expert, column block)``, slot blocks outermost (the
    first slots of every expert fill first)."""
    mb = tile // (L * NB)
    rest = tile % (L * NB)
    return mb, rest // NB, rest % NB


@triton.jit
def _rows_dot(a, a_scales, rows_ok, b, off_n, N, KD, stride_ak, stride_bk, stride_bn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, QUANT: tl.constexpr, NG: tl.constexpr,
              GROUP: tl.constexpr, EXACT: tl.constexpr):
    """``[BM, BN]`` fp32 tile of ``A @ B``: ``a [BM, 1]`` row pointers (``rows_ok [BM, 1]`` the
    valid rows; ``KD`` columns ``stride_ak`` apart), ``b`` a ``[KD, N]`` matrix (strides
    ``stride_bk``, ``stride_bn``), columns ``off_n …``. ``QUANT``: ``A`` is fp8, row ``i``'s
    column group ``g`` scaled by ``a_scales[i, g]`` (``[BM, 1]`` pointers to ``NG`` scales a row);
    ``BK`` divides ``GROUP``."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    cols = off_n + tl.arange(0, BN)
    for k0 in range(0, KD, BK):
        c = k0 + tl.arange(0, BK)
        x = tl.load(a + c[None, :] * stride_ak, mask=rows_ok & (c[None, :] < KD), other=0.0)
        if QUANT:
            sc = tl.load(a_scales + k0 // GROUP, mask=rows_ok, other=0.0)
            x = (x.to(tl.float32) * sc).to(b.dtype.element_ty)
        y = tl.load(b + c[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(c[:, None] < KD) & (cols[None, :] < N), other=0.0)
        acc = tiles.dot(x, y, acc, EXACT)
    return acc


@triton.jit
def _dispatch_gemm_kernel(recv_x, recv_scales, weight, y, arrived, recv_counts, epochs, state,
                          stride_wl, stride_wk, stride_wn, stride_yl, stride_yc, rank, heap_bases,
                          H: tl.constexpr, N: tl.constexpr, L: tl.constexpr, C: tl.constexpr, NT: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, QUANT: tl.constexpr,
                          GROUP: tl.constexpr, EXACT: tl.constexpr):
    """The dispatch's grouped GEMM, tile by tile as the rows arrive: ``y[l, s] = recv_x[l, s] @
    weight[l]`` for the received rows ``s < recv_counts[l]``. ``recv_x [L, C, H]`` (fp8 with
    ``recv_scales [L, C, NG]`` fp32 when ``QUANT``), ``weight [L, H, N]`` (strides
    ``stride_w*``), ``y [L, C, N]`` (rows ``stride_yc``, experts ``stride_yl`` apart, columns
    contiguous), ``arrived [L, NT]`` int32 (symmetric: the dispatch's per-tile row counts, then
    :data:`~iris_fw.moe.TILES_FINAL` added once its counts are final), ``recv_counts [L]``
    int32, ``epochs [programs]`` / ``state [1]`` int64 (call epoch, last program). Waits only
    for the dispatch's launches (earlier ones on this rank, or other ranks'), never for a program
    of this launch. The last program zeroes ``arrived`` for the next call."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NG: tl.constexpr = (H + GROUP - 1) // GROUP
    epoch = tc.program_epoch(epochs)
    NB: tl.constexpr = (N + BN - 1) // BN
    live = 1
    for tile in range(pid, NT * L * NB, nprog):
        mb, le, nb = _tile_coords(tile, L, NB)
        flag = arrived + le * NT + mb
        room = tl.minimum(BM, C - mb * BM)  # rows the tile can hold
        if live != 0:
            live = dv.wait_until(flag, ">=", room, rank, rank, heap_bases)
        if live != 0:
            rows = room
            if tl.load(flag, volatile=True) >= _TILES_FINAL:  # counts final: a partial or empty tile
                rows = tl.minimum(tl.maximum(tl.load(recv_counts + le, volatile=True) - mb * BM, 0), room)
            if rows > 0:
                r = tl.arange(0, BM)
                ok = (r < rows)[:, None]
                slot = (le * C + mb * BM + r).to(tl.int64)[:, None]
                le64 = le.to(tl.int64)
                acc = _rows_dot(recv_x + slot * H, recv_scales + slot * NG, ok, weight + le64 * stride_wl, nb * BN,
                                N, H, 1, stride_wk, stride_wn, BM, BN, BK, QUANT, NG, GROUP, EXACT)
                cols = nb * BN + tl.arange(0, BN)
                dst = y + le64 * stride_yl + (mb * BM + r).to(tl.int64)[:, None] * stride_yc + cols[None, :]
                tl.store(dst, acc.to(y.dtype.element_ty), mask=ok & (cols[None, :] < N))
    if tc.last_program(state, nprog, epoch):
        offs = tl.arange(0, _RESET_BLOCK)
        for i in range(0, L * NT, _RESET_BLOCK):
            tl.store(arrived + i + offs, tl.zeros([_RESET_BLOCK], tl.int32), mask=i + offs < L * NT)


@triton.jit
def _gemm_combine_kernel(h, weight, recv_src, recv_counts, comb, slots, epochs, state,
                         stride_hl, stride_hc, stride_wl, stride_wk, stride_wn, rank, world_size, heap_bases,
                         I: tl.constexpr, H: tl.constexpr, K: tl.constexpr, L: tl.constexpr, C: tl.constexpr,
                         TMAX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         EXACT: tl.constexpr):
    """GEMM → combine: each tile of ``h[l] @ weight[l]`` (``h [L, C, I]``, ``weight [L, I, H]``)
    over the received rows (``recv_counts [L]``), each row stored straight into its source's
    ``comb [TMAX, K, H]`` (symmetric) at ``(t, k)`` from ``recv_src [L, C]``; entry and done
    barriers on ``slots`` int64 ``[2, world_size]`` (symmetric): a source's ``comb`` is free once
    it entered the call, and complete on every rank when the launch ends."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(epochs)
    tc.arrive(slots, epoch, rank, world_size, heap_bases)
    live = tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)
    NB: tl.constexpr = (H + BN - 1) // BN
    NT: tl.constexpr = (C + BM - 1) // BM
    for tile in range(pid, NT * L * NB * live, nprog):
        mb, le, nb = _tile_coords(tile, L, NB)
        rows = tl.minimum(tl.maximum(tl.load(recv_counts + le) - mb * BM, 0), BM)
        if rows > 0:
            r = tl.arange(0, BM)
            ok = r < rows
            slot = (le * C + mb * BM + r).to(tl.int64)
            le64 = le.to(tl.int64)
            rows_h = h + le64 * stride_hl + (mb * BM + r).to(tl.int64)[:, None] * stride_hc
            acc = _rows_dot(rows_h, rows_h, ok[:, None],
                            weight + le64 * stride_wl, nb * BN, H, I, 1, stride_wk, stride_wn, BM, BN, BK, False, 1,
                            1, EXACT)
            meta = tl.load(recv_src + slot, mask=ok, other=0)
            src = meta // (TMAX * K)
            tk = (meta % (TMAX * K)).to(tl.int64)
            cols = nb * BN + tl.arange(0, BN)
            m = ok[:, None] & (cols[None, :] < H)
            dv.store(comb + tk[:, None] * H + cols[None, :], acc.to(comb.dtype.element_ty), rank, src[:, None],
                     heap_bases, mask=m)
    if tc.last_program(state, nprog, epoch):
        tc.arrive(slots + world_size, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(slots + world_size, epoch, rank, world_size, heap_bases)


# ---- the calls ------------------------------------------------------------------------------------


class DispatchedGemm(NamedTuple):
    """What :func:`moe_dispatch_gemm` returns (the plan's buffers, overwritten by its next call):
    ``y [L, C, N]`` the GEMM of the received rows (the first ``counts[l]`` of expert ``l``
    valid), ``x [L, C, H]`` the received rows, ``counts [L]`` int32, ``handle``
    (:class:`~iris_fw.moe.MoeHandle`: for :func:`moe_gemm_combine` or
    :func:`~iris_fw.moe.moe_combine`), ``scales`` (fp8 dispatch: ``[L, C, ceil(H/128)]``, else
    None)."""

    y: torch.Tensor
    x: torch.Tensor
    counts: torch.Tensor
    handle: moe.MoeHandle
    scales: torch.Tensor | None


def _exact(dtype: torch.dtype) -> bool:
    """fp32 operands multiplied exactly unless torch's TF32 switch allows TF32 (as torch.matmul)."""
    return dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32


def _check_weight(ctx, what: str, weight, shape: tuple, dtype: torch.dtype, name: str, dims: str) -> None:
    if not isinstance(weight, torch.Tensor):
        raise ArgumentTypeError(f"{what}: {name} must be a torch.Tensor, got {type(weight).__name__}")
    if tuple(weight.shape) != shape or weight.dtype != dtype or weight.device != ctx.device:
        raise ArgumentError(f"{what}: {name} must be a {list(shape)} tensor {dims} of x's dtype {dtype} on "
                            f"{ctx.device}, got {list(weight.shape)} {weight.dtype} on {weight.device}")


def _prepare(made: moe.MoePlan, label: str, fields: dict, check: Callable[[], None], make: Callable[[], Any]):
    """The miss path of a fused call on ``made`` (:func:`iris_fw.callpath.plan_call`):
    ``check()`` validates this rank's arguments; the world group's exchange of ``fields`` and any
    local error raises on every rank on a mismatch or a rejection; ``make()`` then prepares the
    call's entry — a failure there, after every rank agreed, aborts the peers."""
    def checked():
        check()
        return fields, None, None

    return callpath.plan_call(made.ctx, label, checked,
                              lambda fields_, error, _: made.group.exchange(label, fields_, error),
                              lambda _state, _agreed: make())


def _free_dim(what: str, t, name: str, shape: str, dims: str) -> int:
    """The last dimension of the 3-d tensor ``t`` (the one the call leaves free: N, I), at least 1;
    else raises naming ``name``, its expected ``shape`` and ``dims``."""
    size = t.shape[2] if isinstance(t, torch.Tensor) and t.dim() == 3 else None
    if size is None or size < 1:
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ArgumentError(f"{what}: {name} must be a {shape} tensor ({dims}), got {got}")
    return size


def _check_dispatch_gemm(made: moe.MoePlan, weight, out) -> None:
    """This rank's checks of ``weight [L, H, N]`` and ``out [L, C, N]`` (every call)."""
    c, ctx, what = made.call, made.ctx, "moe_dispatch_gemm"
    n = _free_dim(what, weight, "weight", "[L, H, N]", f"local experts {c.local_experts}, hidden {c.hidden}, N >= 1")
    _check_weight(ctx, what, weight, (c.local_experts, c.hidden, n), c.x_dtype, "weight",
                  "(local experts, hidden, N)")
    if out is not None:
        _check_weight(ctx, what, out, (c.local_experts, c.capacity, n), c.x_dtype, "out",
                      "(local experts, capacity, N)")
        if out.stride(-1) != 1:
            raise ArgumentError(f"{what}: out must have contiguous rows, got strides {list(out.stride())}")


class _GemmState:
    """A fused dispatch plan's GEMM of one ``(N, dtype, schedule)``: its output, launcher, epochs;
    calling it runs one :func:`moe_dispatch_gemm` call (the call path's cached entry)."""

    def __init__(self, plan: moe.MoePlan, n: int, weight_dtype: torch.dtype, schedule: str, cfg: TileConfig):
        c, ctx = plan.call, plan.ctx
        dev = ctx.device
        self.plan = plan
        self.y = torch.empty(c.local_experts, c.capacity, n, dtype=c.x_dtype, device=dev)
        tiles_n = triton.cdiv(n, cfg.block_n)
        work = plan.tiles * c.local_experts * tiles_n
        programs = devinfo.persistent_programs(dev, work)
        if schedule == "producer_consumer":  # both grids resident at once (module docstring)
            dispatch = max(plan.nprog, plan.nprog_scatter if c.mode == "throughput" else 0)
            programs = max(1, min(work, devinfo.num_sms(dev) - dispatch))
        self.programs = programs
        # local only: the GEMM's last program (tilecomm.last_program, on this grid's own counter) zeroes
        # the plan's ``arrived`` counters; no cross-rank slot is waited on with these epochs, so GEMMs of
        # several N on one plan (each its own epochs and grid) share nothing epoch-ordered
        self.epochs = torch.zeros(programs, dtype=torch.int64, device=dev)
        self.state = torch.zeros(1, dtype=torch.int64, device=dev)
        self.side = None
        if schedule == "producer_consumer" and dev.type == "cuda":
            from .engine.scheduler import SideStream

            self.side = SideStream(dev)
        self.launch = KernelLauncher(_dispatch_gemm_kernel, (programs,), constexprs=dict(
            H=c.hidden, N=n, L=c.local_experts, C=c.capacity, NT=plan.tiles, BM=cfg.block_m, BN=cfg.block_n,
            BK=cfg.block_k, QUANT=c.quant, GROUP=moe.FP8_GROUP, EXACT=_exact(weight_dtype)),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    def __call__(self, x, topk_idx, topk_weights, weight, out) -> "DispatchedGemm":
        """One call: this rank's checks (the weight, ``out``, the token count), then the dispatch
        (on the side stream under ``producer_consumer``) and the GEMM."""
        made = self.plan
        ctx, c = made.ctx, made.call
        _check_dispatch_gemm(made, weight, out)
        y = self.y if out is None else out
        side = self.side
        main = side.fork() if side is not None else None
        d = made(x, topk_idx, topk_weights, stream=side.stream if side is not None else None)
        scales = made.recv_scales if c.quant else made.recv_x
        self.launch(made.recv_x, scales, weight, y, made.arrived, made.recv_counts, self.epochs, self.state,
                    weight.stride(0), weight.stride(1), weight.stride(2), y.stride(0), y.stride(1), ctx.rank,
                    ctx.heap_bases)
        if side is not None:
            side.join(main)
        return DispatchedGemm(y, d.x, d.counts, d.handle, d.scales)


def _mean_rows(ctx, topk_idx, num_experts, max_tokens) -> float | None:
    """Rows per expert of a full, uniformly routed call (the tile size's key); None where an
    argument is not what it should be (the plan's validation then reports it on every rank)."""
    try:
        return int(max_tokens) * ctx.world_size * int(topk_idx.shape[1]) / int(num_experts)
    except Exception:  # noqa: BLE001 - reported by the collective validation
        return None


def _resolve_schedule(device: torch.device, schedule) -> str:
    """The schedule ``schedule=`` names on ``device`` (``"auto"`` resolved), else an
    :class:`~iris_fw.errors.ArgumentError` naming ``schedule`` and the accepted values."""
    if not isinstance(schedule, str) or schedule not in ("auto", *SCHEDULES):
        raise ArgumentError(f"moe_dispatch_gemm: schedule must be 'auto' or one of {SCHEDULES}, got {schedule!r}")
    if schedule == "auto":
        return "producer_consumer" if device.type == "cuda" else "bulk_sync"
    return schedule


def _reject_schedule(ctx, label: str, error: ArgumentError, cfg: TileConfig, plan_args: tuple) -> None:
    """This rank's ``schedule=`` is bad (``error``); raises it, so that every rank raises.

    Where no fused plan of this call's shape class is cached (under either schedule's dispatch
    programs), every rank plans the call now (the ranks make the same calls, so their caches
    agree): the error goes with the arguments into the plan's validation exchange, before the
    ranks agree (as :mod:`iris_fw.ccl` checks an unknown algorithm name): every rank raises — the
    ranks that passed the bad schedule this error, the others a
    :class:`~iris_fw.engine.contract.CollectiveMismatch` (a ValueError too) naming the rank and
    the error. Where a plan is cached, the peers may be on the cached path, already inside the
    call's kernels, which no exchange reaches: the error takes the call path's way for a host
    failure after the ranks agreed (:func:`iris_fw.callpath.fail`): the peers' waits abort at
    once and they raise :class:`~iris_fw.PeerFailure` naming this rank and the error (a rank
    whose schedule is bad too raises this error); ``ctx.barrier()`` re-arms the job."""
    x, topk_idx, topk_weights, num_experts, max_tokens, capacity, dtype, mode = plan_args
    if any(moe.cached_plan(ctx, *plan_args, tile_rows=cfg.block_m, programs=programs) is not None
           for programs in {cfg.dispatch_programs, 0}):
        callpath.fail(ctx, label, error)
        raise error
    moe.plan(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank=max_tokens, capacity=capacity,
             dtype=dtype, mode=mode, ctx=ctx, tile_rows=cfg.block_m, programs=0, rejected=error)
    raise error  # (not reached: the exchange raised on every rank)


def moe_dispatch_gemm(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, weight: torch.Tensor,
                      num_experts: int, *, max_tokens_per_rank: int, capacity: int | None = None,
                      dtype: torch.dtype | None = None, mode: str = "auto", schedule: str = "auto",
                      out: torch.Tensor | None = None, ctx: Any = None) -> DispatchedGemm:
    """Dispatch (as :func:`iris_fw.moe.moe_dispatch`) fused with the experts' first grouped
    GEMM (collective): ``weight [L, H, N]`` (x's dtype) → :class:`DispatchedGemm` ``(y [L, C,
    N], x [L, C, H], counts [L], handle, scales)`` with ``y[l, s] = x[l, s] @ weight[l]`` for
    the received rows, each tile computed as soon as its rows have arrived. ``schedule``:
    ``"producer_consumer"``, ``"bulk_sync"`` or ``"auto"``; ``out``: a ``[L, C, N]`` tensor of
    x's dtype for ``y`` (default: the plan's buffer). See the module docstring."""
    ctx = _context.resolve(ctx)
    ctx._check_open()
    label = "iris_fw.moe_dispatch_gemm"
    cfg = tile_config(ctx.device, _mean_rows(ctx, topk_idx, num_experts, max_tokens_per_rank))
    try:
        sched = _resolve_schedule(ctx.device, schedule)
    except ArgumentError as exc:  # bad input: raised on every rank (see _reject_schedule)
        _reject_schedule(ctx, label, exc, cfg, (x, topk_idx, topk_weights, num_experts, max_tokens_per_rank,
                                                capacity, dtype, mode))
    programs = cfg.dispatch_programs if sched == "producer_consumer" else 0
    made = moe.plan(x, topk_idx, topk_weights, num_experts, max_tokens_per_rank=max_tokens_per_rank,
                    capacity=capacity, dtype=dtype, mode=mode, ctx=ctx, tile_rows=cfg.block_m, programs=programs)
    n = weight.shape[2] if isinstance(weight, torch.Tensor) and weight.dim() == 3 else None
    key = (n, getattr(weight, "dtype", None), getattr(weight, "device", None), sched)
    return callpath.call(ctx, made.gemm_calls, key, lambda _: _prepare(
        made, label, {"weight N (weight.shape[2])": n, "weight dtype": key[1], "schedule": sched},
        lambda: _check_dispatch_gemm(made, weight, out), lambda: _GemmState(made, n, weight.dtype, sched, cfg)),
        None, label, x, topk_idx, topk_weights, weight, out)


class _CombineState:
    """A plan's GEMM → combine buffers, barrier slots, call epochs and grid, shared by its calls
    of every ``(I, dtypes)`` (allocated on every rank after the first call's exchange)."""

    def __init__(self, plan: moe.MoePlan):
        c, ctx = plan.call, plan.ctx
        dev = ctx.device
        # one row per (token, k) at the source: the low_latency combine's buffer, else one of its own
        self.comb = plan.comb if c.mode == "low_latency" else ctx.zeros(c.max_tokens, c.topk, c.hidden,
                                                                        dtype=c.x_dtype)
        # The entry / done barrier of every moe_gemm_combine call on this plan, whatever its I or
        # dtypes: one slot array, so ONE epoch sequence (``epochs``, ``state``) and one grid
        # (``programs``: the tiles are over the output [L, C, H], whatever I is) for all of them. A
        # slot holds the epoch of its rank's last arrival and a wait passes at ``>= epoch``: two
        # counters on one slot array (as per-I epochs were) would let a call with the lower
        # count pass its barriers at once on a peer's older, higher arrival — a peer's rows still
        # on their way when its combine buffer is read, or overwritten while being read — and an
        # arrival with the lower count overwrite a higher one a peer still waits for. Each plan
        # has its own state (``plan.gemm_combine``): plans never share slots; nor with the
        # plan's own dispatch / combine barriers (its ``slots``, each row with its own counter).
        # (low_latency: ``comb`` is the plan's moe_combine buffer, written under two barriers —
        # safe: passing either one's entry means every peer entered that call, so its earlier
        # work on its stream, a reduce of ``comb`` included, is done.)
        self.slots = ctx.zeros(2, c.world, dtype=torch.int64)
        self.cfg = tile_config(dev, c.max_tokens * c.world * c.topk / c.num_experts)
        work = triton.cdiv(c.capacity, self.cfg.block_m) * c.local_experts * triton.cdiv(c.hidden, self.cfg.block_n)
        self.programs = devinfo.persistent_programs(dev, work)
        self.epochs = torch.zeros(self.programs, dtype=torch.int64, device=dev)
        self.state = torch.zeros(1, dtype=torch.int64, device=dev)
        kp = max(2, triton.next_power_of_2(c.topk))
        self.reduce = KernelLauncher(moe._combine_reduce_kernel, (plan.nprog,), constexprs=dict(
            H=c.hidden, K=c.topk, KP=kp, BH=min(moe.ROW_BLOCK, triton.next_power_of_2(c.hidden))),
            num_warps=moe.NUM_WARPS)
        # every rank's buffers zeroed before a peer writes into them: the group's exchange, not
        # ctx.barrier(), so that a rank failing above (aborting the job) fails its peers here at
        # once (see iris_fw.moe's plan allocation)
        plan.group.sync("iris_fw.moe_gemm_combine: the plan's GEMM -> combine buffers zeroed")


def _check_gemm_combine(made: moe.MoePlan, h, weight, handle: moe.MoeHandle, out) -> None:
    """This rank's checks of a :func:`moe_gemm_combine` call (every call)."""
    c, ctx, what = made.call, made.ctx, "moe_gemm_combine"
    if handle.generation != made.generation:
        raise ArgumentError(f"{what}: the handle is from dispatch #{handle.generation} of this plan, which was "
                            f"overwritten by dispatch #{made.generation} (a handle is valid until the next "
                            f"dispatch with the same shapes)")
    i_dim = _free_dim(what, h, "h", "[L, C, I]", f"local experts {c.local_experts}, capacity {c.capacity}, I >= 1")
    _check_weight(ctx, what, h, (c.local_experts, c.capacity, i_dim), c.x_dtype, "h",
                  "(local experts, capacity, I)")
    if h.stride(-1) != 1:
        raise ArgumentError(f"{what}: h must have contiguous rows, got strides {list(h.stride())}")
    _check_weight(ctx, what, weight, (c.local_experts, i_dim, c.hidden), c.x_dtype, "weight",
                  "(local experts, I, hidden)")
    if out is not None:
        _check_weight(ctx, what, out, (handle.tokens, c.hidden), c.x_dtype, "out", "(tokens, hidden)")
        if out.numel() and out.stride(-1) != 1:
            raise ArgumentError(f"{what}: out must have contiguous rows, got strides {list(out.stride())}")


class _GemmCombine:
    """A plan's GEMM → combine of one ``(I, h dtype, weight dtype)`` (made after the first call's
    exchange); calling it runs one :func:`moe_gemm_combine` call (the call path's cached entry)."""

    def __init__(self, made: moe.MoePlan, key: tuple, weight_dtype: torch.dtype):
        c = made.call
        st = made.gemm_combine
        if st is None:
            st = made.gemm_combine = _CombineState(made)
        self.plan, self.st = made, st
        cfg = st.cfg
        # the plan's one epoch sequence and grid for its barrier slots (see _CombineState)
        self.epochs, self.state = st.epochs, st.state
        self.launch = KernelLauncher(_gemm_combine_kernel, (st.programs,), constexprs=dict(
            I=key[0], H=c.hidden, K=c.topk, L=c.local_experts, C=c.capacity, TMAX=c.max_tokens, BM=cfg.block_m,
            BN=cfg.block_n, BK=cfg.block_k, EXACT=_exact(weight_dtype)), num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)

    def __call__(self, h, weight, handle, out):
        made, st = self.plan, self.st
        c, ctx = made.call, made.ctx
        _check_gemm_combine(made, h, weight, handle, out)
        if out is None:
            out = torch.empty(handle.tokens, c.hidden, dtype=c.x_dtype, device=ctx.device)
        self.launch(h, weight, made.recv_src, made.recv_counts, st.comb, st.slots, self.epochs, self.state,
                    h.stride(0), h.stride(1), weight.stride(0), weight.stride(1), weight.stride(2), ctx.rank,
                    ctx.world_size, ctx.heap_bases)
        st.reduce(st.comb, made.src_slot, made.weights, out, handle.tokens, out.stride(0))
        return out


def moe_gemm_combine(h: torch.Tensor, weight: torch.Tensor, handle: moe.MoeHandle, *,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' second grouped GEMM fused with the combine (collective): ``h [L, C, I]``
    (x's dtype; rows past the counts ignored), ``weight [L, I, H]`` (x's dtype) and the
    dispatch's ``handle`` → ``[T, H]``, ``out[t] = sum_k topk_weights[t, k] * (h[row of (t, k)]
    @ weight[e_k])`` over the rows not dropped; the GEMM's rows go straight to their tokens'
    owners, weighted and summed there. ``out``: a ``[T, H]`` tensor of x's dtype (default a new
    one)."""
    if not isinstance(handle, moe.MoeHandle):
        raise ArgumentTypeError(f"moe_gemm_combine: handle must be the MoeHandle moe_dispatch / moe_dispatch_gemm "
                                f"returned, got {type(handle).__name__}")
    made = handle.plan
    i_dim = h.shape[2] if isinstance(h, torch.Tensor) and h.dim() == 3 else None
    key = (i_dim, getattr(h, "dtype", None), getattr(weight, "dtype", None))
    label = "iris_fw.moe_gemm_combine"
    return callpath.call(made.ctx, made.gemm_combines, key, lambda _: _prepare(
        made, label, {"I (h.shape[2])": i_dim, "h dtype": key[1], "weight dtype": key[2]},
        lambda: _check_gemm_combine(made, h, weight, handle, out), lambda: _GemmCombine(made, key, weight.dtype)),
        None, label, h, weight, handle, out)


# ---- torch reference ------------------------------------------------------------------------------


def moe_gemm_reference(xs: list, idxs: list, weights: list, w1: list, w2: list, num_experts: int,
                       act: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list:
    """What ``moe_dispatch_gemm`` → ``act`` → ``moe_gemm_combine`` compute, in float64, from every
    rank's ``xs[r] [T_r, H]``, ``idxs[r]``, ``weights[r] [T_r, K]`` and every rank's expert weights
    ``w1[r] [L, H, N]``, ``w2[r] [L, N, H]`` (expert ``e`` is ``w*[e // L][e % L]``; no capacity
    limit). Returns ``outs[r] [T_r, H]``."""
    world = len(xs)
    local = num_experts // world
    fn = act or (lambda v: v)

    def expert(e, row):
        r, l = divmod(e, local)
        return fn(row @ w1[r][l].double()) @ w2[r][l].double()

    return moe.moe_reference(xs, idxs, weights, num_experts, expert_fn=expert)[1]
