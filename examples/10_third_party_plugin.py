"""10 · a third-party plugin package: install it, and iris-fw uses what it registers.

``examples/plugin_template`` is a plugin package (docs/plugins.md) with one plugin of each kind.
Install it, and every part is found through its entry point::

    pip install ./examples/plugin_template
    iris-fw plugins                       # lists private_shm, filestore, reverse_fused, ...
    IRIS_FW_EXAMPLE_FILESTORE=$(mktemp -u) iris-fw launch -n 2 examples/10_third_party_plugin.py

This program uses each: its bootstrap (``filestore``, chosen by the variable above), its
transport (``private_shm``, on CPU ranks), its pattern under two built-in schedulers, its
scheduler running a built-in pattern, its broadcast algorithm and its benchmark — every result
against a torch reference.
"""

import os
import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch

from iris_fw import ccl, ops
from iris_fw.bench import BenchOptions
from iris_fw.registry import load_registries

PARTS = {"transport": "private_shm", "bootstrap": "filestore", "scheduler": "reverse_fused",
         "pattern": "scale_all_gather", "algorithm": "broadcast.pull", "benchmark": "example_broadcast"}


def main() -> int:
    regs = load_registries()
    missing = [f"{kind} {name}" for kind, name in PARTS.items() if name not in getattr(regs, kind)]
    if missing:
        print(f"the example plugin is not installed ({', '.join(missing)} not registered): "
              "pip install ./examples/plugin_template", file=sys.stderr)
        return 1
    transport = "private_shm" if iris_fw.interpreting() else None  # the plugin's transport is for CPU ranks
    with iris_fw.init(heap_size=1 << 26, transport=transport, registries=regs) as ctx:
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        seed = ctx.broadcast(int(torch.randint(1 << 30, ())))
        g = torch.Generator().manual_seed(seed)
        failures = []
        # the plugin's pattern under two built-in schedulers: y[p] = alpha * x_p on every rank
        xs = [torch.randn(300, generator=g) for _ in range(w)]
        for scheduler in ("bulk_sync", "fused_sequential"):
            got = ops.plan("scale_all_gather", xs[r].to(dev), 2.5, scheduler=scheduler)(xs[r].to(dev), 2.5)
            if not torch.allclose(got.double().cpu(), 2.5 * torch.stack(xs).double(), atol=1e-5):
                failures.append(f"scale_all_gather/{scheduler}")
        # the plugin's scheduler running a built-in pattern
        ab = [(torch.randn(24, 40, generator=g), torch.randn(40, 16, generator=g)) for _ in range(w)]
        got = ops.gemm_all_scatter(ab[r][0].to(dev), ab[r][1].to(dev), scheduler="reverse_fused")
        if not torch.allclose(got.double().cpu(), torch.cat([a.double() @ b.double() for a, b in ab], 1), atol=1e-3):
            failures.append("gemm_all_scatter/reverse_fused")
        # the plugin's collective algorithm
        want = torch.randn(5000, generator=g)  # every rank draws it; only the root's is sent
        t = want.to(dev, copy=True) if r == w - 1 else torch.full((5000,), float("nan"), device=dev)
        ccl.broadcast(t, src=w - 1, algorithm="pull")
        ctx.synchronize()
        if not torch.equal(t.cpu(), want):
            failures.append("broadcast/pull")
        # the plugin's benchmark (what `iris-fw bench example_broadcast` runs on every rank)
        rows = regs.benchmark.get("example_broadcast").run(
            ctx, BenchOptions(sizes=[4096], iters=2, warmup=1, quick=True, rotate_bytes=0, log=lambda msg: None))
        if sorted(row["algorithm"] for row in rows) != ["pull", "push"] or not all(row["time_us"] > 0 for row in rows):
            failures.append("example_broadcast")
        everyone = ctx.bootstrap.all_gather(failures)
        if r == 0:
            print(f"third-party plugin on {w} ranks: bootstrap {ctx.bootstrap.name}, transport {ctx.transport.name}; "
                  "pattern, scheduler, algorithm, benchmark -> "
                  + ("correct on every rank" if not any(everyone) else f"WRONG: {everyone}"))
        store = os.environ.get("IRIS_FW_EXAMPLE_FILESTORE")
        if store and ctx.bootstrap.name != "filestore":
            print(f"IRIS_FW_EXAMPLE_FILESTORE is set but bootstrap {ctx.bootstrap.name} was chosen", file=sys.stderr)
            return 1
        return 0 if not any(everyone) else 1


if __name__ == "__main__":
    sys.exit(main())
