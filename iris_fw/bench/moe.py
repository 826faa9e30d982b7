"""MoE dispatch + combine (:mod:`iris_fw.moe`) against torch baselines, as a benchmark plugin
(``iris-fw bench moe``).

Shapes (:data:`SHAPES`): DeepSeek-V3-like (hidden 7168, 256 experts, top-8) at 128 tokens per
rank (decode) and 4096 (prefill), Mixtral-like (hidden 4096, 8 experts, top-2) at 128 and 4096;
``--quick``: the decode points only. Routing: uniform random distinct experts per token, weights
random. The experts are the identity (``expert_out`` a fixed buffer), so the times are the
exchange's. For each point and dtype (bf16, fp8 — ``--dtype`` picks one) one interleaved
measurement (:func:`~iris_fw.bench.harness.measure_interleaved`), eager and, on GPUs, in a CUDA
graph of :data:`~iris_fw.bench.ccl.GRAPH_CALLS` pairs:

* ``low_latency`` / ``throughput`` — ``moe_dispatch`` + ``moe_combine`` in that mode;
* ``torch_a2a`` — the torch.distributed baseline: the rows sorted by destination rank, the
  per-rank counts exchanged with ``all_to_all_single`` and brought to the host (the split
  exchange), the rows with ``all_to_all_single`` (splits), the reverse for the combine, then a
  weighted ``index_add_`` (needs NCCL: skipped with a reason where it is not, e.g. ranks sharing
  one GPU);
* ``torch_local`` — that baseline's local torch work alone (sort by expert, gather the rows,
  weighted ``index_add_`` back): the part one GPU can run without NCCL;
* ``copy`` — the copy rate of the same bytes: the rows a rank sends, copied there and back by
  torch on this rank's GPU (``gb_per_s`` of every dispatch + combine row is those bytes both ways
  over its time, beside this one's);
* the experts' GEMMs (:data:`FFN`: each expert ``[H, N]`` then ``[N, H]``, weights random,
  bf16): ``dispatch_then_gemm`` (``moe_dispatch``, then torch's grouped GEMM ``torch.bmm`` over
  ``[L, C, H] @ [L, H, N]``; fp8 rows dequantized first) beside ``dispatch_gemm_fused``
  (:func:`~iris_fw.moe_gemm.moe_dispatch_gemm`: each tile starts as its rows arrive), and the
  whole layer ``layer_unfused`` (dispatch, bmm, SiLU, bmm, ``moe_combine``) beside
  ``layer_fused`` (``moe_dispatch_gemm``, SiLU, :func:`~iris_fw.moe_gemm.moe_gemm_combine`), all
  in ``mode="auto"``; the fused rows carry ``speedup`` (the unfused time over theirs, graph
  times where there are, else eager).

Before timing, each iris-fw method is checked (``layer_fused`` against ``layer_unfused``'s output
for the same tokens, where neither dropped a row): the combine of the identity experts must be
``sum_k w[t, k] * x[t]`` over the rows not dropped (float64; fp8: of the dequantized rows), and
the drops are reported (``dropped``: rows past capacity at this rank; prefill points use a capacity
of :data:`PREFILL_CAPACITY_FACTOR` times the mean load). ``bytes_per_rank``: the bytes of rows a
rank sends in one dispatch. At W ≥ 2 on GPUs the run first measures the signal round trip between
ranks 0 and 1 (:func:`iris_fw.bench.protocols.round_trip_us`, a ``round_trip`` row) and every
dispatch + combine row carries ``over_round_trip`` (its time in round trips). On CPU ranks (a
smoke run) the shapes shrink to :data:`CPU_SHAPE`.
"""

from __future__ import annotations

import gc
import itertools
import math

import torch

import iris_fw

from .. import moe
from ..moe_gemm import moe_dispatch_gemm, moe_gemm_combine
from ..hookspecs import hookimpl
from .ccl import GRAPH_CALLS, _attempt, _capture, _nccl_reason
from .harness import measure_interleaved
from .protocols import round_trip_us

#: name -> (hidden, experts, topk, tokens per rank)
SHAPES = {"dsv3_decode": (7168, 256, 8, 128), "dsv3_prefill": (7168, 256, 8, 4096),
          "mixtral_decode": (4096, 8, 2, 128), "mixtral_prefill": (4096, 8, 2, 4096)}
