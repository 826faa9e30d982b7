"""05 · a hand-written all-reduce: push, count arrivals, reduce locally.

One kernel per call (a one-shot all-reduce): every program takes one block of the vector,
``put``s it into row ``rank`` of that block in every peer's ``inbox`` ``[world_size, n]``, then
adds one to the peer's arrival counter for the block (``signal(op="add")``, release). When its
own counter shows every rank's block (``wait_until``, acquire), it sums the ``world_size`` rows
in rank order. Counters count up across calls (``epoch``), so they are never reset; the host
barrier between calls keeps a fast rank from overwriting an inbox a peer is still summing
(``iris_fw.ccl.all_reduce`` double-buffers on the device instead). Compared with a float64
sum; every rank's result is bitwise the same.

    iris-fw launch -n 3 examples/05_all_reduce_kernel.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv


@triton.jit
def _all_reduce_kernel(x, inbox, counters, out, n, epoch, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """x: [n] any local tensor; inbox: [world_size, n] and counters: [programs] int32 on the heap;
    out: [n] any local tensor."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(0, world_size):
        dv.put(x + offs, inbox + rank * n + offs, rank, peer, heap_bases, mask=mask)
        dv.signal(counters + pid, 1, rank, peer, heap_bases, op="add")
    # this program waits only for the same program of the other ranks (never for another
    # program of this launch: under Triton's interpreter those run one after another)
    dv.wait_until(counters + pid, ">=", epoch * world_size, rank, rank, heap_bases)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for src in range(0, world_size):
        acc += tl.load(inbox + src * n + offs, mask=mask, other=0.0)
    tl.store(out + offs, acc, mask=mask)


class AllReduce:
    """Sum of every rank's fp32 ``[n]`` vector (collective: every rank calls it)."""

    def __init__(self, ctx: iris_fw.Context, n: int, block: int = 256):
        self.ctx, self.n, self.block = ctx, n, block
        self.grid = (triton.cdiv(n, block),)
        self.inbox = ctx.empty(ctx.world_size, n, dtype=torch.float32)  # same sizes, same order on
        self.counters = ctx.zeros(self.grid[0], dtype=torch.int32)      # every rank: symmetric
        self.epoch = 0
        ctx.barrier()  # every rank's buffers exist before anyone writes into them

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.n,) or x.dtype != torch.float32 or x.device != self.ctx.device:
            raise ValueError(f"x must be float32 [{self.n}] on {self.ctx.device}, got {x.dtype} {list(x.shape)} on {x.device}")
        self.epoch += 1
        out = torch.full_like(x, float("nan"))
        _all_reduce_kernel[self.grid](x, self.inbox, self.counters, out, self.n, self.epoch, self.ctx.rank,
                                      self.ctx.world_size, self.ctx.heap_bases, BLOCK=self.block)
        self.ctx.barrier()  # raises WaitTimeout on every rank if a wait gave up
        return out


def main() -> int:
    # the inbox holds world_size x n floats: ~16 MiB per rank on GPUs, where n is 4 Mi
    with iris_fw.init(heap_size=(1 << 28) if torch.cuda.is_available() else (1 << 24)) as ctx:
        w, n = ctx.world_size, (1000 if ctx.device.type == "cpu" else (1 << 22) + 5)
        all_reduce = AllReduce(ctx, n)
        oks = []
        for call in range(2):  # fresh inputs each call; counters and buffers are reused
            seed = ctx.broadcast(int(torch.randint(1 << 30, ())))
            xs = [torch.randn(n, generator=torch.Generator().manual_seed(seed + r)) for r in range(w)]
            got = all_reduce(xs[ctx.rank].to(ctx.device)).cpu()
            want = torch.stack(xs).double().sum(0)
            first = ctx.broadcast(got.clone(), src=0)  # rank 0's result, to compare bitwise
            oks.append(torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5) and torch.equal(got, first))
        oks = ctx.bootstrap.all_gather(all(oks))
        if ctx.rank == 0:
            print(f"hand-written all-reduce on {w} ranks ({ctx.device.type}), {n} floats, 2 calls -> "
                  + ("correct and identical on every rank" if all(oks) else f"WRONG on ranks {[r for r, k in enumerate(oks) if not k]}"))
        return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
