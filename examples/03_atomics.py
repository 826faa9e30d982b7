"""03 · atomics: read-modify-write on a peer's heap.

Every rank, from every program of one kernel:

* ``atomic_add``s ``rank + 1`` into a counter on *every* rank — each counter ends at
  ``programs * sum(r + 1)``;
* ``atomic_max``es its rank into a slot on every rank — it ends at ``world_size - 1``;
* tries to claim rank 0's ``owner`` slot with ``atomic_cas(-1 -> rank)``: exactly one program
  of one rank sees ``-1`` come back, and the slot names it.

Atomics default to ``sem="acq_rel", scope="sys"`` (visible to other GPUs and the host).

    iris-fw launch -n 3 examples/03_atomics.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv


@triton.jit
def _atomics_kernel(counter, top, owner, won, rank, world_size, heap_bases):
    """counter, top, owner: one int32 each on the heap; won: [programs] int32, local."""
    for peer in range(0, world_size):
        dv.atomic_add(counter, rank + 1, rank, peer, heap_bases)
        dv.atomic_max(top, rank, rank, peer, heap_bases)
    old = dv.atomic_cas(owner, -1, rank, rank, 0, heap_bases)  # claim rank 0's slot
    tl.store(won + tl.program_id(0), (old == -1).to(tl.int32))


def main() -> int:
    with iris_fw.init(heap_size=1 << 24) as ctx:
        w, programs = ctx.world_size, (4 if ctx.device.type == "cpu" else 1024)
        counter = ctx.zeros(1, dtype=torch.int32)
        top = ctx.full((1,), -1, dtype=torch.int32)
        owner = ctx.full((1,), -1, dtype=torch.int32)
        won = torch.zeros(programs, dtype=torch.int32, device=ctx.device)
        ctx.barrier()
        _atomics_kernel[(programs,)](counter, top, owner, won, ctx.rank, w, ctx.heap_bases)
        ctx.barrier()
        wins = ctx.bootstrap.all_gather(int(won.sum()))
        winner = ctx.broadcast(int(owner.item()), src=0)  # the slot on rank 0
        ok = (counter.item() == programs * sum(r + 1 for r in range(w)) and top.item() == w - 1
              and sum(wins) == 1 and wins[winner] == 1)
        oks = ctx.bootstrap.all_gather(ok)
        if ctx.rank == 0:
            print(f"atomics on {w} ranks x {programs} programs ({ctx.device.type}): counter {counter.item()}, "
                  f"max {top.item()}, owner rank {winner} (one winner) -> "
                  + ("correct on every rank" if all(oks) else f"WRONG on ranks {[r for r, k in enumerate(oks) if not k]}"))
        return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
