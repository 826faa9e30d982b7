"""GEMM + all-reduce (:func:`iris_fw.ops.gemm_all_reduce`, a row-parallel linear layer) against
cuBLAS + NCCL, as a benchmark plugin (``iris-fw bench gemm_all_reduce``).

For every ``(N, K)`` of :data:`SHAPES` and every ``M`` of :data:`MS` (global ``K``; each rank
multiplies ``a[M, K/W] @ b[K/W, N]``, bf16, with a bias), one interleaved measurement
(:func:`~iris_fw.bench.harness.measure_interleaved`) times side by side, eager and as
:data:`~iris_fw.bench.ccl.GRAPH_CALLS` back-to-back calls captured in one CUDA graph:

* ``cublas+nccl`` — ``torch.matmul`` into a buffer, ``torch.distributed.all_reduce``, the bias
  added (the baseline; its time is ``baseline_us`` of every row of the same mode);
* ``cublas+iris_ccl`` — the op's ``library`` scheduler: the same with :func:`iris_fw.ccl.all_reduce`;
* the fused schedules: ``fused_sequential`` with ``one_shot`` and ``two_shot`` (tiles reduced
  inside the kernel), ``producer_consumer`` (two streams; reduction in a kernel after);
* ``gemm_alone`` — the cuBLAS GEMM of one rank, no communication.

Each method's result is compared once with the baseline's (``max_rel_err``, largest over
ranks). ``speedup`` = baseline time / time, both from the same interleaved measurement.
``--quick``: two ``M`` per shape, fused one-shot/two-shot and the library form. On CPU ranks
(a smoke run) the shapes are tiny, only eager calls are timed, and the rows say what ran: the
baseline is ``torch.matmul+host_gather`` (torch's CPU matmul, the bootstrap's gather instead of
NCCL) and the library form ``torch.matmul+iris_ccl``; each row's ``baseline`` column names it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..hookspecs import hookimpl
from .ccl import GRAPH_CALLS, _capture, _nccl_reason
from .harness import measure_interleaved

#: ``(N, K)`` of the issue's targets (global K; ``K / W`` per rank).
SHAPES = [(8192, 28672), (8192, 8192)]
MS = [16, 64, 256, 1024, 4096, 8192]
QUICK_MS = [64, 4096]
CPU_SHAPES, CPU_MS = [(48, 64)], [5, 33]
#: ``(method, scheduler, algorithm)`` of the iris-fw methods (algorithm None: the default).
METHODS = [("cublas+iris_ccl", "library", None), ("fused_sequential one_shot", "fused_sequential", "one_shot"),
           ("fused_sequential two_shot", "fused_sequential", "two_shot"),
           ("producer_consumer", "producer_consumer", None)]
QUICK_METHODS = METHODS[:3]


def _operands(ctx, M, N, K, seed):
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    k = K // ctx.world_size
    a = (torch.randn(M, k, generator=g, device=ctx.device) / K ** 0.5).to(torch.bfloat16)
    b = torch.randn(k, N, generator=g, device=ctx.device).to(torch.bfloat16)
    bias_gen = torch.Generator(device=ctx.device).manual_seed(7)  # the same bias on every rank
    bias = torch.randn(N, generator=bias_gen, device=ctx.device).to(torch.bfloat16)
    return a, b, bias


def _baseline(ctx, a, b, bias):
    """``fn()`` computing ``out`` = cuBLAS GEMM + NCCL all-reduce + bias (the bootstrap's
    gather where there is no NCCL); returns ``(fn, out)``."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=ctx.device)
    nccl = _nccl_reason(ctx) is None
    if nccl:
        import torch.distributed as dist

    def fn():
        torch.matmul(a, b, out=out)
        if nccl:
            dist.all_reduce(out)
        else:
            out.copy_(sum(t.float() for t in ctx.bootstrap.all_gather(out.cpu())).to(out.dtype))
        out.add_(bias)

    return fn, out


