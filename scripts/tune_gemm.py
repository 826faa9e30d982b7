"""The few-row GEMM sweep behind ``iris_fw/tuning/gemm.json``'s split-K rows (issue 32): the
Triton GEMM (:func:`iris_fw.gemm.matmul`) under candidate configurations — split count,
block sizes, warps, stages — against cuBLAS (``torch.matmul``) at ``M x N x K`` (default
M 16, 64, 256 x N 8192 x K 4096, 8192, 14336, 28672), bf16, one GPU.

Each candidate and cuBLAS run as CUDA graphs of ``--calls`` back-to-back calls (the host's
launch time left out: what a decode step's graph replays; captured on a stream that ran the
call before, so split-K uses the stream's counters, no memset node), over ``B`` copies totalling at least
256 MiB (no call finds its ``B`` in L2), replays interleaved round by round in rotating order
(:func:`iris_fw.bench.harness`'s rule: every method in the same stretch of clocks); the median
per call is reported. Every candidate's result is checked against torch's first (a wrong one
is reported and never chosen). Writes ``gemm_tune.jsonl`` (every measurement) and
``gemm_tuning_rows.json`` (the best configuration per shape as rows of the tuning table:
paste them under the device's name) into ``--out``; prints a table.

``--groups``: instead, the tile order — GROUP_M 1, 4, 8, 16 — of the best measured (or
default) configuration at the given shapes (``--shapes M,N,K ...``), same protocol.

``--large``: instead, the large products where :func:`iris_fw.gemm.default_config`'s estimate
applies (default 16384x14336x4096, the taxonomy's all-gather + GEMM, and 8192x8192x8192;
``--shapes``, or ``--shapes taxonomy`` for the taxonomy's local GEMMs at one rank): the
estimate's configuration and :data:`LARGE_CANDIDATES` (block 128x256x64 / 256x128x64 /
128x128x64 / 128x256x32, warps 4 / 8, stages 3-5, GROUP_M 8 / 16) and
:data:`PERSISTENT_CANDIDATES` (the persistent schedule, :class:`iris_fw.gemm.GemmConfig`
``persistent``: flattened or not, a stream-K tail of 0-2 waves, the epilogue in 1-4 pieces),
same protocol. Writes
``gemm_large.jsonl`` and ``gemm_large_rows.json``: a row ``[null, {config, "min_m": M,
"min_n": N, "max_k": K, "measured"}]`` per shape whose best beat the estimate's configuration
(paste them after the device's few-row rows; ordered shortest K first).

    python3 scripts/tune_gemm.py --out $OUT                       # the split-K sweep
    python3 scripts/tune_gemm.py --groups --shapes 256,8192,8192 8192,8192,8192
    python3 scripts/tune_gemm.py --large --out $OUT               # 16384x14336x4096, 8192^3
    python3 scripts/tune_gemm.py --quick                          # CPU smoke run (interpreter)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, fields, replace

import iris_fw  # (first: interpreter on CPU-only machines)
import torch
from iris_fw import devinfo
from iris_fw.gemm import PERSISTENT_FIELDS, GemmConfig, default_config, matmul

MS = (16, 64, 256)
N = 8192
KS = (4096, 8192, 14336, 28672)
#: Bytes of B copies a shape rotates through at least (beyond L2).
ROTATE_BYTES = 256 << 20
#: GROUP_M values of the tile-order sweep.
GROUPS = (1, 4, 8, 16)
#: Shapes of the ``--groups`` sweep.
GROUP_SHAPES = ("256,8192,8192", "8192,8192,8192")
#: Shapes of the ``--large`` sweep: the taxonomy's shortest-K local GEMM (95.2 % of cuBLAS with
#: the estimate on one H100, docs/performance.md) and the square one.
LARGE_SHAPES = ("16384,14336,4096", "8192,8192,8192")
#: The configurations of the ``--large`` sweep beside the estimate's own (bf16; (block_m,
#: block_n, block_k, group_m, warps, stages)). 128x256 and 256x128 tiles need 8 warps (their
#: fp32 accumulator spills at 4) and fit 4 stages of 64-deep blocks in Hopper's shared memory,
#: not 5; 128x128 tiles fit 5; 32-deep blocks of 128x256 tiles fit 5.
LARGE_CANDIDATES = (
    (128, 256, 64, 16, 8, 3), (128, 256, 64, 16, 8, 4), (128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4),
    (256, 128, 64, 16, 8, 3), (256, 128, 64, 16, 8, 4), (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 16, 4, 4), (128, 128, 64, 16, 4, 5), (128, 128, 64, 16, 8, 4), (128, 128, 64, 8, 8, 5),
    (128, 128, 64, 8, 4, 5),
    (128, 256, 32, 16, 8, 4), (128, 256, 32, 16, 8, 5), (128, 256, 32, 8, 8, 5),
)
#: The persistent schedule's candidates of the ``--large`` sweep (:class:`iris_fw.gemm.GemmConfig`
#: ``persistent``; bf16): (block_m, block_n, block_k, group_m, warps, stages, flatten,
#: warp_specialize, stream_k, epilogue_subtile). The epilogue's staging buffer takes shared memory
#: beside the stages (Hopper: 227 KB a program): 128x256x64 fits 3 stages with the whole tile
#: staged, 4 in 2 or 4 pieces; 128x256x32 fits 6 whole (Triton 3.6, sm_90: 213, 229, 213 and 213
#: KB). First what a probe of the kernel measured best at 16384x14336x4096 on one H100 (flattened,
#: 128x256x64, GROUP_M 8, 4 stages with the epilogue in 2 pieces: 102 % of cuBLAS; without
#: flattening no faster than the tile kernel; GROUP_M 4 / 16, 32-deep blocks, a 2-wave stream-K
#: tail and 256x128 tiles slower), then its neighbours. Warp specialization reaches Blackwell only
#: (:func:`iris_fw.gemm.warp_specializes`): on Hopper its candidate is its twin's kernel, a
#: measure of the run's noise.
PERSISTENT_CANDIDATES = (
    (128, 256, 64, 8, 8, 4, True, False, 1, 2), (128, 256, 64, 8, 8, 4, True, False, 0, 2),
    (128, 256, 64, 8, 8, 3, True, False, 1, 1), (128, 256, 64, 8, 8, 3, True, False, 0, 1),
    (128, 256, 64, 8, 8, 4, True, False, 1, 4), (128, 256, 64, 16, 8, 4, True, False, 1, 2),
    (128, 256, 64, 8, 8, 4, True, False, 2, 2), (128, 256, 64, 8, 8, 4, True, True, 1, 2),
    (128, 256, 64, 8, 8, 4, False, False, 1, 2), (128, 256, 32, 8, 8, 5, True, False, 1, 1),
    (128, 256, 32, 8, 8, 6, True, False, 0, 1), (256, 128, 64, 8, 8, 4, True, False, 1, 2),
)


def candidates(m: int) -> list[GemmConfig]:
    """The configurations tried at ``m`` rows (bf16, Hopper-sized tiles): block shapes that
    fit the rows, each with 1, 2, 3 or 4 splits of K."""
    if m <= 16:
        shapes = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 64, 256, 4, 3), (16, 128, 64, 4, 6),
                  (16, 256, 64, 4, 4)]
        splits = (1, 2, 4)
    elif m <= 64:
        shapes = [(64, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 128, 64, 4, 5), (64, 128, 128, 4, 3),
                  (64, 256, 64, 8, 3)]
        splits = (1, 2, 4)
    else:
        shapes = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 64, 64, 8, 4), (256, 128, 64, 8, 3),
                  (64, 128, 64, 4, 4), (128, 128, 128, 8, 3), (128, 128, 64, 4, 5), (64, 256, 64, 8, 4),
                  (128, 64, 128, 4, 4), (64, 128, 128, 4, 4)]
        splits = (1, 2, 3, 4)
    group = 1 if m <= 64 else 8
    return [GemmConfig(bm, bn, bk, group, w, st, split_k=s) for bm, bn, bk, w, st in shapes for s in splits]


def label(cfg: GemmConfig) -> str:
    """``128x256x64/g8/w8/s3/k1``, and for the persistent schedule ``…/P`` with ``f`` (flatten),
    ``ws`` (warp-specialized), ``sk<n>`` (stream-K waves) and ``e<n>`` (epilogue pieces)."""
    text = (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/g{cfg.group_m}/w{cfg.num_warps}/s{cfg.num_stages}"
            f"/k{cfg.split_k}")
    if cfg.persistent:
        text += (f"/P{'f' if cfg.flatten else ''}{'ws' if cfg.warp_specialize else ''}"
                 f"{f'sk{cfg.stream_k}' if cfg.stream_k else ''}e{cfg.epilogue_subtile}")
    return text


def row_config(cfg: GemmConfig, drop: tuple = ("xcds",)) -> dict:
    """``cfg`` as a tuning-table row's config: without ``drop`` and without the persistent
    schedule's fields where they have their defaults (a row of the tile schedule reads as before)."""
    defaults = {f.name: f.default for f in fields(GemmConfig)}
    return {key: v for key, v in asdict(cfg).items()
            if key not in drop and not (key in ("persistent", *PERSISTENT_FIELDS) and v == defaults[key])}


