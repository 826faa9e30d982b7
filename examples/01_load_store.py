"""01 · load and store: read a peer's heap and write into it from inside a kernel.

Every rank fills its buffer ``x`` with an index plus 1000 x its rank. One kernel then ``load``s
the right neighbour's ``x`` (a remote read) and ``store``s it, doubled, into the right
neighbour's ``y`` (a remote write). So each rank's ``y`` is written by its left neighbour and
holds twice its own ``x``; checked against torch on every rank. ``x`` and ``y`` live on the
symmetric heap (``ctx.arange``/``ctx.full`` and in-place updates): a primitive's pointer is an
address in the caller's heap, translated to the same offset in the peer's.

    iris-fw launch -n 2 examples/01_load_store.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv


@triton.jit
def _load_store_kernel(x, y, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    right = (rank + 1) % world_size
    value = dv.load(x + offs, rank, right, heap_bases, mask=mask)      # the right neighbour's x
    dv.store(y + offs, value * 2, rank, right, heap_bases, mask=mask)  # into the right neighbour's y


def main() -> int:
    with iris_fw.init(heap_size=1 << 24) as ctx:
        n = 1000 if ctx.device.type == "cpu" else 1 << 20
        x = ctx.arange(n, dtype=torch.float32)
        x += 1000 * ctx.rank  # in place: `x + …` would be a new tensor off the heap
        y = ctx.full((n,), float("nan"))  # poison: anything not written stays NaN
        ctx.barrier()  # every rank's x is written before anyone reads it
        _load_store_kernel[(triton.cdiv(n, 256),)](x, y, n, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=256)
        ctx.barrier()  # every store has landed
        expected = 2 * x  # the left neighbour read this rank's own x
        ok = ctx.bootstrap.all_gather(bool(torch.equal(y, expected)))
        if ctx.rank == 0:
            print(f"load/store on {ctx.world_size} ranks ({ctx.device.type}): "
                  + ("correct on every rank" if all(ok) else f"WRONG on ranks {[r for r, k in enumerate(ok) if not k]}"))
        return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
