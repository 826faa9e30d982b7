"""The op engine's costs, as a benchmark plugin (``iris-fw bench engine``):

* ``host``: host time per op call, enqueue only (the host loop is timed without synchronizing
  inside it; shapes are tiny so the GPU keeps up), for one- and two-kernel schedules, through an
  :class:`~iris_fw.engine.op.Op` and through the cached functional ``iris_fw.ops`` call; and a
  bare 20-argument kernel launched through Triton's own path vs the engine's launcher.
* ``graph``: per-call device time of the same ops captured ``GRAPH_CALLS`` times back to back in
  one CUDA graph, against the eager per-call time.
* ``tile_all_reduce``: an 8 KiB all-reduce written with :mod:`iris_fw.tilecomm` (each program
  pushes its tile into every rank's double-buffered receive slots, arrives, waits for every
  rank's arrival and sums locally — one cross-rank round trip per call, no host integer), per
  call inside a CUDA graph of ``GRAPH_CALLS`` back-to-back calls, beside NCCL's all-reduce of
  the same bytes in the same way.
"""

from __future__ import annotations

import statistics
import time

import torch
import triton
import triton.language as tl

from .. import callpath
from .. import tilecomm as tc
from ..kernel_launcher import KernelLauncher
from ..engine.skeletons import begin_call, state_slots
from ..hookspecs import hookimpl
from .harness import measure_interleaved

#: Back-to-back calls captured in one graph (per-call time = replay time / this).
GRAPH_CALLS = 20
#: Calls per host-time measurement.
HOST_CALLS = 200
SCHEDULERS = (("fused_sequential", 1), ("wg_specialized", 1), ("producer_consumer", 2), ("bulk_sync", 2))


