"""A benchmark: ``example_broadcast``, the built-in ``push`` broadcast against this plugin's
``pull``, over the sizes ``iris-fw bench`` is given.

A benchmark has a ``name``, a ``run(ctx, options)`` that every rank calls and that returns rows
(dicts; rank 0's are written as CSV, JSON, Markdown and a plot), and optionally ``description``,
``plot`` and ``available()``. Run it with ``iris-fw bench example_broadcast``.
"""

import torch

from iris_fw import ccl
from iris_fw.bench import measure_interleaved


class BroadcastBenchmark:
    name = "example_broadcast"
    description = "broadcast from rank 0: built-in push vs the example plugin's pull"
    plot = {"x": "bytes", "y": "time_us", "series": "algorithm", "ylabel": "µs (max over ranks)"}

    def run(self, ctx, options):
        rows = []
        for size in options.sizes:
            t = torch.zeros(max(1, size // 4), device=ctx.device)
            fns = {algo: (lambda i, algo=algo: ccl.broadcast(t, src=0, algorithm=algo)) for algo in ("push", "pull")}
            for algo, us in measure_interleaved(ctx, fns, options.iters, options.warmup).items():
                rows.append({"bytes": size, "algorithm": algo, "time_us": us})
            options.log(f"{size} B: " + ", ".join(f"{r['algorithm']} {r['time_us']:.1f} us" for r in rows[-2:]))
        return rows
