"""Context: factories, broadcast, the allocator (reuse, alignment, symmetry, OOM, divergence
report) and clear errors for bad input. On CPU ranks the pooled cases run at world sizes 1 and 3
by default, 2 under ``-m extended`` (3 covers what 2 would: a rank other than 0 and 1 too)."""

import pytest
import torch
import triton
import triton.language as tl

import iris_fw
from helpers import fresh_seed, on_worlds
from iris_fw import device as dv
from iris_fw.heap import ALIGN, SymmetricHeap
from iris_fw.interpreter import interpreting


# ---- factories ---------------------------------------------------------------------------


def _factories(ctx):
    dev = ctx.device
    for shape_args in [(3, 5), ((3, 5),), ([3, 5],), (torch.Size([3, 5]),)]:
        t = ctx.empty(*shape_args, dtype=torch.float16)
        assert t.shape == (3, 5) and t.dtype == torch.float16 and t.device == dev and ctx.is_symmetric(t)
    assert ctx.empty(4).dtype == torch.get_default_dtype()
    assert torch.equal(ctx.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32, device=dev))
    assert torch.equal(ctx.ones(7, dtype=torch.bfloat16), torch.ones(7, dtype=torch.bfloat16, device=dev))
    assert ctx.full((2, 2), 7).dtype == torch.int64 and ctx.full((2, 2), 7.5).dtype == torch.get_default_dtype()
    assert torch.equal(ctx.full((2, 2), True), torch.full((2, 2), True, device=dev))
    assert torch.equal(ctx.arange(10), torch.arange(10, device=dev))
    assert torch.equal(ctx.arange(2, 11, 3, dtype=torch.float32), torch.arange(2, 11, 3, dtype=torch.float32, device=dev))
    assert torch.allclose(ctx.linspace(-1, 1, 9), torch.linspace(-1, 1, 9, device=dev))
    g = torch.Generator(device=dev).manual_seed(fresh_seed(ctx))
    r = ctx.rand(1000, generator=g)
    assert r.min() >= 0 and r.max() < 1 and r.std() > 0.2
    n = ctx.randn(4000, dtype=torch.float64)
    assert abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1) < 0.1
    i = ctx.randint(5, 9, (1000,))
    assert i.dtype == torch.int64 and i.min() >= 5 and i.max() <= 8 and len(i.unique()) == 4
    assert ctx.randint(3, (10,)).max() < 3
    src = torch.randn(3, 4, device=dev)
    for like, want in [(ctx.zeros_like(src), torch.zeros_like(src)), (ctx.ones_like(src), torch.ones_like(src)),
                       (ctx.full_like(src, 2.5), torch.full_like(src, 2.5))]:
        assert torch.equal(like, want) and ctx.is_symmetric(like)
    assert ctx.empty_like(src, dtype=torch.int8).dtype == torch.int8
    sym = ctx.as_symmetric(src)
    assert torch.equal(sym, src) and ctx.is_symmetric(sym) and not ctx.is_symmetric(src)
    assert ctx.as_symmetric(src.cpu()).device == dev
    assert ctx.zeros(3, requires_grad=True).requires_grad
    assert ctx.empty(3, device=dev).device == dev and ctx.empty(3, device=dev.type).device == dev
    assert ctx.empty(0).numel() == 0


@on_worlds(1, 3)
def test_factories(world):
    world.run(_factories)


# ---- broadcast ---------------------------------------------------------------------------


