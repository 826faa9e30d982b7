"""02 · put and get: copy between a local tensor and a peer's heap.

``put`` copies from any local memory into a peer's heap; ``get`` copies from a peer's heap into
any local memory. Here every rank *puts* its message into the ``inbox`` of every peer (row =
sender), then, after a barrier, *gets* row ``rank`` of every peer's inbox — what it sent —
into a plain local tensor. Both are checked against torch.

    iris-fw launch -n 3 examples/02_put_get.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv


@triton.jit
def _put_kernel(message, inbox, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """message: [n], any local tensor; inbox: [world_size, n] on the heap."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(0, world_size):
        dv.put(message + offs, inbox + rank * n + offs, rank, peer, heap_bases, mask=mask)


@triton.jit
def _get_kernel(inbox, echoes, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """echoes: [world_size, n], any local tensor; row p gets peer p's inbox row ``rank``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(0, world_size):
        dv.get(inbox + rank * n + offs, echoes + peer * n + offs, rank, peer, heap_bases, mask=mask)


def main() -> int:
    with iris_fw.init(heap_size=1 << 24) as ctx:
        w, n = ctx.world_size, (777 if ctx.device.type == "cpu" else (1 << 20) - 3)
        seed = ctx.broadcast(int(torch.randint(1 << 30, ())))  # one seed, every rank draws every message
        messages = [torch.randn(n, generator=torch.Generator().manual_seed(seed + r)) for r in range(w)]
        message = messages[ctx.rank].to(ctx.device)  # an ordinary tensor: put reads any local memory
        inbox = ctx.full((w, n), float("nan"))       # on the heap: peers write into it
        ctx.barrier()
        grid = (triton.cdiv(n, 256),)
        _put_kernel[grid](message, inbox, n, ctx.rank, w, ctx.heap_bases, BLOCK=256)
        ctx.barrier()  # every put has landed
        echoes = torch.full((w, n), float("nan"), device=ctx.device)  # ordinary tensor: get writes any local memory
        _get_kernel[grid](inbox, echoes, n, ctx.rank, w, ctx.heap_bases, BLOCK=256)
        ctx.barrier()
        ok = torch.equal(inbox.cpu(), torch.stack(messages)) and torch.equal(echoes.cpu(), message.cpu().expand(w, n))
        oks = ctx.bootstrap.all_gather(ok)
        if ctx.rank == 0:
            print(f"put/get on {w} ranks ({ctx.device.type}): "
                  + ("correct on every rank" if all(oks) else f"WRONG on ranks {[r for r, k in enumerate(oks) if not k]}"))
        return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
