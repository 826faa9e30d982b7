"""How many of flash-decode's thread-block clusters one GPU holds at once (issue 32's cluster
combine, ``Tuning.cluster_combine``): for ``iris-fw bench flash_decode``'s shape (32 q / 8 kv
heads, D 128, bf16) at each batch, the table row's plan with ``cluster_combine`` — its split
count, programs, the cluster the plan kept (0: none) — and, for the row's tile compiled, the
driver's ``cuOccupancyMaxActiveClusters`` at cluster sizes 2, 4, 8 and 16 with the combine's
shared memory (one program per SM's worth of shared memory: a cluster's programs share a GPC).

    python3 scripts/probe_fd_clusters.py [--batches 1 2 4 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch

import iris_fw
from iris_fw import driver
from iris_fw import flash_decode as fd
from iris_fw.bench.flash_decode import HEAD_DIM, KV_HEADS, Q_HEADS
from iris_fw.flash_decode_kernels import cluster_region_bytes
from iris_fw.kernel_launcher import compiled_resources, resolved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--out", default=os.environ.get("OUT") or ".")
    opts = p.parse_args(argv)
    rows = []
    with iris_fw.init(heap_size=1 << 26) as ctx:
        dev = ctx.device
        calls = driver.cluster_calls()
        print(f"device {torch.cuda.get_device_name(dev)}; cluster calls {'found' if calls else 'absent'}")
        print("| B | units | splits | programs | cluster kept | tile | regs | shared B | +combine B | "
              "max clusters of 2 / 4 / 8 / 16 |\n|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
        for batch in opts.batches:
            q = torch.zeros(batch, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
            k = torch.zeros(batch, 64, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
            base = fd.plan(q, k, k, scheduler="bulk_sync", ctx=ctx)
            tune = replace(base.tune, cluster_combine=True)
            plan = fd.FlashDecode(base.group, fd.DecodeCall(**base.call.__dict__), tune)
            kernel = resolved(base.compile())
            regs, warps, shared = compiled_resources(kernel)
            fits = []
            for size in (2, 4, 8, 16):
                extra = cluster_region_bytes(size, base.combine_rows, base.constexprs["BDV"])
                try:
                    fits.append(calls.max_active_clusters(kernel.function, size, warps * 32, shared + extra))
                except Exception as exc:  # noqa: BLE001 (reported)
                    fits.append(f"{type(exc).__name__}: {exc}"[:80])
            t = base.tune
            label = f"bn{t.block_n} w{t.num_warps} s{t.num_stages}{' swap' if t.swap_ab else ''}"
            print(f"| {batch} | {plan.units} | {plan.n_split} | {plan.nprog} | {plan.cluster} | {label} | {regs} | "
                  f"{shared} | {cluster_region_bytes(max(plan.n_split, 1), base.combine_rows, base.constexprs['BDV'])}"
                  f" | {' / '.join(map(str, fits))} |", flush=True)
            rows.append({"batch": batch, "units": plan.units, "splits": plan.n_split, "programs": plan.nprog,
                         "cluster": plan.cluster, "tile": label, "regs": regs, "shared": shared,
                         "max_active_clusters": dict(zip(("2", "4", "8", "16"), fits))})
    with open(os.path.join(opts.out, "fd_clusters.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
