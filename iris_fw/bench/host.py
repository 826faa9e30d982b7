"""Host time per call of every public op and collective, as a benchmark plugin (``iris-fw bench host``).

Enqueue-only host time — the loop of calls is timed without synchronizing inside it — of every
``iris_fw.ccl`` all-reduce algorithm (on a heap tensor, and ``auto`` on a plain tensor),
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``ops.gemm_all_reduce``,
``ops.flash_decode`` and every taxonomy op through ``iris_fw.ops.*`` (``auto``, and the one-kernel
``fused_sequential`` schedule of ``gemm_all_reduce`` and ``all_gather_gemm``), beside the references of
issue "One call path": torch ``add_`` on 8 KiB (for the collectives), ``torch.matmul`` of each
op's local shape (for the ops: into a given tensor for the calls with ``out=``, ``…, new tensor``
for the calls that return one) and a bare prepared launch (:class:`~iris_fw.kernel_launcher.PreparedLaunch`
of a one-argument kernel: the floor of any launch). Every case runs :data:`ROUNDS` rounds of
:data:`CALLS` calls, the cases interleaved round by round (their order rotating) so that all of
them share the same stretch of time; a row gives the median round's µs per call (the maximum
over ranks) and its ratio to its reference (``x_ref``); beside it the median round's µs per call
of its first :data:`FIRST_CALLS` calls (``first_us``: too few to fill the launch queue) and until
its work finished on the device (``done_us``). Where the round's enqueue time per call exceeds
its first calls' (``queue_bound``), later calls waited for a full launch queue: ``host_us``
then measures the device more than the call path, and ``first_us`` is the host's figure.

Calls that come back with every tensor at the same address — here every collective, every op
with ``out=`` (flash-decode's too), and every op without it, whose new result the call path makes
first (the loop drops each result, so torch's allocator hands its block back) — are replayed as
CUDA graphs by the call path (:class:`iris_fw.callpath.Replay`) after their first calls, where
a replay proved quicker on the host than the call's eager launches (``replayed``: the share of
the last round's calls that were graph launches); each such case also has a row ``…, eager``
with replay off (``callpath.state(ctx).replay``), the call path's launches themselves. On a GPU
a row ``bare graph launch`` launches a graph of the bare prepared launch as the call path
launches a replay: a replayed call's floor.

On CPU ranks every call runs its kernels under Triton's interpreter: the numbers measure the
interpreter (rows marked ``measured=cpu-interpreter``, :data:`CPU_ROUNDS` × :data:`CPU_CALLS` calls) and
only show that each call path works; GPU rows are the measurement (docs/performance.md).
"""

from __future__ import annotations

import statistics
import time

import torch
import triton
import triton.language as tl

from ..hookspecs import hookimpl
from ..kernel_launcher import KernelLauncher

#: Rounds and calls per round (GPU); CPU ranks make :data:`CPU_ROUNDS` of :data:`CPU_CALLS` (a smoke run).
ROUNDS, CALLS = 5, 200
CPU_ROUNDS, CPU_CALLS = 1, 1
#: Calls at the start of each round timed on their own (``first_us``): too few to fill the launch
#: queue, so their enqueue time is the call path's whatever the device does.
FIRST_CALLS = 16
#: A case whose enqueue time per call over the round exceeds its first calls' by this factor is
#: marked ``queue_bound``: later calls waited for a full launch queue, so ``host_us`` measures the
#: device more than the call path (``first_us`` is then the host's figure).
QUEUE_BOUND = 1.25
#: Bytes of the collectives' tensors and of the ``add_`` reference.
MESSAGE_BYTES = 8 << 10
#: Local shapes on GPU: the GEMM ops' ``M, N, K per rank`` (a decode step's row-parallel
#: layer) and flash-decode's ``B, Hq, Hkv, D, tokens per rank``; small ones on CPU ranks.
GPU_GEMM, CPU_GEMM = (16, 8192, 4096), (16, 32, 16)
GPU_DECODE, CPU_DECODE = (1, 32, 8, 128, 4096), (1, 4, 2, 16, 32)