@triton.jit
def _tile_all_reduce_kernel(x, recv, out, st, slots, n, rank, world_size, heap_bases,
                            BLOCK: tl.constexpr, NPROG: tl.constexpr):
    """``out[:n] = sum over ranks of x[:n]``; program ``p`` owns tile ``p`` (``n <= BLOCK*NPROG``).
    ``recv``: ``[2, world_size, n]`` on the heap (double-buffered by call parity);
    ``slots``: ``[NPROG, world_size]`` arrival slots on the heap."""
    pid = tl.program_id(0)
    epoch = begin_call(st, world_size)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    buf = recv + (epoch % 2) * world_size * n
    tc.tile_put_all(x + offs, buf + rank * n + offs, rank, world_size, heap_bases, mask=mask)
    tc.arrive(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if tc.wait_arrivals(slots + pid * world_size, epoch, rank, world_size, heap_bases):
        for i in range(0, world_size):
            acc += tl.load(buf + ((rank + i) % world_size) * n + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


class TileAllReduce:
    """The benchmark's all-reduce: buffers on ``ctx``'s heap, a launcher bound once."""

    def __init__(self, ctx, n: int, dtype: torch.dtype, block: int = 1024):
        self.ctx, self.n = ctx, n
        nprog = triton.cdiv(n, block)
        self.x = ctx.zeros(n, dtype=dtype)
        self.out = torch.empty(n, dtype=dtype, device=ctx.device)
        self.recv = ctx.zeros(2, ctx.world_size, n, dtype=dtype)
        self.st = ctx.zeros(state_slots(ctx.world_size, nprog), dtype=torch.int64)
        self.slots = ctx.zeros(nprog, ctx.world_size, dtype=torch.int64)
        self.launch = KernelLauncher(_tile_all_reduce_kernel, (nprog,), constexprs={"BLOCK": block, "NPROG": nprog},
                                     num_warps=4)

    def __call__(self, i: int = 0) -> torch.Tensor:
        c = self.ctx
        self.launch(self.x, self.recv, self.out, self.st, self.slots, self.n, c.rank, c.world_size, c.heap_bases)
        return self.out


@triton.jit
def _twenty_args_kernel(x, y, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                        BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16 + a17
    tl.store(y + offs, tl.load(x + offs) + s)


def _host_us(ctx, fn) -> float:
    """Median over 5 rounds of the host time of :data:`HOST_CALLS` enqueues of ``fn`` (2 calls,
    1 round on the CPU interpreter, where a call runs the kernel), µs per call; the maximum
    over ranks."""
    gpu = ctx.device.type == "cuda"
    calls, rounds = (HOST_CALLS, 5) if gpu else (2, 1)
    fn()
    ctx.synchronize()
    per_round = []
    for _ in range(rounds):
        ctx.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - t0) / calls * 1e6)
        ctx.synchronize()
    return max(ctx.bootstrap.all_gather(statistics.median(per_round)))


def _graph(ctx, fn, calls: int = GRAPH_CALLS):
    """``fn`` captured ``calls`` times in one CUDA graph: the replay as a function."""
    stream = torch.cuda.Stream(device=ctx.device)
    stream.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(ctx.device).wait_stream(stream)
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    ctx.barrier()
    return lambda i: graph.replay()


class EngineBench:
    name = "engine"
    description = "host time per op call, ops in CUDA graphs, an 8 KiB tile all-reduce in a graph vs NCCL"

    def run(self, ctx, opts):
        from .. import ops

        gpu = ctx.device.type == "cuda"
        rows = []
        dtype = torch.bfloat16 if gpu else torch.float32
        m = 256 if gpu else 32
        a = torch.randn(m, m, device=ctx.device, dtype=dtype)
        b = torch.randn(m, m // 2, device=ctx.device, dtype=dtype)

        # bare launches: Triton's own path vs the launcher
        x = torch.zeros(128, device=ctx.device)
        y = torch.empty_like(x)
        scalars = tuple(range(3, 21))
        launcher = KernelLauncher(_twenty_args_kernel, (1,), constexprs={"BLOCK": 128}, num_warps=4)
        for method, fn in (("triton_launch", lambda: _twenty_args_kernel[(1,)](x, y, *scalars, BLOCK=128, num_warps=4)),
                           ("engine_launcher", lambda: launcher(x, y, *scalars))):
            us = _host_us(ctx, fn)
            rows.append({"what": "host", "op": "kernel_20_args", "method": method, "kernels": 1, "host_us": us})
            opts.log(f"  host, 20-argument kernel, {method}: {us:.1f} us per launch")

        for sched, kernels in SCHEDULERS:
            op = ops.plan("gemm_all_scatter", a, b, scheduler=sched)
            us = _host_us(ctx, lambda: op(a, b))
            rows.append({"what": "host", "op": "gemm_all_scatter", "method": f"Op ({sched})", "kernels": kernels,
                         "host_us": us})
            opts.log(f"  host, gemm_all_scatter {m}x{m}x{m // 2 * ctx.world_size} via {sched} ({kernels} kernels): "
                     f"{us:.1f} us per call")
            if gpu:
                eager = lambda i: op(a, b)  # noqa: E731
                replay = _graph(ctx, lambda: op(a, b))
                t = measure_interleaved(ctx, {"eager": eager, "graph": replay}, opts.iters, opts.warmup)
                rows.append({"what": "graph", "op": "gemm_all_scatter", "method": sched, "kernels": kernels,
                             "eager_us": t["eager"], "graph_us_per_call": t["graph"] / GRAPH_CALLS})
                opts.log(f"  graph, gemm_all_scatter via {sched}: {t['graph'] / GRAPH_CALLS:.1f} us per call "
                         f"(eager {t['eager']:.1f} us)")
            del op
            ctx.barrier()
        us = _host_us(ctx, lambda: ops.gemm_all_scatter(a, b, scheduler="fused_sequential"))
        rows.append({"what": "host", "op": "gemm_all_scatter", "method": "ops.gemm_all_scatter (cached op + clone)",
                     "kernels": 1, "host_us": us})
        opts.log(f"  host, ops.gemm_all_scatter (cached op + clone of the result): {us:.1f} us per call")
        callpath.state(ctx).ops.clear()

        # 8 KiB all-reduce
        n = 8192 // torch.empty((), dtype=dtype).element_size()
        ar = TileAllReduce(ctx, n, dtype)
        ar.x.copy_(torch.randn(n, device=ctx.device, dtype=dtype))
        ar()
        ctx.synchronize()
        want = torch.stack(ctx.bootstrap.all_gather(ar.x.float().cpu())).sum(0)
        err = (ar.out.float().cpu() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
        if not err < 1e-2:
            raise AssertionError(f"tile all-reduce: max relative error {err:.3g} against the float sum")
        us = _host_us(ctx, ar)
        rows.append({"what": "host", "op": "tile_all_reduce_8KiB", "method": "launcher", "kernels": 1, "host_us": us})
        if gpu:
            fns = {"tile_all_reduce_graph": _graph(ctx, ar), "tile_all_reduce_eager": lambda i: ar()}
            nccl = self._nccl(ctx, n, dtype)
            if nccl is not None:
                fns["nccl_graph"] = _graph(ctx, nccl)
                fns["nccl_eager"] = lambda i: nccl()
            t = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
            for method, value in t.items():
                per_call = value / GRAPH_CALLS if method.endswith("graph") else value
                rows.append({"what": "all_reduce_8KiB", "op": "all_reduce", "method": method, "bytes": 8192,
                             "us_per_call": per_call, "max_rel_err": err if method.startswith("tile") else None})
                opts.log(f"  8 KiB all-reduce, {method}: {per_call:.2f} us per call")
        del ar
        ctx.barrier()
        return rows

    @staticmethod
    def _nccl(ctx, n, dtype):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or "nccl" not in dist.get_backend():
            return None
        t = torch.randn(n, device=ctx.device, dtype=dtype)
        return lambda: dist.all_reduce(t)


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(EngineBench())
