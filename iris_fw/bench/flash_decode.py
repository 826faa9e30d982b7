"""Distributed flash-decode (:mod:`iris_fw.flash_decode`) against the bulk-synchronous baseline,
as a benchmark plugin (``iris-fw bench flash_decode``).

The issue's shape: 32 query / 8 KV heads, D = Dv = 128, bf16 (``--dtype`` changes it), batch
``B`` in :data:`BATCHES` and ``S`` KV tokens per rank (``--sizes 4K,16K,64K``: tokens, the
default; ``--quick``: batches 1, 8, 16). Every rank holds its own random slice; ``q`` is the
same everywhere. For each (B, S) one interleaved measurement
(:func:`~iris_fw.bench.harness.measure_interleaved`) times side by side, eager and captured
:data:`~iris_fw.bench.ccl.GRAPH_CALLS` times back to back in one CUDA graph (per-call time =
replay / that):

* ``fused`` — ``flash_decode(scheduler="fused")``: one kernel per call, the cross-rank combine
  inside it;
* ``bulk_sync`` — ``flash_decode(scheduler="bulk_sync")``: the local kernel, iris_fw.ccl's
  all-gather of the rank partials, a combine kernel;
* ``bsp_nccl`` — the issue's baseline: the same local kernel, ``torch.distributed.all_gather_into_tensor``
  (NCCL) of the packed rank partials (``o`` and ``lse`` in one fp32 message), and
  :func:`~iris_fw.flash_decode.combine_partials` in torch;
* ``local_kernel`` — the local split-KV kernel alone (no communication), with its KV read
  bandwidth ``kv_TBps`` = bytes of K and V read / time (target: ≥ 3.0 TB/s at B = 8,
  S = 16K on an H200);
* ``torch_sdpa_local`` — ``F.scaled_dot_product_attention(..., enable_gqa=True)`` over the
  local slice (K/V stored in its ``[B, Hkv, S, D]`` layout), torch's own local speed.

``speedup_vs_bsp``: the baseline's time over the method's, eager and in graphs. Inputs rotate
through copies totalling at least ``--rotate`` bytes (default 256 MiB), so no call finds its
K/V in L2. Before timing, ``fused``, ``bulk_sync`` and ``bsp_nccl`` are checked against a
reference: each rank's partial over its slice in fp32 torch, combined in float64
(``max_err``, ``ok``). ``IRIS_FW_BENCH_TUNE=1`` adds ``tune:`` rows: the local kernel under
each launch configuration of :data:`TUNE_GRID` at B = 8, S = 16K (or the first point), to
fill ``iris_fw/tuning/flash_decode.json``. Methods that cannot run (no NCCL, CPU ranks: no
graphs) get a ``skipped`` row. On CPU ranks (the smoke run) the sizes shrink to
:data:`CPU_TOKENS` tokens, batch 1 and :data:`CPU_HEADS`.
"""

from __future__ import annotations

import gc
import itertools
import math

import torch

from .. import env
from .. import flash_decode as fd
from ..hookspecs import hookimpl
from .ccl import GRAPH_CALLS, _attempt, _capture, _nccl_reason, parse_dtype
from .harness import measure_interleaved

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BATCHES = (1, 2, 4, 8, 16)
QUICK_BATCHES = (1, 8, 16)
TOKENS = (4096, 16384, 65536)
#: The issue's bandwidth target point (batch, tokens per rank).
TARGET = (8, 16384)
#: The CPU smoke run: tokens per rank, batches, (query heads, kv heads, head dim).
CPU_TOKENS, CPU_BATCHES, CPU_HEADS = (40,), (1,), (8, 2, 32)
#: Launch configurations of the tune sweep (block_n, num_warps, num_stages, programs_per_sm).
TUNE_GRID = [(bn, w, st, pps) for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4) for pps in (1, 2)]
#: Most bytes of K/V copies the rotation allocates per rank (besides the first).
MAX_ROTATION_BYTES = 8 << 30


