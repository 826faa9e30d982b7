"""An all-load bandwidth loop written for AMD's Iris; only the import line differs.

Every rank reads its buffer-sized slice from every rank with iris.load, in a persistent
loop, and reports the aggregate read bandwidth. Run on N ranks:

    mpirun -n 4 python examples/iris_compat/all_load.py
    torchrun --nproc-per-node 4 examples/iris_compat/all_load.py
"""

import time

import iris_fw.compat.iris as iris  # was: import iris

import torch
import triton
import triton.language as tl


@triton.jit
def all_load_kernel(source, out, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in range(0, world_size):
            acc += iris.load(source + offs, cur_rank, r, heap_bases, mask=mask)
        tl.store(out + offs, acc, mask=mask)


def main():
    shmem = iris.iris(1 << 28)
    rank, world = shmem.get_rank(), shmem.get_num_ranks()
    on_gpu = shmem.get_device().type == "cuda"
    n, block, iters = (1 << 24, 4096, 20) if on_gpu else (1 << 12, 256, 2)
    source = shmem.full((n,), float(rank + 1), dtype=torch.float32)
    out = torch.empty_like(source)
    grid = (shmem.get_cu_count() * 4,) if on_gpu else (4,)
    shmem.barrier()
    all_load_kernel[grid](source, out, n, rank, world, shmem.get_heap_bases(), BLOCK=block)  # warm-up
    shmem.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        all_load_kernel[grid](source, out, n, rank, world, shmem.get_heap_bases(), BLOCK=block)
    shmem.barrier()
    seconds = (time.perf_counter() - start) / iters
    expected = world * (world + 1) / 2
    ok = bool(torch.all(out == expected))
    gbps = n * 4 * world / seconds / 1e9
    results = shmem.ctx.bootstrap.all_gather((ok, gbps))
    if rank == 0:
        print(f"all-load on {world} ranks: {'correct' if all(r[0] for r in results) else 'WRONG'}; "
              f"per-rank read bandwidth (all peers, host-timed) " + ", ".join(f"{r[1]:.1f}" for r in results) + " GB/s",
              flush=True)
    if not all(r[0] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
