"""What tracing costs: each op (pattern x scheduler) and collective timed with its untraced and
its traced kernels, interleaved call by call in the same stretch of time (CUDA events; the
untraced calls run inside ``session.paused()``), several rounds; prints the median time of each
and the overhead ``traced / untraced - 1`` with its spread over the rounds, the events recorded
per call and the clock's granularity seen in the trace. Target (issue 14): at most 3 % of the
kernel time.

    python3 scripts/trace_overhead.py                      # one GPU (W = 1), the taxonomy shape
    iris-fw launch -n 2 scripts/trace_overhead.py          # two GPUs: also the collectives
    python3 scripts/trace_overhead.py --quick              # CPU smoke run (interpreter; no timing value)

Options: ``--shape M N K`` (global, default 8192 8192 8192), ``--patterns``, ``--schedulers``,
``--iters`` (interleaved calls per round, 20), ``--rounds`` (5), ``--comm-sms N …`` (the two-role
schedules also with N communication programs), ``--out DIR`` (default $OUT or
./trace-overhead: ``overhead.json`` with every number, one trace of each case).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import iris_fw  # noqa: F401  (first: decides interpreter vs GPU)
import torch
from iris_fw import ccl, ops
from iris_fw.bench.harness import measure_interleaved
from iris_fw.bench.taxonomy import operands

SCHEDULERS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "copy_engine")
PATTERNS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
#: Collectives timed on two or more ranks: (name, elements of one rank's bf16 message).
COLLECTIVES = (("all_reduce", 1 << 16), ("all_reduce", 1 << 24), ("all_gather", 1 << 22), ("reduce_scatter", 1 << 24))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=int, nargs=3, default=None, metavar=("M", "N", "K"))
    p.add_argument("--patterns", nargs="+", default=list(PATTERNS))
    p.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-collectives", action="store_true")
    p.add_argument("--comm-sms", type=int, nargs="*", default=[],
                   help="also time the two-role schedules (producer_consumer, wg_specialized) with these "
                        "communication programs (the default split gives one at W = 1)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, one round (CPU smoke run)")
    p.add_argument("--out", default=os.environ.get("OUT") or "trace-overhead")
    return p.parse_args(argv)


def granularity_ns(trace: dict) -> float | None:
    """The smallest non-zero difference between event stamps of one program (ns): an upper bound
    of the clock's update granularity seen."""
    stamps = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X":
            stamps.setdefault((e["pid"], e["tid"]), []).extend([e["ts"], e["ts"] + e["dur"]])
    best = None
    for values in stamps.values():
        values = sorted(set(round(v * 1e3) for v in values))
        for a, b in zip(values, values[1:]):
            if b > a and (best is None or b - a < best):
                best = b - a
    return best


