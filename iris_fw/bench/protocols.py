"""Latency protocols beside the signal round trip of the same run (``iris-fw bench protocols``).

One run, one interleaved measurement per size, every row carrying the round trip measured
first in the same job:

* ``round_trip``: ``signal`` -> ``wait_until`` between ranks 0 and 1 (the latency floor of any
  protocol that waits for a peer once);
* ``all_reduce``: :func:`iris_fw.ccl.all_reduce` of 8 KiB, 256 KiB and 1 MiB (bf16) for every
  registered algorithm and ``auto``, eager and in a CUDA graph of :data:`GRAPH_CALLS` calls;
* ``tile_all_reduce``: the 8 KiB all-reduce written with :mod:`iris_fw.tilecomm`
  (:class:`iris_fw.bench.engine.TileAllReduce`), eager and in a graph;
* ``all_reduce_rmsnorm``: :func:`iris_fw.ccl.all_reduce_rmsnorm` at 1, 16 and 128 tokens of
  hidden 8192 (bf16) for every algorithm, eager and in a graph.

The timed all-reduces average (``op="avg"``) random data, so thousands of in-place calls stay
finite without timing zeros. Checks against a float64 reference (``ok``, ``max_rel_err``): the
all-reduce and tile all-reduce graphs are replayed once more on fresh random inputs; each
all_reduce_rmsnorm algorithm runs one eager call on fresh inputs (a replay of its graph adds
``GRAPH_CALLS`` partial sums to the residual). ``over_round_trip_us`` is
the graph time per call minus the round trip: the target for 8 KiB is the round trip + 1 µs for
the algorithm ``auto`` picks, + 2 µs for the others.

Run it with ranks sharing one GPU under CUDA MPS (``IRIS_FW_SHARE_GPUS=1``,
scripts/gpu_mps.sh): the rows are labelled "one GPU, MPS" by the harness's device field; they
measure the protocols (ordering, flags, launches), not NVLink. ``--sizes`` replaces the
all-reduce sizes; ``--quick`` runs 8 KiB and 1 token only.
"""

from __future__ import annotations

import torch

from .. import ccl
from ..hookspecs import hookimpl
from .engine import GRAPH_CALLS, TileAllReduce, _graph
from .harness import KiB, MiB, fmt_bytes, measure_interleaved
from .primitives import _ping_pong_kernel

#: all_reduce sizes (bytes per rank) and all_reduce_rmsnorm token counts of the default run.
SIZES = (8 * KiB, 256 * KiB, 1 * MiB)
TOKENS = (1, 16, 128)
HIDDEN = 8192
DTYPE = torch.bfloat16
#: Rounds of ping-pong per timed launch of the round-trip kernel.
ROUNDS = 1000
#: Relative error a bf16 result may have against the float64 reference: all-reduce, fused RMSNorm.
ALL_REDUCE_TOL, RMSNORM_TOL = 2e-2, 5e-2
#: Target over the round trip, µs, for an 8 KiB all-reduce in a graph: auto's, the others'.
TARGET_AUTO_US, TARGET_OTHER_US = 1.0, 2.0


def round_trip_us(ctx, opts) -> float:
    """Median signal -> wait_until round trip between ranks 0 and 1 (µs; every rank calls)."""
    flag = ctx.zeros(1, dtype=torch.int64)
    rounds = ROUNDS if ctx.device.type == "cuda" else 3
    state = {"base": 0}

    def fn(i):
        if ctx.rank < 2:
            _ping_pong_kernel[(1,)](flag, state["base"], rounds, ctx.rank, 1 - ctx.rank, ctx.heap_bases,
                                    SERVE=(ctx.rank == 0))
        state["base"] += rounds

    ctx.barrier()
    us = measure_interleaved(ctx, {"rt": fn}, opts.iters, opts.warmup)["rt"] / rounds
    ctx.barrier()
    del flag
    return us


