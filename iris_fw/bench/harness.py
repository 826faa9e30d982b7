"""``iris-fw bench`` (also ``python -m iris_fw.bench``): run benchmark plugins on N ranks.

This module is the harness: options, timing (:func:`measure_us`, :func:`measure_interleaved`),
input rotation (:class:`Rotation`), tables, plots and result files, and the command's ``main``.
The benchmarks themselves are plugins (:mod:`iris_fw.bench.primitives`,
:mod:`iris_fw.bench.taxonomy`, or a third party's).

The parent process launches the ranks (one per GPU, or CPU ranks for a smoke run) with
:func:`iris_fw.launch.launch`; every rank creates a context (reusing a torch.distributed
group that has NCCL on GPUs, for the baselines) and runs each selected benchmark. Timing:
device events around every iteration after a warm-up, the median over iterations, then the
maximum over ranks; inputs rotate through a pool larger than the L2 cache. Rank 0 prints a
table and writes, per benchmark, ``<name>.csv``, ``<name>.json`` (rows + device, versions,
command, date), ``<name>.md`` and ``<name>.png`` (a benchmark whose ``plot`` is a list of specs gets
``<name><suffix>.png`` for each) into the output folder.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from .. import env

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: The ``measured`` column of every row taken on CPU ranks, and the note printed before them.
CPU_LABEL = "cpu-interpreter"
CPU_NOTE = ("CPU ranks run the kernels under Triton's interpreter: these times measure the interpreter "
            "(a functional smoke run), not performance; rows are marked measured=" + CPU_LABEL)


@dataclass
class BenchOptions:
    """What every benchmark's ``run(ctx, options)`` receives."""

    sizes: list[int]
    iters: int
    warmup: int
    quick: bool
    rotate_bytes: int  # inputs rotate through at least this many bytes (> L2)
    log: Callable[[str], None] = print
    extra: dict = field(default_factory=dict)


def parse_size(text: str) -> int:
    """``"4K"``, ``"256M"``, ``"1G"`` or bytes → bytes."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    value = int(float(number) * scale)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"8K,256K,1M"`` → sorted distinct bytes."""
    return sorted({parse_size(t) for t in text.split(",") if t.strip()})


def size_sweep(low: int, high: int) -> list[int]:
    """Powers of four from ``low`` to ``high`` (both included when they are powers of four)."""
    out, s = [], low
    while s <= high:
        out.append(s)
        s *= 4
    return out


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---- timing ------------------------------------------------------------------------------------


def measure_us(ctx, fn: Callable[[int], None], iters: int, warmup: int) -> float:
    """Median microseconds of ``fn(i)`` over ``iters`` calls after ``warmup``; the maximum of
    the ranks' medians. Every rank must call it (it ends in a collective)."""
    return measure_interleaved(ctx, {"fn": fn}, iters, warmup)["fn"]


def measure_interleaved(ctx, fns: dict, iters: int, warmup: int) -> dict:
    """Like :func:`measure_us` for several functions at once, called in turn, so all of them
    run in the same stretch of time: comparisons between them are not skewed by the GPU's
    clock drifting with its temperature and power (seen on H200: the same cuBLAS GEMM took
    1216 µs and 1459 µs within 30 s). The order rotates every round (``a b c``, ``b c a``,
    ``c a b``, …) so each function follows each other one equally often; what runs around a
    GEMM still sets its clock (4x H200: 1221 µs interleaved with NCCL work, 1348 µs with
    another GEMM; docs/performance.md). Returns ``{name: µs}``."""
    import torch

    for i in range(warmup):
        for fn in fns.values():
            fn(i)
    ctx.barrier()
    times = {name: [] for name in fns}
    names = list(fns)
    rounds = [(i, name) for i in range(iters) for name in names[i % len(names):] + names[:i % len(names)]]
    if ctx.device.type == "cuda":
        marks = []
        for i, name in rounds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name](warmup + i)
            end.record()
            marks.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in marks:
            times[name].append(start.elapsed_time(end) * 1000.0)
    else:
        for i, name in rounds:
            t0 = time.perf_counter()
            fns[name](warmup + i)
            times[name].append((time.perf_counter() - t0) * 1e6)
    ctx.synchronize()
    medians = [statistics.median(times[name]) for name in fns]
    worst = zip(*ctx.bootstrap.all_gather(medians))
    return {name: max(per_rank) for name, per_rank in zip(fns, worst)}


