"""07 · the fused GEMM + communication ops of ``iris_fw.ops``, each under two schedulers.

The same op runs under interchangeable schedulers — the overlap strategy is one argument:
``bulk_sync`` (compute every tile, then send) and ``fused_sequential`` (one persistent kernel
that sends each tile from registers as soon as it is computed). Each result is compared with a
float64 torch reference of the unsplit computation:

* ``gemm_all_scatter(a[M, K], b[K, N/W]) -> C[M, N]``: column block ``p`` is rank ``p``'s product;
* ``all_gather_gemm(a_shard[M/W, K], b[K, N/W]) -> C[M, N/W]``: the gathered ``A`` times ``b``;
* ``gemm_reduce_scatter(a[M, K/W], b[K/W, N]) -> [M/W, N]``: rows ``rank*M/W…`` of the sum.

``iris-fw plugins`` lists every scheduler; docs/taxonomy.md compares them.

    iris-fw launch -n 2 examples/07_taxonomy_ops.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch

from iris_fw import ops

SCHEDULERS = ("bulk_sync", "fused_sequential")


def main() -> int:
    with iris_fw.init(heap_size=1 << 26) as ctx:
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        m, k, n = (24 * w, 40, 20) if dev.type == "cpu" else (512 * w, 2048, 1024)  # ragged on CPU tiles
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
        seed = ctx.broadcast(int(torch.randint(1 << 30, ())))
        g = torch.Generator().manual_seed(seed)  # every rank draws every rank's operands
        a = [torch.randn(m, k, generator=g).to(dtype) for _ in range(w)]
        b = [torch.randn(k, n, generator=g).to(dtype) for _ in range(w)]
        shard = m // w
        cases = {  # op: (this rank's inputs, float64 reference of its result)
            "gemm_all_scatter": ((a[r], b[r]), torch.cat([a[p].double() @ b[p].double() for p in range(w)], dim=1)),
            "all_gather_gemm": ((a[r][:shard], b[r]), torch.cat([a[p][:shard] for p in range(w)]).double() @ b[r].double()),
            "gemm_reduce_scatter": ((a[r], b[r]), sum(a[p].double() @ b[p].double() for p in range(w))[r * shard:(r + 1) * shard]),
        }
        errors = {}
        for name, (inputs, want) in cases.items():
            for scheduler in SCHEDULERS:
                got = getattr(ops, name)(*(t.to(dev) for t in inputs), scheduler=scheduler)  # collective
                err = (got.double().cpu() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
                errors[f"{name}/{scheduler}"] = err
        tol = 1e-5 if dtype == torch.float32 else 2.0 ** -6
        wrong = [case for case, err in errors.items() if not err <= tol]
        all_wrong = ctx.bootstrap.all_gather(wrong)
        if r == 0:
            print(f"ops on {w} ranks ({dev.type}, {str(dtype)[6:]}): " + ", ".join(errors)
                  + (f" -> correct on every rank (largest relative error {max(errors.values()):.1e})"
                     if not any(all_wrong) else f" -> WRONG: {all_wrong}"))
        return 0 if not any(all_wrong) else 1


if __name__ == "__main__":
    sys.exit(main())
