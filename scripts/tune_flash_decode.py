"""The flash-decode local kernel's split-count / tile sweep behind ``iris_fw/tuning/flash_decode.json``
(issue 32): at every batch x KV tokens of ``iris-fw bench flash_decode``'s table (32 q / 8 kv
heads, D 128, bf16; one GPU), the local split-KV kernel (``FlashDecode.partial``) under candidate
launch rows beside torch SDPA (``enable_gqa``, K/V in its ``[B, Hkv, S, D]`` layout) and the
table's current row. Candidates (:data:`GRID`, :data:`SMALL_GRID`): work items per program and
split cap (together the split count), ``block_n``, warps, stages and — at small batch — 2
programs per SM (more, lighter programs: at batch 1 one program per SM leaves too few loads in
flight, docs/performance.md); at every batch the lighter kernels of :func:`light` (the products
swapped, ``swap_ab``; register caps, ``max_registers``, for 3-4 programs per SM).

Every method runs as a CUDA graph of ``--calls`` back-to-back calls over K/V copies totalling at
least 256 MiB (no call finds its K/V in L2); replays interleaved in rotating order; the median per
call and the KV read bandwidth (bytes of K and V / time) are reported. Each candidate's partial is
checked against the current row's first; candidates giving a plan already measured at a point
(the same tile, split count and programs) are measured once. A point's candidates are compiled
together first (Triton's ``AsyncCompileMode`` on a thread pool, where it exists). Writes
``flash_decode_tune.jsonl`` (every measurement) and ``flash_decode_tuning_row.json`` — the
device's row for head dim <= 128: the largest batch's best as the base, and a ``by_units`` entry
for each smaller batch whose best differs (chosen by the smallest geometric mean of time over that
batch's best across the token counts), rewritten after each batch. A chosen row with more than one
program per SM is kept only if the ``fused`` algorithm's plan keeps it (its kernel, compiled, fits
that many times per SM: :meth:`iris_fw.flash_decode.FlashDecode._fit_residency`); else that
batch's next best. ``--budget`` seconds: points not started by then are skipped (the row is
written from those measured).

    python3 scripts/tune_flash_decode.py --out $OUT
    python3 scripts/tune_flash_decode.py --points 1x4096 1x16384 1x65536 16x4096 --out $OUT
    python3 scripts/tune_flash_decode.py --grid combine --batches 1 2 --out $OUT   # the combine's unroll
    python3 scripts/tune_flash_decode.py --grid deep --points 1x16384 --out $OUT   # stages, combine in one pass
    python3 scripts/tune_flash_decode.py --grid cluster --batches 1 2 4 --out $OUT   # combine in a cluster
    python3 scripts/tune_flash_decode.py --grid current --out $OUT   # the table's row alone vs SDPA
    python3 scripts/tune_flash_decode.py --grid current --layouts hnd nhd --out $OUT   # on SDPA's own tensors too
    python3 scripts/tune_flash_decode.py --grid current --caps 6 7 --batches 2 --out $OUT   # fewer programs
    python3 scripts/tune_flash_decode.py --quick          # CPU smoke run (interpreter)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from typing import NamedTuple

import iris_fw
import torch
from iris_fw import devinfo
from iris_fw import flash_decode as fd
from iris_fw.bench.flash_decode import BATCHES, HEAD_DIM, KV_HEADS, Q_HEADS, TOKENS
from tune_gemm import graph_of, interleaved  # (this folder: the script's own directory leads sys.path)

ROTATE_BYTES = 256 << 20
#: The split cap of the rows that leave the split count to the grid (items per program).
MAX_SPLITS = 128


class Candidate(NamedTuple):
    """A launch row to measure (:class:`iris_fw.flash_decode.Tuning`'s fields but ``max_rows``)."""

    items_per_program: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    max_splits: int
    swap_ab: bool = False
    max_registers: int = 0
    combine_unroll: int = 8
    cluster_combine: bool = False
    pdl: bool = False


def candidate_of(tune: "fd.Tuning") -> Candidate:
    """A row as a candidate (its fields but ``max_rows`` and ``by_units``)."""
    return Candidate(**{f: getattr(tune, f) for f in Candidate._fields})


def light(cap: int) -> list[Candidate]:
    """The lighter kernels (issue 32, item 2), splits capped at ``cap``: the products swapped
    (``swap_ab``: tokens on the MMA's M side, Hopper's wgmma reading K/V from shared memory:
    140-194 registers a thread where the unswapped tile takes 181-255, scripts/fd_registers.py)
    and register caps (``max_registers``) that let 3 or 4 programs of 4 warps share an SM. One
    item per program: the split count fills the grid up to the cap — at batch 1 (8 units) 3
    programs per SM give 49 splits, 4 give 64 (cap 64); at batch 16 (128 units) 3 and 4. (The
    cap also bounds the splits' combine, ``MAX_SPLITS``: 128 costs 14 registers more than 16.)"""
    return ([Candidate(1, 64, 4, 2, pps, cap, True, regs) for pps, regs in ((1, 0), (2, 0), (3, 168))]
            + [Candidate(1, 64, 4, 3, 2, cap, True), Candidate(1, 64, 8, 3, 1, cap, True),
               Candidate(1, 64, 8, 3, 2, cap, True, 128), Candidate(1, 128, 8, 2, 1, cap, True),
               Candidate(1, 32, 4, 3, 3, cap, True), Candidate(1, 32, 4, 3, 4, cap, True, 128),
               Candidate(1, 64, 4, 2, 3, cap, False, 168), Candidate(1, 32, 4, 2, 4, cap, False, 128)])


def fill_one_pass() -> list[Candidate]:
    """One item per program, the split count left to the grid (at batch 1, 16 splits on 128 of
    132 slots, 33 on 264), with the unit's combine in one pass (``combine_unroll`` at least the
    split count; the plan takes at most the split count's power of two)."""
    return ([Candidate(1, bn, w, st, 1, MAX_SPLITS, False, 0, 32) for bn, w in ((64, 4), (64, 8), (128, 4), (128, 8))
             for st in (2, 3)]
            + [Candidate(1, bn, 4, st, 2, MAX_SPLITS, False, 0, 64) for bn in (32, 64) for st in (2, 3)]
            + [Candidate(1, 64, 4, 2, 2, MAX_SPLITS, True, 0, 64), Candidate(1, 64, 4, 3, 1, MAX_SPLITS, True, 0, 32)])


def deeper_pipelines() -> list[Candidate]:
    """Batch 1's 128 programs (8 units x 16 splits: one per SM) with more K/V stages in flight: on
    the H200 (run 79) the kernel streamed KV at 4.0-4.3 TB/s between 4K and 64K tokens where SDPA,
    with two programs per SM, streams at 4.5-4.6 (docs/performance.md, fourteenth session); 4 and 5
    stages of 64-token K and V tiles (32 KiB a stage) fit one program per SM's shared memory (128-token
    tiles would not). Run 81 (one H200): with 4 warps the same plans as the row's two-per-SM 4-warp
    candidates (128 programs either way), the swapped products' 4 stages the best at batch 1; with
    8 warps 9-41 % slower than the same stages with 4 (docs/performance.md, fifteenth session)."""
    return [Candidate(4, 64, w, st, 1, 16) for w in (4, 8) for st in (4, 5)]


#: Candidates at every batch (run 31's 36, then :func:`light` at 8 splits): the split count from items per
#: program, or, with one item per program, capped at 4 and 8 (at batch 1 and 2 more splits meant
#: a longer combine of the unit's partials before the combine was unrolled: run 28, 33 splits
#: took twice the time of 16).
GRID = ([Candidate(items, bn, w, 3, 1, MAX_SPLITS) for items in (1, 2, 4, 8) for bn in (32, 64, 128) for w in (4, 8)]
        + [Candidate(1, bn, w, 3, 1, cap) for cap in (4, 8) for bn in (32, 64, 128) for w in (4, 8)] + light(8)
        + [Candidate(1, bn, w, 3, 1, 1) for bn, w in ((64, 8), (128, 4), (128, 8))])
#: Batches at most this large take :data:`SMALL_GRID` instead.
SMALL_BATCH = 4
#: Candidates at small batch (run 35's 40, then :func:`light` at 64 splits and the swapped kernel
#: at run 35's best split caps): the split count set by the cap (4 items per program leave it free up to 66
#: splits per unit at batch 1), 2 programs per SM of 4 warps (255 registers a thread fit twice;
#: 8 warps would not) with small tiles, 1 program per SM with the larger ones; 2 and 3 stages.
SMALL_GRID = ([Candidate(4, bn, 4, st, 2, cap) for bn in (32, 64) for st in (2, 3) for cap in (8, 16, 32, 64)]
              + [Candidate(4, bn, w, st, 1, cap) for bn in (64, 128) for w in (4, 8) for st in (2, 3)
                 for cap in (8, 16, 32)]
              + light(64)
              + [Candidate(4, 64, 4, 2, pps, cap, True) for pps in (1, 2) for cap in (16, 32)]
              + [Candidate(4, 64, 8, 3, 1, 16, True), Candidate(4, 128, 8, 2, 1, 16, True)]
              + fill_one_pass() + deeper_pipelines())
#: ``--grid combine``: the unit combine's loads in flight at once (``combine_unroll``; at least the
#: split count: all of them) at these split caps, on the current row's tile and on 2 programs per
#: SM of 4 warps (more splits cost less where their combine is one round of loads).
COMBINE_UNROLLS, COMBINE_CAPS = (8, 16, 32, 64), (8, 16, 32, 64)


def combine_grid(base: "fd.Tuning") -> list[Candidate]:
    """The candidates of ``--grid combine`` around the current row ``base``."""
    same = [candidate_of(base)._replace(max_splits=cap, combine_unroll=u)
            for cap in COMBINE_CAPS for u in COMBINE_UNROLLS if u <= cap]
    return same + [Candidate(4, bn, 4, 3, 2, cap, False, 0, u) for bn in (32, 64) for cap in (16, 32)
                   for u in (8, cap)]


def one_per_sm(sms: int, units: int) -> list[Candidate]:
    """One work item per program on one program per SM (``sms // units`` splits a unit): 64-token
    tiles of 4 warps in 3-5 stages, 128-token ones of 4 and 8 warps in 3, the products both ways,
    the unit's combine in one pass."""
    splits = max(1, sms // max(units, 1))
    return [Candidate(4, bn, w, st, 1, splits, swap, 0, 64)
            for bn, w, st in ((64, 4, 3), (64, 4, 4), (64, 4, 5), (128, 4, 3), (128, 8, 3)) for swap in (False, True)]


def two_per_sm(sms: int, units: int, tiles) -> list[Candidate]:
    """One work item per program on two programs per SM (twice :func:`one_per_sm`'s splits): each
    ``(block_n, stages)`` of ``tiles`` in 4 warps, the products both ways, the combine in one pass."""
    splits = max(1, 2 * sms // max(units, 1))
    return [Candidate(4, bn, 4, st, 2, splits, swap, 0, 64) for bn, st in tiles for swap in (False, True)]


def deep_grid(base: "fd.Tuning", sms: int, units: int) -> list[Candidate]:
    """The candidates of ``--grid deep`` around the current row ``base`` for a call of ``units``
    work units on ``sms`` SMs: its tile with 1 and 2 stages more, the products both ways, the
    unit's combine as the row has it and in one pass (``combine_unroll`` 64: every split's partial
    loaded at once); then the grids of one work item per program — one program per SM (``sms //
    units`` splits, 64-token tiles in 3-5 stages, 128-token ones in 3) and two per SM (twice the
    splits, 32- and 64-token tiles) — with a one-pass combine. (Run 81, one H200: 4 and 5 stages
    of the swapped products took batch 1 from 94-99 % of SDPA to 98-99 %; run 82 chose the H200's
    rows of batches 1, 2 and 4 from this grid; the K/V tiles by TMA from device-made descriptors
    were slower than the same candidate's pointer loads in 64 of 69 pairs, their best 3.7-11.1 %
    behind each point's best, and were taken back.)"""
    same = candidate_of(base)
    out = [same._replace(num_stages=base.num_stages + extra, swap_ab=swap, combine_unroll=unroll)
           for extra in (0, 1, 2) for swap in (False, True) for unroll in (base.combine_unroll, 64)]
    return out + one_per_sm(sms, units) + two_per_sm(sms, units, ((64, 3), (32, 4)))


def cluster_grid(base: "fd.Tuning", sms: int, units: int) -> list[Candidate]:
    """The candidates of ``--grid cluster``: the unit's splits as one thread-block cluster
    combined in distributed shared memory (``cluster_combine``), beside the same launch with the
    counter combine — the current row ``base``; one work item per program on one program per SM
    (``sms // units`` splits: 64-token tiles in 3-5 stages, 128-token ones in 3, the products
    both ways); and on two programs per SM (twice the splits, every SM holding two of the grid's
    programs: 32-token tiles in 3-4 stages, 64-token ones in 2, light enough for two programs and
    the combine's shared memory an SM). A plan that cannot cluster (split count, GPU, residency)
    measures as its counter twin, once."""
    tiles = [candidate_of(base)] + one_per_sm(sms, units) + two_per_sm(sms, units, ((32, 3), (32, 4), (64, 2)))
    return [c._replace(cluster_combine=cl) for c in tiles for cl in (True, False)]


#: Threads compiling a point's candidates at once.
COMPILE_THREADS = 8


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--points", nargs="+", metavar="BxS", default=None,
                   help="only these batch x tokens points (e.g. 1x4096 16x4096), instead of --batches x --tokens")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--min-copies", type=int, default=1,
                   help="K/V copies the calls rotate over at least (beyond the 256 MiB that keep L2 cold: with 2 "
                        "no call reads the buffers of the call before it)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="seconds: points not started by then are skipped (the row comes from those measured)")
    p.add_argument("--grid", choices=("full", "combine", "deep", "cluster", "current"), default="full",
                   help="full: the batch's whole grid; combine: the unit combine's unroll and split caps "
                        "around the current row (combine_grid); deep: more stages and a one-pass combine around "
                        "it (deep_grid); cluster: the splits' combine in a thread-block cluster beside the "
                        "counter's (cluster_grid); current: the table's row alone (a check of it)")
    p.add_argument("--caps", type=int, nargs="+", default=[],
                   help="also the current row's tile at these split caps (fewer programs than SMs: e.g. batch 2's "
                        "16 units at 6 splits are 96 programs), with the grid's combines")
    p.add_argument("--tiles", nargs="+", metavar="BN:W:S[:swap]", default=[],
                   help="also the current row's plan with these tiles (block_n, warps, stages; 'swap': the products "
                        "swapped), e.g. 64:4:4:swap")
    p.add_argument("--pdl", action="store_true",
                   help="also every candidate (the current row too) launched the other way: as a programmatic "
                        "dependent launch (pdl) or not")
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=["nhd"],
                   help="where the kernel's K/V copies live (LAYOUTS; each plan measured on each, interleaved; "
                        "the tuning row from the first)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT") or "flash-decode-tune")
    return p.parse_args(argv)


