"""Probe (run under ``iris-fw launch``): where small ops spend their time.

For a few taxonomy shapes and every scheduler: GPU time per call (events, back to back), host
time per call (enqueue only), host time of the pieces (bind, one device barrier), and for the
flag-free fused schedule the GPU time of a CUDA-graph replay (no launch gaps). Then the Triton
GEMM at the local shapes with more tile configurations than the taxonomy benchmark tries.
Prints one line per measurement on rank 0.
"""

import sys
import time

import torch

import iris_fw
from iris_fw import ops
from iris_fw.bench import measure_us
from iris_fw.bench.taxonomy import operands
from iris_fw.gemm import GemmConfig, matmul

ITERS, WARMUP = 20, 3


def main():
    ctx = iris_fw.init(heap_size=4 << 30)
    say = (lambda *a: print(*a, flush=True)) if ctx.rank == 0 else (lambda *a: None)
    what = sys.argv[1:] or ["launch", "gemm"]

    def host_us(fn, n=20):
        ctx.synchronize()
        ctx.barrier()
        t0 = time.perf_counter()
        for i in range(n):
            fn()
        t = (time.perf_counter() - t0) / n * 1e6
        ctx.synchronize()
        return max(ctx.bootstrap.all_gather(t))

    if "launch" in what:
        for pattern, M, N, K in [("gemm_all_scatter", 1024, 8192, 8192), ("gemm_all_scatter", 4096, 8192, 8192),
                                 ("all_gather_gemm", 16384, 14336, 4096)]:
            a, b = operands(pattern, M, N, K, ctx.world_size, ctx.device, seed=ctx.rank + 1)
            say(f"== {pattern} {M}x{N}x{K}")
            say(f"  device_barrier host {host_us(ctx.device_barrier, 100):.1f} us")
            for sched in ["bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized"]:
                op = ops.plan(pattern, a, b, ctx=ctx, scheduler=sched)
                gpu = measure_us(ctx, lambda i: op(a, b), ITERS, WARMUP)
                host = host_us(lambda: op(a, b))
                bind = host_us(lambda: op.pattern.bind(ctx, op.buffers, a, b))
                line = f"  {sched:18s} gpu {gpu:8.1f} us  host/call {host:7.1f} us  bind {bind:6.1f} us"
                if sched == "fused_sequential":
                    try:
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            op(a, b)
                        torch.cuda.current_stream().wait_stream(s)
                        ctx.synchronize()
                        ctx.barrier()
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            op(a, b)
                        ctx.barrier()
                        line += f"  graph replay gpu {measure_us(ctx, lambda i: g.replay(), ITERS, WARMUP):8.1f} us"
                        del g
                    except Exception as exc:  # noqa: BLE001
                        line += f"  graph: {type(exc).__name__}: {str(exc)[:100]}"
                        ctx.synchronize()
                        ctx.barrier()
                say(line)
                del op
            m, n, k = (M, N // ctx.world_size, K) if pattern == "gemm_all_scatter" else (M, N // ctx.world_size, K)
            ga = torch.randn(m, k, device=ctx.device, dtype=torch.bfloat16)
            gb = torch.randn(k, n, device=ctx.device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=ctx.device, dtype=torch.bfloat16)
            say(f"  matmul {m}x{n}x{k}: gpu {measure_us(ctx, lambda i: matmul(ga, gb, out=out), ITERS, WARMUP):.1f} us"
                f" host {host_us(lambda: matmul(ga, gb, out=out)):.1f} us;"
                f" cublas gpu {measure_us(ctx, lambda i: torch.matmul(ga, gb), ITERS, WARMUP):.1f} us"
                f" host {host_us(lambda: torch.matmul(ga, gb)):.1f} us")
            del a, b, ga, gb, out

    if "gemm" in what:
        configs = [GemmConfig(128, 128, 64, 8, 8, 4), GemmConfig(128, 128, 64, 8, 8, 5),
                   GemmConfig(128, 128, 64, 8, 8, 6), GemmConfig(128, 128, 128, 8, 8, 3),
                   GemmConfig(128, 64, 64, 8, 4, 4), GemmConfig(128, 64, 64, 8, 4, 6),
                   GemmConfig(64, 128, 64, 8, 4, 4), GemmConfig(64, 128, 64, 8, 4, 6),
                   GemmConfig(128, 256, 64, 8, 8, 3), GemmConfig(128, 256, 64, 16, 8, 3),
                   GemmConfig(128, 256, 64, 4, 8, 3), GemmConfig(256, 128, 64, 8, 8, 3),
                   GemmConfig(128, 128, 64, 16, 8, 4), GemmConfig(128, 128, 64, 4, 8, 4)]
        for m, n, k in [(1024, 2048, 8192), (8192, 1152, 36864), (8192, 7168, 8192), (16384, 3584, 4096),
                        (8192, 8192, 7168), (8192, 7168, 8192)]:
            a = torch.randn(m, k, device=ctx.device, dtype=torch.bfloat16) / k ** 0.5
            b = torch.randn(k, n, device=ctx.device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=ctx.device, dtype=torch.bfloat16)
            cub = measure_us(ctx, lambda i: torch.matmul(a, b), ITERS, WARMUP)
            res = []
            for cfg in configs:
                try:
                    us = measure_us(ctx, lambda i, c=cfg: matmul(a, b, out=out, config=c), ITERS, WARMUP)
                    res.append((us, cfg))
                except Exception as exc:  # noqa: BLE001
                    say(f"  {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
                    ctx.synchronize()
                    ctx.barrier()
            cub2 = measure_us(ctx, lambda i: torch.matmul(a, b), ITERS, WARMUP)
            res.sort(key=lambda t: t[0])
            say(f"== gemm {m}x{n}x{k}: cublas {cub:.1f} / {cub2:.1f} us")
            for us, c in res:
                say(f"  {c.block_m}x{c.block_n}x{c.block_k}/g{c.group_m}/w{c.num_warps}/s{c.num_stages}: "
                    f"{us:.1f} us ({100 * min(cub, cub2) / us:.1f}% of cuBLAS)")
            del a, b, out
    ctx.close()


if __name__ == "__main__":
    main()