def _broadcast(ctx):
    w, me = ctx.world_size, ctx.rank
    for src in range(w):
        assert ctx.broadcast({"from": me, "x": [me] * 3}, src=src) == {"from": src, "x": [src] * 3}
        seed = fresh_seed(ctx)
        want = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed + src)).to(ctx.device)
        mine = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed + me)).to(ctx.device)
        on_heap = ctx.as_symmetric(mine)
        assert ctx.broadcast(on_heap, src=src) is on_heap and torch.equal(on_heap, want)
        off_heap = mine.clone()
        assert torch.equal(ctx.broadcast(off_heap, src=src), want)
    with pytest.raises(ValueError, match=r"src must be in \[0, %d\), got %d" % (w, w)):
        ctx.broadcast(1, src=w)
    if w > 1:
        with pytest.raises(ValueError, match="same shape and dtype on every rank"):
            ctx.broadcast(torch.zeros(me + 1, device=ctx.device), src=0)


@on_worlds(1, 3)
def test_broadcast(world):
    world.run(_broadcast)


# ---- allocator -----------------------------------------------------------------------------


class _FakeMemory:
    def __init__(self, size):
        self.buf = torch.zeros(size, dtype=torch.uint8)

    def wrap(self, address, nbytes):
        import numpy as np
        import ctypes

        owner = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
        return torch.from_numpy(owner), owner


def _heap(size=1 << 16, start=4096):
    mem = _FakeMemory(size)
    return SymmetricHeap(mem.buf.data_ptr(), size, start, mem.wrap), mem


def test_allocator_alignment_reuse_and_coalescing():
    heap, _mem = _heap()
    blocks = [heap.alloc(n) for n in (1, 255, 256, 257, 1000)]
    assert all(b.offset % ALIGN == 0 and b.size % ALIGN == 0 and b.size >= 1 for b in blocks)
    assert [b.offset for b in blocks] == [4096, 4352, 4608, 4864, 5376]
    for b in blocks[1:4]:
        heap.free(b.offset)
    assert heap.bytes_pending == 256 * 4 and heap.alloc(256).offset == 6400  # pending: not reused yet
    heap.reclaim(heap.pending_offsets())
    big = heap.alloc(1024)  # the three middle blocks coalesced into one 1024-byte hole
    assert big.offset == 4352
    t = heap.tensor((10, 3), torch.float32)
    assert heap.offset_of(t) == 6656 and heap.offset_of(t[1:]) == 6656 + 12 and heap.offset_of(torch.zeros(3)) is None
    off = heap.offset_of(t)
    view = t[2]
    del t
    assert off not in heap.pending_offsets(), "a live view must keep the block"
    del view
    assert heap.pending_offsets() == [off]


def test_allocator_out_of_memory_message():
    heap, _mem = _heap(size=8192, start=4096)
    heap.alloc(3000)
    with pytest.raises(iris_fw.HeapOutOfMemory) as info:
        heap.alloc(2000, what="float32[500]")
    msg = str(info.value)
    assert "requested 2000 bytes" in msg and "heap size 8192" in msg and "3072 in use" in msg and "float32[500]" in msg
    assert isinstance(info.value, MemoryError)


def _symmetry_and_reuse(ctx):
    ctx.barrier()  # reclaim what earlier tests on this pool freed, so first-fit starts clean
    seed = fresh_seed(ctx)
    g = torch.Generator().manual_seed(seed)  # same on every rank: same allocation sequence
    sizes = torch.randint(1, 5000, (12,), generator=g).tolist()
    ts = [ctx.empty(n, dtype=torch.uint8) for n in sizes]
    offsets = [ctx.offset_of(t) for t in ts]
    assert all(o % ALIGN == 0 for o in offsets)
    every = ctx.bootstrap.all_gather(offsets)
    assert all(o == offsets for o in every), f"offsets differ across ranks: {every}"
    ctx.check_symmetry()
    # a dropped tensor returns its block (after the barrier every rank has dropped it)
    first = offsets[3]
    del ts[3]
    ctx.barrier()
    again = ctx.empty(sizes[3], dtype=torch.uint8)
    assert ctx.offset_of(again) == first
    # OOM on the real heap: clear numbers
    with pytest.raises(iris_fw.HeapOutOfMemory, match=f"heap size {ctx.heap_size} bytes"):
        ctx.empty(ctx.heap_size, dtype=torch.uint8)
    del ts, again
    ctx.barrier()


