"""Iris conformance, the last gaps of issue 29: ``ccl.Config``'s every field (Iris's validation,
``AUTOTUNE``, AMD-only tuning noted once), ``shmem.heap`` (``allocate``, ``allocator``) and
``iris.tensor_creation``, ``shmem._device_barrier_state``, the ``iris.host.*`` package layout,
Iris's tracing API (``shmem.tracing``, ``DeviceContext.initialize(…, tracing=True)``,
``iris.TraceEvent``) over iris-fw's tracing, the workspace capacity check of the spin-lock and
ring all-reduce, ``iris.ops.<op>`` modules and AMD-only launch options, Iris's message-passing
example (producer/consumer on two ranks, launched as Iris's test launches it: no barrier between
allocating the flags and signalling them), and ``allocator_type="vmem"``.

Two ranks mostly (the protocols are pairwise); CPU ranks by default, the same tests on GPUs (one
GPU under MPS at W = 2 is enough; references never use torch's all_to_all). Values are checked
against float64 / exact references; every wait in a test kernel is bounded.
"""

import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
import triton
import triton.language as tl

import iris_fw
import iris_fw.compat.iris as iris
from iris_fw.compat.iris import tensor_creation
from iris_fw.compat.iris.ccl import AUTOTUNE, Config
from helpers import capture_graph, fresh_seed, on_worlds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spins(ctx):
    """A bound for test kernels' spin loops: seconds of polling, on GPUs and the interpreter."""
    return 1 << 24 if ctx.device.type == "cuda" else 1 << 12


# ---- (a) ccl.Config ---------------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_config_fields_defaults_and_validation():
    """Every field of Iris's Config is accepted with Iris's default; each of Iris's checks raises
    ValueError; AUTOTUNE fields skip validation until resolved; AMD-only tuning is noted once."""
    c = Config()
    assert (c.block_size_m, c.block_size_n, c.swizzle_size, c.comm_sms) == (32, 64, 4, 64)
    assert (c.all_gather_variant, c.all_reduce_variant, c.all_reduce_distribution) == ("persistent", "two_shot", 1)
    assert (c.num_stages, c.num_warps, c.threads_per_warp, c.waves_per_eu, c.use_gluon) == (1, 4, 64, 0, False)
    assert c.num_xcds == 1 and c.chunk_size == min(16, 64) and c.all_reduce_ring_slice_n == 64
    Config(all_gather_variant="partitioned", num_stages=2, num_warps=8, all_reduce_num_rings=2)
    for bad in [dict(block_size_m=0), dict(block_size_n=-1), dict(swizzle_size=0), dict(comm_sms=0), dict(num_xcds=0),
                dict(all_gather_variant="ring"), dict(all_reduce_variant="bogus"), dict(all_reduce_distribution=2),
                dict(all_reduce_num_rings=0), dict(all_reduce_ring_slice_n=48), dict(all_reduce_ring_slice_n=128),
                dict(all_reduce_ring_slice_n=-2), dict(reduce_scatter_variant="x"), dict(threads_per_warp=16),
                dict(num_warps=0)]:
        with pytest.raises(ValueError):
            Config(**bad)
    # AUTOTUNE: one object, not a bool; fields left to the library skip validation
    assert repr(AUTOTUNE) == "AUTOTUNE" and iris.ccl.AUTOTUNE is AUTOTUNE
    with pytest.raises(TypeError):
        bool(AUTOTUNE)
    t = Config(block_size_m=AUTOTUNE, comm_sms=0)  # comm_sms=0 is not checked while a field is tuned
    assert t.get_autotune_fields() == ["block_size_m"]
    with pytest.raises(ValueError):
        t.with_resolved(block_size_m=32)  # resolved: now validated
    a = Config.autotune(comm_sms=48)
    assert a.comm_sms == 48 and "block_size_m" in a.get_autotune_fields() and a.num_xcds is None
    with pytest.raises(TypeError):
        Config.autotune(bogus=1)
    space = Config.get_search_space("all_gather")
    assert space["all_gather_variant"] == ["persistent", "partitioned"] and "all_reduce_variant" not in space
    assert "all_gather_variant" in Config.get_tunable_fields("all_gather")
    assert "all_reduce_distribution" in Config.get_tunable_fields("reduce_scatter")
    # AMD-only tuning: accepted, ignored, one note per field and process
    from iris_fw.compat.state import state as compat_state

    records = _Records()
    iris.logger.addHandler(records)
    try:
        compat_state().noted.discard("ccl.Config.waves_per_eu")
        Config(waves_per_eu=2)
        Config(waves_per_eu=1)
        notes = [m for m in records.messages if "waves_per_eu" in m]
        assert len(notes) == 1 and "ignored" in notes[0]
    finally:
        iris.logger.removeHandler(records)


