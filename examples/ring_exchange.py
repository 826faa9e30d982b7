"""Ring all-gather written with iris-fw's device primitives.

Each rank owns a block of ``N`` floats. In one kernel, every rank passes blocks around the
ring: at step ``s`` it puts the block it received last step into its right neighbour's
buffer and raises the neighbour's flag; then it waits for its left neighbour's flag before
the next step. After ``world_size - 1`` steps every rank holds every block.

Run it on 4 ranks (CPU when no GPU is present, one rank per GPU otherwise)::

    iris-fw launch -n 4 examples/ring_exchange.py
    mpirun -n 4 python examples/ring_exchange.py
    torchrun --nproc-per-node 4 examples/ring_exchange.py
"""

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv


@triton.jit
def _ring_all_gather_kernel(out, flags, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """out: [world_size, n] on the heap, row ``rank`` filled by the caller; flags: [world_size]
    int32 on the heap, zero. Programs split the block; each program runs the whole ring."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    right = (rank + 1) % world_size
    for step in range(0, world_size - 1):
        # forward the block that originated at rank - step
        row = (rank - step + world_size) % world_size
        src = out + row * n + offs
        dv.put(src, src, rank, right, heap_bases, mask=mask)
        # per-program flag: step + 1 means "row for this step has arrived"
        dv.signal(flags + pid, step + 1, rank, right, heap_bases, op="set")
        dv.wait_until(flags + pid, ">=", step + 1, rank, rank, heap_bases)


def ring_all_gather(ctx: iris_fw.Context, block: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """Gather every rank's ``block`` ``[n]`` into ``[world_size, n]`` on every rank."""
    # validate
    if block.dim() != 1:
        raise ValueError(f"block must be 1-D [n], got shape {tuple(block.shape)}")
    # allocate
    n = block.numel()
    out = ctx.empty(ctx.world_size, n, dtype=block.dtype)
    out.fill_(float("nan") if block.dtype.is_floating_point else -1)  # poison
    out[ctx.rank].copy_(block)
    grid = (triton.cdiv(n, block_size),)
    flags = ctx.zeros(grid[0], dtype=torch.int32)
    ctx.barrier()  # every rank's buffers are ready before anyone writes into them
    # launch
    _ring_all_gather_kernel[grid](out, flags, n, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=block_size)
    ctx.barrier()  # raises WaitTimeout on every rank if any wait gave up
    return out


def main() -> None:
    with iris_fw.init(heap_size=1 << 28) as ctx:
        n = 1 << 12 if ctx.device.type == "cpu" else 1 << 22  # floats per rank
        block = torch.randn(n, device=ctx.device) + 100 * ctx.rank
        gathered = ring_all_gather(ctx, block)
        # reference: every rank's block, through the bootstrap
        expected = torch.stack([b.to(ctx.device) for b in ctx.bootstrap.all_gather(block.cpu())])
        ok = torch.equal(gathered, expected)
        results = ctx.bootstrap.all_gather(ok)
        if ctx.rank == 0:
            print(
                f"ring all-gather on {ctx.world_size} ranks ({ctx.transport.name}, {ctx.bootstrap.name}, "
                f"{ctx.device.type}): {n} floats per rank -> "
                + ("correct on every rank" if all(results) else f"WRONG on ranks {[r for r, k in enumerate(results) if not k]}")
            )
        if not all(results):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