class Rotation:
    """Slices of ``size`` bytes cycling through a symmetric pool of at least ``rotate_bytes``,
    so repeated iterations do not find their inputs in L2."""

    def __init__(self, ctx, size: int, rotate_bytes: int, dtype):
        import torch

        elem = torch.empty((), dtype=dtype).element_size()
        self.n = size // elem
        self.slots = max(1, rotate_bytes // size)
        self.pool = ctx.empty(self.slots, self.n, dtype=dtype)

    def __getitem__(self, i: int):
        return self.pool[i % self.slots]


def shared_gpus() -> bool:
    """Whether this job's ranks share GPUs (``IRIS_FW_SHARE_GPUS=1`` and more ranks on this host
    than GPUs): NCCL cannot run there, and rows are labelled by how the ranks share."""
    from ..launch import gpu_count, share_gpus

    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = gpu_count()
    return bool(gpus) and share_gpus() and local > gpus


# ---- output ---------------------------------------------------------------------------------


def environment(ctx) -> dict:
    import numpy
    import torch
    import triton

    from .. import devinfo

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": env.get("IRIS_FW_BENCH_COMMAND") or " ".join(sys.argv),
        "world_size": ctx.world_size,
        "transport": ctx.transport.name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
    }
    if ctx.device.type == "cuda":
        dev = devinfo.info(ctx.device)
        what = f"{dev.name} ({dev.sms} SMs, {dev.memory_bytes >> 30} GiB)"
        if shared_gpus():
            from ..launch import gpu_count

            mps, _ = devinfo.mps_status()
            gpus = gpu_count()
            info["device"] = (f"{ctx.world_size} ranks sharing {gpus}x {what}, "
                              + ("one GPU, MPS (ranks run at once; no NVLink: not interconnect numbers)" if mps
                                 else "time-sliced without MPS (timings of cross-rank waits mean nothing)"))
            info["sharing"] = "mps" if mps else "time-sliced"
        else:
            info["device"] = f"{ctx.world_size}x {what}"
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = f"{ctx.world_size} CPU ranks (Triton interpreter)"
    return info


def write_results(name: str, rows: list[dict], env: dict, out_dir: str, plot_spec: dict | None) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    columns = list(dict.fromkeys(k for r in rows for k in r))
    path = os.path.join(out_dir, f"{name}.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    paths.append(path)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": name, "environment": env, "rows": rows}, f, indent=1)
    paths.append(path)
    path = os.path.join(out_dir, f"{name}.md")
    with open(path, "w") as f:
        f.write(markdown_table(rows, columns))
    paths.append(path)
    for spec in _plot_specs(plot_spec) if rows else []:
        if not any(r.get(spec["y"]) not in (None, "") for r in rows):
            continue  # nothing measured for it here (e.g. CUDA-graph times on CPU ranks): no empty plot
        try:
            paths.append(_plot(name, rows, env, out_dir, spec))
        except ImportError:
            pass  # matplotlib is optional (iris-fw[bench])
    return paths