@on_worlds(1, 3)
def test_allocator_symmetry_reuse_and_divergence(world):
    world.run(_symmetry_and_reuse)


def _divergence_reports(ctx):
    """Rank-dependent allocations are reported: by check_symmetry, at the next barrier, and in
    debug mode at the allocation itself. Uses throwaway contexts: the pool's heap stays sane."""
    if ctx.world_size == 1:
        return
    sub = iris_fw.init(heap_size=1 << 20, transport=ctx.transport.name)
    try:
        extra = sub.empty(256 * (ctx.rank + 1), dtype=torch.uint8)
        with pytest.raises(iris_fw.SymmetryError) as info:
            sub.check_symmetry()
        assert "rank 1: offset" in str(info.value) and "test_context.py" in str(info.value)
        del extra, info
        with pytest.raises(iris_fw.SymmetryError, match="diverged across ranks before this barrier"):
            sub.barrier()
    finally:
        sub.close()
    dbg = iris_fw.init(heap_size=1 << 20, debug=True, transport=ctx.transport.name)
    try:
        a = dbg.empty(100)  # same on all ranks: fine
        with pytest.raises(iris_fw.SymmetryError) as info:
            dbg.empty(100 + 300 * ctx.rank)  # sizes differ: reported at the allocation itself
        text = str(info.value)
        assert "allocation #1" in text and "rank 0:" in text and "rank 1:" in text and "test_context.py" in text
        del a
    finally:
        dbg.close()
    dbg.close()  # idempotent


@on_worlds(1, 3)
def test_divergence_is_reported(world):
    world.run(_divergence_reports)


# ---- bad input ---------------------------------------------------------------------------


def _bad_inputs(ctx):
    w = ctx.world_size
    with pytest.raises(iris_fw.NotOnHeapError, match="x must lie on the symmetric heap"):
        ctx.check_symmetric(torch.zeros(4, device=ctx.device), "x")
    if ctx.device.type == "cuda":
        with pytest.raises(iris_fw.NotOnHeapError, match=r"y must be on cuda:\d"):
            ctx.check_symmetric(torch.zeros(4), "y")
    with pytest.raises(TypeError, match="z must be a torch.Tensor"):
        ctx.check_symmetric([1, 2], "z")
    with pytest.raises(ValueError, match=r"peer must be in \[0, %d\), got %d" % (w, w)):
        ctx.check_rank(w, "peer")
    with pytest.raises(ValueError, match=r"peer must be in \[0, %d\), got -1" % w):
        ctx.peer_view(ctx.zeros(2), -1)
    with pytest.raises(TypeError, match="src must be an int"):
        ctx.broadcast(3, src="0")
    with pytest.raises(ValueError, match="device must be"):
        ctx.empty(3, device="meta")
    with pytest.raises(ValueError, match="size must be non-negative ints"):
        ctx.zeros(-1)
    with pytest.raises(ValueError, match="wait_timeout must be a finite number of seconds > 0"):
        ctx.wait_timeout = 0
    with pytest.raises(ValueError, match="randint: high must be greater than low"):
        ctx.randint(5, 5, (3,))


@on_worlds(1, 3)
def test_bad_inputs(world):
    world.run(_bad_inputs)


def test_heap_too_small_and_bad_arguments():
    with pytest.raises(ValueError, match=r"heap_size=100 is too small: 1 ranks need at least \d+ bytes"):
        iris_fw.init(heap_size=100, bootstrap="single")
    with pytest.raises(TypeError, match="heap_size must be an int"):
        iris_fw.init(heap_size="1G", bootstrap="single")
    with pytest.raises(ValueError, match="heap_size must be in >= 1"):
        iris_fw.init(heap_size=0, bootstrap="single")
    with pytest.raises(iris_fw.IrisError, match="no transport named 'nvlink'; registered: .*host_shm"):
        iris_fw.init(heap_size=1 << 20, transport="nvlink", bootstrap="single")
    with pytest.raises(iris_fw.IrisError, match="no bootstrap named 'slurm'"):
        iris_fw.init(heap_size=1 << 20, bootstrap="slurm")