@triton.jit
def _bare_kernel(x, BLOCK: tl.constexpr):
    """Nothing but a store: a launch's floor."""
    tl.store(x + tl.arange(0, BLOCK), tl.zeros((BLOCK,), dtype=tl.float32))


def _bare_graph_launch(prepared, dev):
    """A CUDA graph of the bare prepared launch, launched as the call path launches a replay
    (:class:`iris_fw.callpath.Replay`: the driver's graph launch on torch's current stream, or
    ``graph.replay()`` where the driver's call or the raw handle is missing): a replay's floor."""
    from .. import driver

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        graph.capture_begin()
        prepared()
        graph.capture_end()
    torch.cuda.current_stream(dev).wait_stream(side)
    calls = driver.calls()
    raw = graph.raw_cuda_graph_exec() if calls is not None and hasattr(graph, "raw_cuda_graph_exec") else None
    if not raw:
        return graph.replay
    stream, launch = driver.current_stream(), calls.launch_graph_status
    index = torch.cuda.current_device() if dev.index is None else dev.index

    def run(graph=graph):  # (the graph kept alive with its handle)
        rc = launch(raw, stream(index))
        if rc:
            calls.launch_failed(rc)

    return run


#: The row of a bare prepared launch's CUDA graph, launched as the call path replays (GPU only).
BARE_GRAPH = "bare graph launch"
#: Suffix of a case run with the call path's graph replay off.
EAGER = ", eager"
#: Suffix of a torch reference that returns a new tensor (the reference of the ops called without ``out=``).
NEW = ", new tensor"


