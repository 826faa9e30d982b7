"""Back-to-back calls without a synchronize between them, every collective and op, checked
(``iris-fw launch -n 2 scripts/diag_pipelined.py [CALLS]``; on a GPU under MPS:
``scripts/gpu_mps.sh launch:2,scripts/diag_pipelined.py``).

The tests make one to three calls per case; an application enqueues hundreds (``iris-fw bench
host`` timed out on one H100 under MPS at W = 2 in its 200-call loop, 2026-11-25). Here every
case enqueues CALLS calls (default 200 on GPUs, 4 on CPU ranks), each on its own fresh random
inputs and into its own output, then synchronizes once and checks every call's result against a
float64 reference built from every rank's inputs (within 1e-4 of the largest value for fp32
collectives, two bf16 units in the last place for the GEMM ops, as the tests). Per case one line per rank: calls wrong, the
first wrong call, or the error (a wait that timed out names its flag). ``IRIS_FW_WAIT_TIMEOUT``
bounds each case.
"""

import sys
import time

import torch

import iris_fw
from iris_fw import ccl, ops
from iris_fw.engine.contract import PatternError


def _inputs(seed, shape, world, dtype):
    """Every rank's input of one call, on the host (the same on every rank: each builds all of them)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(world)]


def _elems(ctx, gpu_elems, cpu_elems):
    """Elements of a message before its ragged tail: ``gpu_elems`` on GPUs, ``cpu_elems`` on CPU
    ranks (each tile is interpreted there; a few tiles still spread a call over several programs)."""
    return cpu_elems if ctx.device.type == "cpu" else gpu_elems


def _case_ccl_all_reduce(ctx, calls, algorithm, heap):
    n = _elems(ctx, 4096, 2048) + 37
    w, r = ctx.world_size, ctx.rank
    data = [_inputs(1000 + i, (n,), w, torch.float32) for i in range(calls)]
    make = ctx.zeros if heap else (lambda *s, **k: torch.zeros(*s, device=ctx.device, **k))
    ts = [make(n, dtype=torch.float32) for _ in range(calls)]
    for t, d in zip(ts, data):
        t.copy_(d[r])
    for t in ts:
        ccl.all_reduce(t, algorithm=algorithm, ctx=ctx)
    return [(t, torch.stack([x.double() for x in d]).sum(0), 1e-4) for t, d in zip(ts, data)]


def _case_all_gather(ctx, calls):
    n, w, r = _elems(ctx, 2048, 1024) + 5, ctx.world_size, ctx.rank
    data = [_inputs(2000 + i, (n,), w, torch.float32) for i in range(calls)]
    src = [ctx.zeros(n, dtype=torch.float32) for _ in range(calls)]
    for s, d in zip(src, data):
        s.copy_(d[r])
    outs = [torch.full((w * n,), float("nan"), device=ctx.device) for _ in range(calls)]
    for o, s in zip(outs, src):
        ccl.all_gather_into_tensor(o, s, ctx=ctx)
    return [(o, torch.cat(d).double(), 0) for o, d in zip(outs, data)]


def _case_reduce_scatter(ctx, calls):
    n, w, r = 1024 + 3, ctx.world_size, ctx.rank
    data = [_inputs(3000 + i, (w * n,), w, torch.float32) for i in range(calls)]
    src = [ctx.zeros(w * n, dtype=torch.float32) for _ in range(calls)]
    for s, d in zip(src, data):
        s.copy_(d[r])
    outs = [torch.full((n,), float("nan"), device=ctx.device) for _ in range(calls)]
    for o, s in zip(outs, src):
        ccl.reduce_scatter_tensor(o, s, ctx=ctx)
    return [(o, torch.stack([x.double() for x in d]).sum(0)[r * n:(r + 1) * n], 1e-4) for o, d in zip(outs, data)]


def _case_gemm(ctx, calls, op, scheduler):
    """The four engine ops on bf16 [M, K] @ [K, N] shapes, every call its own A."""
    w, r, dev, bf = ctx.world_size, ctx.rank, ctx.device, torch.bfloat16
    m, n, k = 64 * w, 96 * w, 128 * w
    gb = torch.Generator().manual_seed(7)
    b_full = torch.randn(k, n, generator=gb).to(bf)
    outs = []
    for i in range(calls):
        a_full = torch.randn(m, k, generator=torch.Generator().manual_seed(4000 + i)).to(bf)
        ref = a_full.double() @ b_full.double()
        if op == "gemm_all_reduce":      # sum over ranks of a[M, K/W] @ b[K/W, N]
            ks = slice(r * k // w, (r + 1) * k // w)
            got = ops.gemm_all_reduce(a_full[:, ks].to(dev), b_full[ks].to(dev), ctx=ctx, scheduler=scheduler)
            want = ref
        elif op == "gemm_reduce_scatter":  # rows rank*M/W...
            ks = slice(r * k // w, (r + 1) * k // w)
            got = ops.gemm_reduce_scatter(a_full[:, ks].to(dev), b_full[ks].to(dev), ctx=ctx, scheduler=scheduler)
            want = ref[r * m // w:(r + 1) * m // w]
        elif op == "gemm_all_scatter":     # a @ b[K, N/W] gathered column-wise
            ns = slice(r * n // w, (r + 1) * n // w)
            got = ops.gemm_all_scatter(a_full.to(dev), b_full[:, ns].to(dev), ctx=ctx, scheduler=scheduler)
            want = ref
        else:                              # all_gather(a[M/W, K]) @ b[K, N/W]
            ms, ns = slice(r * m // w, (r + 1) * m // w), slice(r * n // w, (r + 1) * n // w)
            got = ops.all_gather_gemm(a_full[ms].to(dev), b_full[:, ns].to(dev), ctx=ctx, scheduler=scheduler)
            want = ref[:, ns]
        outs.append((got, want, 2.0 ** -6))  # two bf16 units in the last place of the largest value
    return outs


def _cases(ctx, calls):
    cases = {}
    for algorithm in ccl.algorithms("all_reduce", ctx=ctx):
        cases[f"ccl.all_reduce heap {algorithm}"] = lambda a=algorithm: _case_ccl_all_reduce(ctx, calls, a, True)
    cases["ccl.all_reduce plain auto"] = lambda: _case_ccl_all_reduce(ctx, calls, "auto", False)
    cases["ccl.all_gather_into_tensor"] = lambda: _case_all_gather(ctx, calls)
    cases["ccl.reduce_scatter_tensor"] = lambda: _case_reduce_scatter(ctx, calls)
    for op in ("gemm_all_reduce", "gemm_reduce_scatter", "gemm_all_scatter", "all_gather_gemm"):
        for scheduler in ["auto"] + ctx.registries.scheduler.names():
            cases[f"ops.{op} {scheduler}"] = lambda o=op, s=scheduler: _case_gemm(ctx, calls, o, s)
    return cases


def main():
    gpu = torch.cuda.is_available()
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else (200 if gpu else 4)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    ctx = iris_fw.init(heap_size=1 << 30 if gpu else 1 << 26)
    for name, case in _cases(ctx, calls).items():
        if only and not any(o in name for o in only):
            continue
        ctx.barrier()
        t0 = time.perf_counter()
        try:
            results = case()
            ctx.synchronize()
        except PatternError as exc:  # a scheduler that does not run this op (raised on every rank alike)
            print(f"rank {ctx.rank} {name}: n/a ({str(exc).splitlines()[0][:200]})", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 -- reported per case, the job re-armed below
            msg = str(exc).splitlines()[0][:300]
            print(f"rank {ctx.rank} {name}: {type(exc).__name__}: {msg}", flush=True)
            try:
                ctx.barrier()
            except Exception as again:  # noqa: BLE001
                print(f"rank {ctx.rank} {name}: barrier after the error failed too: {again!r}"[:300], flush=True)
                raise
            continue
        wrong = []
        for i, (got, want, tol) in enumerate(results):
            g = got.double().cpu()
            bad = ~((g - want).abs() <= tol * max(float(want.abs().max()), 1.0))  # NaN counts as wrong
            if bool(bad.any()):
                wrong.append((i, int(bad.sum()), float((g - want).abs().nan_to_num(float("inf")).max())))
        took = time.perf_counter() - t0
        print(f"rank {ctx.rank} {name}: {len(results)} calls, {len(wrong)} wrong"
              + (f" (first: call {wrong[0][0]}, {wrong[0][1]} elements, max err {wrong[0][2]:.3g})" if wrong else "")
              + f" [{took:.1f} s]", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
