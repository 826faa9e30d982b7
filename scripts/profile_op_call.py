"""Where an op call's host time goes: cProfile of many enqueues of one small op on one rank
(run on one GPU: python3 scripts/profile_op_call.py [scheduler ...]); prints µs per call and the
functions with the most own time."""

import cProfile
import pstats
import sys
import time

import iris_fw  # noqa: F401  (first)
import torch
from iris_fw import ops

CALLS = 500

with iris_fw.init(heap_size=1 << 26) as ctx:
    a = torch.randn(256, 256, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(256, 128, device=ctx.device, dtype=torch.bfloat16)
    for sched in sys.argv[1:] or ["fused_sequential", "producer_consumer"]:
        op = ops.plan("gemm_all_scatter", a, b, scheduler=sched)
        op(a, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            op(a, b)
        host = (time.perf_counter() - t0) / CALLS * 1e6
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            op(a, b)
        prof.disable()
        torch.cuda.synchronize()
        print(f"== {sched}: {host:.1f} us per call (enqueue only, no profiler)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        del op
