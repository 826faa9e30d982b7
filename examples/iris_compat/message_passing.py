"""A producer/consumer program written for AMD's Iris; only the import line differs.

Rank 0 produces blocks into rank 1's buffer with iris.put and raises a per-block flag with
an atomic; rank 1 spins on each flag, then checks the block. Run on 2 ranks:

    mpirun -n 2 python examples/iris_compat/message_passing.py
    torchrun --nproc-per-node 2 examples/iris_compat/message_passing.py
"""

import iris_fw.compat.iris as iris  # was: import iris

import torch
import triton
import triton.language as tl


@triton.jit
def producer_kernel(source, target, flags, n, from_rank, to_rank, heap_bases, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    iris.put(source + offs, target + offs, from_rank, to_rank, heap_bases, mask=mask)
    tl.debug_barrier()
    iris.atomic_xchg(flags + pid, 1, from_rank, to_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def consumer_kernel(target, flags, out, n, cur_rank, heap_bases, max_spins, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    seen = iris.atomic_cas(flags + pid, 1, 1, cur_rank, cur_rank, heap_bases, sem="acquire", scope="sys")
    spins = 0
    while (seen != 1) & (spins < max_spins):
        seen = iris.atomic_cas(flags + pid, 1, 1, cur_rank, cur_rank, heap_bases, sem="acquire", scope="sys")
        spins += 1
    tl.debug_barrier()
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, iris.load(target + offs, cur_rank, cur_rank, heap_bases, mask=mask), mask=mask)


def main():
    shmem = iris.iris(1 << 26)
    rank, world = shmem.get_rank(), shmem.get_num_ranks()
    if world != 2:
        raise SystemExit(f"run on 2 ranks, got {world}")
    n, block = (1 << 12, 256) if shmem.get_device().type == "cpu" else (1 << 22, 4096)
    grid = (triton.cdiv(n, block),)
    source = shmem.randn(n, dtype=torch.float32)
    target = shmem.full((n,), float("nan"), dtype=torch.float32)
    flags = shmem.zeros(grid[0], dtype=torch.int32)
    expected = torch.from_numpy(shmem.broadcast(source, source_rank=0)).to(source.device)
    shmem.barrier()
    if rank == 0:
        producer_kernel[grid](source, target, flags, n, 0, 1, shmem.get_heap_bases(), BLOCK=block)
        ok = True
    else:
        out = torch.full_like(source, float("nan"))
        # bounded spin: ~16 s of polls on a GPU, ~10 s under the CPU interpreter; a block whose
        # flag never came stays NaN in `out` and the check below reports it
        max_spins = 1 << 24 if source.device.type == "cuda" else 1 << 14
        consumer_kernel[grid](target, flags, out, n, 1, shmem.get_heap_bases(), max_spins, BLOCK=block)
        ok = bool(torch.equal(out, expected))
    shmem.barrier()
    oks = shmem.broadcast(ok, source_rank=1)
    if rank == 0:
        shmem.info(f"message passing over {n} floats: {'correct' if oks else 'WRONG'}")
        print(f"message passing over {n} floats: {'correct' if oks else 'WRONG'}", flush=True)
    if not oks:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