def _config_collectives(ctx):
    shmem = iris.Iris(context=ctx)
    me, world = ctx.rank, ctx.world_size
    seed = fresh_seed(ctx)
    M, N = 6, 10
    parts = [torch.randn(M, N, generator=torch.Generator().manual_seed(seed + r), dtype=torch.float64)
             for r in range(world)]
    x = shmem.as_symmetric(parts[me].to(torch.float32).to(ctx.device))
    want = torch.cat([p.to(torch.float32) for p in parts])
    for variant in ("persistent", "partitioned"):
        out = shmem.full((world * M, N), float("nan"))
        shmem.ccl.all_gather(out, x, config=Config(all_gather_variant=variant, block_size_m=16, num_warps=8,
                                                    num_stages=2, threads_per_warp=32))
        assert torch.equal(out.cpu(), want), f"all_gather {variant}"
    total = sum(p for p in parts)
    for config in (AUTOTUNE, Config(all_reduce_variant=AUTOTUNE), Config.autotune(comm_sms=32),
                   Config(all_reduce_variant="one_shot", waves_per_eu=1)):
        out = shmem.full((M, N), float("nan"))
        shmem.ccl.all_reduce(out, x, config=config)
        assert torch.allclose(out.cpu().double(), total, atol=1e-5 * world), f"all_reduce {config!r}"
    shmem.barrier()


@on_worlds(2)
def test_config_in_collectives(world):
    """Configs with Iris's newer fields (all_gather_variant, num_warps, num_stages,
    threads_per_warp, waves_per_eu) and AUTOTUNE (whole config, one field, Config.autotune) run
    every collective to the right values."""
    world.run(_config_collectives)


# ---- (d) workspace capacity -------------------------------------------------------------------------