class Shape:
    """``a [m, k]`` and rotated ``b [k, n]`` copies, bf16; the reference of copy 0."""

    def __init__(self, m, n, k, dev, quick):
        self.m, self.n, self.k, self.dev = m, n, k, dev
        g = torch.Generator(device=dev).manual_seed(m * 131 + n * 7 + k)
        self.a = (torch.randn(m, k, generator=g, device=dev) / math.sqrt(k)).to(torch.bfloat16)
        copies = 1 if quick else max(1, math.ceil(ROTATE_BYTES / (k * n * 2)))
        self.bs = [torch.randn(k, n, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
        self.out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        self.ref = (self.a.float() @ self.bs[0].float())

    def check(self, cfg) -> float:
        """Max error of ``cfg``'s result over max |reference| (bf16 output: ~2^-8)."""
        got = matmul(self.a, self.bs[0], out=torch.full_like(self.out, float("nan")), config=cfg)
        return float((got.float() - self.ref).abs().max() / self.ref.abs().max().clamp_min(1e-30))

    def call(self, cfg):
        a, bs, out = self.a, self.bs, self.out
        if cfg == "cublas":
            return lambda i: torch.matmul(a, bs[i % len(bs)], out=out)
        return lambda i: matmul(a, bs[i % len(bs)], out=out, config=cfg)


def graph_of(fn, calls: int, dev):
    """A replayable callable running ``fn(0..calls-1)``: a CUDA graph on GPUs (made on a side
    stream after one eager run: split-K's counters exist before the capture), else the calls."""
    if dev.type != "cuda":
        return lambda: [fn(i) for i in range(calls)]
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for i in range(calls):
            fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        for i in range(calls):
            fn(i)
    return graph.replay


def interleaved(replays: dict, rounds: int, calls: int, dev) -> dict:
    """Median µs per call of each replay, the replays interleaved in rotating order."""
    names = list(replays)
    for name in names:  # warm-up
        replays[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if dev.type == "cuda":
            marks = []
            for name in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                replays[name]()
                end.record()
                marks.append((name, start, end))
            torch.cuda.synchronize()
            for name, start, end in marks:
                times[name].append(start.elapsed_time(end) * 1000.0 / calls)
        else:
            for name in order:
                t0 = time.perf_counter()
                replays[name]()
                times[name].append((time.perf_counter() - t0) * 1e6 / calls)
    return {name: statistics.median(v) for name, v in times.items()}


def sweep(shape: Shape, configs: list, opts, log) -> dict:
    """``{label: {"config", "us", "err"}}`` plus ``"cublas"`` at one shape (interleaved)."""
    dev = shape.dev
    replays, meta = {}, {}
    for cfg in dict.fromkeys(configs):
        name = label(cfg)
        try:
            err = shape.check(cfg)
            if not err <= 2 ** -6:
                log(f"  {name}: WRONG (max error {err:.3g} of max |ref|): not a candidate")
                meta[name] = {"config": cfg, "err": err, "wrong": True}
                continue
            replays[name] = graph_of(shape.call(cfg), opts.calls, dev)
            meta[name] = {"config": cfg, "err": err}
        except Exception as exc:  # a configuration that does not fit (shared memory, registers)
            log(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}")
    replays["cublas"] = graph_of(shape.call("cublas"), opts.calls, dev)
    times = interleaved(replays, opts.rounds, opts.calls, dev)
    for name, us in times.items():
        meta.setdefault(name, {})["us"] = us
    return meta


def table_rows(best: dict, device_name: str) -> list[list]:
    """The tuning table's rows (``iris_fw/tuning/gemm.json``) from the best configuration per
    ``(m, n, k)``: per ``m`` (ascending; ``max_m`` = m) one row per ``k`` (``max_k`` = k, the
    largest ``k`` without a bound), split rows bounded by the measured ``n``; ``local`` where the
    best was at least as fast as cuBLAS."""
    rows = []
    for m in sorted({m for m, _, _ in best}):
        ks = sorted(k for mm, _, k in best if mm == m)
        for k in ks:
            (n,) = {nn for mm, nn, kk in best if (mm, kk) == (m, k)} or {None}
            cfg, us, ref = best[(m, n, k)]
            # a row: [max_m, config], the config carrying its bounds and its measurement (not
            # xcds: the device's tile order gives it)
            config = row_config(cfg)
            if cfg.split_k > 1:
                config["max_n"] = n
            if k != ks[-1]:
                config["max_k"] = k
            if us <= ref:  # at least cuBLAS's speed: one-rank ops run it (iris_fw.gemm.local_kernel)
                config["local"] = True
            config["measured"] = (f"{device_name} {time.strftime('%Y-%m-%d', time.gmtime())}: {m}x{n}x{k} "
                                  f"{us:.1f} us, cuBLAS {ref:.1f} us ({100 * ref / us:.1f}%)")
            rows.append([m, config])
    return rows


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", type=int, nargs="+", default=list(MS))
    p.add_argument("--n", type=int, default=N)
    p.add_argument("--ks", type=int, nargs="+", default=list(KS))
    p.add_argument("--calls", type=int, default=10, help="calls per graph replay")
    p.add_argument("--rounds", type=int, default=15, help="interleaved replays of each method")
    p.add_argument("--groups", action="store_true", help="the GROUP_M sweep instead (at --shapes)")
    p.add_argument("--large", action="store_true", help="the large-product sweep instead (at --shapes)")
    p.add_argument("--shapes", nargs="+", default=None,
                   help=f"M,N,K for --groups (default {' '.join(GROUP_SHAPES)}) or --large (default "
                        f"{' '.join(LARGE_SHAPES)}; 'taxonomy': the taxonomy's local GEMMs at one rank)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 2 rounds (CPU smoke run)")
    p.add_argument("--out", default=os.environ.get("OUT") or "gemm-tune")
    return p.parse_args(argv)


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    # a one-rank context holds the split-K tile counters the measured calls reuse (iris_fw.gemm);
    # without one each split call would zero counters of its own
    with iris_fw.init(heap_size=1 << 20, bootstrap="single"):
        return _sweep_all(opts)


def _sweep_all(opts) -> int:
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if opts.shapes is None:
        opts.shapes = list(LARGE_SHAPES if opts.large else GROUP_SHAPES)
    elif opts.shapes == ["taxonomy"]:
        from iris_fw.bench.taxonomy import SHAPES, local_shape

        opts.shapes = list(dict.fromkeys(",".join(map(str, local_shape(p, M, N, K, 1))) for p, M, N, K in SHAPES))
    if opts.quick:
        opts.ms, opts.n, opts.ks, opts.calls, opts.rounds = [5, 20], 40, [48], 1, 1
        opts.shapes = ["40,40,32", "20,40,48"] if opts.large else ["20,40,48"]
    os.makedirs(opts.out, exist_ok=True)
    name = devinfo.info(dev).name
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    log(f"device {name}, torch {torch.__version__}; {opts.calls} calls per replay, {opts.rounds} rounds")
    records = []
    if opts.large:
        return _large(opts, dev, name, log)
    if opts.groups:
        log("| M x N x K | config | GROUP_M | us | % of cuBLAS |\n|---|---|---:|---:|---:|")
        for spec in opts.shapes:
            m, n, k = (int(x) for x in spec.split(","))
            shape = Shape(m, n, k, dev, opts.quick)
            base = default_config(m, n, k, torch.bfloat16, dev, split=True)
            meta = sweep(shape, [replace(base, group_m=g) for g in GROUPS], opts, log)
            ref = meta["cublas"]["us"]
            for lab, r in meta.items():
                if lab != "cublas" and "us" in r:
                    records.append({"m": m, "n": n, "k": k, "config": lab, "group_m": r["config"].group_m,
                                    "us": r["us"], "cublas_us": ref, "pct_of_cublas": 100 * ref / r["us"]})
                    log(f"| {m}x{n}x{k} | {lab} | {r['config'].group_m} | {r['us']:.1f} | {100 * ref / r['us']:.1f} |")
        with open(os.path.join(opts.out, "gemm_groups.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        # the tile order of the estimated (large) configurations: least geometric mean of time
        # over each shape's best, across the shapes above 256 rows (the few-row rows carry their own)
        large = [r for r in records if r["m"] > 256] or records
        best = {}
        for r in large:
            key = (r["m"], r["n"], r["k"])
            best[key] = min(best.get(key, r["us"]), r["us"])
        score = {}
        for r in large:
            score.setdefault(r["group_m"], []).append(math.log(r["us"] / best[(r["m"], r["n"], r["k"])]))
        group = min(score, key=lambda g: sum(score[g]))
        text = "; ".join(f"{r['m']}x{r['n']}x{r['k']} {r['us']:.1f} us (cuBLAS {r['cublas_us']:.1f})"
                         for r in large if r["group_m"] == group)
        order = {name: {"group_m": group, "measured": f"{time.strftime('%Y-%m-%d', time.gmtime())}, "
                                                       f"scripts/tune_gemm.py --groups: {text}"}}
        with open(os.path.join(opts.out, "gemm_tile_order.json"), "w") as f:
            json.dump(order, f, indent=1)
        log(f"tile order for {name!r} (iris_fw/tuning/gemm.json 'tile_order'; add ncu's L2 hit rates):\n"
            + json.dumps(order))
        return 0
    best = {}
    summary = ["| M x N x K | cuBLAS us | current us (config) | best us (config) | best % of cuBLAS |",
               "|---|---:|---|---|---:|"]
    for m in opts.ms:
        for k in opts.ks:
            shape = Shape(m, opts.n, k, dev, opts.quick)
            current = default_config(m, opts.n, k, torch.bfloat16, dev, split=True)
            configs = [current, replace(current, split_k=2)] if opts.quick else [current] + candidates(m)
            meta = sweep(shape, configs, opts, log)
            ref = meta.pop("cublas")["us"]
            for lab, r in meta.items():
                records.append({"m": m, "n": opts.n, "k": k, "config": lab, "split_k": r["config"].split_k,
                                "us": r.get("us"), "err": r.get("err"), "wrong": r.get("wrong", False),
                                "cublas_us": ref, "pct_of_cublas": 100 * ref / r["us"] if r.get("us") else None,
                                "current": r["config"] == current})
            timed = {lab: r for lab, r in meta.items() if r.get("us") and not r.get("wrong")}
            if not timed:
                log(f"| {m}x{opts.n}x{k} | {ref:.1f} | no configuration ran right | | |")
                continue
            win = min(timed, key=lambda lab: timed[lab]["us"])
            best[(m, opts.n, k)] = (timed[win]["config"], timed[win]["us"], ref)
            cur = timed.get(label(current))
            cur_text = f"{cur['us']:.1f} ({label(current)})" if cur else "n/a"
            line = (f"| {m}x{opts.n}x{k} | {ref:.1f} | {cur_text} | {timed[win]['us']:.1f} ({win}) | "
                    f"{100 * ref / timed[win]['us']:.1f} |")
            summary.append(line)
            log(line)
            with open(os.path.join(opts.out, "gemm_tune.jsonl"), "w") as f:  # every shape so far
                f.writelines(json.dumps(r) + "\n" for r in records)
            with open(os.path.join(opts.out, "gemm_tuning_rows.json"), "w") as f:  # (a cut-short run keeps them)
                json.dump({name: table_rows(best, name)}, f, indent=1)
    rows = table_rows(best, name)
    log("\n".join(summary))
    log(f"tuning rows for {name!r} (iris_fw/tuning/gemm.json):\n" + json.dumps(rows, indent=1))
    return 0


def large_candidates(current: GemmConfig, quick: bool) -> list[GemmConfig]:
    """The estimate's configuration first, then :data:`LARGE_CANDIDATES` (on the CPU: the
    estimate and one more GROUP_M)."""
    if quick:  # the estimate, another GROUP_M, and the persistent schedule with its stream-K tail
        return [current, replace(current, group_m=current.group_m * 2),
                replace(current, split_k=1, persistent=True, flatten=True, stream_k=1)]
    plain = [GemmConfig(bm, bn, bk, g, w, st) for bm, bn, bk, g, w, st in LARGE_CANDIDATES]
    persistent = [GemmConfig(bm, bn, bk, g, w, st, persistent=True, flatten=fl, warp_specialize=ws, stream_k=sk,
                             epilogue_subtile=sub) for bm, bn, bk, g, w, st, fl, ws, sk, sub in PERSISTENT_CANDIDATES]
    return list(dict.fromkeys([current] + plain + persistent))


def large_rows(best: dict, device_name: str) -> list[list]:
    """Tuning-table rows (``iris_fw/tuning/gemm.json``) from ``{(m, n, k): (config, us, cuBLAS
    us, estimate's us)}``, one per shape whose best is not the estimate's configuration:
    ``[None, config]`` bounded to products at least ``m x n`` with at most ``k`` (``min_m``,
    ``min_n``, ``max_k``), shortest ``k`` first, then the larger ``m * n`` (the first row whose
    bounds hold applies)."""
    rows = []
    for (m, n, k), (cfg, us, ref, current_us) in sorted(best.items(), key=lambda kv: (kv[0][2], -kv[0][0] * kv[0][1])):
        config = row_config(cfg, ("split_k", "xcds"))
        config.update(min_m=m, min_n=n, max_k=k)
        config["measured"] = (f"{device_name} {time.strftime('%Y-%m-%d', time.gmtime())}, scripts/tune_gemm.py --large: "
                              f"{m}x{n}x{k} bf16 {us:.1f} us, cuBLAS {ref:.1f} us ({100 * ref / us:.1f}%); "
                              f"the estimate's {current_us:.1f} us ({100 * ref / current_us:.1f}%)")
        rows.append([None, config])
    return rows


def _large(opts, dev, name, log) -> int:
    """The ``--large`` sweep (module docstring)."""
    records, best = [], {}
    summary = ["| M x N x K | cuBLAS us | estimate us (config) | best us (config) | best % of cuBLAS |",
               "|---|---:|---|---|---:|"]
    for spec in opts.shapes:
        m, n, k = (int(x) for x in spec.split(","))
        shape = Shape(m, n, k, dev, opts.quick)
        current = default_config(m, n, k, torch.bfloat16, dev, split=True)
        meta = sweep(shape, large_candidates(current, opts.quick), opts, log)
        ref = meta.pop("cublas")["us"]
        for lab, r in meta.items():
            records.append({"m": m, "n": n, "k": k, "config": lab, "us": r.get("us"), "err": r.get("err"),
                            "wrong": r.get("wrong", False), "cublas_us": ref,
                            "pct_of_cublas": 100 * ref / r["us"] if r.get("us") else None,
                            "current": r["config"] == current})
        with open(os.path.join(opts.out, "gemm_large.jsonl"), "w") as f:  # every shape so far
            f.writelines(json.dumps(r) + "\n" for r in records)
        timed = {lab: r for lab, r in meta.items() if r.get("us") and not r.get("wrong")}
        cur = timed.get(label(current))
        if not timed or cur is None:
            log(f"| {m}x{n}x{k} | {ref:.1f} | the estimate's configuration did not run | | |")
            continue
        win = min(timed, key=lambda lab: timed[lab]["us"])
        line = (f"| {m}x{n}x{k} | {ref:.1f} | {cur['us']:.1f} ({label(current)}, {100 * ref / cur['us']:.1f}%) | "
                f"{timed[win]['us']:.1f} ({win}) | {100 * ref / timed[win]['us']:.1f} |")
        summary.append(line)
        log(line)
        if timed[win]["config"] != current:
            best[(m, n, k)] = (timed[win]["config"], timed[win]["us"], ref, cur["us"])
        with open(os.path.join(opts.out, "gemm_large_rows.json"), "w") as f:  # (a cut-short run keeps them)
            json.dump({name: large_rows(best, name)}, f, indent=1)
    rows = large_rows(best, name)
    with open(os.path.join(opts.out, "gemm_large_rows.json"), "w") as f:
        json.dump({name: rows}, f, indent=1)
    log("\n".join(summary))
    log(f"large-product rows for {name!r} (iris_fw/tuning/gemm.json 'devices', after its few-row rows; "
        f"none where the estimate's configuration won):\n" + json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