@triton.jit
def _switches_kernel(out, heap_bases):
    tl.store(out, dv.check_pointers(heap_bases))
    tl.store(out + 1, dv.nvshmem_calls(heap_bases))
    tl.store(out + 2, tl.load(dv.bases(heap_bases)))


def test_primitive_switches_come_with_heap_bases():
    """The primitives read their compile-time switches from what they are given as
    ``heap_bases`` (a DeviceHeaps, or a bare pointer: checks under the interpreter only, no
    NVSHMEM calls), not from module state."""
    with iris_fw.init(heap_size=1 << 20, bootstrap="single") as ctx:
        bare = ctx.heap_bases.bases
        for given, want in ((ctx.heap_bases, [interpreting() or ctx.debug, 0]), (bare, [interpreting(), 0]),
                            (dv.device_heaps(bare, False, 2), [False, 2]), (dv.device_heaps(bare, True), [True, 0])):
            out = torch.zeros(3, dtype=torch.int64, device=ctx.device)
            _switches_kernel[(1,)](out, given)
            assert out.tolist() == [int(want[0]), want[1], int(bare[0])], (given, out)
        assert not hasattr(dv, "CHECK_POINTERS") and not hasattr(dv, "NVSHMEM_CALLS")


def test_single_rank_context_lifecycle(tmp_path):
    import os

    before = {n for n in os.listdir("/dev/shm") if n.startswith("iris_fw")}
    with iris_fw.init(heap_size=1 << 20, bootstrap="single") as ctx:
        assert (ctx.rank, ctx.world_size) == (0, 1) and ctx.heap_bases.bases.dtype == torch.int64
        assert ctx.heap_bases.bases.shape == (1,) and ctx.heap_bases.bases.device == ctx.device
        # the primitives' compile-time switches come with the argument (decided at init, not at import)
        assert ctx.heap_bases.CHECK_POINTERS.value is (interpreting() or ctx.debug)
        assert ctx.heap_bases.NVSHMEM_CALLS.value == ctx.transport.call_mode == 0
        x = ctx.ones(4)
        assert {n for n in os.listdir("/dev/shm") if n.startswith("iris_fw")} <= before, "segment not unlinked"
        del x
    assert ctx.closed
    ctx.close()  # idempotent
    with pytest.raises(iris_fw.IrisError, match="closed"):
        ctx.barrier()


def _leave_open(ctx):
    """An Iris-style function: creates a context and never closes it."""
    other = iris_fw.init(heap_size=1 << 20, transport=ctx.transport.name)
    assert iris_fw.context.current() is other
    return other.heap_size


def _current_is_pool(ctx):
    from iris_fw.context import current, open_contexts

    return current() is ctx and open_contexts() == [ctx]


def test_current_context_and_make_current(iris_pool):
    """``current()`` is the last context created until another is made current; a context a
    pooled function left open is closed after it, so calls without ``ctx=`` in the next
    function never land on it (on GPUs its 1 MiB heap once served later tests' collectives)."""
    pool = iris_pool(2)
    assert pool.run(_leave_open) == [1 << 20] * 2
    assert pool.run(_current_is_pool) == [True, True]


def test_make_current_single_rank():
    a = iris_fw.init(heap_size=1 << 20, bootstrap="single")
    try:
        b = iris_fw.init(heap_size=1 << 20, bootstrap="single")
        try:
            assert iris_fw.context.current() is b
            a.make_current()
            assert iris_fw.context.current() is a
        finally:
            b.close()
        assert iris_fw.context.current() is a
    finally:
        a.close()
    with pytest.raises(iris_fw.IrisError, match="closed"):
        a.make_current()
