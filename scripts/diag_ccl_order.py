"""Diagnose ccl all-reduce results on GPUs (``iris-fw launch -n 2 scripts/diag_ccl_order.py``).

For each algorithm, rounds of three back-to-back all-reduces (the pattern of tests/test_ccl.py,
which failed on 2x H200 at the first call of a reduction after another reduction had used the
same buffers), alternating the reduction between rounds (sum, max, sum, avg) and, in every
other round, letting one rank enter late (it sleeps first). Prints, per call, how many elements
are wrong and whether the wrong ones equal the rank's own input (a peer's data missing).

Seen on 2x H200 (2026-11-22): single calls with a late rank, sum only, were all right for
one_shot and lamport (no fence needed beyond the barrier + one thread's release).
"""

import sys
import time

import torch

import iris_fw
from iris_fw import ccl

OPS = ("sum", "max", "sum", "avg")


def _want(xs, op):
    wide = torch.stack([x.double() for x in xs])
    if op == "max":
        return wide.amax(0)
    s = wide.sum(0)
    return s / len(xs) if op == "avg" else s


def main():
    ctx = iris_fw.init(heap_size=1 << 30)
    n = (1 << 20) + 1037 if torch.cuda.is_available() else 3000
    algos = (sys.argv[1] if len(sys.argv) > 1 else "one_shot,lamport,two_shot,ring").split(",")
    for algo in algos:
        for rnd, op in enumerate(OPS):
            g = torch.Generator().manual_seed(100 + rnd)
            data = [[torch.randn(n, generator=g) for _ in range(ctx.world_size)] for _ in range(3)]
            ts = [d[ctx.rank].to(ctx.device, copy=True) for d in data]
            ctx.barrier()
            late = rnd % ctx.world_size
            if rnd % 2 and ctx.rank == late:
                time.sleep(1.5)
            err = None
            try:
                for t in ts:
                    ccl.all_reduce(t, op=op, algorithm=algo)
                ctx.synchronize()
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {str(exc)[:160]}"
            for i, t in enumerate(ts):
                want = _want(data[i], op)
                got = t.cpu().double()
                bad = (got - want).abs() > 1e-4 * want.abs().clamp(min=1)
                own = (got - data[i][ctx.rank].double()).abs() < 1e-6
                print(f"rank {ctx.rank} {algo} round {rnd} ({op}{', late rank %d' % late if rnd % 2 else ''}) "
                      f"call {i}: {int(bad.sum())} wrong of {n}, {int((bad & own).sum())} equal own input; "
                      f"first {bad.nonzero().flatten()[:3].tolist()}{'; ' + err if err else ''}", flush=True)
            ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
