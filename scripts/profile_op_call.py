"""Where an op call's host time goes: many enqueues of one small op on one rank, timed, then
under cProfile; prints µs per call and the functions with the most own time.

    python3 scripts/profile_op_call.py [scheduler ...]          # on one GPU: enqueue time
    python3 scripts/profile_op_call.py --stub [scheduler ...]   # Python side only

On a GPU a call is timed up to the kernel launches (the GPU is synchronized outside the timed
loop). With ``--stub`` (the default without a GPU, where kernels would run in the interpreter)
``KernelLauncher`` calls are replaced by a function that only counts them: what is left is the
engine's own Python per call (validation, bind, scheduler) without Triton's launch.
"""

import cProfile
import pstats
import statistics
import sys
import time

import iris_fw  # noqa: F401  (first)
import torch
from iris_fw import ops
from iris_fw import kernel_launcher as _launcher

CALLS = 500
ROUNDS = 5
SCHEDULERS = ["fused_sequential", "wg_specialized", "producer_consumer", "bulk_sync"]

argv = sys.argv[1:]
stub = "--stub" in argv or not torch.cuda.is_available()
names = [a for a in argv if not a.startswith("--")] or SCHEDULERS
launches = [0]


def _count(self, args, stream):
    launches[0] += 1


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


with iris_fw.init(heap_size=1 << 26) as ctx:
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    a = torch.randn(256, 256, device=ctx.device, dtype=dtype)
    b = torch.randn(256, 128, device=ctx.device, dtype=dtype)
    if stub:
        if hasattr(_launcher.KernelLauncher, "_launch"):
            _launcher.KernelLauncher._launch = _count  # both __call__ and launch_on
        else:  # an older launcher (before launch_on)
            _launcher.KernelLauncher.__call__ = lambda self, *args: _count(self, args, None)
    print(f"{'stubbed launches (Python side only)' if stub else 'enqueue only'}, {ctx.device}, "
          f"{CALLS} calls x {ROUNDS} rounds")
    for sched in names:
        op = ops.plan("gemm_all_scatter", a, b, ctx=ctx, scheduler=sched)
        op(a, b)
        _sync()
        per_round = []
        for _ in range(ROUNDS):
            launches[0] = 0
            t0 = time.perf_counter()
            for _ in range(CALLS):
                op(a, b)
            per_round.append((time.perf_counter() - t0) / CALLS * 1e6)
            _sync()
        per_call = launches[0] / CALLS
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            op(a, b)
        prof.disable()
        _sync()
        extra = f", {per_call:.0f} launch(es) per call stubbed" if stub else ""
        print(f"== {sched}: {statistics.median(per_round):.1f} us per call (median of {ROUNDS}; "
              f"min {min(per_round):.1f}{extra}, no profiler)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        del op
