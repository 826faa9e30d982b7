"""Fail fast inside a job (docs/reliability.md, "Fail fast"): pointer checks of the device
primitives, the abort word (one lost producer costs one wait bound, a host error on one rank
stops the others' waits at once), and symmetry checks that see allocation order and dtype.
Rank deaths, exits and stops under the three launchers: tests/test_faults.py."""

import re
import time

import pytest
import torch
import triton
import triton.language as tl

import iris_fw
from iris_fw import device as dv
from iris_fw import env
from iris_fw.interpreter import interpreting


@triton.jit
def _copy_from_peer_kernel(src, dst, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, dv.load(src + offs, rank, peer, heap_bases, mask=mask, other=0.0), mask=mask)


@triton.jit
def _put_kernel(src, dst, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    dv.put(src + offs, dst + offs, rank, peer, heap_bases, mask=offs < n)


def _settle(ctx):
    """The barrier after every rank raised its own pointer failure: a peer's failure that reached
    this rank after its synchronize is reported once more, here, on every rank (each rank reports
    another rank's cause once); the next barrier re-arms without raising."""
    try:
        ctx.barrier()
    except iris_fw.NotOnHeapError:
        ctx.barrier()


def _pointer_checks(ctx):
    w, me = ctx.world_size, ctx.rank
    assert ctx.heap_bases.CHECK_POINTERS
    canary = ctx.full((256,), 7.0)
    good = ctx.arange(64, dtype=torch.float32)
    out = torch.zeros(64, device=ctx.device)
    ctx.barrier()
    # a tensor that is not on the heap: reported, nothing read through it
    stray = torch.arange(64, dtype=torch.float32, device=ctx.device)
    _copy_from_peer_kernel[(1,)](stray, out, 64, me, (me + 1) % w, ctx.heap_bases, BLOCK=64)
    with pytest.raises(iris_fw.NotOnHeapError) as info:
        ctx.synchronize()
    text = str(info.value)
    assert f"rank {me}" in text and f"heap of {ctx.heap_size} bytes" in text and "offset" in text, text
    _settle(ctx)  # re-arms the job (every rank's waits were aborted)
    # a peer outside the world: reported, no heap touched
    _put_kernel[(1,)](good, canary, 64, me, w + 3, ctx.heap_bases, BLOCK=64)
    with pytest.raises(iris_fw.NotOnHeapError, match=rf"peer rank {w + 3} is outside the world \[0, {w}\)"):
        ctx.synchronize()
    _settle(ctx)
    assert torch.equal(canary, torch.full_like(canary, 7.0)), "a failed check wrote memory"
    # lanes masked off may point anywhere (a tile overhanging a heap's end, a stray pointer)
    _copy_from_peer_kernel[(1,)](stray, out, 0, me, (me + 1) % w, ctx.heap_bases, BLOCK=64)
    _copy_from_peer_kernel[(1,)](good, out, 64, me, (me + 1) % w, ctx.heap_bases, BLOCK=128)
    ctx.synchronize()
    assert torch.equal(out, torch.arange(64, dtype=torch.float32, device=ctx.device))
    ctx.barrier()


def test_pointer_checks(world):
    # what every rank's context decides (ctx.heap_bases.CHECK_POINTERS): skipped here, not in the ranks
    if not (interpreting() or env.get("IRIS_FW_DEBUG")):
        pytest.skip("device pointer checks are compiled in on GPUs in a debug context (IRIS_FW_DEBUG=1) only")
    world.run(_pointer_checks)


def _lost_producer(ctx):
    """A consumer whose producer never runs: its first acquire times out, every later one gives
    up at once (the abort word): one wait bound for the kernel, not one per tile."""
    from iris_fw import ops
    from iris_fw.engine.scheduler import launch_consumer

    # at least 8 tiles: CPU tiles are small, GPU tiles up to 128 x 256
    m, n = (64, 64) if ctx.device.type == "cpu" else (1024, 512)
    a = torch.randn(m, 64, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(64, n, device=ctx.device, dtype=torch.bfloat16)
    op = ops.plan("gemm_all_scatter", a, b, scheduler="producer_consumer")
    plan = op.pattern.bind(ctx, op.buffers, a, b)
    flag = ctx.zeros(1, dtype=torch.int32)
    old, ctx.wait_timeout = ctx.wait_timeout, 0.5
    try:
        ctx.barrier()
        start = time.monotonic()
        _wait_kernel[(1,)](flag, ctx.rank, ctx.heap_bases)  # one wait bound, for comparison
        with pytest.raises(iris_fw.WaitTimeout):
            ctx.synchronize()
        one = time.monotonic() - start
        ctx.barrier()
        start = time.monotonic()
        launch_consumer(ctx, plan, op.workspace, sync=True, queue=False)
        with pytest.raises(iris_fw.WaitTimeout) as info:
            ctx.synchronize()
        many = time.monotonic() - start
    finally:
        ctx.wait_timeout = old
    assert plan.num_tiles >= 8, plan.num_tiles
    # one program's wait timed out and the others gave up at once: on CPU ranks (programs one
    # after another) exactly one; on a GPU the programs spinning at the same moment may reach
    # the bound together (seen under MPS with 8 SMs each: 4), never one per tile
    timed_out = int(re.search(r"(\d+) wait\(s\) timed out", str(info.value)).group(1))
    most = 1 if ctx.device.type == "cpu" else plan.num_tiles - 1
    assert 1 <= timed_out <= most, str(info.value)
    assert many < 3 * one + 2, f"{plan.num_tiles} tiles took {many:.1f} s; one wait bound {one:.1f} s"
    del op, plan
    ctx.barrier()


@triton.jit
def _wait_kernel(flag, rank, heap_bases):
    dv.wait_until(flag, "==", 1, rank, rank, heap_bases)


def test_lost_producer_costs_one_wait_bound(iris_pool):
    iris_pool(1).run(_lost_producer)


def _host_error(ctx):
    """Rank 1 fails on its host inside an op call; rank 0, already in the op's kernel, stops
    waiting at once (not after its wait bound) and raises naming rank 1."""
    from iris_fw import ops
    from iris_fw.engine.contract import PatternError

    a = torch.randn(16, 16, device=ctx.device, dtype=torch.bfloat16)
    op = ops.plan("gemm_all_scatter", a, a, scheduler="fused_sequential")
    op(a, a)
    ctx.synchronize()
    old, ctx.wait_timeout = ctx.wait_timeout, 60.0
    try:
        ctx.barrier()
        start = time.monotonic()
        if ctx.rank == 1:
            with pytest.raises(PatternError):
                op(a[:8], a)  # planned for other shapes: raises here, before any launch
        else:
            op(a, a)  # waits in the kernel's entry barrier for rank 1
            with pytest.raises(iris_fw.PeerFailure, match="rank 1 failed: iris_fw.ops gemm_all_scatter") as info:
                ctx.synchronize()
            assert info.value.rank == 1
        elapsed = time.monotonic() - start
    finally:
        ctx.wait_timeout = old
    ctx.barrier()  # every rank raised: the barrier re-arms without raising again
    # the op's per-call state differs across ranks now (rank 1 never launched): it refuses calls,
    # a new one works
    with pytest.raises(iris_fw.IrisError, match="plan it again"):
        op(a, a)
    op = ops.plan("gemm_all_scatter", a, a, scheduler="fused_sequential")
    c = op(a, a)
    ctx.synchronize()
    ref = a.double() @ a.double()
    torch.testing.assert_close(c[:, ctx.rank * 16:(ctx.rank + 1) * 16].double(), ref, atol=0.1, rtol=0.05)
    del op, c
    ctx.barrier()
    return elapsed


def test_host_error_inside_an_op_aborts_the_others(iris_pool):
    elapsed = iris_pool(2).run(_host_error)
    assert elapsed[0] < 30, elapsed  # the wait bound was 60 s


def _symmetry(ctx, case):
    if case == "order":  # the same two sizes, in another order on rank 1
        dtypes = [torch.float32, torch.int64] if ctx.rank == 0 else [torch.int64, torch.float32]
        tensors = [ctx.empty(64 if d == torch.float32 else 32, dtype=d) for d in dtypes]
    else:  # the same bytes, another dtype on rank 1
        tensors = [ctx.empty(64, dtype=torch.float32 if ctx.rank == 0 else torch.int32)]
    with pytest.raises(iris_fw.SymmetryError, match="dtypes and offsets in the same order"):
        ctx.barrier()
    del tensors
    ctx.barrier()  # the next window compares afresh


@pytest.mark.parametrize("case", ["order", "dtype"])
def test_barrier_sees_allocation_order_and_dtype(iris_pool, case):
    """Same sizes in another order, or the same bytes as another dtype: the free lists agree,
    the allocation sequence does not."""
    iris_pool(2).run(_symmetry, case)