def time_case(ctx, name, fn, opts, log) -> dict:
    """Traced vs untraced ``fn`` (a call), interleaved, ``opts.rounds`` times."""
    fn()  # the untraced variant compiles
    ctx.barrier()
    path = os.path.join(opts.out, "traces", f"{name.replace('/', '_')}.json")
    with ctx.trace(path, label=f"{name} (overhead run)", events_per_program=256) as session:
        fn()  # the traced variant compiles
        ctx.barrier()

        def untraced(i):
            with session.paused():
                fn()

        rounds = []
        for _ in range(opts.rounds):
            times = measure_interleaved(ctx, {"untraced": untraced, "traced": lambda i: fn()}, opts.iters,
                                        opts.warmup)
            rounds.append(times)
    ratios = [r["traced"] / r["untraced"] - 1 for r in rounds]
    result = {"untraced_us": statistics.median(r["untraced"] for r in rounds),
              "traced_us": statistics.median(r["traced"] for r in rounds),
              "overhead": statistics.median(ratios), "overhead_min": min(ratios), "overhead_max": max(ratios),
              "rounds": rounds, "trace": path}
    events = [e for e in (session.trace or {}).get("traceEvents", []) if e.get("ph") == "X"]
    calls = 1 + opts.rounds * (opts.iters + opts.warmup)  # traced calls made (the last rings' worth kept)
    result["events_kept"] = len(events)
    result["events_lost"] = session.lost
    result["events_per_call"] = (len(events) + session.lost) / calls
    result["clock_granularity_ns"] = granularity_ns(session.trace or {})
    log(f"{name:<44} untraced {result['untraced_us']:>10.1f} us  traced {result['traced_us']:>10.1f} us  "
        f"overhead {100 * result['overhead']:+6.2f}% [{100 * min(ratios):+.2f}, {100 * max(ratios):+.2f}]  "
        f"{result['events_per_call']:.0f} events/call, clock step <= {result['clock_granularity_ns']} ns")
    return result


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.quick:
        opts.rounds, opts.iters, opts.warmup = 1, 2, 0
    os.makedirs(opts.out, exist_ok=True)
    with iris_fw.init(heap_size=(1 << 26) if opts.quick else (8 << 30)) as ctx:
        w = ctx.world_size
        log = (lambda msg: print(msg, flush=True)) if ctx.rank == 0 else (lambda msg: None)
        cpu = ctx.device.type == "cpu"
        M, N, K = opts.shape or ((32 * w, 32 * w, 32 * w) if (cpu or opts.quick) else (8192, 8192, 8192))
        dtype = torch.float32 if cpu else torch.bfloat16
        log(f"trace overhead on {w} rank(s), {ctx.device} ({iris_fw.devinfo.info(ctx.device).name}), "
            f"shape {M}x{N}x{K} {str(dtype).replace('torch.', '')}, {opts.rounds} rounds x {opts.iters} interleaved "
            f"calls (median per round; overhead median and [min, max] over rounds)")
        results = {"world_size": w, "device": iris_fw.devinfo.info(ctx.device).name, "shape": [M, N, K],
                   "dtype": str(dtype), "cases": {}}
        for pattern in opts.patterns:
            a, b = operands(pattern, M, N, K, w, ctx.device, dtype)
            for scheduler in opts.schedulers:
                try:
                    op = ops.plan(pattern, a, b, scheduler=scheduler)
                except Exception as exc:  # a scheduler that declines the pattern (copy_engine)
                    log(f"{pattern}/{scheduler}: skipped ({type(exc).__name__}: {str(exc)[:100]})")
                    continue
                name = f"{pattern}/{scheduler}"
                results["cases"][name] = time_case(ctx, name, lambda: op(a, b), opts, log)
                for comm in opts.comm_sms if scheduler in ("producer_consumer", "wg_specialized") else ():
                    op2 = ops.plan(pattern, a, b, scheduler=scheduler, comm_sms=comm)
                    name2 = f"{name} comm_sms={comm}"
                    results["cases"][name2] = time_case(ctx, name2, lambda op2=op2: op2(a, b), opts, log)
        if w > 1 and not opts.no_collectives:
            sizes = dict.fromkeys((c, 1024 if (cpu or opts.quick) else n) for c, n in COLLECTIVES)
            for collective, n in sizes:
                x = torch.randn(n, device=ctx.device, dtype=dtype)
                if collective == "all_reduce":
                    fn = lambda x=x: ccl.all_reduce(x)  # noqa: E731
                elif collective == "all_gather":
                    out = torch.empty(w * n, device=ctx.device, dtype=dtype)
                    fn = lambda x=x, out=out: ccl.all_gather_into_tensor(out, x)  # noqa: E731
                else:
                    out = torch.empty(n // w, device=ctx.device, dtype=dtype)
                    fn = lambda x=x, out=out: ccl.reduce_scatter_tensor(out, x[:(n // w) * w])  # noqa: E731
                name = f"ccl {collective} {n * x.element_size() >> 10} KiB"
                results["cases"][name] = time_case(ctx, name, fn, opts, log)
        if ctx.rank == 0:
            with open(os.path.join(opts.out, "overhead.json"), "w") as f:
                json.dump(results, f, indent=1)
            worst = max((c["overhead"] for c in results["cases"].values()), default=0.0)
            log(f"worst median overhead: {100 * worst:+.2f}% (target: <= 3%); {opts.out}/overhead.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