QUICK = ("dsv3_decode", "mixtral_decode")
#: The experts' intermediate size N by shape family (DeepSeek-V3's routed experts: 2048; Mixtral: 14336);
#: the CPU smoke run's: :data:`CPU_FFN`.
FFN = {"dsv3": 2048, "mixtral": 14336}
CPU_FFN = 24
#: Fused method -> the unfused method it is compared with (its row's ``speedup``).
FUSED = {"dispatch_gemm_fused": "dispatch_then_gemm", "layer_fused": "layer_unfused"}
GEMM_METHODS = ("dispatch_then_gemm", "dispatch_gemm_fused", "layer_unfused", "layer_fused")
#: Bound of the layer_fused check, in units of the largest |output| of the unfused layer.
LAYER_TOL = 2 ** -5
#: The CPU smoke run's shape (experts per rank, not total).
CPU_SHAPE = ("cpu", 48, 2, 2, 4)
#: Capacity of prefill points: this many times the mean rows per expert (decode: no drops).
PREFILL_CAPACITY_FACTOR = 2
PREFILL_TOKENS = 1024
#: Bounds of the check's fp8 rounding, in units of a row's largest |x| (see _Point.check).
FP8_STEP, FP8_INTERP_STEP = 2 ** -4 + 2 ** -7, 0.5
DTYPES = {"bf16": None, "fp8": torch.float8_e4m3fn}


