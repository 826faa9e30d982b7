"""Trace every scheduler of the taxonomy at one shape on N GPUs and write, under ``$OUT``, per
pattern: the traces (``<pattern>/<scheduler>.json`` merged, ``.rank<r>.json`` per rank), their
summaries (``.txt``, what ``iris-fw trace summarize`` prints), timelines of the last call
(``.png``) and the schedulers side by side (``<pattern>/compare.png``), plus ``index.md`` with
each schedule's time per call and its compute / communicate / wait / idle shares.

    iris-fw launch -n 2 scripts/trace_taxonomy.py                             # the default shape
    iris-fw launch -n 2 scripts/trace_taxonomy.py --pattern all_gather_gemm --shape 16384 14336 4096
    iris-fw launch -n 2 scripts/trace_taxonomy.py --quick                     # CPU ranks: format only

Each schedule is warmed up untraced (compiles), then once traced outside the recorded session
(compiles the traced variants), then ``--calls`` calls (default 3) are recorded; the plots show
the last one. The time per call printed is measured untraced, interleaved (CUDA events), so the
timelines can be read against it.
"""

from __future__ import annotations

import argparse
import os
import sys

import iris_fw  # noqa: F401  (first: decides interpreter vs GPU)
import torch
from iris_fw import ops, trace_report
from iris_fw.bench.harness import measure_interleaved
from iris_fw.bench.taxonomy import SHAPES, operands

SCHEDULERS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "copy_engine", "library")
#: The shape traced by default per pattern (2x H200 comparisons of docs/performance.md).
DEFAULT_SHAPES = {"all_gather_gemm": (16384, 14336, 4096), "gemm_all_scatter": (8192, 4608, 36864),
                  "gemm_reduce_scatter": (8192, 8192, 28672)}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pattern", nargs="+", default=["all_gather_gemm"],
                   help="patterns to trace (default all_gather_gemm; 'all' for the three)")
    p.add_argument("--shape", type=int, nargs=3, default=None, metavar=("M", "N", "K"),
                   help=f"global shape (default per pattern: {DEFAULT_SHAPES}); taxonomy shapes: "
                        + ", ".join(f"{p} {m}x{n}x{k}" for p, m, n, k in SHAPES))
    p.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    p.add_argument("--comm-sms", type=int, default=None, help="SMs that communicate (two-role schedules)")
    p.add_argument("--calls", type=int, default=3, help="calls recorded per schedule")
    p.add_argument("--iters", type=int, default=20, help="untraced calls timed per schedule")
    p.add_argument("--events-per-program", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU ranks: the files' format only)")
    p.add_argument("--out", default=os.environ.get("OUT") or "trace-taxonomy")
    return p.parse_args(argv)


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    patterns = ["all_gather_gemm", "gemm_all_scatter", "gemm_reduce_scatter"] if opts.pattern == ["all"] \
        else opts.pattern
    with iris_fw.init(heap_size=(1 << 26) if opts.quick else (16 << 30)) as ctx:
        w = ctx.world_size
        log = (lambda msg: print(msg, flush=True)) if ctx.rank == 0 else (lambda msg: None)
        cpu = ctx.device.type == "cpu"
        dtype = torch.float32 if cpu else torch.bfloat16
        device_name = iris_fw.devinfo.info(ctx.device).name
        index = [f"# Traces of the taxonomy's schedulers on {w}x {device_name}", "",
                 f"`{' '.join(['iris-fw launch -n', str(w), 'scripts/trace_taxonomy.py'] + (argv or sys.argv[1:]))}`"
                 + (" — CPU ranks (Triton's interpreter): the format only, not GPU timing" if cpu else ""), ""]
        for pattern in patterns:
            M, N, K = opts.shape or DEFAULT_SHAPES[pattern]
            if opts.quick:
                M, N, K = 32 * w, 32 * w, 32 * w
            a, b = operands(pattern, M, N, K, w, ctx.device, dtype)
            folder = os.path.join(opts.out, pattern)
            os.makedirs(folder, exist_ok=True)
            index += [f"## {pattern} {M}x{N}x{K} ({str(dtype).replace('torch.', '')})", "",
                      "| scheduler | us per call (untraced) | compute | communicate | wait | idle | trace | timeline |",
                      "|---|---|---|---|---|---|---|---|"]
            traced = []
            for scheduler in opts.schedulers:
                try:
                    op = ops.plan(pattern, a, b, scheduler=scheduler,
                                  comm_sms=opts.comm_sms if scheduler in ("producer_consumer", "wg_specialized")
                                  else None)
                except Exception as exc:  # e.g. copy_engine declines compute-first patterns
                    log(f"{pattern}/{scheduler}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
                    continue
                label = f"{pattern}/{scheduler} {M}x{N}x{K} W={w}"
                us = measure_interleaved(ctx, {"op": lambda i: op(a, b)}, 1 if cpu else opts.iters,
                                         0 if cpu else 3)["op"]
                with ctx.trace(None, events_per_program=opts.events_per_program):
                    op(a, b)  # compiles the traced kernels; not recorded
                path = os.path.join(folder, f"{scheduler}.json")
                with ctx.trace(path, label=label, events_per_program=opts.events_per_program) as session:
                    for _ in range(opts.calls):
                        op(a, b)
                if session.lost:
                    log(f"{label}: {session.lost} events lost on rank {ctx.rank} (raise --events-per-program)")
                if ctx.rank == 0:
                    trace = trace_report.load(path)
                    try:
                        events = trace_report.select(trace, call=-1)
                    except ValueError:  # the library form records no program spans
                        events = trace.events
                    summary = trace_report.summarize(trace, events)
                    with open(os.path.join(folder, f"{scheduler}.txt"), "w") as f:
                        f.write(f"time per call, untraced: {us:.1f} us\n(last call of {opts.calls})\n")
                        f.write(trace_report.format_summary(trace, summary) + "\n")
                    png = os.path.join(folder, f"{scheduler}.png")
                    trace_report.plot([trace], png, call=-1 if events is not trace.events else None)
                    traced.append(trace)
                    shares = _shares(summary)
                    index.append(f"| {scheduler} | {us:.1f} | " + " | ".join(f"{100 * s:.1f}%" for s in shares)
                                 + f" | [{scheduler}.json]({pattern}/{scheduler}.json) | "
                                   f"![{scheduler}]({pattern}/{scheduler}.png) |")
                    log(f"{label}: {us:.1f} us per call; compute/communicate/wait/idle "
                        + " / ".join(f"{100 * s:.0f}%" for s in shares) + f" -> {png}")
            if ctx.rank == 0 and traced:
                compare = os.path.join(folder, "compare.png")
                call = -1 if all(any(e.role == "program" for e in t.events) for t in traced) else None
                trace_report.plot(traced, compare, call=call, title=f"{pattern} {M}x{N}x{K} on {w}x {device_name}")
                index += ["", f"![all schedulers]({pattern}/compare.png)", ""]
                log(f"{pattern}: {compare}")
        if ctx.rank == 0:
            with open(os.path.join(opts.out, "index.md"), "w") as f:
                f.write("\n".join(index) + "\n")
            log(f"index: {os.path.join(opts.out, 'index.md')}")
    return 0


def _shares(summary: dict) -> list:
    """compute, communicate, wait and idle shares of the program time, over all ranks."""
    total = sum(s["program_time"] for s in summary.values()) or 1e-9
    busy = [sum(s["busy"].get(role, 0.0) for s in summary.values()) for role in ("compute", "communicate", "wait")]
    return [b / total for b in busy] + [sum(s["idle"] for s in summary.values()) / total]


if __name__ == "__main__":
    sys.exit(main())