class GemmAllReduceBench:
    name = "gemm_all_reduce"
    description = "GEMM + all-reduce (row-parallel linear): fused schedules and cuBLAS + iris ccl vs cuBLAS + NCCL"
    plot = {"kind": "bars", "x": "shape", "y": "speedup", "series": "method",
            "ylabel": "speedup over the baseline (same mode; its name: the baseline column)",
            "skip": {"method": ("cublas+nccl", "torch.matmul+host_gather", "gemm_alone")}, "only_flag": "plot"}

    def run(self, ctx, opts):
        from .. import ops

        gpu = ctx.device.type == "cuda"
        shapes = SHAPES if gpu else CPU_SHAPES
        ms = (QUICK_MS if opts.quick else MS) if gpu else CPU_MS
        methods = QUICK_METHODS if opts.quick or not gpu else METHODS
        modes = ("eager", "graph") if gpu else ("eager",)
        # rows are named by what ran: cuBLAS and NCCL on GPUs; torch's CPU matmul and the
        # bootstrap's gather (no NCCL) on CPU ranks
        nccl = _nccl_reason(ctx) is None
        base_name = "cublas+nccl" if nccl else "torch.matmul+host_gather"
        library_name = "cublas+iris_ccl" if gpu else "torch.matmul+iris_ccl"
        rows = []
        for N, K in shapes:
            for M in ms:
                label = f"M={M} N={N} K={K}"
                a, b, bias = _operands(ctx, M, N, K, seed=ctx.rank + 1)
                base_fn, base_out = _baseline(ctx, a, b, bias)
                base_fn()
                ctx.synchronize()
                expected = base_out.float().clone()
                fns = {base_name: base_fn, "gemm_alone": lambda: torch.matmul(a, b)}
                errors, held = {}, []
                pattern = ctx.registries.pattern.get("gemm_all_reduce")
                for method, scheduler, algorithm in methods:
                    method = library_name if scheduler == "library" else method
                    try:
                        config = None
                        if algorithm is not None:
                            config = replace(pattern.default_config(ctx, pattern.signature(ctx, a, b, bias)),
                                             algorithm=algorithm)
                        op = ops.plan("gemm_all_reduce", a, b, bias, scheduler=scheduler, config=config)
                        got = op(a, b, bias).float()
                        ctx.synchronize()
                        err = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
                        errors[method] = max(ctx.bootstrap.all_gather(err))
                        fns[method] = (lambda op=op: op(a, b, bias))
                        held.append(op)
                    except Exception as exc:  # noqa: BLE001 - reported as a row, the others go on
                        rows.append({"shape": label, "M": M, "N": N, "K": K, "method": method, "mode": "-", "us": None,
                                     "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                        opts.log(f"{label} {method}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    ctx.barrier()
                for mode in modes:
                    if mode == "graph":
                        timed = {name: _capture(ctx, fn) for name, fn in fns.items()}
                        per_call = GRAPH_CALLS
                    else:
                        timed = {name: (lambda i, fn=fn: fn()) for name, fn in fns.items()}
                        per_call = 1
                    iters = opts.iters if M * N * K < (1 << 38) else max(5, opts.iters // 3)
                    times = measure_interleaved(ctx, timed, iters, opts.warmup)
                    base = times[base_name] / per_call
                    for name, us in times.items():
                        us /= per_call
                        row = {"shape": label, "M": M, "N": N, "K": K, "method": name, "mode": mode, "us": us,
                               "baseline": base_name, "baseline_us": base, "speedup": base / us,
                               "plot": mode == ("graph" if gpu else "eager")}
                        if name in errors:
                            row["max_rel_err"] = errors[name]
                        rows.append(row)
                    opts.log(f"{label} {mode}: " + ", ".join(f"{n} {t / per_call:.1f} us" for n, t in times.items()))
                    del timed
                    ctx.barrier()
                del held, fns
                ctx.barrier()
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(GemmAllReduceBench())