class _Point:
    def __init__(self, ctx, name, hidden, experts, topk, tokens, dtype):
        self.ctx, self.name, self.hidden, self.experts = ctx, name, hidden, experts
        self.topk, self.tokens = topk, tokens
        self.dtype = dtype
        dev, w = ctx.device, ctx.world_size
        gen = torch.Generator(device="cpu").manual_seed(4321 + 17 * ctx.rank + tokens)
        self.x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(dev)
        self.idx = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)]).to(dev)
        self.w = torch.rand(tokens, topk, generator=gen).to(dev)
        mean = tokens * w * topk / experts
        self.capacity = None if tokens < PREFILL_TOKENS else max(1, math.ceil(PREFILL_CAPACITY_FACTOR * mean))
        self.out = torch.empty_like(self.x)
        self.plans = {mode: moe.plan(self.x, self.idx, self.w, experts, max_tokens_per_rank=tokens,
                                     capacity=self.capacity, dtype=dtype, mode=mode, ctx=ctx) for mode in moe.MODES}
        plan = self.plans["low_latency"]
        self.expert_out = torch.zeros(plan.recv_x.shape, dtype=torch.bfloat16, device=dev)
        self.ffn = CPU_FFN if dev.type == "cpu" else FFN[name.split("_")[0]]
        local = experts // w
        self.w1 = (torch.randn(local, hidden, self.ffn, generator=gen) / hidden ** 0.5).to(torch.bfloat16).to(dev)
        self.w2 = (torch.randn(local, self.ffn, hidden, generator=gen) / self.ffn ** 0.5).to(torch.bfloat16).to(dev)
        self.y = torch.empty(local, plan.call.capacity, self.ffn, dtype=torch.bfloat16, device=dev)
        self.eo = torch.empty(plan.recv_x.shape, dtype=torch.bfloat16, device=dev)
        self.layer_out = torch.empty_like(self.x)
        self.bytes = tokens * topk * (hidden * (1 if dtype is not None else 2) + (4 * plan.call.groups if dtype else 0))
        self._copy_src = torch.empty(self.bytes, dtype=torch.uint8, device=dev)
        self._copy_dst = torch.empty_like(self._copy_src)

    def _copy(self, i):
        """The same bytes as a dispatch + combine moves, copied there and back on this GPU."""
        self._copy_dst.copy_(self._copy_src)
        self._copy_src.copy_(self._copy_dst)

    def method(self, name):
        if name in moe.MODES:
            plan, x, idx, w, eo, out = self.plans[name], self.x, self.idx, self.w, self.expert_out, self.out

            def call(i):
                d = plan.dispatch(x, idx, w)
                plan.combine(eo, d.handle, out)
            return call
        if name in GEMM_METHODS:
            return getattr(self, "_" + name)
        if name == "torch_local":
            return self._torch_local
        if name == "copy":
            return self._copy
        if name == "torch_a2a":
            return self._torch_a2a
        raise KeyError(name)

    def check(self, mode) -> tuple[float, bool, int]:
        """Identity experts: the combine must be the weighted sum of the rows not dropped."""
        plan = self.plans[mode]
        d = plan.dispatch(self.x, self.idx, self.w)
        rows = d.x.float()
        if d.scales is not None:
            rows = rows * d.scales.repeat_interleave(moe.FP8_GROUP, dim=2)[:, :, :self.hidden]
        got = plan.combine(rows.to(torch.bfloat16), d.handle)
        self.ctx.synchronize()
        kept = (d.handle.src_slot >= 0).double().cpu()
        x = self.x.double().cpu()
        if d.scales is not None:
            q, s = moe.quantize_reference(self.x.cpu())
            x = (q.float() * s.repeat_interleave(moe.FP8_GROUP, dim=1)[:, :self.hidden]).double()
        want = (self.w.double().cpu() * kept).sum(1, keepdim=True) * x
        err = (got.double().cpu() - want).abs()
        # fp8: one e4m3 step (2^-4 of a value) per row; Triton's CPU interpreter mis-rounds a carry into
        # the exponent (1.96 -> 1.0: half a value), so CPU ranks get that bound instead
        step = (FP8_INTERP_STEP if iris_fw.interpreting() else FP8_STEP) if d.scales is not None else 2 ** -7
        wsum = (self.w.double().cpu() * kept).sum(1, keepdim=True)
        tol = 2 ** -7 * want.abs() + step * wsum * x.abs().amax(1, keepdim=True) + 1e-6
        return float(err.max()) if err.numel() else 0.0, bool((err <= tol).all()), int(d.handle.stats()["dropped"])

    def _dispatch(self):
        return moe.moe_dispatch(self.x, self.idx, self.w, self.experts, max_tokens_per_rank=self.tokens,
                                capacity=self.capacity, dtype=self.dtype, ctx=self.ctx)

    def _rows(self, d):
        """The received rows in bf16 (fp8: dequantized) for torch's GEMM."""
        if d.scales is None:
            return d.x
        scale = d.scales.repeat_interleave(moe.FP8_GROUP, dim=2)[:, :, :self.hidden]
        return (d.x.float() * scale).to(torch.bfloat16)

    def _dispatch_then_gemm(self, i):
        torch.bmm(self._rows(self._dispatch()), self.w1, out=self.y)

    def _fused_dispatch(self):
        return moe_dispatch_gemm(self.x, self.idx, self.w, self.w1, self.experts, max_tokens_per_rank=self.tokens,
                                 capacity=self.capacity, dtype=self.dtype, ctx=self.ctx)

    def _dispatch_gemm_fused(self, i):
        self._fused_dispatch()

    def _layer_unfused(self, i):
        d = self._dispatch()
        torch.bmm(self._rows(d), self.w1, out=self.y)
        torch.bmm(torch.nn.functional.silu(self.y), self.w2, out=self.eo)
        moe.moe_combine(self.eo, d.handle, out=self.out)
        return d

    def _layer_fused(self, i):
        g = self._fused_dispatch()
        moe_gemm_combine(torch.nn.functional.silu(g.y), self.w2, g.handle, out=self.layer_out)
        return g

    def check_layer(self) -> tuple[float, bool, int]:
        """``layer_fused`` against ``layer_unfused`` on the same tokens (rows past capacity may
        differ between two dispatches: compared only where neither dropped one)."""
        d = self._layer_unfused(0)
        self.ctx.synchronize()
        want, dropped = self.out.double().cpu(), int(d.handle.stats()["dropped"])
        g = self._layer_fused(0)
        self.ctx.synchronize()
        dropped = max(dropped, int(g.handle.stats()["dropped"]))
        got = self.layer_out.double().cpu()
        err = float((got - want).abs().max()) if got.numel() else 0.0
        ok = err <= LAYER_TOL * (float(want.abs().max()) if want.numel() else 0.0) + 1e-3
        return err, bool(ok) or dropped > 0, dropped

    def _torch_local(self, i):
        """Sort rows by expert, gather, weighted index_add back (the local torch work)."""
        flat = self.idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // self.topk
        rows = self.x.index_select(0, tok)
        torch.bincount(flat, minlength=self.experts)
        out = torch.zeros(self.tokens, self.hidden, dtype=torch.float32, device=self.x.device)
        out.index_add_(0, tok, rows.float() * self.w.reshape(-1)[order, None])
        self.out.copy_(out)

    def _torch_a2a(self, i):
        import torch.distributed as dist

        w = self.ctx.world_size
        local = self.experts // w
        flat = self.idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // self.topk
        send = self.x.index_select(0, tok)
        counts = torch.bincount(flat // local, minlength=w)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        sc, rc = counts.tolist(), recv_counts.tolist()  # the host split exchange
        recv = torch.empty(sum(rc), self.hidden, dtype=send.dtype, device=send.device)
        dist.all_to_all_single(recv, send, rc, sc)
        back = torch.empty_like(send)
        dist.all_to_all_single(back, recv, sc, rc)
        out = torch.zeros(self.tokens, self.hidden, dtype=torch.float32, device=self.x.device)
        out.index_add_(0, tok, back.float() * self.w.reshape(-1)[order, None])
        self.out.copy_(out)


class MoeBench:
    name = "moe"
    description = ("MoE dispatch + combine (DeepSeek-V3-like and Mixtral-like shapes, decode and prefill, bf16 and "
                   "fp8): iris-fw low_latency and throughput beside torch.distributed all_to_all_single with the host "
                   "split exchange and the local torch work alone; the fused expert GEMMs beside dispatch then "
                   "grouped GEMM; eager and in CUDA graphs")
    plot = [{"x": "tokens_per_rank", "y": "graph_us", "series": "method", "facet": "shape", "logy": True,
             "xlabel": "tokens per rank", "ylabel": f"us per dispatch+combine (graph of {GRAPH_CALLS})"}]

    def run(self, ctx, opts):
        gpu = ctx.device.type == "cuda"
        w = ctx.world_size
        if gpu:
            names = QUICK if opts.quick else tuple(SHAPES)
            shapes = [(n, *SHAPES[n]) for n in names]
        else:
            name, hidden, per_rank, topk, tokens = CPU_SHAPE
            shapes = [(name, hidden, per_rank * w, topk, tokens)]
        shapes = [s for s in shapes if s[2] % w == 0]
        wanted = opts.extra.get("dtype")
        dtypes = {k: v for k, v in DTYPES.items() if not wanted or wanted.lower().removeprefix("torch.") in (k, str(v))}
        skipped = {}
        why = _nccl_reason(ctx)
        if why:
            skipped["torch_a2a"] = f"needs NCCL's process group ({why})"
        if not gpu:
            skipped["graphs"] = "CPU ranks: no CUDA graphs (eager only)"
        rows = []
        rt = None
        if gpu and w >= 2:
            rt = round_trip_us(ctx, opts)
            rows.append({"method": "round_trip", "eager_us": rt})
            opts.log(f"  signal round trip (ranks 0 <-> 1): {rt:.2f} us")
        for (name, hidden, experts, topk, tokens), (dname, dtype) in itertools.product(shapes, dtypes.items()):
            point = _Point(ctx, name, hidden, experts, topk, tokens, dtype)
            methods = [*moe.MODES, "copy", "torch_local"] + ([] if "torch_a2a" in skipped or dtype is not None
                                                     else ["torch_a2a"]) + list(GEMM_METHODS)
            checks = {m: point.check(m) for m in moe.MODES}
            checks["layer_fused"] = point.check_layer()
            fns = {}
            for m in methods:
                f = point.method(m)
                fns[(m, "eager")] = f
                if gpu:
                    holder, counter = {}, itertools.count()
                    if _attempt(ctx, lambda: holder.setdefault("g", _capture(ctx, lambda: f(next(counter))))) is None:
                        fns[(m, "graph")] = holder["g"]
            times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
            parts = []
            best = {m: times.get((m, "graph"), times.get((m, "eager"))) for m in methods}
            for m in methods:
                eager, graph = times.get((m, "eager")), times.get((m, "graph"))
                graph = None if graph is None else graph / GRAPH_CALLS
                row = {"shape": name, "hidden": hidden, "experts": experts, "topk": topk, "tokens_per_rank": tokens,
                       "dtype": dname, "method": m, "eager_us": eager, "graph_us": graph,
                       "bytes_per_rank": point.bytes, "capacity": point.plans["low_latency"].call.capacity}
                if m in checks:
                    row["max_err"], row["ok"], row["dropped"] = checks[m]
                if (m in moe.MODES or m == "copy") and best.get(m):
                    row["gb_per_s"] = 2 * point.bytes / best[m] / 1e3  # the rows there and back
                    if rt and m in moe.MODES:
                        row["over_round_trip"] = best[m] / rt
                if m in FUSED and best.get(m) and best.get(FUSED[m]):
                    row["speedup"] = best[FUSED[m]] / best[m]
                if m in GEMM_METHODS:
                    row["ffn"] = point.ffn
                rows.append({k: v for k, v in row.items() if v is not None})
                parts.append(f"{m} {eager:.1f}" + (f"/{graph:.1f}" if graph is not None else "")
                             + (f" (x{row['speedup']:.2f})" if "speedup" in row else "")
                             + (" WRONG" if row.get("ok") is False else ""))
            opts.log(f"  {name} {dname} T {tokens} (us eager{'/graph' if gpu else ''}): " + ", ".join(parts))
            del point, fns
            # the point's plans live on the world group (every cached MoE plan does): dropping the
            # group frees their buffers for the next point (prefill plans are ~1 GiB each)
            iris_fw.ccl.destroy_group(ctx=ctx)
            gc.collect()
            ctx.barrier()
        rows += [{"method": m, "skipped": why} for m, why in skipped.items()]
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(MoeBench())
