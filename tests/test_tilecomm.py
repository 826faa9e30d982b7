"""iris_fw.tilecomm: every exchange in small multi-program kernels, world sizes 1-4.

Each kernel splits a ragged 1-D (or 2-D) symmetric tensor into tiles spread over a few
programs, takes its epoch from a heap counter on the device, enters with an arrival barrier
and leaves with a cross-rank exit barrier done by the last program. Every kernel runs at least
twice in a row on the same buffers with fresh data and no host synchronization between the
calls (seeds are agreed once per rank function), so only the device-side epochs order them. Outputs are poisoned first
and checked against float64/int64 references built from every rank's inputs: exactly for
integers, max and min; within 2 ulps of the output dtype times the magnitude for float sums
and products (the interpreter truncates fp32 -> bf16 where a GPU rounds: 1 ulp at most).
Last, the kernels are compiled for sm_90 in a child process (no GPU needed).

On CPU ranks the exchanges run at world sizes 1 and 3 by default, 2 under ``-m extended``
(tilecomm loops over the ranks with no branch that 2 takes and 3 does not); so does the
missing-rank timeout (at 3 two ranks wait for the missing one).
"""

import os
import subprocess
import sys
import time

import pytest
import torch
import triton
import triton.language as tl

from helpers import fresh_seed, on_worlds, poison_value, sizes
from iris_fw import WaitTimeout
from iris_fw import tilecomm as tc

# ---- kernel prologue / epilogue --------------------------------------------------------------


@triton.jit
def _enter(sync, state, rank, world_size, heap_bases):
    """Every program: this call's epoch (state[0] + 1); arrive at and wait for the entry
    barrier (2 * epoch - 1 in sync): every rank's inputs are written, its outputs poisoned."""
    epoch = tl.load(state) + 1
    tc.arrive(sync, 2 * epoch - 1, rank, world_size, heap_bases)
    tc.wait_arrivals(sync, 2 * epoch - 1, rank, world_size, heap_bases)
    return epoch