def _cases(ctx) -> tuple[dict, dict]:
    """``{name: fn}`` of every case and ``{name: reference name}``; cases a world size or dtype
    does not support (every rank raises alike on its first call) are left out, named in ``skipped``.
    A case whose calls the call path may replay (every collective and op) also runs as
    ``name + EAGER``, with replay off (GPUs: CPU ranks replay nothing)."""
    from .. import ccl, ops

    gpu = ctx.device.type == "cuda"
    dev, w = ctx.device, ctx.world_size
    dtype = torch.bfloat16 if gpu else torch.float32
    n = MESSAGE_BYTES // torch.empty((), dtype=dtype).element_size()
    cases, refs = {}, {}

    plain = torch.zeros(n, device=dev, dtype=dtype)
    cases["torch add_ 8 KiB"] = lambda: plain.add_(1)
    bare = torch.zeros(128, device=dev)
    prepared = KernelLauncher(_bare_kernel, (1,), constexprs={"BLOCK": 128}, num_warps=1).prepare(bare)
    cases["bare prepared launch"] = prepared
    if gpu:
        cases[BARE_GRAPH] = _bare_graph_launch(prepared, dev)
    add = "torch add_ 8 KiB"

    heap = ctx.zeros(n, dtype=dtype)
    for algorithm in ccl.algorithms("all_reduce", ctx=ctx):
        cases[f"ccl.all_reduce 8 KiB heap ({algorithm})"] = (
            lambda algorithm=algorithm: ccl.all_reduce(heap, algorithm=algorithm, ctx=ctx))
        refs[f"ccl.all_reduce 8 KiB heap ({algorithm})"] = add
    cases["ccl.all_reduce 8 KiB plain (auto)"] = lambda: ccl.all_reduce(plain, ctx=ctx)
    gathered = torch.empty(w * n, device=dev, dtype=dtype)
    cases["ccl.all_gather_into_tensor 8 KiB"] = lambda: ccl.all_gather_into_tensor(gathered, heap, ctx=ctx)
    scattered = torch.empty(n, device=dev, dtype=dtype)
    cases["ccl.reduce_scatter_tensor 8 KiB"] = lambda: ccl.reduce_scatter_tensor(scattered, gathered, ctx=ctx)
    for name in list(cases):
        if name.startswith("ccl."):
            refs[name] = add

    m, nn, k = GPU_GEMM if gpu else CPU_GEMM
    a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, nn, device=dev, dtype=dtype)
    c = torch.empty(m, nn, device=dev, dtype=dtype)
    mm = f"torch.matmul {m}x{nn}x{k}"
    cases[mm] = lambda: torch.matmul(a, b, out=c)
    mm_new = mm + NEW
    cases[mm_new] = lambda: torch.matmul(a, b)
    out = torch.empty(m, nn, device=dev, dtype=dtype)
    cases[f"ops.gemm_all_reduce {m}x{nn}, K {k} per rank"] = lambda: ops.gemm_all_reduce(a, b, ctx=ctx)
    cases[f"ops.gemm_all_reduce {m}x{nn}, K {k} per rank, out="] = lambda: ops.gemm_all_reduce(a, b, out=out, ctx=ctx)
    # the taxonomy ops on the same local product [M, K] @ [K, N] (all_gather_gemm: A's rows split)
    cases[f"ops.gemm_all_scatter {m}x{k} @ {k}x{nn}"] = lambda: ops.gemm_all_scatter(a, b, ctx=ctx)
    cases[f"ops.gemm_reduce_scatter {m * w}x{k} @ {k}x{nn}"] = (
        lambda a2=torch.randn(m * w, k, device=dev, dtype=dtype): ops.gemm_reduce_scatter(a2, b, ctx=ctx))
    cases[f"ops.all_gather_gemm {m}x{k} (per rank) @ {k}x{nn}"] = lambda: ops.all_gather_gemm(a, b, ctx=ctx)
    # one kernel per call: the fused schedule, its result written straight into the new tensor
    # or out= (Plan.result_arg; all_gather_gemm also copies its shard into the heap)
    fused = "fused_sequential"
    cases[f"ops.gemm_all_reduce {m}x{nn}, K {k} per rank, {fused}"] = (
        lambda: ops.gemm_all_reduce(a, b, scheduler=fused, ctx=ctx))
    cases[f"ops.gemm_all_reduce {m}x{nn}, K {k} per rank, {fused}, out="] = (
        lambda: ops.gemm_all_reduce(a, b, scheduler=fused, out=out, ctx=ctx))
    cases[f"ops.all_gather_gemm {m}x{k} (per rank) @ {k}x{nn}, {fused}"] = (
        lambda: ops.all_gather_gemm(a, b, scheduler=fused, ctx=ctx))
    for name in cases:
        if name.startswith("ops."):
            refs[name] = mm if name.endswith("out=") else mm_new

    bsz, hq, hkv, d, s = GPU_DECODE if gpu else CPU_DECODE
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(bsz, hq, d, generator=gen).to(dev, dtype)  # the same on every rank
    kk = torch.randn(bsz, s, hkv, d, device=dev, dtype=dtype)
    vv = torch.randn(bsz, s, hkv, d, device=dev, dtype=dtype)
    dec = f"torch.matmul decode {hq}x{d} @ {d}x{s}"
    qm, km = torch.randn(hq, d, device=dev, dtype=dtype), torch.randn(d, s, device=dev, dtype=dtype)
    sm = torch.empty(hq, s, device=dev, dtype=dtype)
    cases[dec] = lambda: torch.matmul(qm, km, out=sm)
    cases[dec + NEW] = lambda: torch.matmul(qm, km)
    o = torch.empty(bsz, hq, d, device=dev, dtype=dtype)
    name = f"ops.flash_decode B {bsz}, Hq {hq}, Hkv {hkv}, D {d}, {s} tokens per rank"
    cases[name] = lambda: ops.flash_decode(q, kk, vv, ctx=ctx)
    refs[name] = dec + NEW
    cases[name + ", out="] = lambda: ops.flash_decode(q, kk, vv, out=o, ctx=ctx)
    refs[name + ", out="] = dec
    replayed = [n for n in cases if n.startswith(("ccl.", "ops."))]
    for name in replayed if gpu else ():  # (CPU ranks replay nothing)
        cases[name + EAGER] = cases[name]
        refs[name + EAGER] = refs[name]
    return cases, refs