def _workspace_capacity(ctx):
    shmem = iris.Iris(context=ctx)
    me, world = ctx.rank, ctx.world_size
    M, N = 40, 72  # 2 x 2 tiles of 32 x 64; 3 x 3 of 16 x 32
    x = shmem.full((M, N), float(me + 1))
    total = float(world * (world + 1) // 2)
    for variant, array in (("spinlock", "locks"), ("ring", "flags")):
        big = Config(all_reduce_variant=variant, block_size_m=32, block_size_n=64)
        small = Config(all_reduce_variant=variant, block_size_m=16, block_size_n=32)
        out = shmem.full((M, N), float("nan"))
        ws = shmem.ccl.all_reduce_preamble(out, x, config=big)
        held = getattr(ws, array)
        assert held.numel() == 4 and held.dtype == torch.int32 and shmem.is_symmetric(held)
        assert torch.all(out == 0), f"{variant}: the preamble zeroes the output (Iris)"
        with pytest.raises(ValueError, match="too small: have 4 but need 9"):
            shmem.ccl.all_reduce(out, x, config=small, workspace=ws)
        assert getattr(ws, array) is held, "a failed call keeps the workspace as it was"
        got = shmem.ccl.all_reduce(out, x, config=big, workspace=ws)  # the tiles it was prepared for
        assert got is ws and torch.all(out == total), variant
        ws = shmem.ccl.all_reduce_preamble(out, x, config=small, workspace=ws)  # prepared for more tiles
        assert getattr(ws, array).numel() == 9
        out.fill_(float("nan"))
        shmem.ccl.all_reduce(out, x, config=small, workspace=ws)
        assert torch.all(out == total), variant
        shmem.ccl.all_reduce(out, x, config=big, workspace=ws)  # fewer tiles: fits
        assert torch.all(out == total), variant
    # a workspace of another shape is prepared afresh, no error
    y = shmem.full((M + 40, N), float(me + 1))
    out = shmem.zeros_like(y)
    ws2 = shmem.ccl.all_reduce(out, y, config=Config(all_reduce_variant="spinlock"), workspace=ws)
    assert ws2.shape == (M + 40, N) and torch.all(out == total)
    shmem.barrier()


@on_worlds(2)
def test_workspace_capacity(world):
    """Iris's check: a spin-lock or ring-flag workspace prepared for fewer tiles raises
    ValueError (on every rank, before any rank communicates) when a later call's block sizes
    need more; the same workspace serves the call it was prepared for, and a new preamble fits."""
    world.run(_workspace_capacity)


# ---- (b) shmem.heap and iris.tensor_creation --------------------------------------------------------


def _heap(ctx):
    shmem = iris.Iris(context=ctx)
    me, world = ctx.rank, ctx.world_size
    heap = shmem.heap
    assert (heap.heap_size, heap.cur_rank, heap.num_ranks) == (ctx.heap_size, me, world)
    assert heap.get_device() == ctx.device and heap.get_heap_bases() is ctx.heap_bases.bases
    base = heap.allocator.get_base_address()
    assert base == int(ctx.heap_bases.bases[me]) and heap.allocator.get_device() == ctx.device
    used = heap.allocator.heap_offset
    tensors = {}
    for n, dtype, alignment in [(7, torch.int64, 1024), (33, torch.float16, 4096), (0, torch.float32, 1024),
                                (5, torch.int8, 64)]:
        t = heap.allocate(n, dtype, alignment) if alignment != 1024 else heap.allocate(n, dtype)
        assert t.shape == (n,) and t.dtype == dtype
        assert (t.data_ptr() - base) % alignment == 0 or n == 0
        assert heap.is_symmetric(t) and heap.on_symmetric_heap(t) and heap.allocator.owns_tensor(t)
        tensors[(n, str(dtype))] = t
    assert heap.allocator.heap_offset > used
    assert not heap.is_symmetric(torch.zeros(4, device=ctx.device))
    # symmetric: the same offsets on every rank; a peer's copy holds what the peer wrote
    t = tensors[(33, "torch.float16")]
    t.copy_(torch.arange(33, dtype=torch.float16) + 100 * me)
    offsets = ctx.bootstrap.all_gather(t.data_ptr() - base)
    assert len(set(offsets)) == 1, offsets
    shmem.barrier()
    peer = (me + 1) % world
    assert torch.equal(ctx.peer_view(t, peer).cpu(), torch.arange(33, dtype=torch.float16) + 100 * peer)
    for bad in (3, 0, -8):
        with pytest.raises(ValueError, match="alignment"):
            heap.allocate(4, torch.float32, bad)
    with pytest.raises(ValueError, match="num_elements"):
        heap.allocate(-1, torch.float32)
    # Iris's tests: factories into heap.allocate'd out= tensors
    out = heap.allocate(6, torch.float32)
    r = shmem.ones(2, 3, out=out)
    assert r.data_ptr() == out.data_ptr() and torch.all(r == 1) and r.shape == (2, 3)
    ai = heap.allocate(3, torch.int64)
    assert shmem.arange(3, out=ai) is ai and torch.equal(ai.cpu(), torch.arange(3))
    assert torch.equal(heap.as_symmetric(torch.arange(4)).cpu(), torch.arange(4))
    heap.refresh_peer_access()
    # iris.tensor_creation, with the heap object
    with pytest.raises(RuntimeError, match="4 elements, but 9 are required"):
        tensor_creation.throw_if_invalid_output_tensor(heap, shmem._Iris__allocate(4, torch.float32), 9, torch.float32)
    with pytest.raises(RuntimeError, match="dtype torch.int32, but torch.float32 is required"):
        tensor_creation.throw_if_invalid_output_tensor(heap, shmem._Iris__allocate(9, torch.int32), 9, torch.float32)
    with pytest.raises(RuntimeError, match="not on the symmetric heap"):
        tensor_creation.throw_if_invalid_output_tensor(heap, torch.zeros(9, device=ctx.device), 9, torch.float32)
    tensor_creation.throw_if_invalid_output_tensor(heap, shmem._Iris__allocate(9, torch.float32), 9, torch.float32)
    dev = shmem.get_device()
    z = tensor_creation.zeros(heap, dev, (2, 3), dtype=torch.float32)
    o = tensor_creation.ones(heap, dev, (4,), dtype=torch.int32)
    f = tensor_creation.full(heap, dev, (5,), 3.5, dtype=torch.float32)
    zl = tensor_creation.zeros_like(heap, dev, shmem.ones(3, 3, dtype=torch.float64))
    s = tensor_creation.zeros(heap, dev, ())
    for t, shape, value in ((z, (2, 3), 0), (o, (4,), 1), (f, (5,), 3.5), (zl, (3, 3), 0), (s, (), 0)):
        assert tuple(t.shape) == shape and shmem.is_symmetric(t) and torch.all(t == value)
    assert zl.dtype == torch.float64 and o.dtype == torch.int32
    with pytest.raises(RuntimeError, match="Device mismatch"):
        tensor_creation.zeros(heap, dev, (2,), device="meta")
    shmem.barrier()


@on_worlds(2)
def test_heap_and_tensor_creation(world):
    """``shmem.heap.allocate`` (symmetric offsets, Iris's alignment, zero elements),
    ``shmem.heap.allocator`` queries, and ``iris.tensor_creation``'s helpers and factories."""
    world.run(_heap)


def test_tensor_creation_helpers():
    """``parse_size`` and the device checks, as Iris's tests call them (no heap needed)."""
    assert tensor_creation.parse_size((2, 3)) == ((2, 3), 6)
    assert tensor_creation.parse_size(((2, 3),)) == ((2, 3), 6)
    assert tensor_creation.parse_size(([4, 5],)) == ([4, 5], 20)
    assert tensor_creation.parse_size(((),)) == ((), 1)
    assert tensor_creation.parse_size((7,)) == ((7,), 7)
    cuda0 = torch.device("cuda:0")
    assert tensor_creation.is_valid_device(None, cuda0) is True
    assert tensor_creation.is_valid_device(torch.device("cuda:0"), cuda0) is True
    assert tensor_creation.is_valid_device("cuda", cuda0) is True
    assert tensor_creation.is_valid_device("cuda:1", cuda0) is False
    assert tensor_creation.is_valid_device("cpu", cuda0) is False
    assert tensor_creation.is_valid_device("cpu", torch.device("cpu")) is True  # CPU ranks' heaps
    assert tensor_creation.is_valid_device("bogus", cuda0) is False
    with pytest.raises(RuntimeError):
        tensor_creation.throw_if_invalid_device("cpu", cuda0)
    tensor_creation.throw_if_invalid_device(None, cuda0)
    tensor_creation.throw_if_invalid_device("cuda", cuda0)
    t = torch.zeros(2, 3)
    assert tensor_creation.apply_layout(t, torch.strided) is t
    with pytest.raises(ValueError):
        tensor_creation.apply_layout(t, torch.sparse_coo)


# ---- (c) device barrier state -----------------------------------------------------------------------


@triton.jit
def _write_peer_kernel(buf, value, rank: tl.constexpr, peer: tl.constexpr, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    iris.store(buf + offs, tl.full([BLOCK], value, tl.float32), rank, peer, heap_bases)


def _barrier_state(ctx, rounds):
    shmem = iris.Iris(context=ctx)
    me, world = ctx.rank, ctx.world_size
    assert shmem._device_barrier_state == {}
    shmem.device_barrier()
    assert None in shmem._device_barrier_state
    slots = shmem._device_barrier_state[None]
    ptr = slots.data_ptr()
    base = ctx.transport.bases[me]
    assert slots.shape == (world,) and base <= slots.data_ptr() < base + ctx.heap_size  # this rank's heap (header)
    ctx.synchronize()
    first = slots.clone()
    for _ in range(rounds):
        shmem.device_barrier()
        assert shmem._device_barrier_state[None].data_ptr() == ptr
    ctx.synchronize()
    # this rank's slot (its epoch) advanced by one per barrier; a peer's slot holds the peer's
    # epoch, which every barrier here waited for and which may already be one barrier ahead
    before, after = first.cpu(), slots.cpu()
    assert int(after[me] - before[me]) == rounds, (before, after)
    assert all(after[me] <= after[r] <= after[me] + 1 for r in range(world)), (before, after)
    # a group's barrier keeps its own slots (in the group's workspace)
    group = iris_fw.ccl.new_group(list(range(world)), ctx=ctx)
    shmem.device_barrier(group=group)
    gslots = shmem._device_barrier_state[group]
    shmem.device_barrier(group=group)
    assert shmem._device_barrier_state[group].data_ptr() == gslots.data_ptr() != ptr
    # data written before a device barrier is visible after it (Iris's cross-rank test, eager)
    seed = fresh_seed(ctx)
    buf = shmem.zeros(64)
    peer, writer = (me + 1) % world, (me - 1) % world
    for i in range(3):
        value = float(seed % 1000 + 10 * i + me)
        buf.fill_(float("nan"))
        shmem.device_barrier()
        _write_peer_kernel[(1,)](buf, value, me, peer, shmem.get_heap_bases(), BLOCK=64)
        shmem.device_barrier()
        ctx.synchronize()
        assert torch.all(buf.cpu() == float(seed % 1000 + 10 * i + writer)), i
        shmem.barrier()
    if ctx.device.type == "cuda":  # the same through a CUDA graph, the buffer poisoned before each replay
        def step():
            shmem.device_barrier()
            _write_peer_kernel[(1,)](buf, 0.0, me, peer, shmem.get_heap_bases(), BLOCK=64)
            shmem.device_barrier()

        graph = capture_graph(ctx, step)
        for i in range(3):
            buf.fill_(float("nan"))
            ctx.synchronize()
            shmem.barrier()
            graph.replay()
            ctx.synchronize()
            assert torch.all(buf == 0.0), i
    shmem.barrier()


@on_worlds(2)
@pytest.mark.parametrize("rounds", [1, 5])
def test_device_barrier_state(world, rounds):
    """``shmem._device_barrier_state[group]``: the barrier's arrival slots on this rank's heap, the
    same tensor on every call, advanced once per barrier on every rank; writes before a device
    barrier are seen after it (eager, and replayed in a CUDA graph on GPUs)."""
    world.run(_barrier_state, rounds)


# ---- (c) tracing ------------------------------------------------------------------------------------


@triton.jit
def _traced_put_kernel(context_tensor, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr,
                       TRACING: tl.constexpr, BLOCK: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context_tensor, rank, world_size, tracing=TRACING)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    peer = (rank + 1) % world_size
    handle = ctx.tracing.record_event_start(event_id=iris.TraceEvent().put, target_rank=peer, address=dst + offs,
                                            pid_m=pid, pid_n=0, mask=mask)
    ctx.put(src + offs, dst + offs, to_rank=peer, mask=mask)
    ctx.tracing.record_event_end(handle)
    h2 = ctx.tracing.record_event_start(event_id=iris.TraceEvent().compute, target_rank=rank, address=src + offs,
                                        pid_m=pid, pid_n=1)
    ctx.tracing.record_event_end(h2)


def _tracing(ctx, path):
    shmem = iris.Iris(context=ctx)
    me, world = ctx.rank, ctx.world_size
    n, block = 100, 32
    programs = triton.cdiv(n, block)
    src = shmem.as_symmetric(torch.arange(n, dtype=torch.float32) + 1000 * me)
    dst = shmem.full((n,), float("nan"))
    assert int(shmem.get_device_context()[2 + world]) == 0, "tracing off: no buffer in the device context"
    shmem.tracing.enable(max_events=256)
    try:
        assert shmem.tracing.enabled and int(shmem.get_device_context()[2 + world]) != 0
        _traced_put_kernel[(programs,)](shmem.get_device_context(), src, dst, n, me, world, TRACING=True, BLOCK=block)
        _traced_put_kernel[(programs,)](shmem.get_device_context(), src, dst, n, me, world, TRACING=False,
                                        BLOCK=block)  # compiled out: no events
        shmem.barrier()
        prev = (me - 1) % world
        assert torch.equal(dst.cpu(), torch.arange(n, dtype=torch.float32) + 1000 * prev)
        assert int(shmem.tracing.trace_counter.item()) == 2 * programs
        shmem.tracing.reset()
        assert int(shmem.tracing.trace_counter.item()) == 0
        _traced_put_kernel[(programs,)](shmem.get_device_context(), src, dst, n, me, world, TRACING=True, BLOCK=block)
        shmem.barrier()
        got = shmem.tracing.export(os.path.join(path, "trace.json"), merge=True)
        assert shmem.tracing.enabled  # recording goes on after an export
        assert int(shmem.tracing.trace_counter.item()) == 0
    finally:
        shmem.tracing.disable()
    assert int(shmem.get_device_context()[2 + world]) == 0
    with open(os.path.join(path, f"trace_rank{me}.json")) as f:
        mine = json.load(f)
    puts = [e for e in mine["traceEvents"] if e.get("name") == "put"]
    assert len(puts) == programs, puts
    for e in puts:
        lanes = min(block, n - e["args"]["item"] * block)
        assert e["args"]["peer"] == (me + 1) % world and e["args"]["bytes"] == 4 * lanes and e["cat"] == "communicate"
        assert e["args"]["aux"] == dst.data_ptr() - ctx.transport.bases[me] + 4 * block * e["args"]["item"]
    computes = [e for e in mine["traceEvents"] if e.get("name") == "compute"]
    assert len(computes) == programs and all(e["cat"] == "compute" and e["args"]["bytes"] == 4 * block for e in computes)
    if me == 0:
        assert got["traceEvents"] and os.path.exists(os.path.join(path, "trace.json"))
        ranks = {e["pid"] for e in got["traceEvents"] if e.get("name") == "put"}
        assert ranks == set(range(world))
    else:
        assert got == {}
    shmem.barrier()


@on_worlds(2)
def test_tracing(world, tmp_path):
    """Iris's tracing API over iris-fw's: ``shmem.tracing.enable/reset/export/disable``,
    ``trace_counter``, ``DeviceContext.initialize(…, tracing=True)`` with ``ctx.tracing.
    record_event_start/end`` and ``iris.TraceEvent``; events carry Iris's name, the peer, the
    payload bytes (masked lanes × element size) and the address (a heap offset); per-rank files
    at Iris's names and the merged trace on rank 0."""
    world.run(_tracing, str(tmp_path))


@triton.jit
def _one_event_kernel(context_tensor, buffer, rank: tl.constexpr, world_size: tl.constexpr, TRACING: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context_tensor, rank, world_size, tracing=TRACING)
    if TRACING:
        offs = tl.arange(0, 4)
        handle = ctx.tracing.record_event_start(event_id=iris.TraceEvent().put, target_rank=(rank + 1) % world_size,
                                                address=buffer + offs, pid_m=tl.program_id(0), pid_n=0)
        ctx.tracing.record_event_end(handle)


def _tracing_own_context(ctx):
    """Iris's tracing test as Iris writes it: its own ``iris.iris()``, tracing enabled and never
    exported, the host object dropped (closed, session and all, by the next ``iris.iris()``)."""
    import gc

    shmem = iris.iris(1 << 20)
    shmem.tracing.enable(max_events=1000)
    buffer = shmem.zeros((16,), dtype=torch.int64)
    shmem.barrier()
    _one_event_kernel[(1,)](shmem.get_device_context(), buffer, shmem.get_rank(), shmem.get_num_ranks(),
                            TRACING=True)
    shmem.barrier()
    assert int(shmem.tracing.trace_counter.item()) == 1
    del shmem, buffer
    gc.collect()
    again = iris.iris(1 << 20)  # closes the dropped one
    assert int(again.get_device_context()[-1]) == 0 and not again.tracing.enabled
    again.barrier()
    del again
    gc.collect()


@on_worlds(2)
def test_tracing_own_context(world):
    world.run(_tracing_own_context)


@triton.jit
def _event_ids_kernel(out):
    e = iris.TraceEvent()
    tl.store(out + 0, e.load)
    tl.store(out + 1, e.put)
    tl.store(out + 2, e.atomic_max)
    tl.store(out + 3, e.wg_sdma)
    tl.store(out + 4, e.fetch)
    tl.store(out + 5, e.reduce)
    tl.store(out + 6, e.barrier)


def test_trace_event_ids():
    """``iris.TraceEvent()``'s constexpr ids and ``EVENT_NAMES`` (Iris's numbering)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.zeros(7, dtype=torch.int32, device=device)
    _event_ids_kernel[(1,)](out)
    assert out.cpu().tolist() == [0, 3, 13, 17, 1024, 2049, 3073]
    assert iris.tracing.EVENT_NAMES[3] == "put" and iris.tracing.EVENT_NAMES[3072] == "wait"


# ---- (f) message passing ----------------------------------------------------------------------------


@triton.jit
def _producer_kernel(source, target, flags, n, producer: tl.constexpr, consumer: tl.constexpr, heap_bases,
                     BLOCK: tl.constexpr):
    """Iris's producer: put a block into the consumer's buffer, then raise the consumer's flag
    with a release compare-and-swap 0 -> 1."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = iris.load(source + offs, producer, producer, heap_bases, mask=mask)
    iris.store(target + offs, values, producer, consumer, heap_bases, mask=mask)
    iris.atomic_cas(flags + pid, 0, 1, producer, consumer, heap_bases, sem="release", scope="sys")


@triton.jit
def _consumer_kernel(buffer, flags, seen, n, consumer: tl.constexpr, heap_bases, max_spins, BLOCK: tl.constexpr):
    """Iris's consumer: acquire compare-and-swap 1 -> 0 on its own flag until it was 1 (bounded
    here: ``seen[pid]`` says whether it came), then double the block in place."""
    pid = tl.program_id(0)
    done = iris.atomic_cas(flags + pid, 1, 0, consumer, consumer, heap_bases, sem="acquire", scope="sys")
    spins = 0
    while (done == 0) & (spins < max_spins):
        done = iris.atomic_cas(flags + pid, 1, 0, consumer, consumer, heap_bases, sem="acquire", scope="sys")
        spins += 1
    tl.store(seen + pid, done)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = iris.load(buffer + offs, consumer, consumer, heap_bases, mask=mask)
    iris.store(buffer + offs, values * 2, consumer, consumer, heap_bases, mask=mask)


def _message_passing(ctx, n, block, late, dirty):
    """Iris's example test: both ranks allocate, then launch — no barrier in between. ``late``:
    the consumer reaches its allocations that many seconds after the producer. ``dirty``: the
    flags' heap block held other data before (iris-fw reuses freed blocks)."""
    shmem = iris.Iris(context=ctx)
    me = ctx.rank
    producer, consumer = 0, 1
    seed = fresh_seed(ctx)
    grid = (triton.cdiv(n, block),)
    if dirty:  # a block of -1s, freed and reclaimed: the next allocation of its size lands there
        junk = shmem.full((grid[0],), -1, dtype=torch.int32)
        del junk
        shmem.barrier()
    shmem.barrier()
    if me == consumer:
        time.sleep(late)
    source = shmem.as_symmetric(torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(ctx.device))
    target = shmem.randn(n)
    flags = shmem.zeros((grid[0],), dtype=torch.int32)
    if me == producer:
        _producer_kernel[grid](source, target, flags, n, producer, consumer, shmem.get_heap_bases(), BLOCK=block)
    elif me == consumer:
        seen = torch.full(grid, -1, dtype=torch.int32, device=ctx.device)
        _consumer_kernel[grid](target, flags, seen, n, consumer, shmem.get_heap_bases(), _spins(ctx), BLOCK=block)
    shmem.barrier()
    if me == consumer:
        assert torch.all(seen == 1).item(), f"flags never came for blocks {torch.nonzero(seen != 1).flatten().tolist()}"
        assert torch.equal(target.cpu(), source.cpu() * 2), "consumer's buffer is not 2 x the producer's data"
        assert torch.all(flags == 0).item(), "the consumer's compare-and-swap resets its flags"
    shmem.barrier()


@on_worlds(2)
@pytest.mark.parametrize("late,dirty", [(0.0, False), (0.3, True)], ids=["together", "consumer-late-dirty-heap"])
def test_message_passing(world, late, dirty):
    """Iris's message-passing example (producer/consumer kernels on two ranks, release/acquire
    compare-and-swap flags), allocated and launched as Iris's test does it. With the consumer
    late and its flags block dirty, a producer signalling before the consumer zeroed its flags
    would be wiped (or fail its 0 -> 1 compare) and the consumer would spin forever: Iris's
    allocations end in a barrier of every rank, and so do the compat layer's."""
    if world.world_size < 2:
        pytest.skip("a producer and a consumer: two ranks or more (ranks beyond 1 only allocate)")
    n, block = (4096, 512) if not iris_fw.interpreting() else (1000, 256)
    world.run(_message_passing, n, block, late, dirty)


# ---- (g) allocator_type="vmem" ----------------------------------------------------------------------


def _vmem(ctx):
    shmem = iris.Iris(ctx.heap_size, "vmem", context=ctx)
    me, world = ctx.rank, ctx.world_size
    assert shmem.allocator_type == "vmem" and shmem.heap_size == ctx.heap_size
    t = shmem.zeros(1024, dtype=torch.float32)
    assert torch.all(t == 0) and shmem.heap.allocator.owns_tensor(t)
    assert not shmem.heap.allocator.owns_tensor(torch.zeros(8, device=ctx.device))
    t.fill_(float(me * 100))
    bases = shmem.heap_bases.cpu()
    assert bases.shape == (world,) and all(int(b) > 0 for b in bases) and len(set(bases.tolist())) == world
    shmem.barrier()
    assert torch.all(ctx.peer_view(t, (me + 1) % world) == float(((me + 1) % world) * 100))
    with pytest.raises(NotImplementedError, match="share storage"):
        shmem.as_symmetric(torch.ones(4, device=ctx.device))
    with pytest.raises(NotImplementedError, match="share storage"):
        shmem.heap.as_symmetric(torch.ones(4, device=ctx.device))
    with pytest.raises(ValueError, match="vmem_chunked.*not provided"):
        iris.Iris(ctx.heap_size, "vmem_chunked", context=ctx)
    with pytest.raises(ValueError, match="allocator_type must be one of"):
        iris.Iris(ctx.heap_size, "bogus", context=ctx)
    shmem.barrier()


@on_worlds(2)
def test_allocator_vmem(world):
    """``allocator_type="vmem"``: Iris's allocator API served by iris-fw's heap (allocation,
    ``owns_tensor``, heap bases, RMA); ``as_symmetric``'s shared-storage import (HIP virtual
    memory, DMA-BUF) raises instead of silently copying; ``vmem_chunked`` is refused."""
    world.run(_vmem)


# ---- (c, e) Iris's package layout, op modules, AMD-only launch options ------------------------------

_LAYOUT_PROGRAM = r"""
import logging, sys
import iris_fw.compat.run as run
run.install()
import iris
import iris.host.platform, iris.host.distributed, iris.host.logging, iris.host.memory, iris.host.tracing
from iris.host.platform import hip
from iris.host.platform.utils import do_bench, is_simulation_env
from iris.host.distributed.helpers import distributed_allgather, extract_group_info, distributed_barrier
from iris.host.logging.logging import _log_rank, logger
from iris.host.memory.symmetric_heap import SymmetricHeap
from iris.host.tracing import Tracing, TraceEvent as TE
from iris.tracing import TraceEvent, EVENT_NAMES, DeviceTracing
from iris.tensor_creation import is_valid_device
from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter, matmul_reduce_scatter_preamble
from iris.ops.matmul_all_reduce import matmul_all_reduce
from iris.ops.all_gather_matmul import all_gather_matmul
from iris.ops.matmul_all_gather import matmul_all_gather
import iris.ops.matmul_reduce_scatter
assert hip is iris.hip and do_bench is iris.do_bench and TE is TraceEvent is iris.TraceEvent
assert iris.ops.matmul_reduce_scatter is matmul_reduce_scatter and callable(iris.ops.matmul_reduce_scatter)
assert sys.modules["iris.ops.matmul_reduce_scatter"].matmul_reduce_scatter_preamble is matmul_reduce_scatter_preamble
assert is_simulation_env() is False
assert extract_group_info(None, 2, 4) == (2, 2, 4, 0, 1)
try:
    distributed_allgather([1, 2])
except RuntimeError as e:
    assert "not initialized" in str(e)
else:
    raise AssertionError("distributed_allgather without torch.distributed must raise")
import io
buf = io.StringIO()
handler = logging.StreamHandler(buf)
handler.setFormatter(iris.logging.IrisFormatter())
logger.addHandler(handler)
_log_rank(logging.WARNING, "allocate: %d elements", 100, rank=1, num_ranks=2)
_log_rank(logging.WARNING, "plain")
assert "[Iris] [1/2] allocate: 100 elements" in buf.getvalue() and "[Iris] plain" in buf.getvalue(), buf.getvalue()

import torch, triton, triton.language as tl

@triton.jit
def twice(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.arange(100, dtype=torch.float32, device=dev)
y = torch.zeros_like(x)
for _ in range(2):
    twice[(4,)](x, y, 100, BLOCK=32, matrix_instr_nonkdim=16, waves_per_eu=2, num_warps=4)
assert torch.equal(y, x * 2)
notes = [l for l in buf.getvalue().splitlines() if "AMD-only" in l]
assert len(notes) == (0 if torch.version.hip else 2), notes
print("layout ok")
"""


def test_package_layout_and_launch_options(tmp_path):
    """Under the ``iris`` alias (``iris-fw run --as-iris``): the ``iris.host.platform/
    distributed/logging/memory/tracing`` modules, ``iris.tracing``, ``iris.tensor_creation``,
    ``iris.ops.<op>`` modules (the package attribute stays the function, as in Iris), and
    Triton's AMD-only launch options accepted and dropped off AMD with one note each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    program = tmp_path / "layout.py"  # a file: Triton (3.6) compiles @triton.jit functions only from files
    program.write_text(_LAYOUT_PROGRAM)
    res = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=ROOT)
    assert res.returncode == 0 and "layout ok" in res.stdout, res.stdout + res.stderr[-4000:]


# ---- compiled for GPUs ------------------------------------------------------------------------------


def _compile_jobs(target):
    """Compile this file's device kernels for ``target`` (child process, TRITON_INTERPRET=0)."""
    from helpers import compile_kernel

    for tracing in (True, False):
        compile_kernel(_traced_put_kernel, target, {"rank": 0, "world_size": 2, "TRACING": tracing, "BLOCK": 32},
                       {"context_tensor": "*i64", "src": "*fp32", "dst": "*fp32"})
        print("compiled traced put", tracing, flush=True)
    compile_kernel(_event_ids_kernel, target, {}, {"out": "*i32"})
    print("compiled event ids", flush=True)
    compile_kernel(_producer_kernel, target, {"producer": 0, "consumer": 1, "BLOCK": 256},
                   {"source": "*bf16", "target": "*bf16", "flags": "*i32", "heap_bases": "*i64"})
    compile_kernel(_consumer_kernel, target, {"consumer": 1, "BLOCK": 256},
                   {"buffer": "*bf16", "flags": "*i32", "seen": "*i32", "heap_bases": "*i64"})
    print("compiled message passing", flush=True)
    compile_kernel(_write_peer_kernel, target, {"rank": 0, "peer": 1, "BLOCK": 64},
                   {"buf": "*fp32", "value": "fp32", "heap_bases": "*i64"})
    print("compiled write peer", flush=True)


@pytest.mark.extended
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_kernels_compile(tmp_path, target):
    """Every kernel here compiles for sm_90 and gfx942 — the traced ones with each target's
    clock (``%globaltimer``, ``s_memrealtime``), chosen by the compile target."""
    from helpers import compile_in_child

    compile_in_child(tmp_path, "test_iris_conformance_api", "_compile_jobs", target, 5)
