"""Is flash-decode's uneven split time a property of the SM (issue 32)? The kernel's own trace
(:mod:`iris_fw.trace`: each work item's ``attention`` event with the SM it ran on) over several
calls at B x S (32 q / 8 kv heads, D 128, bf16; the table's row, or ``--row`` JSON fields
replacing it), beside a map of the SMs to their GPCs: a probe kernel launched in thread-block
clusters of 16, 8, 4 and 2 programs (one per SM: a cluster's programs share one GPC; more
clusters than fit, so that they run in waves) records the SM of each program, and SMs that ever
share a cluster are one GPC.

    python3 scripts/probe_fd_sm_spread.py [--points 1x16384 1x65536 4x4096] [--calls 6] [--row JSON]

Prints, per point: the attention time of each work item (min / median / max over items and
calls), how much of an item's deviation from the call's median the same SM's deviation in the
other calls predicts (the correlation of per-SM deviations between calls: near 1, the SM
decides; near 0, chance), and per GPC (its SMs, the programs it ran a call, their median
attention time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import iris_fw  # (first: it decides whether Triton interprets)
import torch
import triton
import triton.language as tl

from iris_fw.kernel_launcher import KernelLauncher
from probe_fd_program_spans import traced_calls  # (this folder: the script's own directory leads sys.path)


@triton.jit
def _where_kernel(out):
    """``out[pid] = %smid``: the SM the program runs on."""
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out + tl.program_id(0), sm)


def gpc_map(dev) -> dict[int, int]:
    """SM -> GPC index (SMs that shared a cluster of any launch are one GPC)."""
    parent: dict[int, int] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    shared = 200 << 10  # (one program an SM)
    for size in (16, 8, 4, 2):
        clusters = 64
        out = torch.full((clusters * size,), -1, dtype=torch.int32, device=dev)
        launch = KernelLauncher(_where_kernel, (clusters * size,), constexprs={}, num_warps=4, cluster=size,
                                cluster_shared=shared)
        for _ in range(3):
            launch(out)
            torch.cuda.synchronize()
            sms = out.view(clusters, size).tolist()
            for group in sms:
                for s in group[1:]:
                    parent[find(s)] = find(group[0])
    roots = sorted({find(s) for s in parent})
    return {s: roots.index(find(s)) for s in parent}


def correlation(xs, ys) -> float:
    """Pearson's correlation of ``xs`` and ``ys`` (nan where either is constant)."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return float("nan")


def mean_pair_correlation(calls: list[dict]) -> tuple[float, int]:
    """The mean over every pair of calls of the correlation of their values at the keys both
    have (more than two), and the number of pairs; ``(nan, 0)`` without any."""
    pairs = []
    for n, a in enumerate(calls):
        for b in calls[n + 1:]:
            common = sorted(set(a) & set(b))
            if len(common) > 2:
                pairs.append(correlation([a[x] for x in common], [b[x] for x in common]))
    return (statistics.fmean(pairs), len(pairs)) if pairs else (float("nan"), 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", nargs="+", default=["1x16384", "1x65536", "4x4096"])
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--row", default="", help="JSON fields replacing the table row's")
    opts = p.parse_args(argv)
    row = json.loads(opts.row) if opts.row else {}
    with iris_fw.init(heap_size=1 << 26, bootstrap="single") as ctx:
        gpcs = gpc_map(ctx.device) if ctx.device.type == "cuda" else {}
        sizes = {}
        for s, gi in gpcs.items():
            sizes.setdefault(gi, []).append(s)
        print(f"GPC map: {len(gpcs)} SMs in {len(sizes)} groups: "
              + ", ".join(f"{len(v)}" for _, v in sorted(sizes.items())))
        print("  " + json.dumps({gi: sorted(v) for gi, v in sorted(sizes.items())}))
        for pt in opts.points:
            batch, tokens = (int(x) for x in pt.split("x"))
            plan, traced = traced_calls(ctx, batch, tokens, row, opts.calls)
            runs = [[(e["args"]["sm"], e["dur"], e["args"]["item"]) for e in events if e["name"] == "attention"]
                    for events in traced]
            durs = [d for run in runs for _, d, _ in run]
            print(f"\nB {batch} x {tokens}: {plan} ({len(runs[0])} items a call, {opts.calls} calls)")
            print(f"  attention per item (min / median / max): {min(durs):.2f} / {statistics.median(durs):.2f} / "
                  f"{max(durs):.2f} us")
            meds = [statistics.median(d for _, d, _ in run) for run in runs]  # each call's median
            dev_by_sm = []  # per call: {sm: mean deviation from the call's median}
            for run, med in zip(runs, meds):
                per = {}
                for sm, d, _ in run:
                    per.setdefault(sm, []).append(d - med)
                dev_by_sm.append({sm: statistics.fmean(v) for sm, v in per.items()})
            by_item = [{item: d - med for _, d, item in run} for run, med in zip(runs, meds)]
            for what, calls in (("per-SM deviation", dev_by_sm),
                                ("per-item deviation (the same unit and split)", by_item)):
                mean, pairs = mean_pair_correlation(calls)
                print(f"  {what}, correlation between calls (mean over {pairs} pairs): {mean:.2f}" if pairs
                      else f"  {what}: no pairs")
            n_split = plan.n_split
            for name, of in (("split", lambda i: i % n_split), ("unit", lambda i: i // n_split)):
                groups = {}
                for run in by_item:
                    for item, dev in run.items():
                        groups.setdefault(of(item), []).append(dev)
                print(f"  mean deviation by {name}: " + " ".join(f"{g}:{statistics.fmean(v):+.2f}"
                                                               for g, v in sorted(groups.items())))
            print("  | GPC | SMs | items a call | median attention us | mean deviation us |\n"
                  "  |---:|---:|---:|---:|---:|")
            for gi, members in sorted(sizes.items()):
                mine = [d for run in runs for sm, d, _ in run if gpcs.get(sm) == gi]
                devs = [dev for calls_ in dev_by_sm for sm, dev in calls_.items() if gpcs.get(sm) == gi]
                if mine:
                    print(f"  | {gi} | {len(members)} | {len(mine) / len(runs):.1f} | {statistics.median(mine):.2f} | "
                          f"{statistics.fmean(devs):+.2f} |")
            unmapped = [d for run in runs for sm, d, _ in run if sm not in gpcs]
            if unmapped:
                print(f"  ({len(unmapped)} items on SMs the map lacks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
