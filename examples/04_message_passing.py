"""04 · message passing: data, then a flag (release); wait for the flag (acquire), then read.

A message travels around the ring ``ROUNDS`` times. Each hop: the receiver waits until its
flag reaches the round number, adds one to every element, stores the result into its right
neighbour's buffer and ``signal``s the neighbour's flag with the round number. ``signal``
orders the program's earlier stores before the flag (release); ``wait_until`` orders the reads
after it (acquire) and is bounded: a message that never comes raises ``iris_fw.WaitTimeout``
at the next ``ctx.barrier()``, naming who waited for what. Flags count up (one value per round)
instead of being reset, so no reset can race a neighbour's next signal.

    iris-fw launch -n 3 examples/04_message_passing.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch
import triton
import triton.language as tl

from iris_fw import device as dv

ROUNDS = 3


@triton.jit
def _ring_kernel(buf, flag, rank, world_size, heap_bases, ROUNDS: tl.constexpr, N: tl.constexpr):
    """buf: [N] on the heap (rank 0's holds the message); flag: one int32 on the heap, zero."""
    offs = tl.arange(0, N)
    right = (rank + 1) % world_size
    for k in range(1, ROUNDS + 1):
        if rank != 0:
            dv.wait_until(flag, ">=", k, rank, rank, heap_bases)  # round k has arrived here
        value = tl.load(buf + offs) + 1
        dv.store(buf + offs, value, rank, right, heap_bases)
        dv.signal(flag, k, rank, right, heap_bases, op="set")
        if rank == 0:
            dv.wait_until(flag, ">=", k, rank, rank, heap_bases)  # round k came back


def main() -> int:
    with iris_fw.init(heap_size=1 << 24) as ctx:
        w, n = ctx.world_size, (64 if ctx.device.type == "cpu" else 4096)
        message = ctx.arange(n, dtype=torch.float32)  # the same on every rank; only rank 0's is sent
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        _ring_kernel[(1,)](message, flag, ctx.rank, w, ctx.heap_bases, ROUNDS=ROUNDS, N=n)
        ctx.barrier()  # raises WaitTimeout on every rank if a message never arrived
        # rank 0 holds the message after ROUNDS full turns; rank r after ROUNDS - 1 turns and r hops
        hops = ROUNDS * w if ctx.rank == 0 else (ROUNDS - 1) * w + ctx.rank
        ok = torch.equal(message.cpu(), torch.arange(n, dtype=torch.float32) + hops) and flag.item() == ROUNDS
        oks = ctx.bootstrap.all_gather(ok)
        if ctx.rank == 0:
            print(f"message passing: {ROUNDS} turns of a {w}-rank ring ({ctx.device.type}), {n} floats -> "
                  + ("correct on every rank" if all(oks) else f"WRONG on ranks {[r for r, k in enumerate(oks) if not k]}"))
        return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
