"""iris_fw.compat.iris in Iris's own test style: a kernel per primitive, every dtype Iris
supports, block sizes 1 … 64, every sem × scope for atomics, the host factories, and programs
written for Iris run with only the import line changed."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import iris_fw.compat.iris as iris
import iris_fw.testing
from helpers import DTYPES, fresh_seed, random_data, same

BLOCKS = [1, 2, 8, 32, 64]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def _load(data, results, heap_bases, cur_rank, peer, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    tl.store(results + offsets, iris.load(data + offsets, cur_rank, peer, heap_bases, mask=offsets < BLOCK_SIZE))


@triton.jit
def _store(data, results, heap_bases, cur_rank, peer, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    iris.store(results + cur_rank * BLOCK_SIZE + offsets, tl.load(data + offsets), cur_rank, peer, heap_bases,
               mask=offsets < BLOCK_SIZE)


@triton.jit
def _get(data, results, heap_bases, cur_rank, peer, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    iris.get(data + offsets, results + offsets, peer, cur_rank, heap_bases, mask=offsets < BLOCK_SIZE)


@triton.jit
def _put(data, results, heap_bases, cur_rank, peer, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    iris.put(data + offsets, results + cur_rank * BLOCK_SIZE + offsets, cur_rank, peer, heap_bases,
             mask=offsets < BLOCK_SIZE)


@triton.jit
def _copy(data, results, heap_bases, cur_rank, peer, BLOCK_SIZE: tl.constexpr):
    # pull: from peer's data into my results row `peer`
    offsets = tl.arange(0, BLOCK_SIZE)
    iris.copy(data + offsets, results + peer * BLOCK_SIZE + offsets, peer, cur_rank, cur_rank, heap_bases,
              mask=offsets < BLOCK_SIZE)


KERNELS = {"load": _load, "store": _store, "get": _get, "put": _put, "copy": _copy}


def _primitive(ctx, name, dtype, block):
    shmem = iris.Iris(context=ctx)  # the pool's context, not a new one
    me, world = ctx.rank, ctx.world_size
    seed = fresh_seed(ctx)
    values = [random_data(block, dtype, ctx.device, seed + r) for r in range(world)]
    data = shmem.as_symmetric(values[me])
    rows = world if name in ("store", "put", "copy") else 1
    results = shmem.zeros(rows, block, dtype=dtype)
    shmem.barrier()
    for peer in range(world):
        if name in ("load", "get"):
            results.zero_()
        KERNELS[name][(1,)](data, results, shmem.get_heap_bases(), me, peer, BLOCK_SIZE=block)
        if name in ("load", "get"):
            shmem.ctx.synchronize()
            assert same(results[0], values[peer]), f"{name} {dtype} block {block} from {peer}"
    shmem.barrier()
    if name in ("store", "put"):  # row r was written by rank r
        for r in range(world):
            assert same(results[r], values[r]), f"{name} {dtype} block {block} by {r}"
    if name == "copy":  # row p pulled from rank p
        for p in range(world):
            assert same(results[p], values[p]), f"copy {dtype} block {block} from {p}"


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name", list(KERNELS))
def test_primitive(world, name, dtype, block):
    world.run(_primitive, name, dtype, block)


@triton.jit
def _atomic_kernel(results, heap_bases, cur_rank, num_ranks, OP: tl.constexpr, SEM: tl.constexpr,
                   SCOPE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    one = tl.full([BLOCK_SIZE], 1, results.dtype.element_ty)
    bit = one << cur_rank
    for target in range(0, num_ranks):
        p = results + offsets
        if OP == "add":
            iris.atomic_add(p, one, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "sub":
            iris.atomic_sub(p, one, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xchg":
            iris.atomic_xchg(p, one, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "cas":
            iris.atomic_cas(p, one * 0, one, cur_rank, target, heap_bases, sem=SEM, scope=SCOPE)
        elif OP == "or":
            iris.atomic_or(p, bit, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xor":
            iris.atomic_xor(p, bit, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "and":
            iris.atomic_and(p, ~bit, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "min":
            iris.atomic_min(p, one * cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        else:
            iris.atomic_max(p, one * cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)


def _atomic(ctx, op, sem, scope):
    world, block = ctx.world_size, 16
    init = {"and": -1, "min": 1 << 20, "max": -1}.get(op, 0)
    want = {
        "add": world, "sub": -world, "xchg": 1, "cas": 1, "or": (1 << world) - 1, "xor": (1 << world) - 1,
        "and": ~((1 << world) - 1), "min": 0, "max": world - 1,
    }[op]
    results = ctx.full((block,), init, dtype=torch.int32)
    ctx.barrier()
    _atomic_kernel[(1,)](results, ctx.heap_bases, ctx.rank, world, OP=op, SEM=sem, SCOPE=scope, BLOCK_SIZE=block)
    ctx.barrier()
    assert torch.all(results == want), f"atomic_{op} sem={sem} scope={scope}: {results.tolist()} != {want}"


@pytest.mark.parametrize("scope", [None, "cta", "gpu", "sys"])
@pytest.mark.parametrize("sem", [None, "relaxed", "acquire", "release", "acq_rel"])
@pytest.mark.parametrize("op", ["add", "sub", "xchg", "cas", "and", "or", "xor", "min", "max"])
def test_atomic(world, op, sem, scope):
    world.run(_atomic, op, sem, scope)


def _factories(ctx):
    shmem = iris.Iris(context=ctx)
    dev = shmem.get_device()
    for dtype in DTYPES:
        for make in (lambda: shmem.zeros(2, 3, dtype=dtype), lambda: shmem.ones((2, 3), dtype=dtype),
                     lambda: shmem.empty(2, 3, dtype=dtype), lambda: shmem.full((2, 3), 1, dtype=dtype)):
            t = make()
            assert t.shape == (2, 3) and t.dtype == dtype and t.device == dev and shmem.is_symmetric(t)
    assert shmem.zeros(4).dtype == torch.float32 and torch.equal(shmem.zeros(4), torch.zeros(4, device=dev))
    assert torch.equal(shmem.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32, device=dev))
    assert torch.equal(shmem.arange(5), torch.arange(5, device=dev)) and shmem.arange(0, 1, 0.25).dtype == torch.float32
    assert torch.allclose(shmem.linspace(0, 1, 5), torch.linspace(0, 1, 5, device=dev))
    r = shmem.randint(0, 10, (100,))
    assert r.dtype == torch.int64 and 0 <= r.min() and r.max() < 10
    u = shmem.uniform((64,), low=2.0, high=3.0)
    assert u.dtype == torch.float32 and u.min() >= 2 and u.max() <= 3
    assert shmem.randn(2, 2).shape == (2, 2) and shmem.rand(5).max() < 1
    out = shmem.zeros(6)
    assert shmem.ones(2, 3, out=out).data_ptr() == out.data_ptr() and torch.equal(out, torch.ones(6, device=dev))
    assert shmem.empty(3, 2, out=out).shape == (3, 2)
    z = shmem.zeros_like(out, dtype=torch.float16)
    assert z.dtype == torch.float16 and shmem.is_symmetric(z)
    with pytest.raises(ValueError, match="layout must be torch.strided"):
        shmem.zeros(2, layout=torch.sparse_coo)
    ext = torch.arange(4.0, device=dev)
    sym = shmem.as_symmetric(ext)
    assert torch.equal(sym, ext) and shmem.is_symmetric(sym) and not shmem.is_symmetric(ext)
    assert shmem.get_rank() == ctx.rank and shmem.get_num_ranks() == ctx.world_size and shmem.get_cu_count() >= 1
    assert shmem.get_heap_bases().shape == (ctx.world_size,)
    got = shmem.broadcast(torch.full((3,), float(ctx.rank)), source_rank=0)
    assert isinstance(got, np.ndarray) and np.array_equal(got, np.zeros(3, dtype=np.float32))
    assert shmem.broadcast({"k": ctx.rank}, source_rank=ctx.world_size - 1) == {"k": ctx.world_size - 1}
    shmem.device_barrier()
    shmem.barrier()


def test_factories_and_host_api(world):
    world.run(_factories)


def test_logging_levels(caplog):
    iris.set_logger_level(iris.DEBUG)
    shmem = iris.Iris.__new__(iris.Iris)
    shmem.cur_rank, shmem.num_ranks = 0, 1
    with caplog.at_level(iris.DEBUG, logger="iris"):
        shmem.debug("d")
        shmem.info("i")
        shmem.warning("w")
        shmem.error("e")
    assert [r.levelno for r in caplog.records] == [iris.DEBUG, iris.INFO, iris.WARNING, iris.ERROR]
    assert caplog.records[1].getMessage() == "[Iris] [0/1] i"


def _launchers(n):
    """(name, command prefix) for every launcher here, for ``n`` ranks."""
    out = [("torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n)])]
    mpirun = iris_fw.testing.find_mpirun()
    if mpirun:
        out.append(("mpirun", [mpirun, "-n", str(n), sys.executable]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("program,ranks,expect", [
    ("message_passing.py", 2, "message passing over"),
    ("all_load.py", None, "all-load on"),  # every GPU, or 3 CPU ranks
])
def test_programs_written_for_iris(program, ranks, expect):
    gpus = iris_fw.testing.gpu_count()
    n = ranks or (min(gpus, 4) if gpus else 3)
    path = os.path.join(ROOT, "examples", "iris_compat", program)
    for name, cmd in _launchers(n):
        res = subprocess.run(cmd + [path], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{name}: {res.stdout}{res.stderr}"
        assert expect in res.stdout and "correct" in res.stdout and "WRONG" not in res.stdout, f"{name}: {res.stdout}"