def _plot_specs(plot_spec) -> list[dict]:
    """A benchmark's ``plot``: one spec, or a list of them (each with its own ``suffix``:
    ``<name><suffix>.png``)."""
    if not plot_spec:
        return []
    return list(plot_spec) if isinstance(plot_spec, (list, tuple)) else [plot_spec]


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _plot(name: str, rows: list[dict], env: dict, out_dir: str, spec: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y, series = spec["x"], spec["y"], spec.get("series", "op")
    if spec.get("kind") == "bars":
        return _bar_plot(plt, name, rows, env, out_dir, spec)
    # "facet": one panel per value of that column (e.g. one per collective)
    facet = spec.get("facet")
    panels = list(dict.fromkeys(r.get(facet) for r in rows if r.get(y) not in (None, ""))) if facet else [None]
    panels = panels or [None]
    cols = min(len(panels), 3)
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(8 if cols == 1 else 5.5 * cols, 5 if nrows == 1 else 4.2 * nrows),
                             squeeze=False)
    for k, panel in enumerate(panels):
        ax = axes[k // cols][k % cols]
        mine = [r for r in rows if facet is None or r.get(facet) == panel]
        for label in dict.fromkeys(r.get(series) for r in mine if not str(r.get(series)).startswith("tune:")):
            pts = sorted((r[x], r[y]) for r in mine if r.get(series) == label and r.get(y) not in (None, ""))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if spec.get("logx", True):
            ax.set_xscale("log", base=2)
        if spec.get("logy", False):
            ax.set_yscale("log")
        ax.set_xlabel(spec.get("xlabel", x))
        ax.set_ylabel(spec.get("ylabel", y))
        ax.set_title(f"{name}: {env.get('device', '')}" if panel is None else str(panel), fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for k in range(len(panels), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    if facet:
        fig.suptitle(f"{name}: {env.get('device', '')}")
    path = os.path.join(out_dir, f"{name}{spec.get('suffix', '')}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bar_plot(plt, name: str, rows: list[dict], env: dict, out_dir: str, spec: dict) -> str:
    """Grouped bars: one group per ``x`` value, one bar per ``series`` value, height ``y``."""
    x, y, fallback = spec["x"], spec["y"], spec.get("series_fallback")
    series = "_series"
    rows = [dict(r, _series=r.get(spec.get("series", "op")) or r.get(fallback)) for r in rows]
    flag = spec.get("only_flag")
    skip = spec.get("skip", {})
    rows = [r for r in rows if r.get(y) not in (None, "") and r.get(flag, True) is not False
            and not any(r.get(k) in v for k, v in skip.items())]
    groups = list(dict.fromkeys(r[x] for r in rows))
    labels = list(dict.fromkeys(r[series] for r in rows))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups)), 5))
    for j, label in enumerate(labels):
        vals = {r[x]: r[y] for r in rows if r[series] == label}
        xs = [i + (j - (len(labels) - 1) / 2) * width for i, g in enumerate(groups) if g in vals]
        ax.bar(xs, [vals[g] for g in groups if g in vals], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([str(g).replace(" ", "\n", 1) for g in groups], fontsize=7)
    ax.set_ylabel(spec.get("ylabel", y))
    ax.set_title(f"{name}: {env.get('device', '')}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = os.path.join(out_dir, f"{name}{spec.get('suffix', '')}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replot(paths: list[str]) -> int:
    """Redraw ``<name>.png`` beside each recorded ``<name>.json`` with the benchmark's plot spec."""
    from ..registry import load_registries

    regs = load_registries()
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for spec in _plot_specs(getattr(regs.benchmark.get(data["benchmark"]), "plot", None)):
            print(_plot(data["benchmark"], data["rows"], data["environment"], os.path.dirname(path) or ".", spec))
    return 0


# ---- the rank side -------------------------------------------------------------------------------


def _worker(args) -> int:
    import torch
    import torch.distributed as dist

    import iris_fw
    from iris_fw.registry import load_registries

    from ..launch import gpu_count

    gpu = gpu_count() > 0
    if gpu:  # NCCL for the baselines; iris-fw's bootstrap reuses this group
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if shared_gpus():  # NCCL refuses two ranks on one GPU: gloo only, the NCCL baselines skip
            torch.cuda.set_device(local % gpu_count())
            dist.init_process_group(backend="gloo")
        else:
            torch.cuda.set_device(local)
            dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local))
    regs = load_registries()
    names = args.benchmarks or regs.benchmark.names()
    heap = args.heap_size or (max(4 * GiB, 3 * max(args.sizes)) if gpu else 64 * MiB)
    ctx = iris_fw.init(heap_size=heap, registries=regs)
    log = (lambda msg: print(msg, flush=True)) if ctx.rank == 0 else (lambda msg: None)
    opts = BenchOptions(
        sizes=args.sizes, iters=args.iters, warmup=args.warmup, quick=args.quick,
        rotate_bytes=args.rotate or (256 * MiB if gpu else 64 * KiB), log=log,
        extra={"explicit_sizes": args.explicit_sizes, "dtype": args.dtype,
               "cases": [c for c in (args.cases or "").split(",") if c]},
    )
    env = environment(ctx)
    log(f"iris-fw bench on {env['device']}: {', '.join(names)}")
    if not gpu:
        log(f"note: {CPU_NOTE}")
    for name in names:
        bench = regs.benchmark.require_available(name)
        log(f"== {name}: {getattr(bench, 'description', '')}")
        start = time.perf_counter()
        rows = bench.run(ctx, opts)
        ctx.barrier()
        if ctx.rank == 0:
            for row in rows:
                row.setdefault("benchmark", name)
                if not gpu:
                    row.setdefault("measured", CPU_LABEL)
            paths = write_results(name, rows, env, args.out, getattr(bench, "plot", None))
            print(markdown_table(rows, list(dict.fromkeys(k for r in rows for k in r))), flush=True)
            log(f"{name}: {len(rows)} rows in {time.perf_counter() - start:.1f}s -> {', '.join(paths)}")
    ctx.close()
    if gpu and dist.is_initialized():
        dist.destroy_process_group()
    return 0


