"""A quick look at ccl all-reduce latency on GPUs (run as ranks: ``iris-fw launch -n 2
scripts/probe_ccl.py``): per-op time of each algorithm inside a CUDA graph of 20 back-to-back
all-reduces, beside NCCL's, interleaved, at a few sizes (bf16). The full comparison is
``iris-fw bench ccl``; this is the one-minute check."""

import os
import sys

import torch
import torch.distributed as dist

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
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local))
    ctx = iris_fw.init(heap_size=2 << 30)
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "8192,262144,1048576,16777216").split(",")]
    algos = (sys.argv[2] if len(sys.argv) > 2 else "lamport,one_shot,two_shot,ring").split(",")
    for nbytes in sizes:
        n = nbytes // 2
        fns, graphs = {}, {}
        for algo in algos + ["nccl"]:
            t = torch.randn(n, device=ctx.device, dtype=torch.bfloat16)
            if algo == "nccl":
                fn = (lambda t=t: dist.all_reduce(t))
            else:
                fn = (lambda t=t, a=algo: ccl.all_reduce(t, algorithm=a))
            graphs[algo] = graph_of(fn, ctx)
            fns[algo + " graph"] = (lambda i, g=graphs[algo]: g.replay())
            fns[algo + " eager"] = (lambda i, f=fn: f())
        res = measure_interleaved(ctx, fns, iters=30, warmup=5)
        if ctx.rank == 0:
            line = ", ".join(f"{k} {v / (CALLS if k.endswith('graph') else 1):.2f}" for k, v in res.items())
            print(f"all_reduce {nbytes} B (us per op): {line}", flush=True)
        del graphs
        ctx.barrier()
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