class _Point:
    """One (batch, tokens) point: this rank's inputs (rotated copies), the plans, the methods."""

    def __init__(self, ctx, opts, batch: int, tokens: int, dtype: torch.dtype):
        self.ctx, self.batch, self.tokens, self.dtype = ctx, batch, tokens, dtype
        dev = ctx.device
        hq, hkv, d = self.hq, self.hkv, self.d = CPU_HEADS if dev.type == "cpu" else (Q_HEADS, KV_HEADS, HEAD_DIM)
        gen = torch.Generator(device=dev)
        gen.manual_seed(1234 + batch * 7 + tokens)
        self.q = torch.randn(batch, hq, d, generator=gen, device=dev).to(dtype)  # same on every rank
        gen.manual_seed(99991 * (ctx.rank + 1) + batch * 7 + tokens)
        one = batch * tokens * hkv * 2 * d * torch.empty((), dtype=dtype).element_size()
        self.kv_bytes = one
        copies = 1 if ctx.device.type == "cpu" else max(1, min(math.ceil(opts.rotate_bytes / max(one, 1)),
                                                                1 + MAX_ROTATION_BYTES // max(one, 1)))
        self.ks = [torch.randn(batch, tokens, hkv, d, generator=gen, device=dev).to(dtype) for _ in range(copies)]
        self.vs = [torch.randn(batch, tokens, hkv, d, generator=gen, device=dev).to(dtype) for _ in range(copies)]
        self.copies = copies
        self.fused = fd.plan(self.q, self.ks[0], self.vs[0], scheduler="fused", ctx=ctx)
        self.bulk = fd.plan(self.q, self.ks[0], self.vs[0], scheduler="bulk_sync", ctx=ctx)
        self.out = torch.empty(batch, hq, d, dtype=dtype, device=dev)
        self.mine = torch.empty(self.fused.pack, dtype=torch.float32, device=dev)
        self.gathered = torch.empty(ctx.world_size * self.fused.pack, dtype=torch.float32, device=dev)

    # the methods: f(i) runs call i (on copy i % copies) ------------------------------------------
    def method(self, name: str):
        q, ks, vs, n, out = self.q, self.ks, self.vs, self.copies, self.out
        if name == "fused":
            plan = self.fused
            return lambda i: plan(q, ks[i % n], vs[i % n], None, out)
        if name == "bulk_sync":
            plan = self.bulk
            return lambda i: plan(q, ks[i % n], vs[i % n], None, out)
        if name == "local_kernel":
            plan, mine = self.fused, self.mine
            return lambda i: plan.partial(q, ks[i % n], vs[i % n], None, mine)
        if name == "bsp_nccl":
            return self._bsp()
        if name == "torch_sdpa_local":
            return self._sdpa()
        raise KeyError(name)

    def _bsp(self):
        import torch.distributed as dist

        plan, mine, gathered, w = self.fused, self.mine, self.gathered, self.ctx.world_size
        q, ks, vs, n, dtype = self.q, self.ks, self.vs, self.copies, self.dtype
        result = {}

        def call(i):
            plan.partial(q, ks[i % n], vs[i % n], None, mine)
            dist.all_gather_into_tensor(gathered, mine)
            o, lse = plan.unpack(gathered.view(w, -1))
            result["o"] = fd.combine_partials(o, lse).to(dtype)
            return result["o"]

        self.bsp_result = result
        return call

    def _sdpa(self):
        import torch.nn.functional as F

        q4 = self.q.unsqueeze(2)  # [B, Hq, 1, D]
        ks = [k.transpose(1, 2).contiguous() for k in self.ks]  # [B, Hkv, S, D]: SDPA's layout
        vs = [v.transpose(1, 2).contiguous() for v in self.vs]
        n = self.copies
        try:
            F.scaled_dot_product_attention(q4, ks[0], vs[0], enable_gqa=True)
            return lambda i: F.scaled_dot_product_attention(q4, ks[i % n], vs[i % n], enable_gqa=True)
        except TypeError:  # torch without enable_gqa: the kv heads repeated
            rep = self.hq // self.hkv
            return lambda i: F.scaled_dot_product_attention(q4, ks[i % n].repeat_interleave(rep, 1),
                                                            vs[i % n].repeat_interleave(rep, 1))

    # the check -----------------------------------------------------------------------------------------
    def reference(self) -> torch.Tensor:
        """float64 ``[B, Hq, Dv]`` on the CPU: every rank's fp32 partial of its slice (copy 0),
        gathered through the bootstrap, combined in float64."""
        scale = 1.0 / math.sqrt(self.d)
        heads = torch.arange(self.hq, device=self.q.device) // (self.hq // self.hkv)
        o = torch.empty(self.batch, self.hq, self.d, dtype=torch.float32, device=self.q.device)
        lse = torch.empty(self.batch, self.hq, dtype=torch.float32, device=self.q.device)
        for b in range(self.batch):
            k = self.ks[0][b].float()[:, heads]  # [S, Hq, D]
            s = torch.einsum("hd,shd->hs", self.q[b].float(), k) * scale
            lse[b] = torch.logsumexp(s, dim=-1)
            o[b] = torch.einsum("hs,shd->hd", torch.softmax(s, dim=-1), self.vs[0][b].float()[:, heads])
        parts = self.ctx.bootstrap.all_gather((o.cpu(), lse.cpu()))
        return fd.combine_partials(torch.stack([p[0].double() for p in parts]),
                                   torch.stack([p[1].double() for p in parts]))

    def compare(self, got: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
        eps = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10}[self.dtype]
        vmax = max(float(v.abs().max()) for v in self.vs[:1])
        err = (got.cpu().double() - ref).abs()
        # fp32 reference partials: their rounding scales with the slice's magnitudes too
        tol = 2 * eps * (ref.abs() + vmax) + 1e-5 * vmax
        return float(err.max()), bool((err <= tol).all())


def _sizes(ctx, opts) -> tuple[list[int], list[int]]:
    if ctx.device.type == "cpu":
        return list(CPU_TOKENS), list(CPU_BATCHES)
    tokens = list(opts.sizes) if opts.extra.get("explicit_sizes") else list(TOKENS)
    return tokens, list(QUICK_BATCHES if opts.quick else BATCHES)


class FlashDecodeBench:
    name = "flash_decode"
    description = ("distributed flash-decode (32 q / 8 kv heads, D 128): fused and bulk_sync beside the BSP "
                   "baseline (local kernel + NCCL all_gather + torch combine) and torch SDPA on the local slice, "
                   "eager and in CUDA graphs; KV read bandwidth of the local kernel")
    plot = [
        {"x": "tokens_per_rank", "y": "graph_us", "series": "method", "facet": "batch", "logy": True,
         "xlabel": "KV tokens per rank", "ylabel": f"us per call (CUDA graph of {GRAPH_CALLS})", "suffix": "_latency"},
        {"x": "tokens_per_rank", "y": "kv_TBps", "series": "method", "facet": "batch",
         "xlabel": "KV tokens per rank", "ylabel": "KV read TB/s (CUDA graph where captured, else eager: kv_TBps_from)",
         "suffix": "_bandwidth"},
    ]

    def run(self, ctx, opts):
        dtype = parse_dtype(opts.extra.get("dtype"))
        gpu = ctx.device.type == "cuda"
        tokens, batches = _sizes(ctx, opts)
        nccl_why = _nccl_reason(ctx)
        rows, skipped = [], {}
        if nccl_why:
            skipped["bsp_nccl"] = f"needs NCCL's process group ({nccl_why})"
        if not gpu:
            skipped["graphs"] = "CPU ranks: no CUDA graphs (eager only)"
        hq, hkv, d = CPU_HEADS if not gpu else (Q_HEADS, KV_HEADS, HEAD_DIM)
        opts.log(f"  {ctx.world_size} ranks, {dtype}, {hq} q / {hkv} kv heads, D {d}, batches "
                 f"{batches}, KV tokens per rank {tokens}; graphs of {GRAPH_CALLS} calls")
        methods = ["fused", "bulk_sync", "bsp_nccl", "local_kernel", "torch_sdpa_local"]
        for batch, ntok in itertools.product(batches, tokens):
            point = _Point(ctx, opts, batch, ntok, dtype)
            rows += self._one(ctx, opts, point, [m for m in methods if m not in skipped], gpu)
            if env.get("IRIS_FW_BENCH_TUNE") and (batch, ntok) == (TARGET if TARGET[0] in batches
                                                                                 and TARGET[1] in tokens
                                                                                 else (batches[0], tokens[0])):
                rows += self._tune(ctx, opts, point)
            del point
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
            ctx.barrier()
        rows += [{"method": m, "skipped": why} for m, why in skipped.items()]
        return rows

    def _one(self, ctx, opts, point, methods, gpu) -> list[dict]:
        ref = point.reference()
        checks = {}
        for m in ("fused", "bulk_sync", "bsp_nccl"):
            if m in methods:
                got = {}
                why = _attempt(ctx, lambda: got.setdefault("o", point.method(m)(0)))
                if why:
                    methods.remove(m)
                    checks[m] = (None, why)
                    continue
                ctx.synchronize()
                checks[m] = point.compare(got["o"] if m == "bsp_nccl" else point.out, ref)
        fns = {}
        for m in methods:
            f = point.method(m)
            fns[(m, "eager")] = f
            if gpu:
                holder = {}
                counter = itertools.count()
                why = _attempt(ctx, lambda: holder.setdefault("g", _capture(ctx, lambda: f(next(counter)))))
                if why is None:
                    fns[(m, "graph")] = holder["g"]
        times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
        bsp_eager, bsp_graph = times.get(("bsp_nccl", "eager")), times.get(("bsp_nccl", "graph"))
        rows, parts = [], []
        for m in methods + [m for m in checks if m not in methods]:
            eager = times.get((m, "eager"))
            graph = times.get((m, "graph"))
            graph = None if graph is None else graph / GRAPH_CALLS
            row = {"batch": point.batch, "tokens_per_rank": point.tokens, "method": m, "eager_us": eager,
                   "graph_us": graph, "kv_bytes_per_rank": point.kv_bytes}
            if m in ("local_kernel", "torch_sdpa_local"):
                best = graph or eager
                row["kv_TBps"] = point.kv_bytes / best / 1e6 if best else None
                row["kv_TBps_from"] = "graph" if graph else "eager"
            if bsp_eager and eager:
                row["speedup_vs_bsp"] = bsp_eager / eager
            if bsp_graph and graph:
                row["graph_speedup_vs_bsp"] = bsp_graph / graph
            if m in checks:
                err, ok = checks[m]
                if err is None:
                    row["skipped"] = ok
                else:
                    row["max_err"], row["ok"] = err, ok
            rows.append({k: v for k, v in row.items() if v is not None})
            if eager is not None:
                text = f"{m} {eager:.1f}" + (f"/{graph:.1f}" if graph is not None else "")
                if "kv_TBps" in row:
                    text += f" ({row['kv_TBps']:.2f} TB/s)"
                if row.get("ok") is False:
                    text += f" WRONG (max err {row['max_err']:.3g})"
                parts.append(text)
        opts.log(f"  B {point.batch} S {point.tokens} (us eager{'/graph' if gpu else ''}): " + ", ".join(parts))
        return rows

    def _tune(self, ctx, opts, point) -> list[dict]:
        """The local kernel under each configuration of :data:`TUNE_GRID` (interleaved)."""
        g = point.fused.group
        base = point.fused.tune
        fns, plans = {}, {}
        for bn, warps, stages, pps in TUNE_GRID:
            tune = fd.Tuning(block_n=bn, num_warps=warps, num_stages=stages, programs_per_sm=pps,
                             items_per_program=base.items_per_program, max_splits=base.max_splits,
                             max_rows=base.max_rows)
            call = fd.DecodeCall(**{**point.fused.call.__dict__, "scheduler": "bulk_sync"})
            plan = fd.FlashDecode(g, call, tune)
            label = f"tune:bn{bn}_w{warps}_s{stages}_pps{pps}"
            q, ks, vs, n, mine = point.q, point.ks, point.vs, point.copies, point.mine
            f = (lambda p: lambda i: p.partial(q, ks[i % n], vs[i % n], None, mine))(plan)
            why = _attempt(ctx, lambda: f(0))
            if why is None:
                fns[label] = f
                plans[label] = plan
        times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
        rows = []
        for label, us in sorted(times.items(), key=lambda kv: kv[1]):
            rows.append({"batch": point.batch, "tokens_per_rank": point.tokens, "method": label, "eager_us": us,
                         "kv_TBps": point.kv_bytes / us / 1e6, "splits": plans[label].n_split,
                         "programs": plans[label].nprog})
        if rows:
            opts.log(f"  tune B {point.batch} S {point.tokens}: best " + ", ".join(
                f"{r['method']} {r['eager_us']:.1f} us ({r['kv_TBps']:.2f} TB/s)" for r in rows[:3]))
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(FlashDecodeBench())
