"""08 · capture collectives and ops in a CUDA graph, replay with fresh inputs (GPU only).

Plan outside the capture, capture once, then write new data into the same tensors and replay:
every per-call counter of iris-fw's kernels lives on the device, so a replay is a correct new
call. The graph holds an in-place ``ccl.all_reduce`` and a ``gemm_all_scatter`` op from
``ops.plan`` (which returns its own output buffer, overwritten by each call). Each of three
replays is checked against a float64 torch reference.

On CPU ranks it prints why it is skipped and exits 0: CUDA graphs need a GPU, and without one
the kernels run under Triton's interpreter.

    iris-fw launch -n 2 examples/08_cuda_graph.py
"""

import os
import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch

from iris_fw import ccl as dist
from iris_fw import ops


def main() -> int:
    if iris_fw.interpreting():  # decided by `import iris_fw`, the same on every rank
        if os.environ.get("RANK", "0") == "0":
            why = "no GPU is visible" if not torch.cuda.is_available() else "TRITON_INTERPRET=1 asks for the interpreter"
            print(f"cuda graph capture: skipped: CUDA graphs need a GPU; {why}, so the ranks run on the CPU under "
                  "Triton's interpreter")
        return 0
    with iris_fw.init(heap_size=1 << 30) as ctx:
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        n, (m, k, nl) = (1 << 20) + 3, (1024, 1024, 512)
        x = torch.empty(n, device=dev)                                   # the graph's input/output tensors
        a = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.empty(k, nl, device=dev, dtype=torch.bfloat16)
        op = ops.plan("gemm_all_scatter", a, b)                          # collective: validates, allocates

        def step():
            dist.all_reduce(x)
            return op(a, b)

        def fresh_inputs(call):
            """Write new data into x, a, b; return the references."""
            g = torch.Generator().manual_seed(ctx.broadcast(int(torch.randint(1 << 30, ()))) + call)
            xs = [torch.randn(n, generator=g) for _ in range(w)]
            ab = [(torch.randn(m, k, generator=g).bfloat16(), torch.randn(k, nl, generator=g).bfloat16()) for _ in range(w)]
            x.copy_(xs[r])
            a.copy_(ab[r][0])
            b.copy_(ab[r][1])
            return torch.stack(xs).double().sum(0), torch.cat([p.double() @ q.double() for p, q in ab], dim=1)

        fresh_inputs(0)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()  # the first calls run outside the capture: validated across ranks, buffers registered
        torch.cuda.current_stream(dev).wait_stream(side)
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        ok = True
        for call in range(1, 4):
            want_x, want_c = fresh_inputs(call)
            out.fill_(float("nan"))  # poison: a replay must write every element
            graph.replay()
            ctx.synchronize()
            ok &= torch.allclose(x.double().cpu(), want_x, rtol=1e-4, atol=1e-4)
            ok &= (out.double().cpu() - want_c).abs().max().item() <= 2.0 ** -6 * want_c.abs().max().item()
            ctx.barrier()  # every rank has checked before the next inputs are written
        oks = ctx.bootstrap.all_gather(bool(ok))
        if r == 0:
            print(f"cuda graph capture on {w} GPUs: all_reduce + gemm_all_scatter, 3 replays with fresh inputs -> "
                  + ("correct on every rank" if all(oks) else f"WRONG on ranks {[p for p, k in enumerate(oks) if not k]}"))
        return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
