"""Where a cache-hit call's host time goes, per public op and collective of ``iris-fw bench host``
(:func:`iris_fw.bench.host._cases`: the same case list), with the kernel launch itself stubbed.

    python3 scripts/profile_op_call.py [--calls N] [--rounds R] [--top 15] [--out DIR] [-k TEXT]
    iris-fw launch -n 2 scripts/profile_op_call.py --out DIR       # W = 2 (two CPU ranks)
    python3 scripts/profile_op_call.py --no-stub                   # on a GPU: launches kept

Before anything is planned, the two places where the library's launches end are replaced
(without a GPU this is the default: otherwise Triton's interpreter would run every kernel and
the numbers would measure the interpreter): ``KernelLauncher._launch`` (plain and
:class:`~iris_fw.kernel_launcher.BoundLaunch` launches) by a function that computes the
launcher's specialization key as the GPU fast path does (``make_key_fn``, made on the
launcher's first launch) and counts the launch; ``PreparedLaunch.__call__`` (a plan's
memoized launch, which on a GPU skips the key) by one that only counts, and
``PreparedLaunch.launch_with`` (a prepared launch with a few arguments replaced) by one that
compares each new value's key item with the prepared one's and rebuilds the argument list, as
on a GPU, then counts. What is left out is
the driver's launch call itself (the bench's "bare prepared launch" on a GPU) and the fast
path's hook and global checks. Torch's own ops of a call (views, ``copy_``, ``clone``,
``empty``, ``matmul``) run for real — on a CPU host they also compute (small shapes: the
bench's CPU sizes).

Per case, after its first call (the miss: planned, validated across ranks):

* ``us/call``: the median and the best of ``--rounds`` rounds of ``--calls`` hits (the rounds interleaved
  over the cases), no profiler
  (the summary gives the best round's, the maximum over ranks at W > 1: on a shared host the
  best round is the one least disturbed by other processes);
* ``py calls/call``: Python and C functions called per hit (cProfile's count / calls);
* ``torch ops/call``: the torch functions and tensor methods a hit calls that allocate, copy or
  compute (:data:`METADATA` reads such as ``data_ptr``/``stride``/``shape`` left out), by name —
  counted in a separate pass under a ``TorchFunctionMode`` (``clone``, ``copy_``, ``empty``, ...);
* a stage table: cProfile's own time (tottime) of every function called during the hits (the
  median over :data:`CHUNKS` short profiled runs: robust to a preempted call),
  summed by stage (:data:`STAGES`: key/fingerprint, cache look-up, argument checks, bind /
  memo, the launch's key and call, torch tensor methods by name, host syncs, ...), as its share
  and as µs per call scaled to the best unprofiled round (cProfile's per-call overhead inflates
  the deep paths, and on a shared host a preempted call inflates one stage: approximate);
* the top ``--top`` functions by own time (pstats).

The raw text goes to stdout, and with ``--out DIR`` to ``DIR/w{W}_rank{r}.txt`` (the summary table
of rank 0 to ``DIR/w{W}_summary.md``). CPU-host numbers: they show the host's Python work per call,
not a GPU host's enqueue time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import re
import pstats
import statistics
import sys
import time
from collections import defaultdict

import iris_fw  # noqa: F401  (first: the interpreter switch on a CPU host)
import torch
from iris_fw import kernel_launcher as _launcher

#: Tensor methods that only read metadata: not counted as torch ops of a call.
METADATA = frozenset(("data_ptr", "stride", "size", "__get__", "is_contiguous", "numel", "element_size", "dim",
                      "untyped_storage", "storage_offset", "__eq__", "__hash__", "__len__", "__getitem__", "view",
                      "is_symmetric"))
#: Calls per case of the torch-op counting pass.
COUNT_CALLS = 20


def torch_ops_per_call(fn, calls: int = COUNT_CALLS) -> dict:
    """``{name: count per call}`` of the torch functions / tensor methods (not :data:`METADATA`)
    that ``calls`` calls of ``fn`` make, seen by a ``TorchFunctionMode``."""
    from collections import Counter

    from torch.overrides import TorchFunctionMode

    class _Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name not in METADATA:
                self.seen[name] += 1
            return func(*args, **(kwargs or {}))

    with _Count() as mode:
        for _ in range(calls):
            fn()
    return {k: v / calls for k, v in sorted(mode.seen.items())}


#: Short profiled runs per case (each function's time: its median over them).
CHUNKS = 15
#: (stage, predicate on (file, line, function name)) in order; the first match names a function's stage.
STAGES = [
    ("launch: specialization key (plain/bound launches)", lambda f, fn: f.startswith("<KernelLauncher key") or fn in ("spec_key", "_item", "_int_item")
     or f.endswith("profile_op_call.py") and fn == "_count"),
    ("launch: prepared/bound call (stub included)", lambda f, fn: f.endswith("profile_op_call.py") and fn in ("_prepared", "_prepared_with")
     or "<BoundLaunch" in f or ("kernel_launcher" in f and fn in ("__call__", "launch_on", "_resolve", "_launch"))),
    ("key / fingerprint", lambda f, fn: fn in ("input_fingerprint", "_key", "_fast_ok", "_heap_offset", "offset_of",
                                               "operands_key", "exact", "<genexpr>")),
    ("cache look-up (call path)", lambda f, fn: f.endswith("callpath.py") or fn in ("group_of", "resolve", "state")
     or (f.endswith("contract.py") and fn == "get")),
    ("argument checks (hit)", lambda f, fn: fn in ("check_out", "_check_open", "check_same_query")),
    ("op / bind / plan memo", lambda f, fn: f.endswith(("engine/op.py", "engine/scheduler.py", "gemm.py"))
     or fn in ("bind", "_memoized", "run", "launch", "finish", "library", "comm_first", "num_items")
     and not f.endswith("flash_decode.py")),
    ("ccl entry (key built inline)", lambda f, fn: "/ccl/" in f),
    ("flash_decode entry", lambda f, fn: f.endswith("flash_decode.py")),
    ("ops entry", lambda f, fn: f.endswith("iris_fw/ops.py")),
    ("bench case lambda", lambda f, fn: f.endswith("bench/host.py")),
    ("host sync", lambda f, fn: "synchronize" in fn or fn in ("item", "tolist", "cpu")),
]


def stage_of(key) -> str:
    f, _, fn = key
    if f == "~":  # a builtin: torch's by name, the rest together
        m = re.match(r"<method '([^']+)' of '([^']+)' objects>", fn)
        name, owner = (m.group(1), m.group(2)) if m else (fn.strip("<>").replace("built-in method ", ""), "")
        if "torch" in owner or name.startswith("torch."):
            return "torch: " + name
        if "synchronize" in name:
            return "host sync"
        return "builtins (dict/tuple/getattr/isinstance ...)"
    for stage, pred in STAGES:
        if pred(f, fn):
            return stage
    return "other python: " + os.path.basename(f)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profiled-calls", type=int, default=300)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", default=None, help="folder for the raw text (w{W}_rank{r}.txt)")
    p.add_argument("-k", default=None, help="only cases whose name contains this text")
    p.add_argument("--no-stub", action="store_true", help="keep real launches (on a GPU: enqueue time)")
    return p.parse_args()


def main() -> int:
    opts = parse()
    stub = not opts.no_stub or not torch.cuda.is_available()
    launches = [0]

    key_fns = {}

    def _count(self, args, stream):  # a plain or bound launch: the specialization key, as on a GPU
        launches[0] += 1
        key_fn = key_fns.get(self)
        if key_fn is None:
            key_fn = key_fns[self] = _launcher.make_key_fn(self._flags, args, self._desc_cls)
        key_fn(args, None, None)

    def _prepared(self, stream=None):  # a prepared launch: no key (its resolved entry), no launch
        launches[0] += 1

    def _prepared_with(self, changes, stream=None):  # launch_with: what it does on a GPU, but the launch
        launches[0] += 1
        flags, args, final = self.launcher._flags, self.args, list(self.args)
        items = self._items
        if items is None:  # the prepared values' key items, once (as launch_with keeps them)
            items = self._items = {}
        for i, value in changes:  # each new value's key item against the prepared one's, the list rebuilt
            if type(i) is tuple:  # element j of the tuple argument i (a pattern's rest): its tuple rebuilt
                i, j = i
                value = _launcher._with_element(final[i], j, value)
            spec, align = flags[i]
            item = items.get(i)
            if item is None:
                item = items[i] = _launcher._item(args[i], spec, align, None)
            if _launcher._item(value, spec, align, None) != item:
                return self.launcher._launch(tuple(final), stream)
            final[i] = value

    if stub:  # before anything binds a launcher (BoundLaunch keeps the bound method it was made with)
        _launcher.KernelLauncher._launch = _count
        _launcher.PreparedLaunch.__call__ = _prepared
        _launcher.PreparedLaunch.launch_with = _prepared_with

    from iris_fw.bench import host

    torch.set_num_threads(1)  # CPU ranks share the host's cores: no intra-op threads fighting over them

    with iris_fw.init(heap_size=1 << 26) as ctx:
        w, rank = ctx.world_size, ctx.rank
        buf = io.StringIO()

        def say(line=""):
            buf.write(line + "\n")
            if rank == 0:
                print(line, flush=True)

        say(f"# profile_op_call: W = {w}, rank {rank}, {ctx.device}, "
            f"{'launches stubbed (plain/bound: specialization key computed, no launch; prepared: counted only)' if stub else 'real launches'}")
        say(f"# host: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, torch {torch.__version__}; {opts.rounds} rounds x {opts.calls} "
            f"calls timed, {opts.profiled_calls} calls profiled; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
        cases, refs = host._cases(ctx)
        if opts.k:
            cases = {n: f for n, f in cases.items() if opts.k in n or n in refs.values()}
        skipped = {}
        for name in list(cases):  # first call: the miss (plans, validates across ranks)
            try:
                cases[name]()
                ctx.synchronize()
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
                del cases[name]
                ctx.barrier()
        rows = []
        # timed rounds interleaved over the cases (as the bench does), so that a stretch of load
        # from other processes on a shared host spreads over every case instead of hitting one
        per_case = {name: [] for name in cases}
        launches_of = {}
        for name, fn in cases.items():
            fn()  # one more hit (anything lazily made on a second call)
            launches[0] = 0
            fn()
            launches_of[name] = launches[0]
        ctx.barrier()
        for _ in range(opts.rounds):
            for name, fn in cases.items():
                t0 = time.perf_counter_ns()
                for _ in range(opts.calls):
                    fn()
                per_case[name].append((time.perf_counter_ns() - t0) / opts.calls / 1e3)
        ctx.synchronize()
        for name, fn in cases.items():
            ctx.barrier()
            per, nlaunch = per_case[name], launches_of[name]
            tops = torch_ops_per_call(fn)
            shown_ops = ", ".join(f"{k} {v:g}" for k, v in tops.items()) or "none"
            ctx.synchronize()
            # profiled in CHUNKS short runs; each function's numbers are its median over them, so
            # that a call preempted by another process (a shared host) does not inflate one stage
            n = max(1, opts.profiled_calls // CHUNKS)
            runs = []
            for _ in range(CHUNKS):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(n):
                    fn()
                prof.disable()
                runs.append(pstats.Stats(prof).stats)
            keys = set().union(*runs)
            stats = {k: tuple(statistics.median(r[k][i] if k in r else 0 for r in runs) for i in range(4))
                     for k in keys}
            total_prof = sum(v[2] for v in stats.values()) / n * 1e6
            ncalls = sum(v[1] for v in stats.values()) / n
            us = statistics.median(per)
            by_stage = defaultdict(float)
            for key, v in stats.items():
                by_stage[stage_of(key)] += v[2] / n * 1e6
            scale = min(per) / total_prof if total_prof else 0.0  # to the best round (the least disturbed)
            say(f"\n== {name}: {us:.2f} us per call (median of {opts.rounds} rounds; min {min(per):.2f}), "
                f"{nlaunch:g} stubbed launch(es) per call, {ncalls:.0f} function calls per call; "
                f"profiled {total_prof:.2f} us per call")
            say(f"   torch ops per call (not metadata reads): {shown_ops}")
            say(f"   {'stage':<48} {'us/call (scaled)':>16} {'share':>7}")
            for stage, t in sorted(by_stage.items(), key=lambda kv: -kv[1]):
                if t / total_prof < 0.01:
                    continue
                say(f"   {stage:<48} {t * scale:>16.2f} {t / total_prof:>7.1%}")
            say(f"   top {opts.top} by own time (profiled us per call): {'calls':>6} {'own':>7} {'cum':>7}  function")
            for key, v in sorted(stats.items(), key=lambda kv: -kv[1][2])[:opts.top]:
                f, line, fn = key
                where = fn if f == "~" else f"{os.path.relpath(f) if f.startswith('/') else f}:{line}({fn})"
                say(f"   {'':<41} {v[1] / n:>6.1f} {v[2] / n * 1e6:>7.2f} {v[3] / n * 1e6:>7.2f}  {where}")
            rows.append((name, us, min(per), nlaunch, ncalls, dict(by_stage), total_prof, shown_ops))
        for name, why in skipped.items():
            say(f"\n== {name}: skipped ({why})")
        # the summary: the maximum over ranks of each case's median
        medians = [r[2] for r in rows]  # the best round of each case
        worst = [max(v) for v in zip(*ctx.bootstrap.all_gather(medians))] if w > 1 else medians
        ref_us = {r[0]: wv for r, wv in zip(rows, worst)}
        summary = [f"| call | us/call (best round, max over ranks) | x ref | launches | torch ops | fn calls | "
                   f"top stages (rank {rank}) |",
                   "|---|---:|---:|---:|---|---:|---|"]
        for (name, us, _, nl, nc, stages, tp, tops), wv in zip(rows, worst):
            ref = refs.get(name)
            x = f"{wv / ref_us[ref]:.2f}" if ref in ref_us and ref_us[ref] else ""
            top = sorted(stages.items(), key=lambda kv: -kv[1])[:4]
            shown = "; ".join(f"{s} {t / tp:.0%}" for s, t in top)
            summary.append(f"| {name} | {wv:.2f} | {x} | {nl:g} | {tops} | {nc:.0f} | {shown} |")
        say("\n" + "\n".join(summary))
        if opts.out:
            os.makedirs(opts.out, exist_ok=True)
            with open(os.path.join(opts.out, f"w{w}_rank{rank}.txt"), "w") as f:
                f.write(buf.getvalue())
            if rank == 0:
                with open(os.path.join(opts.out, f"w{w}_summary.md"), "w") as f:
                    f.write("\n".join(summary) + "\n")
        ctx.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
