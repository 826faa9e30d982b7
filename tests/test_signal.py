"""signal / wait_until message passing, the bounded wait's WaitTimeout, and device barriers.

On CPU ranks world sizes 1 and 3 by default, 2 under ``-m extended`` (signal, wait_until and the
device barrier loop over the ranks: no branch that 2 takes and 3 does not)."""

import time

import pytest
import torch
import triton
import triton.language as tl

from helpers import fresh_seed, on_worlds, random_data, sizes
from iris_fw import WaitTimeout
from iris_fw import device as dv


@triton.jit
def _ping_kernel(data, box, flag, n, rounds, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """Each round: put `data` (+round) into the right neighbour's box, signal it, wait for the
    left neighbour's message, and check it arrived whole (count mismatches into flag[1])."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    right = (rank + 1) % world_size
    left = (rank + world_size - 1) % world_size
    for r in range(0, rounds):
        # wait until the right neighbour consumed the previous message (ack in flag[2] of ours)
        dv.wait_until(flag + 2, ">=", r, rank, rank, heap_bases)
        v = tl.load(data + offs, mask=mask) + r
        dv.store(box + offs, v, rank, right, heap_bases, mask=mask)
        dv.signal(flag, r + 1, rank, right, heap_bases, op="set")
        dv.wait_until(flag, ">=", r + 1, rank, rank, heap_bases)
        got = tl.load(box + offs, mask=mask)
        want = dv.load(data + offs, rank, left, heap_bases, mask=mask) + r
        bad = tl.sum(((got != want) & mask).to(tl.int32))
        tl.atomic_add(flag + 1, bad, sem="relaxed", scope="sys")
        dv.signal(flag + 2, 1, rank, left, heap_bases, op="add")  # ack: box may be reused


def _message_passing(ctx, rounds):
    block = sizes(ctx)[0]
    n = block - 5
    seed = fresh_seed(ctx)
    data = ctx.as_symmetric(random_data(block, torch.int32, ctx.device, seed + ctx.rank))
    box = ctx.full((block,), -1, dtype=torch.int32)
    flag = ctx.zeros(3, dtype=torch.int64)
    ctx.barrier()
    _ping_kernel[(1,)](data, box, flag, n, rounds, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=block)
    ctx.barrier()
    assert flag[0].item() == rounds, f"flag {flag.tolist()}"
    assert flag[1].item() == 0, f"{flag[1].item()} elements arrived wrong"
    assert flag[2].item() == rounds, f"acks {flag[2].item()}"


@on_worlds(1, 3)
def test_message_passing(world):
    world.run(_message_passing, 5)


@triton.jit
def _counter_kernel(counter, start, step, target, rank, world_size, heap_bases, CMP: tl.constexpr):
    """Every rank adds `step` to every rank's counter (starting at `start`), then waits until
    its own counter CMP target."""
    for peer in range(0, world_size):
        dv.signal(counter, step, rank, peer, heap_bases, op="add")
    dv.wait_until(counter, CMP, target, rank, rank, heap_bases)


@pytest.mark.parametrize("cmp", ["==", "!=", ">=", ">", "<=", "<"])
@on_worlds(1, 3)
def test_wait_comparisons(world, cmp):
    world.run(_wait_comparisons, cmp)


def _wait_comparisons(ctx, cmp):
    w = ctx.world_size
    # (start, step, target) such that `counter cmp target` first holds after all w adds
    start, step, target = {
        "==": (0, 1, w), "!=": (0, 1, 0), ">=": (0, 1, w), ">": (0, 1, w - 1),
        "<=": (w, -1, 0), "<": (w, -1, 1),
    }[cmp]
    counter = ctx.full((1,), start, dtype=torch.int32)
    ctx.barrier()
    _counter_kernel[(1,)](counter, start, step, target, ctx.rank, w, ctx.heap_bases, CMP=cmp)
    ctx.barrier()
    assert counter.item() == start + w * step


@triton.jit
def _wait_forever_kernel(flag, rank, heap_bases):
    dv.wait_until(flag, "==", 42, rank, rank, heap_bases)


def _missing_signal(ctx):
    flag = ctx.zeros(4, dtype=torch.int32)
    old = ctx.wait_timeout
    ctx.wait_timeout = 1.0
    try:
        ctx.barrier()
        start = time.monotonic()
        if ctx.rank == 0:
            _wait_forever_kernel[(1,)](flag[2:], 0, ctx.heap_bases)  # nobody ever signals it
        with pytest.raises(WaitTimeout) as info:
            ctx.barrier()
        elapsed = time.monotonic() - start
    finally:
        ctx.wait_timeout = old
    text = str(info.value)
    offset = ctx.offset_of(flag) + 8
    # every rank learns that rank 0 waited, for which flag, and what it saw
    assert "rank 0 gave up waiting" in text, text
    assert f"offset {offset:#x}" in text and "int32[4]" in text and "test_signal.py" in text, text
    assert "== 42" in text and "last saw 0" in text, text
    assert elapsed < 20, f"took {elapsed:.1f}s to report"
    return elapsed


@on_worlds(1, 3)
def test_missing_signal_times_out(world):
    elapsed = world.run(_missing_signal)
    assert max(elapsed) < 20


@triton.jit
def _write_kernel(buf, value, rank):
    tl.store(buf + rank, value)


@triton.jit
def _read_all_kernel(buf, out, rank, world_size, heap_bases):
    for peer in range(0, world_size):
        tl.store(out + peer * world_size + peer, dv.load(buf + peer, rank, peer, heap_bases))


def _device_barrier(ctx, epochs):
    w = ctx.world_size
    buf = ctx.full((w,), -1, dtype=torch.int64)
    ctx.barrier()
    for epoch in range(epochs):
        out = torch.full((w, w), -1, dtype=torch.int64, device=ctx.device)
        value = epoch * 100 + ctx.rank
        _write_kernel[(1,)](buf, value, ctx.rank)
        ctx.device_barrier()  # no host barrier: the device barrier alone orders write -> read
        _read_all_kernel[(1,)](buf, out, ctx.rank, w, ctx.heap_bases)
        ctx.device_barrier()  # nobody writes the next epoch before everyone read this one
        got = out.diagonal().tolist()
        assert got == [epoch * 100 + r for r in range(w)], f"epoch {epoch}: {got}"
    ctx.barrier()


@on_worlds(1, 3)
def test_device_barrier(world):
    world.run(_device_barrier, 4)


def _device_barrier_graph(ctx):
    if ctx.device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    w = ctx.world_size
    buf = ctx.full((w,), -1, dtype=torch.int64)
    out = torch.full((w, w), -1, dtype=torch.int64, device=ctx.device)
    ctx.device_barrier()
    ctx.barrier()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        _write_kernel[(1,)](buf, ctx.rank, ctx.rank)  # compile outside capture
        _read_all_kernel[(1,)](buf, out, ctx.rank, w, ctx.heap_bases)
        ctx.device_barrier()
    torch.cuda.synchronize()
    ctx.barrier()
    with torch.cuda.graph(graph, stream=stream):
        _write_kernel[(1,)](buf, ctx.rank, ctx.rank)
        ctx.device_barrier()
        _read_all_kernel[(1,)](buf, out, ctx.rank, w, ctx.heap_bases)
        ctx.device_barrier()
    for _ in range(3):
        out.fill_(-1)
        graph.replay()
        ctx.synchronize()
        assert out.diagonal().tolist() == list(range(w))
    ctx.barrier()


def test_device_barrier_in_cuda_graph(world, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    world.run(_device_barrier_graph)
