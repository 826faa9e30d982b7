# A program written for AMD Iris (`import iris`), run unchanged by tests/test_iris_conformance_host.py
# with `iris-fw run --as-iris -n 3`: a message-passing kernel (put + flag), a DeviceContext
# all-gather of tiles, shmem.ccl collectives and shmem.ops, each checked against torch.
import gc

import torch
import triton
import triton.language as tl

import iris
from iris.ccl import Config


@triton.jit
def ring_put(src, dst, flags, heap_bases, cur_rank: tl.constexpr, num_ranks: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    right = (cur_rank + 1) % num_ranks
    iris.put(src + offs, dst + offs, cur_rank, right, heap_bases)
    tl.debug_barrier()
    iris.atomic_add(flags, 1, cur_rank, right, heap_bases, sem="release", scope="sys")


@triton.jit
def tile_gather(inp, out, ctx_t, M: tl.constexpr, N: tl.constexpr, rank: tl.constexpr, ws: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    pm = pid // tl.cdiv(N, BN)
    pn = pid % tl.cdiv(N, BN)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    data = tl.load(inp + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
    ctx = iris.DeviceContext.initialize(ctx_t, rank, ws)
    ctx.all_gather(iris.Tile(pm, pn, BM, BN, data), iris.make_tensor_view(out, M * ws, N, N, 1), 0)


for round_ in range(2):  # a context per round, dropped as Iris's tests do
    shmem = iris.iris(1 << 24)
    rank, world, dev = shmem.get_rank(), shmem.get_num_ranks(), shmem.get_device()
    src = shmem.full((64,), float(rank + 1))
    dst = shmem.zeros(64)
    flags = shmem.zeros(1, dtype=torch.int32)
    shmem.barrier()
    ring_put[(1,)](src, dst, flags, shmem.get_heap_bases(), rank, world, BLOCK=64)
    shmem.barrier()
    left = (rank - 1) % world
    assert torch.all(dst == left + 1) and flags.item() == 1, (dst, flags)

    M, N = 24, 16
    x = shmem.randn(M, N)
    gathered = shmem.zeros(M * world, N)
    shmem.barrier()
    tile_gather[(4,)](x, gathered, shmem.get_device_context(), M, N, rank, world, 16, 8)
    shmem.barrier()
    rows = [torch.from_numpy(shmem.broadcast(x, src=r)).to(dev) for r in range(world)]
    assert torch.equal(gathered, torch.cat(rows)), "DeviceContext.all_gather"

    out = shmem.zeros(M, N)
    shmem.ccl.all_reduce(out, x, config=Config(all_reduce_variant="two_shot"))
    assert torch.allclose(out, sum(rows), atol=1e-5)
    wide = shmem.zeros(M, N * world)
    inp = torch.cat([rows[rank] + 100 * p for p in range(world)], dim=1).contiguous()
    shmem.ccl.all_to_all(wide, shmem.as_symmetric(inp))
    want = torch.cat([rows[s] + 100 * rank for s in range(world)], dim=1)
    assert torch.allclose(wide, want), "all_to_all"

    a = shmem.randn(16, 32) * 0.1
    b = shmem.as_symmetric(torch.from_numpy(shmem.broadcast(torch.randn(32, 24) * 0.1, src=0)).to(dev))  # replicated
    c = shmem.zeros(16 * world, 24)
    shmem.ops.matmul_all_gather(c, a, b)
    a_all = [torch.from_numpy(shmem.broadcast(a, src=r)).to(dev) for r in range(world)]
    assert torch.allclose(c, torch.cat([aa @ b for aa in a_all]), atol=1e-4), "matmul_all_gather"
    shmem.barrier()
    if round_ == 1:
        print(f"iris program ok: rank {rank} of {world}", flush=True)
    del shmem, src, dst, flags, x, gathered, out, wide, a, b, c
    gc.collect()
