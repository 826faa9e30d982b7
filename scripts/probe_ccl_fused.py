"""A quick look at the fused all-reduce + residual add + RMSNorm on GPUs (run as ranks:
``iris-fw launch -n 2 scripts/probe_ccl_fused.py [tokens,...] [hidden]``): per-op time inside a
CUDA graph of 20 back-to-back calls of ``ccl.all_reduce_rmsnorm`` (each algorithm) beside the
all-reduce alone (``ccl.all_reduce``, same algorithm, same bytes), bf16, interleaved. The issue's
target: fused <= 1.1x the all-reduce alone at hidden 8192, 1-512 tokens."""

import sys

import torch

import iris_fw
from iris_fw import ccl
from iris_fw.bench.harness import measure_interleaved

CALLS = 20


def graph_of(fn, ctx):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ctx.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    ctx.barrier()
    return g


def main():
    ctx = iris_fw.init(heap_size=2 << 30)
    tokens_list = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "1,4,16,64,128,512").split(",")]
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    kinds = (sys.argv[3] if len(sys.argv) > 3 else "fused,all_reduce").split(",")
    algos = (sys.argv[4] if len(sys.argv) > 4 else "lamport,one_shot").split(",")
    dev, dtype = ctx.device, torch.bfloat16
    for tokens in tokens_list:
        fns, graphs = {}, []
        for algo in algos:
            x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
            res = torch.randn(tokens, hidden, device=dev, dtype=dtype)
            w = torch.ones(hidden, device=dev, dtype=dtype)
            out = torch.empty_like(x)
            t = torch.randn(tokens * hidden, device=dev, dtype=dtype)
            for name, fn in ((f"fused {algo}", lambda a=algo, x=x, r=res, w=w, o=out:
                              ccl.all_reduce_rmsnorm(x, r, w, out=o, algorithm=a)),
                             (f"all_reduce {algo}", lambda a=algo, t=t: ccl.all_reduce(t, algorithm=a))):
                if name.split()[0] not in kinds:
                    continue
                g = graph_of(fn, ctx)
                graphs.append(g)
                fns[name] = (lambda i, g=g: g.replay())
        times = measure_interleaved(ctx, fns, iters=30, warmup=5)
        if ctx.rank == 0:
            line = ", ".join(f"{k} {v / CALLS:.2f}" for k, v in times.items())
            ratio = ", ".join(f"{a} {times['fused ' + a] / times['all_reduce ' + a]:.2f}x" for a in algos
                              if f"fused {a}" in times and f"all_reduce {a}" in times)
            print(f"[{tokens}, {hidden}] bf16 (us per op in a graph): {line}; fused/all_reduce: {ratio}", flush=True)
        del graphs
        ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
