"""09 · a tensor-parallel MLP compiled with torch.compile, collectives as torch custom ops.

``import iris_fw.ccl.custom_ops`` registers the collectives as ``torch.ops.iris_fw.*``
(functional, with fake implementations), so a model calling them traces with
``torch.compile(fullgraph=True)``. The model is Megatron-style: ``w1`` split by columns and
``w2`` by rows over the ranks, so each rank computes a partial ``relu(x @ w1_r) @ w2_r``; one
all-reduce sums the partials, then the residual add and RMSNorm — once as
``all_reduce`` followed by torch ops, once fused as ``all_reduce_rmsnorm``. Both are compared
with a float64 run of the unsplit model.

    iris-fw launch -n 2 examples/09_tensor_parallel_mlp.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch

import iris_fw.ccl.custom_ops  # noqa: F401  (registers torch.ops.iris_fw.*)

EPS = 1e-6


def rmsnorm(h, gamma):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * gamma


def main() -> int:
    with iris_fw.init(heap_size=1 << 26) as ctx:
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        tokens, hidden, ffn = (5, 64, 32 * w) if dev.type == "cpu" else (64, 4096, 1024 * w)
        g = torch.Generator().manual_seed(ctx.broadcast(int(torch.randint(1 << 30, ()))))
        w1 = torch.randn(hidden, ffn, generator=g) / hidden ** 0.5
        w2 = torch.randn(ffn, hidden, generator=g) / ffn ** 0.5
        gamma = 1 + 0.1 * torch.randn(hidden, generator=g)
        x, residual = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
        cols = slice(r * ffn // w, (r + 1) * ffn // w)  # this rank's shard
        w1_r, w2_r, gamma_d = w1[:, cols].contiguous().to(dev), w2[cols].contiguous().to(dev), gamma.to(dev)

        def mlp(x, residual):
            h = torch.ops.iris_fw.all_reduce(torch.relu(x @ w1_r) @ w2_r, "sum", [], "auto") + residual
            return rmsnorm(h, gamma_d)

        def mlp_fused(x, residual):
            out, _ = torch.ops.iris_fw.all_reduce_rmsnorm(torch.relu(x @ w1_r) @ w2_r, residual, gamma_d, EPS, [], "auto")
            return out

        want = rmsnorm(torch.relu(x.double() @ w1.double()) @ w2.double() + residual.double(), gamma.double())
        backend = "aot_eager" if dev.type == "cpu" else "inductor"  # aot_eager: no C++ toolchain needed on CPUs
        errors = {}
        for name, model in (("all_reduce", mlp), ("all_reduce_rmsnorm", mlp_fused)):
            compiled = torch.compile(model, fullgraph=True, backend=backend)
            for call in range(2):  # the second call runs the cached compiled graph
                out = compiled(x.to(dev), residual.to(dev))
                errors[f"{name} call {call}"] = (out.double().cpu() - want).abs().max().item()
        tol = 1e-4 if dev.type == "cpu" else 1e-2
        worst = ctx.bootstrap.all_gather(max(errors.values()))
        if r == 0:
            print(f"tensor-parallel MLP on {w} ranks ({dev.type}, torch.compile backend {backend}): {tokens}x{hidden}, "
                  f"ffn {ffn}, plain and fused -> " + ("correct on every rank" if max(worst) <= tol else f"WRONG: errors {worst}"))
        return 0 if max(worst) <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