def label(t: fd.Tuning) -> str:
    cap = "" if t.max_splits == MAX_SPLITS else f"_cap{t.max_splits}"
    pps = "" if t.programs_per_sm == 1 else f"_p{t.programs_per_sm}"
    swap = "_swap" if t.swap_ab else ""
    regs = f"_r{t.max_registers}" if t.max_registers else ""
    unroll = "" if t.combine_unroll == 8 else f"_u{t.combine_unroll}"
    cluster = "_cluster" if t.cluster_combine else ""
    pdl = "_pdl" if t.pdl else ""
    return (f"items{t.items_per_program}_bn{t.block_n}_w{t.num_warps}_s{t.num_stages}{pps}{cap}{swap}{regs}{unroll}"
            f"{cluster}{pdl}")


def compile_all(plans, log) -> None:
    """Compile the plans' local kernels at once where Triton has ``AsyncCompileMode`` (threads:
    ``ptxas`` runs as a process, and much of the rest outside the GIL), else one after another
    at their first call. A plan whose kernel fails to compile is left to fail at its call."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return
    if not plans or plans[0].group.ctx.device.type != "cuda":
        return
    t0 = time.perf_counter()
    with ThreadPoolExecutor(COMPILE_THREADS) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for p in plans:
            try:
                p.compile()
            except Exception as exc:  # reported at the plan's call
                log(f"  compile ahead: {type(exc).__name__}: {str(exc)[:120]}")
    log(f"  ({len(plans)} candidates compiled in {time.perf_counter() - t0:.1f} s)")


def sdpa_replay(q, kt, vt, calls: int, dev):
    """A replay (:func:`tune_gemm.graph_of`) of ``calls`` torch SDPA calls (``enable_gqa``) of
    ``q [B, Hq, D]`` on the K/V copies ``kt``, ``vt`` (``[B, Hkv, S, D]``: SDPA's layout) in turn."""
    import torch.nn.functional as F

    q4 = q.unsqueeze(2)
    return graph_of(lambda i: F.scaled_dot_product_attention(q4, kt[i % len(kt)], vt[i % len(vt)], enable_gqa=True),
                    calls, dev)


#: Where the K/V copies of ``--layouts`` live: ``nhd`` — ``[B, S, Hkv, D]`` contiguous (a token's
#: heads side by side: the paged caches' order, vLLM's); ``hnd`` — ``[B, Hkv, S, D]`` contiguous
#: (each head's tokens in one run: SDPA's own layout, the very tensors SDPA reads), given to the
#: kernel as their ``[B, S, Hkv, D]`` view. SDPA always reads ``[B, Hkv, S, D]`` contiguous copies.
LAYOUTS = ("nhd", "hnd")


def point(ctx, batch, tokens, opts, log) -> list[dict]:
    dev = ctx.device
    hq, hkv, d = (8, 2, 32) if opts.quick else (Q_HEADS, KV_HEADS, HEAD_DIM)
    g = torch.Generator(device=dev).manual_seed(batch * 7 + tokens)
    q = torch.randn(batch, hq, d, generator=g, device=dev).to(torch.bfloat16)
    one = batch * tokens * hkv * 2 * d * 2
    copies = 1 if opts.quick else max(opts.min_copies, math.ceil(ROTATE_BYTES / one))
    ks = [torch.randn(batch, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(batch, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
    kt = [k.transpose(1, 2).contiguous() for k in ks]  # SDPA's [B, Hkv, S, D]
    vt = [v.transpose(1, 2).contiguous() for v in vs]
    kv = {"nhd": (ks, vs), "hnd": ([k.transpose(1, 2) for k in kt], [v.transpose(1, 2) for v in vt])}
    kv = {name: kv[name] for name in opts.layouts}
    ks, vs = kv[opts.layouts[0]]  # (the checks' and the plans' operands)
    current = fd.plan(q, ks[0], vs[0], scheduler="bulk_sync", ctx=ctx)
    want = current.partial(q, ks[0], vs[0]).clone()
    base = current.tune
    plans = {"current " + label(base): current}
    if opts.quick:
        grid = [Candidate(3, 16, 4, base.num_stages, 1, MAX_SPLITS), Candidate(1, 16, 4, base.num_stages, 1, 2),
                Candidate(4, 16, 4, base.num_stages, 2, 8), Candidate(1, 16, 4, base.num_stages, 3, 4, True, 168),
                Candidate(1, 16, 4, base.num_stages, 1, 4, False, 0, 2)]
    elif opts.grid == "combine":
        grid = combine_grid(base)
    elif opts.grid == "deep":
        grid = deep_grid(base, devinfo.num_sms(dev), current.units)
    elif opts.grid == "cluster":
        grid = cluster_grid(base, devinfo.num_sms(dev), current.units)
    elif opts.grid == "current":
        grid = []
    else:
        grid = SMALL_GRID if batch <= SMALL_BATCH else GRID
    combines = {c.cluster_combine for c in grid} | {False}
    grid = grid + [candidate_of(base)._replace(max_splits=cap, cluster_combine=cl)
                   for cap in opts.caps for cl in sorted(combines)]
    grid = grid + [candidate_of(base)._replace(block_n=int(bn), num_warps=int(w), num_stages=int(st),
                                               swap_ab=bool(swap))
                   for bn, w, st, *swap in (t.split(":") for t in opts.tiles)]
    if opts.pdl:
        grid = grid + [c._replace(pdl=not c.pdl) for c in [candidate_of(base)] + grid]
    candidates = []
    # (the split bound decides the combine's passes; PDL, how it launches)
    combine = ("MAX_SPLITS", "COMBINE_UNROLL", "CLUSTER", "PDL")
    seen = {(base.block_n, base.num_warps, base.num_stages, base.swap_ab, base.max_registers, current.n_split,
             current.nprog, *(current.constexprs[k] for k in combine))}
    for cand in grid:
        tune = fd.Tuning(**cand._asdict(), max_rows=base.max_rows)
        p = fd.FlashDecode(current.group, fd.DecodeCall(**current.call.__dict__), tune)
        same = (cand.block_n, cand.num_warps, cand.num_stages, cand.swap_ab, cand.max_registers, p.n_split,
                p.nprog, *(p.constexprs[k] for k in combine))
        if same not in seen:  # (another candidate makes this very plan)
            seen.add(same)
            candidates.append(p)
    compile_all(candidates, log)
    for p in candidates:
        tune = p.tune
        try:
            got = p.partial(q, ks[0], vs[0]).clone()
            err = float((got - want).abs().max())
            if not err <= 1e-3 * max(1.0, float(want.abs().max())):
                log(f"  B {batch} S {tokens} {label(tune)}: WRONG (max err {err:.3g}): not a candidate")
                continue
            plans[label(tune)] = p
        except Exception as exc:  # shared memory / registers
            log(f"  B {batch} S {tokens} {label(tune)}: {type(exc).__name__}: {str(exc)[:160]}")
    replays, runs = {}, {}
    for layout, (lk, lv) in kv.items():
        for name, p in plans.items():
            if layout != opts.layouts[0]:  # the same plan on the other layout: the same partial?
                got = p.partial(q, lk[0], lv[0])
                err = float((got - want).abs().max())
                if not err <= 1e-3 * max(1.0, float(want.abs().max())):
                    log(f"  B {batch} S {tokens} {name} on {layout}: WRONG (max err {err:.3g}): not measured")
                    continue
            key = name if len(kv) == 1 else f"{name} @{layout}"
            mine = torch.empty(p.pack, dtype=torch.float32, device=dev)
            replays[key] = graph_of(lambda i, p=p, mine=mine, lk=lk, lv=lv: p.partial(q, lk[i % copies], lv[i % copies],
                                                                                        None, mine), opts.calls, dev)
            runs[key] = (p, layout)
    replays["torch_sdpa"] = sdpa_replay(q, kt, vt, opts.calls, dev)
    times = interleaved(replays, opts.rounds, opts.calls, dev)
    sdpa = times.pop("torch_sdpa")
    rows = []
    for name, us in times.items():
        p, layout = runs[name]
        rows.append({"batch": batch, "tokens": tokens, "method": name, "layout": layout, "us": us,
                     "kv_TBps": one / us / 1e6,
                     "splits": p.n_split, "programs": p.nprog, "units": p.units, "cluster": p.cluster,
                     "sdpa_us": sdpa, "sdpa_TBps": one / sdpa / 1e6, "vs_sdpa": sdpa / us,
                     "tune": {k: v for k, v in p.tune.__dict__.items() if k != "by_units"},
                     "plan": (p.group, p.call)})  # (not written: for the fused check of the row)
    rows.sort(key=lambda r: r["us"])
    for layout in kv:
        mine = [r for r in rows if r["layout"] == layout]
        cur = next(r for r in mine if r["method"].startswith("current"))
        log(f"| {batch} | {tokens} |{f' {layout} |' if len(kv) > 1 else ''} {one / sdpa / 1e6:.2f} ({sdpa:.1f} us) | "
            f"{cur['kv_TBps']:.2f} ({cur['us']:.1f} us, {cur['splits']} splits) | {mine[0]['kv_TBps']:.2f} "
            f"({mine[0]['us']:.1f} us, {mine[0]['method']}, {mine[0]['splits']} splits) | "
            f"{100 * mine[0]['vs_sdpa']:.1f} |")
    del ks, vs, kt, vt, kv, plans, replays
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rows


def table_row(rows: list[dict], fits=None) -> list:
    """The device's row ``[128, config]``: per batch the candidate with the least geometric
    mean of time / that point's best over the token counts; the largest batch's as the base,
    the others as ``by_units`` entries (bound: the batch's units). ``fits(batch, row)``: false
    for a measured row whose launch the ``fused`` plan would not make (then the batch's next best)."""
    chosen = {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        best = {t: min(r["us"] for r in mine if r["tokens"] == t) for t in {r["tokens"] for r in mine}}
        score = {}
        for r in mine:
            score.setdefault(r["method"], []).append((r, math.log(r["us"] / best[r["tokens"]])))
        complete = {m: v for m, v in score.items() if len(v) == len(best)} or score
        for method in sorted(complete, key=lambda m: sum(x for _, x in complete[m]) / len(complete[m])):
            r = complete[method][0][0]
            if fits is None or fits(batch, r):
                break
        chosen[batch] = (r["units"], r["tune"])
    batches = sorted(chosen)
    base = dict(chosen[batches[-1]][1])
    keys = fd.UNIT_OVERRIDES
    by_units = []
    for batch in batches[:-1]:
        units, tune = chosen[batch]
        diff = {k: tune[k] for k in keys if tune[k] != base[k]}
        if diff:
            by_units.append([units, diff])
    if by_units:
        base["by_units"] = by_units
    for key, default in (("swap_ab", False), ("max_registers", 0), ("combine_unroll", 8),
                         ("cluster_combine", False), ("pdl", False)):  # (only what differs)
        if base.get(key) == default:
            del base[key]
    return [128, base]


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.quick:
        opts.batches, opts.tokens, opts.calls, opts.rounds, opts.points = [1, 2], [40], 1, 1, None
    os.makedirs(opts.out, exist_ok=True)
    with iris_fw.init(heap_size=1 << 28) as ctx:
        log = print if ctx.rank == 0 else (lambda *a: None)
        name = devinfo.info(ctx.device).name
        log(f"device {name}; local kernel vs torch SDPA, KV read TB/s; {opts.calls} calls per graph, "
            f"{opts.rounds} rounds", flush=True) if ctx.rank == 0 else None
        both = len(opts.layouts) > 1
        log(f"| B | S |{' K/V |' if both else ''} SDPA TB/s | current TB/s | best TB/s (row) | best % of SDPA |\n"
            f"|---:|---:|{'---|' if both else ''}---:|---:|---|---:|")
        rows, calls, checked = [], {}, {}

        def fits(batch, row) -> bool:
            """The fused plan of this batch makes the measured ``row``'s launch — its split count
            on its programs — with the row's tuning (compiled, its kernel fits the programs per SM
            the grid needs; the CPU keeps any)."""
            tune = row["tune"]
            if tune["programs_per_sm"] == 1 and not row.get("cluster"):
                return True
            key = (batch, json.dumps(tune, sort_keys=True))
            if key not in checked:
                plan = fd.FlashDecode(calls[batch][0], replace(calls[batch][1], scheduler="fused"), fd.Tuning(**tune))
                # (a grid within one program per SM — batch 1's 128 programs — is the same plan either way)
                checked[key] = (plan.n_split, plan.nprog, plan.cluster) == (row["splits"], row["programs"],
                                                                            row.get("cluster", 0))
                if not checked[key]:
                    log(f"  B {batch} {tune}: the fused kernel fits {plan.tune.programs_per_sm} per SM, not "
                        f"{tune['programs_per_sm']} ({plan.n_split} splits on {plan.nprog} programs in clusters of "
                        f"{plan.cluster}, not {row['splits']} on {row['programs']} in clusters of "
                        f"{row.get('cluster', 0)}): not chosen")
            return checked[key]

        def write_row():
            row = table_row([r for r in rows if r["layout"] == opts.layouts[0]], fits)
            stamp = time.strftime("%Y-%m-%d", time.gmtime())
            with open(os.path.join(opts.out, "flash_decode_tuning_row.json"), "w") as f:
                json.dump({"device": name, "row": row, "measured": f"{name} {stamp}, scripts/tune_flash_decode.py"},
                          f, indent=1)
            return row

        start = time.perf_counter()
        points = {}
        if opts.points:
            for text in opts.points:
                batch, tokens = (int(x) for x in text.lower().split("x"))
                points.setdefault(batch, []).append(tokens)
        else:
            points = {batch: list(opts.tokens) for batch in opts.batches}
        for batch, token_counts in points.items():
            for tokens in token_counts:
                if time.perf_counter() - start > opts.budget:
                    log(f"| {batch} | {tokens} | skipped: the {opts.budget:g} s budget is spent |")
                    continue
                got = point(ctx, batch, tokens, opts, log)
                rows += got
                calls[batch] = got[0]["plan"]
                with open(os.path.join(opts.out, "flash_decode_tune.jsonl"), "w") as f:
                    f.writelines(json.dumps({k: v for k, v in r.items() if k != "plan"}) + "\n" for r in rows)
            if rows:
                write_row()  # after each batch: a run cut short still leaves a row
        row = write_row() if rows else None
        log(f"tuning row for {name!r} (iris_fw/tuning/flash_decode.json 'devices'):\n{json.dumps(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