@triton.jit
def _leave(sync, state, epoch, rank, world_size, heap_bases):
    """Every program, at its end: the last one of this rank stores the epoch and does the exit
    barrier (2 * epoch): every peer's writes into this rank's buffers are done."""
    if tc.last_program(state + 1, tl.num_programs(0), epoch):
        tl.store(state, epoch)
        tc.arrive(sync, 2 * epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(sync, 2 * epoch, rank, world_size, heap_bases)


# ---- 1-D kernels: tiles t = pid, pid + nprog, ... of n elements -------------------------------


@triton.jit
def _all_reduce_kernel(src, dst, sync, state, n, rank, world_size, heap_bases,
                       OP: tl.constexpr, BLOCK: tl.constexpr):
    """One-shot all-reduce: dst = reduce over ranks of src."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tc.tile_all_reduce(src + offs, dst + offs, rank, world_size, heap_bases, mask=offs < n, OP=OP)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _two_shot_kernel(src, dst, sync, state, n, rank, world_size, heap_bases,
                     OP: tl.constexpr, BLOCK: tl.constexpr):
    """Two-shot all-reduce: tile t's owner (t % world_size) reduces it and stores it on every rank."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        if t % world_size == rank:
            offs = t * BLOCK + tl.arange(0, BLOCK)
            tc.tile_reduce_broadcast(src + offs, dst + offs, rank, world_size, heap_bases, mask=offs < n, OP=OP)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _reduce_scatter_kernel(src, dst, sync, state, n, stride, rank, world_size, heap_bases,
                           OP: tl.constexpr, BLOCK: tl.constexpr):
    """Reduce-scatter: dst = reduce over ranks of src[rank * stride:][:n]."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tc.tile_all_reduce(src + rank * stride + offs, dst + offs, rank, world_size, heap_bases,
                           mask=offs < n, OP=OP)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _all_gather_kernel(src, dst, sync, state, n, stride, rank, world_size, heap_bases,
                       PULL: tl.constexpr, BLOCK: tl.constexpr):
    """All-gather: dst[p * stride:][:n] = rank p's src[:n], by push or by pull."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if PULL:
            tc.tile_gather(src + offs, dst + offs, stride, rank, world_size, heap_bases, mask=offs < n)
        else:
            tc.tile_put_all(src + offs, dst + rank * stride + offs, rank, world_size, heap_bases, mask=offs < n)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _all_to_all_kernel(src, dst, sync, state, n, stride, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """All-to-all: on rank q, dst[p * stride:][:n] = rank p's src[q * stride:][:n]."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        tc.tile_all_to_all(src + offs, dst + offs, stride, rank, world_size, heap_bases, mask=offs < n)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _put_chunks_kernel(src, dst, meta, sync, state, longest, stride, rank, world_size, heap_bases,
                       BLOCK: tl.constexpr):
    """Ragged all-to-all: on rank q, dst[p * stride:][:c] = rank p's chunk for q (``c``
    elements, ``meta[world_size + q]`` on p, at ``src + meta[q]``); ``meta``: int64
    ``[2, world_size]``, this rank's chunk offsets then lengths; ``longest``: the longest chunk
    of any rank."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(longest, BLOCK), tl.num_programs(0)):
        pos = t * BLOCK + tl.arange(0, BLOCK)
        tc.tile_put_chunks(src + pos, meta, meta + world_size, pos, dst + pos, stride, rank, world_size, heap_bases)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


@triton.jit
def _broadcast_kernel(src, dst, copy, flag, sync, state, n, root, rank, world_size, heap_bases,
                      PULL: tl.constexpr, BLOCK: tl.constexpr):
    """Broadcast: dst[:n] = root's src[:n]; every rank pulls, or the root pushes. Push: the
    root's last program announces the whole tensor with signal_peers(flag, epoch); the other
    ranks wait_flag for it and copy dst into copy inside the kernel (root's other programs
    never wait for it: they are the ones it waits for)."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    if not PULL:
        if rank != root:
            tc.wait_flag(flag, epoch, rank, heap_bases)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if PULL:
            tc.tile_broadcast(src + offs, dst + offs, rank, root, heap_bases, mask=offs < n)
        elif rank == root:
            tc.tile_put_all(src + offs, dst + offs, rank, world_size, heap_bases, mask=offs < n)
        else:
            tl.store(copy + offs, tl.load(dst + offs, mask=offs < n), mask=offs < n)
    if tc.last_program(state + 1, tl.num_programs(0), epoch):
        tl.store(state, epoch)
        if not PULL:
            if rank == root:
                tc.signal_peers(flag, epoch, rank, world_size, heap_bases)
        tc.arrive(sync, 2 * epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(sync, 2 * epoch, rank, world_size, heap_bases)


# ---- 2-D kernel: [BM, BN] tiles of an M x N matrix with row stride ld ------------------------


@triton.jit
def _matrix_kernel(src, dst, sync, state, M, N, ld, slot, rank, world_size, heap_bases,
                   PATTERN: tl.constexpr, OP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """PATTERN "all_reduce": dst = reduce over ranks of src; "gather_push" / "gather_pull":
    dst[p * slot:] (a matrix like src) = rank p's src."""
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    tiles_n = tl.cdiv(N, BN)
    for t in range(tl.program_id(0), tl.cdiv(M, BM) * tiles_n, tl.num_programs(0)):
        rows = (t // tiles_n) * BM + tl.arange(0, BM)
        cols = (t % tiles_n) * BN + tl.arange(0, BN)
        offs = rows[:, None] * ld + cols[None, :]
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if PATTERN == "all_reduce":
            tc.tile_all_reduce(src + offs, dst + offs, rank, world_size, heap_bases, mask=mask, OP=OP)
        elif PATTERN == "gather_push":
            tc.tile_put_all(src + offs, dst + rank * slot + offs, rank, world_size, heap_bases, mask=mask)
        else:
            tc.tile_gather(src + offs, dst + offs, slot, rank, world_size, heap_bases, mask=mask)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


# ---- host side -------------------------------------------------------------------------------

F32, BF16, FP8, I32 = torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32

# Calls per rank function, grouped by dtype (one pair of buffers per dtype, reused by its
# calls). Every kernel runs at least twice in a row on the same buffers with fresh data; the
# interpreter is slow, so the full dtype x op matrix runs on the one-shot kernel only (all
# three reduction kernels share tile_reduce) and the others take a cross-section.
REDUCE_CASES = {
    "one_shot": {F32: ("sum", "sum", "max", "min", "prod"), BF16: ("sum", "max", "min", "prod"),
                 FP8: ("sum", "max"), I32: ("sum", "sum", "max", "min")},
    "two_shot": {F32: ("sum", "sum", "prod"), BF16: ("min", "sum"), I32: ("max", "sum")},
    "reduce_scatter": {F32: ("sum", "sum", "max"), BF16: ("prod", "sum"), FP8: ("sum",), I32: ("min",)},
}
MOVE_CASES = {
    "gather_push": {BF16: 2, I32: 1},
    "gather_pull": {F32: 2, BF16: 1},
    "all_to_all": {I32: 2, F32: 1},
    "broadcast_push": {F32: 2, I32: 1},
    "broadcast_pull": {BF16: 2, F32: 1},
}


def _inputs(numel, dtype, op, seed):
    """One rank's input: normal floats (x8), magnitudes in [0.5, 2) for prod, ints below
    2**30 in magnitude (sums wrap). fp8: small integers, whose sums fp8 holds exactly —
    Triton's interpreter rounds fp32 -> fp8 wrongly where rounding carries into the exponent
    (1.96 -> 1.0), a GPU does not; exact sums test loads, accumulation and stores all the same."""
    g = torch.Generator().manual_seed(seed)
    if not dtype.is_floating_point:
        return torch.randint(-(1 << 30), 1 << 30, (numel,), generator=g).to(dtype)
    if op == "prod":
        sign = torch.randint(0, 2, (numel,), generator=g) * 2 - 1
        return (sign * (0.5 + 1.5 * torch.rand(numel, generator=g))).to(dtype)
    if dtype.itemsize == 1:
        return torch.randint(-3, 4, (numel,), generator=g).to(dtype)
    return (torch.randn(numel, generator=g) * 8).to(dtype)


def _reference(parts, op, dtype):
    """(reference in float64 / int64, per-element error bound) of reducing ``parts``."""
    wide = torch.stack([p.to(torch.float64 if dtype.is_floating_point else torch.int64) for p in parts])
    if op == "sum":
        ref = wide.sum(0)
    elif op == "prod":
        ref = wide.prod(0)
    elif op == "max":
        ref = wide.max(0).values
    else:
        ref = wide.min(0).values
    if not dtype.is_floating_point or op in ("max", "min"):
        return ref, None  # exact (int sums wrap like the kernel's)
    info = torch.finfo(dtype)
    magnitude = wide.abs().sum(0) if op == "sum" else ref.abs()
    return ref, 2 * info.eps * magnitude + info.tiny  # 2 ulps of the output dtype


def _same(a, b):
    """Bitwise equality (NaN-safe) of two tensors of one dtype, 1-byte floats included."""
    a, b = a.cpu(), b.cpu()
    if a.dtype.is_floating_point:
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def _poisoned(t, poison):
    return _same(t, torch.full_like(t, poison))


def _check(got, n, ref, bound, poison, what):
    """got[:n] matches the reference (exactly where ``bound`` is None), got[n:] is poison."""
    got, ref = got.cpu(), ref.cpu()
    if isinstance(bound, torch.Tensor):
        bound = bound.cpu()
    if got.dtype.is_floating_point:
        err = (got[:n].to(torch.float64) - ref).abs()
    else:
        err = (got[:n].to(torch.int64) - ref.to(got.dtype).to(torch.int64)).abs()  # int sums wrap
    bad = ~(err <= (0 if bound is None else bound))  # NaN (poison left) counts as wrong
    assert not bad.any(), f"{what}: {int(bad.sum())} wrong, first at {int(bad.nonzero()[0])}: " \
                          f"got {got[:n][bad][:4].tolist()}, want {ref[bad][:4].tolist()}"
    assert _poisoned(got[n:], poison), f"{what}: masked-off lanes were written"


def _shape(ctx):
    block = sizes(ctx)[0]
    return block, 3 * block - 5, 3 * block  # BLOCK, n (ragged: 3 tiles, the last short), padded


def _sync_state(ctx):
    """Entry/exit slots (one per rank) and [epoch, program counter] for one rank function;
    every kernel run on one state must use the same grid."""
    return ctx.zeros(ctx.world_size, dtype=torch.int64), ctx.zeros(2, dtype=torch.int64)


def _reductions(ctx, pattern, grid):
    block, n, npad = _shape(ctx)
    w, me, hb = ctx.world_size, ctx.rank, ctx.heap_bases
    seed = fresh_seed(ctx)  # the only host collective before the end: calls order themselves
    sync, state = _sync_state(ctx)
    rows = w if pattern == "reduce_scatter" else 1
    calls = 0
    for dtype, ops in REDUCE_CASES[pattern].items():
        if dtype == FP8 and ctx.device.type == "cuda" and torch.cuda.get_device_capability(ctx.device) < (8, 9):
            continue  # no fp8e4nv before sm_89
        src = ctx.zeros(rows * npad, dtype=dtype)
        dst = ctx.zeros(npad, dtype=dtype)
        poison = poison_value(dtype)
        for op in ops:
            calls += 1
            data = [_inputs(rows * npad, dtype, op, seed + 1000 * calls + r) for r in range(w)]
            src.copy_(data[me])
            dst.fill_(poison)
            if pattern == "one_shot":
                _all_reduce_kernel[(grid,)](src, dst, sync, state, n, me, w, hb, OP=op, BLOCK=block)
                parts = [d[:n] for d in data]
            elif pattern == "two_shot":
                _two_shot_kernel[(grid,)](src, dst, sync, state, n, me, w, hb, OP=op, BLOCK=block)
                parts = [d[:n] for d in data]
            else:
                _reduce_scatter_kernel[(grid,)](src, dst, sync, state, n, npad, me, w, hb, OP=op, BLOCK=block)
                parts = [d[me * npad:me * npad + n] for d in data]
            ref, bound = _reference(parts, op, dtype)
            _check(dst, n, ref, bound, poison, f"{pattern} {dtype} {op} (call {calls})")
        del src, dst
    # one epoch per call, the program counter advanced by the grid each call, every slot at
    # the last exit value
    assert state.tolist() == [calls, calls * grid], state.tolist()
    assert sync.tolist() == [2 * calls] * w, sync.tolist()
    del sync, state
    ctx.barrier()


@pytest.mark.parametrize("pattern,grid", [("one_shot", 2), ("two_shot", 3), ("reduce_scatter", 2)])
@on_worlds(1, 3)
def test_reductions(world, pattern, grid):
    world.run(_reductions, pattern, grid)


def _movement(ctx, pattern, grid):
    block, n, npad = _shape(ctx)
    w, me, hb = ctx.world_size, ctx.rank, ctx.heap_bases
    seed = fresh_seed(ctx)
    sync, state = _sync_state(ctx)
    src_rows = w if pattern == "all_to_all" else 1
    dst_rows = 1 if pattern.startswith("broadcast") else w
    flag = ctx.zeros(1, dtype=torch.int64)  # push broadcast: "root's tensor is complete"
    calls = 0
    for dtype, count in MOVE_CASES[pattern].items():
        src = ctx.zeros(src_rows * npad, dtype=dtype)
        dst = ctx.zeros(dst_rows * npad, dtype=dtype)
        copy = torch.empty(npad, dtype=dtype, device=ctx.device)
        poison = poison_value(dtype)
        for _ in range(count):
            calls += 1
            data = [_inputs(src_rows * npad, dtype, "sum", seed + 1000 * calls + r) for r in range(w)]
            src.copy_(data[me])
            dst.fill_(poison)
            copy.fill_(poison)
            root = calls % w
            if pattern in ("gather_push", "gather_pull"):
                _all_gather_kernel[(grid,)](src, dst, sync, state, n, npad, me, w, hb,
                                            PULL=pattern == "gather_pull", BLOCK=block)
                want = [data[p][:n] for p in range(w)]
            elif pattern == "all_to_all":
                _all_to_all_kernel[(grid,)](src, dst, sync, state, n, npad, me, w, hb, BLOCK=block)
                want = [data[p][me * npad:me * npad + n] for p in range(w)]
            else:
                _broadcast_kernel[(grid,)](src, dst, copy, flag, sync, state, n, root, me, w, hb,
                                           PULL=pattern == "broadcast_pull", BLOCK=block)
                want = [data[root][:n]]
                if pattern == "broadcast_push":
                    assert flag.item() == calls, f"flag {flag.item()}, call {calls}"
                    if me != root:  # read inside the kernel once the flag said so
                        assert _same(copy[:n], want[0]), f"{pattern} {dtype} (call {calls}): copy wrong"
                if pattern == "broadcast_pull" or me == root:
                    assert _poisoned(copy, poison), f"{pattern} {dtype} (call {calls}): copy written"
            for p, expected in enumerate(want):
                row = dst[p * npad:(p + 1) * npad]
                assert _same(row[:n], expected), f"{pattern} {dtype} (call {calls}): slot {p} wrong"
                assert _poisoned(row[n:], poison), f"{pattern} {dtype} (call {calls}): tail of slot {p} written"
        del src, dst, copy
    assert state.tolist() == [calls, calls * grid], state.tolist()
    del sync, state, flag
    ctx.barrier()


@pytest.mark.parametrize("pattern,grid", [("gather_push", 4), ("gather_pull", 2), ("all_to_all", 3),
                                          ("broadcast_push", 2), ("broadcast_pull", 4)])
@on_worlds(1, 3)
def test_movement(world, pattern, grid):
    world.run(_movement, pattern, grid)


def _ragged_all_to_all(ctx, grid):
    """tile_put_chunks: chunk lengths differ per (sender, receiver) pair, empty ones and ones
    ending mid-tile included, and change between the two calls on the same buffers."""
    block, _, npad = _shape(ctx)
    w, me, hb = ctx.world_size, ctx.rank, ctx.heap_bases
    seed = fresh_seed(ctx)
    sync, state = _sync_state(ctx)
    src = ctx.zeros(w * npad, dtype=F32)
    dst = ctx.zeros(w * npad, dtype=F32)
    poison = poison_value(F32)
    for call in (1, 2):
        # splits[p][q]: elements rank p sends rank q (every rank computes the same table)
        splits = [[(7 * p + 5 * q + 11 * call) * block // 4 % (npad + 1) for q in range(w)] for p in range(w)]
        if w > 1:
            splits[0][1] = 0
        send = splits[me]
        offsets = [sum(send[:q]) for q in range(w)]
        meta = torch.tensor([offsets, send], dtype=torch.int64, device=ctx.device)
        data = [_inputs(w * npad, F32, "sum", seed + 1000 * call + r) for r in range(w)]
        src.copy_(data[me])
        dst.fill_(poison)
        longest = max(max(row) for row in splits)
        _put_chunks_kernel[(grid,)](src, dst, meta, sync, state, longest, npad, me, w, hb, BLOCK=block)
        for p in range(w):
            count = splits[p][me]
            start = sum(splits[p][:me])
            row = dst[p * npad:(p + 1) * npad]
            assert _same(row[:count], data[p][start:start + count]), f"ragged all_to_all (call {call}): slot {p} wrong"
            assert _poisoned(row[count:], poison), f"ragged all_to_all (call {call}): tail of slot {p} written"
    assert state.tolist() == [2, 2 * grid], state.tolist()
    del src, dst, sync, state
    ctx.barrier()


@on_worlds(1, 3)
def test_ragged_all_to_all(world):
    world.run(_ragged_all_to_all, 2)


def _matrix(ctx, grid):
    """2-D [BM, BN] tiles of a ragged M x N matrix stored with padded rows (ld > N)."""
    bm, bn = 16, 32
    m, ncols, ld = 2 * bm - 3, 2 * bn - 7, 2 * bn
    w, me, hb = ctx.world_size, ctx.rank, ctx.heap_bases
    seed = fresh_seed(ctx)
    sync, state = _sync_state(ctx)
    slot = m * ld
    calls = 0
    for dtype, pattern, ops in [(F32, "all_reduce", ("sum", "max")), (BF16, "gather_push", ("-",)),
                                (I32, "gather_pull", ("-",))]:
        rows = 1 if pattern == "all_reduce" else w
        src = ctx.zeros(slot, dtype=dtype)
        dst = ctx.zeros(rows * slot, dtype=dtype)
        poison = poison_value(dtype)
        for op in ops:
            calls += 1
            data = [_inputs(slot, dtype, op, seed + 1000 * calls + r) for r in range(w)]
            src.copy_(data[me])
            dst.fill_(poison)
            _matrix_kernel[(grid,)](src, dst, sync, state, m, ncols, ld, slot, me, w, hb,
                                    PATTERN=pattern, OP=op if op != "-" else "sum", BM=bm, BN=bn)
            what = f"2-D {pattern} {dtype} {op} (call {calls})"
            if pattern == "all_reduce":
                ref, bound = _reference([d.view(m, ld)[:, :ncols].reshape(-1) for d in data], op, dtype)
                got = dst.view(m, ld)
                _check(got[:, :ncols].reshape(-1), m * ncols, ref, bound, poison, what)
                assert _poisoned(got[:, ncols:], poison), f"{what}: padding written"
            else:
                got = dst.view(w, m, ld)
                for p in range(w):
                    assert _same(got[p, :, :ncols], data[p].view(m, ld)[:, :ncols]), f"{what}: slot {p} wrong"
                assert _poisoned(got[:, :, ncols:], poison), f"{what}: padding written"
        del src, dst
    del sync, state
    ctx.barrier()


@on_worlds(1, 3)
def test_matrix_tiles(world):
    world.run(_matrix, 3)


@triton.jit
def _enter_leave_kernel(sync, state, rank, world_size, heap_bases):
    epoch = _enter(sync, state, rank, world_size, heap_bases)
    _leave(sync, state, epoch, rank, world_size, heap_bases)


def _missing_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    missing = w - 1
    sync, state = _sync_state(ctx)
    old = ctx.wait_timeout
    ctx.wait_timeout = 0.5
    try:
        ctx.barrier()
        start = time.monotonic()
        if me != missing:
            _enter_leave_kernel[(1,)](sync, state, me, w, ctx.heap_bases)
        with pytest.raises(WaitTimeout) as info:
            ctx.barrier()
        elapsed = time.monotonic() - start
    finally:
        ctx.wait_timeout = old
    text = str(info.value)
    slot = ctx.offset_of(sync) + 8 * missing
    # the first waiter to time out names the missing rank's slot; it aborts the others' waits,
    # which give up at once (each rank's report says so) instead of timing out one by one
    assert f"gave up waiting for the flag at offset {slot:#x}" in text, text
    assert "'s heap to become >= 1" in text, text
    for r in range(w):
        if r != missing:
            assert f"rank {r} gave up waiting" in text or f"wait(s) of rank {r} gave up" in text, text
    assert os.path.basename(__file__) in text, text
    assert elapsed < 15, f"took {elapsed:.1f}s to report"
    del sync, state
    ctx.barrier()
    return elapsed


@on_worlds(1, 3)
def test_missing_rank_times_out(world):
    if world.world_size == 1:
        pytest.skip("needs a peer that does not arrive")
    elapsed = world.run(_missing_rank)
    assert max(elapsed) < 15


# ---- the same kernels compiled for an NVIDIA target (no GPU needed) ---------------------------

_SM90_JOBS = [  # (kernel name, element type of src/dst, constexprs)
    ("_all_reduce_kernel", "fp32", {"OP": "sum"}),
    ("_all_reduce_kernel", "bf16", {"OP": "prod"}),
    ("_all_reduce_kernel", "fp8e4nv", {"OP": "max"}),
    ("_all_reduce_kernel", "i32", {"OP": "min"}),
    ("_two_shot_kernel", "bf16", {"OP": "sum"}),
    ("_reduce_scatter_kernel", "fp32", {"OP": "max"}),
    ("_all_gather_kernel", "fp32", {"PULL": False}),
    ("_all_gather_kernel", "fp32", {"PULL": True}),
    ("_all_to_all_kernel", "fp32", {}),
    ("_put_chunks_kernel", "fp32", {}),
    ("_broadcast_kernel", "bf16", {"PULL": True}),
    ("_broadcast_kernel", "i32", {"PULL": False}),
    ("_matrix_kernel", "fp32", {"PATTERN": "all_reduce", "OP": "sum", "BM": 64, "BN": 64}),
]

#: Jobs whose 32-bit tiles move element by element: ragged chunks start at run-time offsets of
#: any alignment and end at run-time lengths (the all-to-all collective's send, the same code).
_SCALAR_JOBS = ("compiled _put_chunks_kernel ",)


def _compile_sm90():
    """Compile every job of _SM90_JOBS for sm_90; print one line per job. Runs in a child
    process that set TRITON_INTERPRET=0 before importing Triton (see the test below)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for name, elem, constexprs in _SM90_JOBS:
        kernel = globals()[name]
        constexprs = {"BLOCK": 1024, **constexprs} if "BLOCK" in kernel.arg_names else constexprs
        sig, attrs = {}, {}
        for i, arg in enumerate(kernel.arg_names):
            if arg in constexprs:
                sig[arg] = "constexpr"
                continue
            sig[arg] = {"src": "*" + elem, "dst": "*" + elem, "copy": "*" + elem, "flag": "*i64",
                        "sync": "*i64", "state": "*i64", "meta": "*i64", "heap_bases": "*i64"}.get(arg, "i32")
            if arg not in ("rank", "root", "world_size"):  # as the JIT specializes aligned
                attrs[(i,)] = [["tt.divisibility", 16]]  # pointers and sizes
        compiled = triton.compile(ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        print("compiled", name, elem, constexprs, "v4" if ".v4." in ptx else "scalar", flush=True)


def test_kernels_compile_for_sm90(tmp_path):
    """Triton's interpreter accepts code that the compiler rejects: compile the test kernels
    (and with them every tilecomm function) for sm_90 in a child process, and check that 32-bit
    tiles, remote ones included, are moved with vector loads and stores."""
    script = tmp_path / "compile_sm90.py"
    script.write_text(
        "import os, sys\n"
        "os.environ['TRITON_INTERPRET'] = '0'\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import test_tilecomm\n"
        "test_tilecomm._compile_sm90()\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("compiled")]
    assert len(lines) == len(_SM90_JOBS), proc.stdout
    for line in lines:
        if (" fp32 " in line or " i32 " in line) and not line.startswith(_SCALAR_JOBS):
            assert line.endswith("v4"), f"not vectorized: {line}"