def _row(opts, label: str, times: tuple, rt: float, err: float, tol: float, **fields) -> dict:
    """One result row (``fields`` plus the times, the round trip and the check), logged."""
    eager, graph = times
    opts.log(f"  {label}: eager {eager:.2f} us"
             + (f", graph {graph:.2f} us/call (round trip + {graph - rt:.2f})" if graph is not None else "")
             + ("" if err < tol else f"  WRONG (max rel err {err:.2e})"))
    return {**fields, "eager_us": eager, "graph_us_per_call": graph, "round_trip_us": rt, "max_rel_err": err,
            "ok": err < tol}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).abs().max() / want.abs().max().clamp_min(1e-30))


class ProtocolsBench:
    name = "protocols"
    description = ("signal round trip, ccl.all_reduce per algorithm, the tile all-reduce and all_reduce_rmsnorm, "
                   "eager and in CUDA graphs, each beside the round trip of the same run")

    def run(self, ctx, opts):
        if ctx.world_size < 2:
            opts.log("  needs at least 2 ranks")
            return []
        gpu = ctx.device.type == "cuda"
        rt = round_trip_us(ctx, opts)
        opts.log(f"  round trip {rt:.2f} us")
        rows = [{"what": "round_trip", "method": "signal/wait_until", "us_per_call": rt, "round_trip_us": rt}]
        sizes = opts.sizes if opts.extra.get("explicit_sizes") else SIZES
        tokens = TOKENS
        if opts.quick or not gpu:
            sizes, tokens = sizes[:1], tokens[:1]
        for nbytes in sizes:
            rows += self._all_reduce(ctx, opts, nbytes, rt)
        rows += self._tile(ctx, opts, rt)
        for t in tokens:
            rows += self._rmsnorm(ctx, opts, t, rt)
        for row in rows:
            graph = row.get("graph_us_per_call")
            if graph is not None:
                row["over_round_trip_us"] = graph - rt
        return [{k: v for k, v in row.items() if v is not None} for row in rows]

    # ---- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _time(ctx, opts, calls: dict) -> tuple[dict, dict]:
        """``({label: (eager µs, graph µs per call or None)}, {label: graph replay})`` of ``calls``
        (label -> no-argument call), measured interleaved; graphs only on GPUs (else no replays)."""
        fns, graphs = {}, {}
        for label, fn in calls.items():
            fns[(label, "eager")] = (lambda f: lambda i: f())(fn)
            if ctx.device.type == "cuda":
                graphs[label] = _graph(ctx, fn)
                fns[(label, "graph")] = graphs[label]
        times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
        out = {}
        for label in calls:
            graph = times.get((label, "graph"))
            out[label] = (times[(label, "eager")], None if graph is None else graph / GRAPH_CALLS)
        return out, graphs

    @staticmethod
    def _fresh(ctx, shape, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A fresh random tensor of this rank and every rank's (on the CPU, float64)."""
        g = torch.Generator().manual_seed(seed * 1009 + ctx.rank)
        mine = torch.randn(shape, generator=g, dtype=torch.float64)
        parts = ctx.bootstrap.all_gather(mine)
        return mine.to(device=ctx.device, dtype=DTYPE), parts

    def _all_reduce(self, ctx, opts, nbytes: int, rt: float) -> list[dict]:
        n = nbytes // torch.empty((), dtype=DTYPE).element_size()
        algorithms = ["auto"] + list(ccl.algorithms("all_reduce", ctx=ctx))
        bufs = {a: torch.randn(n, device=ctx.device, dtype=DTYPE) for a in algorithms}
        calls = {a: (lambda a=a: ccl.all_reduce(bufs[a], op="avg", algorithm=a, ctx=ctx)) for a in algorithms}
        times, graphs = self._time(ctx, opts, calls)
        rows = []
        for i, a in enumerate(algorithms):
            x, parts = self._fresh(ctx, (n,), seed=nbytes + i)
            bufs[a].copy_(x)
            if a in graphs:
                graphs[a](0)  # GRAPH_CALLS averages: the first gives the mean, the others keep it
            else:
                calls[a]()
            ctx.synchronize()
            want = torch.stack([p.to(DTYPE).double() for p in parts]).mean(0)
            err = _rel_err(bufs[a], want)
            rows.append(_row(opts, f"all_reduce {fmt_bytes(nbytes)} {a}", times[a], rt, err, ALL_REDUCE_TOL,
                             what="all_reduce", method=a, bytes=nbytes, size=fmt_bytes(nbytes)))
        del bufs, calls, graphs
        ccl.destroy_group(ctx=ctx)
        ctx.barrier()
        return rows

    def _tile(self, ctx, opts, rt: float) -> list[dict]:
        nbytes = 8 * KiB
        n = nbytes // torch.empty((), dtype=DTYPE).element_size()
        ar = TileAllReduce(ctx, n, DTYPE)
        ar.x.copy_(torch.randn(n, device=ctx.device, dtype=DTYPE))
        times, graphs = self._time(ctx, opts, {"tile_all_reduce": ar})
        x, parts = self._fresh(ctx, (n,), seed=7)
        ar.x.copy_(x)
        (graphs["tile_all_reduce"] if graphs else (lambda i: ar()))(0)
        ctx.synchronize()
        want = torch.stack([p.to(DTYPE).double() for p in parts]).sum(0)
        err = _rel_err(ar.out, want)
        del ar, graphs
        ctx.barrier()
        return [_row(opts, f"tile all_reduce {fmt_bytes(nbytes)}", times["tile_all_reduce"], rt, err, ALL_REDUCE_TOL,
                     what="tile_all_reduce", method="tilecomm", bytes=nbytes, size=fmt_bytes(nbytes))]

    def _rmsnorm(self, ctx, opts, tokens: int, rt: float) -> list[dict]:
        from ..ccl.fused import all_reduce_rmsnorm_reference

        hidden = HIDDEN if ctx.device.type == "cuda" else 256
        algorithms = ["auto"] + list(ccl.algorithms("all_reduce_rmsnorm", ctx=ctx))
        g = torch.Generator().manual_seed(tokens)  # the same weight on every rank
        weight = torch.randn(hidden, generator=g).to(device=ctx.device, dtype=DTYPE)
        state = {a: (torch.randn(tokens, hidden, device=ctx.device, dtype=DTYPE),
                     torch.zeros(tokens, hidden, device=ctx.device, dtype=DTYPE),
                     torch.empty(tokens, hidden, device=ctx.device, dtype=DTYPE)) for a in algorithms}
        calls = {a: (lambda a=a: ccl.all_reduce_rmsnorm(state[a][0], state[a][1], weight, out=state[a][2],
                                                        algorithm=a, ctx=ctx)) for a in algorithms}
        times, graphs = self._time(ctx, opts, calls)
        rows = []
        for i, a in enumerate(algorithms):
            x, parts = self._fresh(ctx, (tokens, hidden), seed=tokens * 31 + i)
            g = torch.Generator().manual_seed(tokens * 37 + i)  # the same residual on every rank
            res0 = torch.randn(tokens, hidden, generator=g).to(DTYPE)
            xs, residual, out = state[a]
            xs.copy_(x)
            residual.copy_(res0.to(ctx.device))
            calls[a]()  # one call, eager: a graph of GRAPH_CALLS would add x to the residual each call
            ctx.synchronize()
            want, _ = all_reduce_rmsnorm_reference(x.cpu(), res0, weight.cpu(), xs=[p.to(DTYPE) for p in parts])
            err = _rel_err(out, want)
            rows.append(_row(opts, f"all_reduce_rmsnorm {tokens}x{hidden} {a}", times[a], rt, err, RMSNORM_TOL,
                             what="all_reduce_rmsnorm", method=a, tokens=tokens, hidden=hidden,
                             bytes=tokens * hidden * 2))
        del state, calls, graphs
        ccl.destroy_group(ctx=ctx)
        ctx.barrier()
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(ProtocolsBench())
