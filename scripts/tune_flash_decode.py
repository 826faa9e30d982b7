"""The flash-decode local kernel's split-count / tile sweep behind ``iris_fw/tuning/flash_decode.json``
(issue 32): at every batch x KV tokens of ``iris-fw bench flash_decode``'s table (32 q / 8 kv
heads, D 128, bf16; one GPU), the local split-KV kernel (``FlashDecode.partial``) under candidate
launch rows — work items per program (the split count), ``block_n``, warps — beside torch SDPA
(``enable_gqa``, K/V in its ``[B, Hkv, S, D]`` layout) and the table's current row.

Every method runs as a CUDA graph of ``--calls`` back-to-back calls over K/V copies totalling at
least 256 MiB (no call finds its K/V in L2); replays interleaved in rotating order; the median per
call and the KV read bandwidth (bytes of K and V / time) are reported. Each candidate's partial is
checked against the current row's first. Writes ``flash_decode_tune.jsonl`` (every measurement)
and ``flash_decode_tuning_row.json`` — the device's row for head dim <= 128: the largest batch's
best as the base, and a ``by_units`` entry for each smaller batch whose best differs (chosen by
the smallest geometric mean of time over that batch's best across the token counts).

    python3 scripts/tune_flash_decode.py --out $OUT
    python3 scripts/tune_flash_decode.py --quick          # CPU smoke run (interpreter)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import iris_fw
import torch
from iris_fw import devinfo
from iris_fw import flash_decode as fd
from iris_fw.bench.flash_decode import BATCHES, HEAD_DIM, KV_HEADS, Q_HEADS, TOKENS
from tune_gemm import graph_of, interleaved  # (this folder: the script's own directory leads sys.path)

ROTATE_BYTES = 256 << 20
#: Candidate (items_per_program, block_n, num_warps) rows (num_stages 3, one program per SM:
#: every program of the fused kernel must be resident).
MAX_SPLITS = 128
#: ... and, with one item per program, fewer splits than the grid would allow (max_splits 4 and
#: 8): at batch 1 and 2 more splits mean a longer combine of the unit's partials (run 28: 33
#: splits took twice the time of 16).
GRID = ([(items, bn, w, MAX_SPLITS) for items in (1, 2, 4, 8) for bn in (32, 64, 128) for w in (4, 8)]
        + [(1, bn, w, cap) for cap in (4, 8) for bn in (32, 64, 128) for w in (4, 8)])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT") or "flash-decode-tune")
    return p.parse_args(argv)


def label(t: fd.Tuning) -> str:
    cap = "" if t.max_splits == MAX_SPLITS else f"_cap{t.max_splits}"
    return f"items{t.items_per_program}_bn{t.block_n}_w{t.num_warps}_s{t.num_stages}{cap}"


def point(ctx, batch, tokens, opts, log) -> list[dict]:
    dev = ctx.device
    hq, hkv, d = (8, 2, 32) if opts.quick else (Q_HEADS, KV_HEADS, HEAD_DIM)
    g = torch.Generator(device=dev).manual_seed(batch * 7 + tokens)
    q = torch.randn(batch, hq, d, generator=g, device=dev).to(torch.bfloat16)
    one = batch * tokens * hkv * 2 * d * 2
    copies = 1 if opts.quick else max(1, math.ceil(ROTATE_BYTES / one))
    ks = [torch.randn(batch, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(batch, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
    current = fd.plan(q, ks[0], vs[0], scheduler="bulk_sync", ctx=ctx)
    want = current.partial(q, ks[0], vs[0]).clone()
    base = current.tune
    plans = {"current " + label(base): current}
    grid = [(3, 16, 4, MAX_SPLITS), (1, 16, 4, 2)] if opts.quick else GRID
    for items, bn, w, cap in grid:
        tune = fd.Tuning(block_n=bn, num_warps=w, num_stages=base.num_stages if opts.quick else 3, programs_per_sm=1,
                         items_per_program=items, max_splits=cap, max_rows=base.max_rows)
        try:
            p = fd.FlashDecode(current.group, fd.DecodeCall(**current.call.__dict__), tune)
            got = p.partial(q, ks[0], vs[0]).clone()
            err = float((got - want).abs().max())
            if not err <= 1e-3 * max(1.0, float(want.abs().max())):
                log(f"  B {batch} S {tokens} {label(tune)}: WRONG (max err {err:.3g}): not a candidate")
                continue
            plans[label(tune)] = p
        except Exception as exc:  # shared memory / registers
            log(f"  B {batch} S {tokens} {label(tune)}: {type(exc).__name__}: {str(exc)[:160]}")
    outs = {}
    replays = {}
    for name, p in plans.items():
        mine = outs[name] = torch.empty(p.pack, dtype=torch.float32, device=dev)
        replays[name] = graph_of(lambda i, p=p, mine=mine: p.partial(q, ks[i % copies], vs[i % copies], None, mine),
                                 opts.calls, dev)
    import torch.nn.functional as F

    q4 = q.unsqueeze(2)
    kt = [k.transpose(1, 2).contiguous() for k in ks]
    vt = [v.transpose(1, 2).contiguous() for v in vs]
    replays["torch_sdpa"] = graph_of(lambda i: F.scaled_dot_product_attention(q4, kt[i % copies], vt[i % copies],
                                                                              enable_gqa=True), opts.calls, dev)
    times = interleaved(replays, opts.rounds, opts.calls, dev)
    sdpa = times.pop("torch_sdpa")
    rows = []
    for name, us in times.items():
        p = plans[name]
        rows.append({"batch": batch, "tokens": tokens, "method": name, "us": us, "kv_TBps": one / us / 1e6,
                     "splits": p.n_split, "programs": p.nprog, "units": p.units,
                     "sdpa_us": sdpa, "sdpa_TBps": one / sdpa / 1e6, "vs_sdpa": sdpa / us,
                     "tune": {k: v for k, v in p.tune.__dict__.items() if k != "by_units"}})
    rows.sort(key=lambda r: r["us"])
    cur = next(r for r in rows if r["method"].startswith("current"))
    log(f"| {batch} | {tokens} | {one / sdpa / 1e6:.2f} ({sdpa:.1f} us) | {cur['kv_TBps']:.2f} ({cur['us']:.1f} us, "
        f"{cur['splits']} splits) | {rows[0]['kv_TBps']:.2f} ({rows[0]['us']:.1f} us, {rows[0]['method']}, "
        f"{rows[0]['splits']} splits) | {100 * rows[0]['vs_sdpa']:.0f} |")
    del ks, vs, kt, vt, plans, replays
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rows


def table_row(rows: list[dict]) -> list:
    """The device's row ``[128, config]``: per batch the candidate with the least geometric
    mean of time / that point's best over the token counts; the largest batch's as the base,
    the others as ``by_units`` entries (bound: the batch's units)."""
    chosen = {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        best = {t: min(r["us"] for r in mine if r["tokens"] == t) for t in {r["tokens"] for r in mine}}
        score = {}
        for r in mine:
            score.setdefault(r["method"], []).append((r, math.log(r["us"] / best[r["tokens"]])))
        complete = {m: v for m, v in score.items() if len(v) == len(best)} or score
        method = min(complete, key=lambda m: sum(x for _, x in complete[m]) / len(complete[m]))
        r = complete[method][0][0]
        chosen[batch] = (r["units"], r["tune"])
    batches = sorted(chosen)
    base = dict(chosen[batches[-1]][1])
    keys = ("block_n", "num_warps", "num_stages", "programs_per_sm", "items_per_program", "max_splits")
    by_units = []
    for batch in batches[:-1]:
        units, tune = chosen[batch]
        diff = {k: tune[k] for k in keys if tune[k] != base[k]}
        if diff:
            by_units.append([units, diff])
    if by_units:
        base["by_units"] = by_units
    return [128, base]


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.quick:
        opts.batches, opts.tokens, opts.calls, opts.rounds = [1, 2], [40], 1, 1
    os.makedirs(opts.out, exist_ok=True)
    with iris_fw.init(heap_size=1 << 28) as ctx:
        log = print if ctx.rank == 0 else (lambda *a: None)
        name = devinfo.info(ctx.device).name
        log(f"device {name}; local kernel vs torch SDPA, KV read TB/s; {opts.calls} calls per graph, "
            f"{opts.rounds} rounds", flush=True) if ctx.rank == 0 else None
        log("| B | S | SDPA TB/s | current TB/s | best TB/s (row) | best % of SDPA |\n|---:|---:|---:|---:|---|---:|")
        rows = []
        for batch in opts.batches:
            for tokens in opts.tokens:
                rows += point(ctx, batch, tokens, opts, log)
                with open(os.path.join(opts.out, "flash_decode_tune.jsonl"), "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
        row = table_row(rows)
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        with open(os.path.join(opts.out, "flash_decode_tuning_row.json"), "w") as f:
            json.dump({"device": name, "row": row, "measured": f"{name} {stamp}, scripts/tune_flash_decode.py"}, f,
                      indent=1)
        log(f"tuning row for {name!r} (iris_fw/tuning/flash_decode.json 'devices'):\n{json.dumps(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
