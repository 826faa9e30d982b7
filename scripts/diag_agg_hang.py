"""``ops.all_gather_gemm`` at the shape that hung, back to back, checked
(``iris-fw launch -n 2 scripts/diag_agg_hang.py [CALLS] [SCHEDULERS]``; on one GPU under MPS:
``STEPS="launch:2,scripts/diag_agg_hang.py" bash scripts/gpu_mps.sh``).

``iris-fw bench host`` at W = 2 on one H100 under MPS (50 % of the SMs per rank) stopped in the
93rd back-to-back call of ``ops.all_gather_gemm`` 16x4096 (per rank) @ 4096x8192 under
``producer_consumer`` (another run: about the 204th): each rank's GEMM kernel waited for the chunk
flag its own fetch kernel sets (docs/gpu-tests.md, 2026-11-25 third session). The cause: the
consumer (GEMM) kernel's programs could be resident on every SM the rank may use before the
producer (fetch) kernel got one; the fix makes a consumer program fetch a chunk itself when the
chunk's producer program has not started (iris_fw/engine/skeletons.py, ``obtain``).

Here every scheduler named (default ``producer_consumer``; ``all``: every one that runs the op)
enqueues CALLS calls (default 300 on GPUs, 3 on CPU ranks) the way the bench does — the functional
``ops.all_gather_gemm`` with no synchronize between calls — each call on its own A (random, from a
per-call seed, the same on every rank), then synchronizes once and checks every call against
``cat(A of every rank) @ B`` computed by torch in fp32 (TF32 off), within two bf16 units in the
last place of the largest value. One line per rank and scheduler: calls, wrong calls, the first
wrong one, or the error (a wait that timed out names its flag); ``IRIS_FW_WAIT_TIMEOUT`` bounds
each case. CPU ranks run a small shape (a smoke test of the script itself).
"""

import os
import sys
import time

import torch

import iris_fw
from iris_fw import devinfo, ops
from iris_fw.engine.contract import PatternError

#: The bench's shape on GPUs: A [M, K] per rank, B [K, N] (B is each rank's N/W columns).
GPU_SHAPE, CPU_SHAPE = (16, 8192, 4096), (16, 32, 48)
SCHEDULERS = ("auto", "bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "copy_engine")


def _a(seed, m, k, world, dtype):
    """Every rank's A of one call (each rank builds all of them from the call's seed)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(m, k, generator=g).to(dtype) for _ in range(world)]


def _case(ctx, calls, scheduler, shape, dtype):
    m, n, k = shape
    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    b = torch.randn(k, n, generator=torch.Generator().manual_seed(17 + r)).to(dtype).to(dev)
    a_all = [_a(5000 + i, m, k, w, dtype) for i in range(calls)]
    mine = [a[r].to(dev) for a in a_all]
    outs = []
    t0 = time.perf_counter()
    for a in mine:  # back to back, as `iris-fw bench host` calls it
        outs.append(ops.all_gather_gemm(a, b, ctx=ctx, scheduler=scheduler))
    enqueue = time.perf_counter() - t0
    ctx.synchronize()
    ran = time.perf_counter() - t0
    wrong = []
    b32 = b.float()
    for i, (got, a) in enumerate(zip(outs, a_all)):
        want = torch.cat(a).to(dev).float() @ b32
        tol = 2.0 ** -6 * max(float(want.abs().max()), 1.0)
        bad = ~((got.float() - want).abs() <= tol)  # NaN counts as wrong
        if bool(bad.any()):
            wrong.append((i, int(bad.sum()), float((got.float() - want).abs().nan_to_num(float("inf")).max())))
    return wrong, enqueue, ran


def main():
    gpu = torch.cuda.is_available()
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else (300 if gpu else 3)
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["producer_consumer"]
    if names == ["all"]:
        names = list(SCHEDULERS)
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference in plain fp32
    shape, dtype = (GPU_SHAPE, torch.bfloat16) if gpu else (CPU_SHAPE, torch.float32)
    ctx = iris_fw.init(heap_size=1 << 30 if gpu else 1 << 26)
    if ctx.rank == 0:
        share = os.environ.get(devinfo.MPS_PERCENT_VAR, "unset")
        print(f"all_gather_gemm A {shape[0]}x{shape[2]} per rank @ B {shape[2]}x{shape[1]}, {ctx.world_size} ranks, "
              f"{calls} calls per scheduler; {devinfo.num_sms(ctx.device)} SMs seen per rank "
              f"({devinfo.MPS_PERCENT_VAR}={share})", flush=True)
    failed = 0
    for name in names:
        ctx.barrier()
        try:
            wrong, enqueue, ran = _case(ctx, calls, name, shape, dtype)
        except PatternError as exc:  # a scheduler that does not run this op (raised on every rank alike)
            print(f"rank {ctx.rank} {name}: n/a ({str(exc).splitlines()[0][:200]})", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 -- reported per case, the job re-armed below
            failed += 1
            print(f"rank {ctx.rank} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:400]}", flush=True)
            ctx.barrier()  # re-arms the job after a wait gave up
            continue
        failed += bool(wrong)
        print(f"rank {ctx.rank} {name}: {calls} calls, {len(wrong)} wrong"
              + (f" (first: call {wrong[0][0]}, {wrong[0][1]} elements, max err {wrong[0][2]:.3g})" if wrong else "")
              + f" [enqueue {enqueue * 1e6 / calls:.0f} us/call, {ran:.2f} s to the last result]", flush=True)
    ctx.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