def benchmark_list() -> str:
    """The registered benchmarks, one a line with its description (``iris-fw bench --help``)."""
    from ..registry import load_registries

    entries = list(load_registries().benchmark)
    width = max((len(e.name) for e in entries), default=0)
    lines = [f"  {e.name:<{width}}  {getattr(e.obj, 'description', '')}" for e in entries]
    return "benchmarks (iris-fw plugins lists their providers):\n" + "\n".join(lines or ["  (none registered)"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="iris-fw bench", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=benchmark_list() if {"-h", "--help"} & set(argv) else None)
    parser.add_argument("benchmarks", nargs="*", help="benchmark names (default: all registered)")
    parser.add_argument("-n", "--nprocs", type=int, default=None, help="ranks (default: GPUs present, else 2 CPU ranks)")
    parser.add_argument("--min-size", type=parse_size, default=None, help="smallest size (default 4K; 4K on CPU)")
    parser.add_argument("--max-size", type=parse_size, default=None, help="largest size (default 1G; 16K on CPU)")
    parser.add_argument("--sizes", type=parse_sizes, default=None,
                        help="comma-separated sizes, e.g. 8K,256K,1M (instead of the --min-size/--max-size sweep)")
    parser.add_argument("--dtype", default=None, help="element type for benchmarks that take one (e.g. bf16, fp32)")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations per point (default 30; 2 on CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed iterations first (default 5; 1 on CPU)")
    parser.add_argument("--rotate", type=parse_size, default=None, help="bytes inputs rotate through (default 256M)")
    parser.add_argument("--heap-size", type=parse_size, default=None)
    parser.add_argument("--quick", action="store_true", help="fewer configurations (smoke runs)")
    parser.add_argument("--cases", default=None,
                        help="comma-separated case groups, for benchmarks that have them (taxonomy: pattern names; "
                             "gemm: taxonomy, small_m)")
    parser.add_argument("--out", default=None, help="output folder (default bench-results/<date>)")
    parser.add_argument("--replot", metavar="RESULT_JSON", nargs="+", help="redraw plots from recorded results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot)

    from ..interpreter import choose as _choose_interpreter
    from ..interpreter import interpreting
    from ..launch import default_world_size, launch

    _choose_interpreter()
    cpu = interpreting()
    args.min_size = args.min_size or 4 * KiB
    args.max_size = args.max_size or (16 * KiB if cpu else GiB)
    args.explicit_sizes = args.sizes is not None
    args.sizes = args.sizes or size_sweep(args.min_size, args.max_size)
    args.iters = args.iters or (2 if cpu else 30)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 5)
    args.out = args.out or os.path.join("bench-results", datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S"))
    if args.worker:
        return _worker(args)
    nprocs = args.nprocs or (2 if cpu else default_world_size())
    os.environ["IRIS_FW_BENCH_COMMAND"] = "iris-fw bench " + " ".join(argv if argv is not None else sys.argv[1:])
    worker = ["-m", "iris_fw.bench", "--worker", *args.benchmarks, "--min-size", str(args.min_size),
              "--max-size", str(args.max_size), "--iters", str(args.iters), "--warmup", str(args.warmup),
              "--out", args.out]
    worker += ["--sizes", ",".join(str(s) for s in args.sizes)] if args.explicit_sizes else []
    worker += ["--dtype", args.dtype] if args.dtype else []
    worker += ["--rotate", str(args.rotate)] if args.rotate else []
    worker += ["--heap-size", str(args.heap_size)] if args.heap_size else []
    worker += ["--quick"] if args.quick else []
    worker += ["--cases", args.cases] if args.cases else []
    return launch(worker, nprocs, tag_output=False)  # rank 0 prints the tables: no prefixes


if __name__ == "__main__":
    sys.exit(main())