class HostBench:
    name = "host"
    description = ("enqueue-only host time per call of every collective and op vs torch add_ / matmul "
                   "and a bare prepared launch (issue 'One call path')")

    def run(self, ctx, opts):
        from .. import callpath

        paths = callpath.state(ctx)
        replay = paths.replay
        try:
            return self._run(ctx, opts, paths, replay)
        finally:
            paths.replay = replay  # (the eager cases switch it off)

    def _run(self, ctx, opts, paths, replay):
        gpu = ctx.device.type == "cuda"
        calls, rounds = (CALLS, ROUNDS) if gpu else (CPU_CALLS, CPU_ROUNDS)
        cases, refs = _cases(ctx)
        skipped = {}
        for name in list(cases):  # first call: plans (collective), compiles; unsupported cases leave
            paths.replay = replay and not name.endswith(EAGER)
            try:
                cases[name]()
                ctx.synchronize()
            except Exception as exc:  # raised on every rank alike (validated across ranks)
                skipped[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
                del cases[name]
                ctx.barrier()  # re-arms the job if the failure aborted it
        names = list(cases)
        head = min(FIRST_CALLS, calls)
        per = {name: [] for name in names}
        device = {name: [] for name in names}  # until the round's work finished: µs per call
        first = {name: [] for name in names}  # the round's first FIRST_CALLS calls: µs per call
        replayed = {name: 0.0 for name in names}  # the last round's calls replayed as graphs (share)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                fn = cases[name]
                opts.log(f"  round {r + 1}/{rounds}: {name}")  # a hang names its case
                paths.replay = replay and not name.endswith(EAGER)
                ctx.barrier()
                graphs = paths.replayed
                t0 = time.perf_counter()
                for _ in range(head):
                    fn()
                first[name].append((time.perf_counter() - t0) / head * 1e6)
                for _ in range(calls - head):
                    fn()
                per[name].append((time.perf_counter() - t0) / calls * 1e6)
                replayed[name] = (paths.replayed - graphs) / calls
                ctx.synchronize()
                device[name].append((time.perf_counter() - t0) / calls * 1e6)
        n = len(names)
        medians = [statistics.median(series[name]) for series in (per, device, first) for name in names]
        worst = [max(v) for v in zip(*ctx.bootstrap.all_gather(medians))]
        us, done, early = (dict(zip(names, worst[i * n:(i + 1) * n])) for i in range(3))
        rows = []
        for name in names:
            ref = refs.get(name)
            ratio = us[name] / us[ref] if ref in us and us[ref] > 0 else None
            # later calls slower than the first ones: they waited for a full launch queue, and
            # host_us measures the device, not the call path (first_us is the host's figure)
            bound = us[name] > QUEUE_BOUND * early[name]
            rows.append({"call": name, "host_us": us[name], "reference": ref or "", "x_ref": ratio,
                         "first_us": early[name], "done_us": done[name], "queue_bound": bound,
                         "replayed": replayed[name],
                         "calls_per_round": calls, "rounds": rounds})
            opts.log(f"  {name}: {us[name]:.1f} us per call" + (f" ({ratio:.2f}x {ref})" if ratio else "")
                     + f"; first {head} calls {early[name]:.1f}; done after {done[name]:.1f}"
                     + (" (queue-bound)" if bound else "") + (" (replayed)" if replayed[name] else ""))
        for name, why in skipped.items():
            rows.append({"call": name, "host_us": None, "reference": refs.get(name, ""), "x_ref": None,
                         "calls_per_round": 0, "rounds": 0, "skipped": why})
            opts.log(f"  {name}: skipped ({why})")
        ctx.barrier()
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(HostBench())
