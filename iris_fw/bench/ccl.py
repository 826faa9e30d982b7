"""Collectives (:mod:`iris_fw.ccl`) against NCCL and torch symmetric memory, as a benchmark
plugin (``iris-fw bench ccl``).

For every collective (all_reduce, all_gather, reduce_scatter, all_to_all with equal splits,
broadcast from rank 0) and every size, one interleaved measurement
(:func:`~iris_fw.bench.harness.measure_interleaved`) times side by side:

* every registered iris-fw algorithm of the collective (``ccl.algorithms(collective)``), eager
  and captured :data:`GRAPH_CALLS` times back to back in one CUDA graph (per-op time = replay
  time / :data:`GRAPH_CALLS`); all_gather's ``pull`` also with an input on the symmetric heap,
  which peers read in place (``pull_zero_copy``);
* NCCL through ``torch.distributed``, eager and captured the same way — when the default
  process group has an NCCL backend (the harness creates ``cpu:gloo,cuda:nccl`` on GPUs);
* for all_reduce, torch symmetric memory's ``one_shot_all_reduce`` and ``two_shot_all_reduce_``
  (peer loads/stores; multicast stays off: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` is set before
  the first symmetric-memory allocation and ``multimem_*`` ops are never called).

Sizes are *per-rank message bytes*: the tensor of all_reduce and broadcast, the input of
all_gather, the output of reduce_scatter (its input is ``W`` times that), the input of
all_to_all. ``total_bytes`` is NCCL-tests' size (all_gather's output, reduce_scatter's input,
else ``bytes``), and bus bandwidth follows NCCL-tests: ``total_bytes / time`` times
``2(W-1)/W`` (all_reduce), ``(W-1)/W`` (all_gather, reduce_scatter, all_to_all) or ``1``
(broadcast).

Each iris-fw algorithm's result is checked once per size, before timing, against a float64
reference built from every rank's input (gathered with ``ctx.bootstrap.all_gather``): the
whole message up to :data:`FULL_CHECK_BYTES`, above that its first and last
:data:`CHECK_SLICE` elements (of each rank's part). ``max_rel_err`` is the largest error over
the largest reference magnitude; ``ok`` applies the tolerance of tests/test_ccl.py (copies
exact; sums within one rounding to the dtype plus fp32 accumulation).

Host time per eager call (enqueue only, as :func:`iris_fw.bench.engine._host_us`) is measured
for the 8 KiB all_reduce of every method. Methods that cannot run (no NCCL group, a dtype an
algorithm or baseline rejects, …) get one row with ``skipped`` saying why.

Options: ``--sizes 8K,256K,1M`` (else the harness sweep 4 KiB … 1 GiB plus the issue's target
sizes), ``--quick`` (only the target sizes 8K, 256K, 1M, 16M, 256M, at most 10 iterations),
``--dtype`` (default bf16; fp16, fp32, fp8_e4m3, fp8_e5m2, int32, int64), ``--iters`` /
``--warmup`` (scaled down above 16 MiB so the default run stays a few minutes on 2 GPUs).
Every (collective, size) runs in a fresh world group, so its kernel configurations' buffers
never accumulate in the group's workspace.
"""

from __future__ import annotations

import gc
import os
import warnings

import torch

from .. import ccl
from ..hookspecs import hookimpl
from .engine import _host_us
from .harness import KiB, MiB, fmt_bytes, measure_interleaved

#: Back-to-back ops captured in one CUDA graph (per-op time = replay time / this).
GRAPH_CALLS = 20
#: The issue's target sizes (always part of the default sweep; ``--quick`` runs only these).
TARGET_SIZES = (8 * KiB, 256 * KiB, 1 * MiB, 16 * MiB, 256 * MiB)
#: Size of the host-time measurement.
HOST_BYTES = 8 * KiB
#: Messages up to this size (per rank) are checked whole on GPUs; larger ones on a slice.
FULL_CHECK_BYTES = 64 * MiB
#: Elements checked at each end of each rank's part of a larger message.
CHECK_SLICE = 1 << 18
#: Above this message size the iterations shrink in proportion (at least MIN_BIG_ITERS).
BIG_BYTES = 16 * MiB
MIN_BIG_ITERS = 5
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")

DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "half": torch.float16, "float16": torch.float16,
    "fp32": torch.float32, "float": torch.float32, "float32": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn, "e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2, "e5m2": torch.float8_e5m2, "float8_e5m2": torch.float8_e5m2,
    "int32": torch.int32, "int64": torch.int64,
}
_EPS = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10,
        torch.float8_e4m3fn: 2 ** -3, torch.float8_e5m2: 2 ** -2}
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def parse_dtype(name: str | None) -> torch.dtype:
    if not name:
        return torch.bfloat16
    try:
        return DTYPES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"--dtype {name!r}: one of {', '.join(sorted(DTYPES))}") from None


def busbw_factor(collective: str, world: int) -> float:
    """NCCL-tests' bus-bandwidth factor (applied to ``total_bytes / time``)."""
    if collective == "all_reduce":
        return 2 * (world - 1) / world
    if collective == "broadcast":
        return 1.0
    return (world - 1) / world


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"


def _attempt(ctx, fn) -> str | None:
    """Run ``fn()`` on every rank; the first rank's error (text) if any rank failed, so every
    rank takes the same branch afterwards."""
    error = None
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded in the results
        error = _error_text(exc)
    return next((e for e in ctx.bootstrap.all_gather(error) if e), None)


def _capture(ctx, fn):
    """``fn`` captured :data:`GRAPH_CALLS` times in one CUDA graph (after one call on a side
    stream, which also initializes NCCL's communicator): the replay as ``f(i)``."""
    stream = torch.cuda.Stream(device=ctx.device)
    stream.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(ctx.device).wait_stream(stream)
    torch.cuda.synchronize(ctx.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    torch.cuda.synchronize(ctx.device)
    return lambda i: graph.replay()


def _nccl_reason(ctx) -> str | None:
    """Why NCCL baselines cannot run (None: they can)."""
    if ctx.device.type != "cuda":
        return "CPU ranks: no NCCL"
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return "torch.distributed is unavailable"
    if not (dist.is_available() and dist.is_initialized()):
        return "torch.distributed is not initialized"
    backend = str(dist.get_backend())
    if "nccl" not in backend:
        return f"the default process group's backend is {backend!r}, without NCCL"
    return None


class SymmMem:
    """torch symmetric memory's one-shot / two-shot all-reduce on one buffer of the largest
    size (views of it for smaller sizes). Peer-to-peer loads and stores only: multicast is
    disabled before the allocation and no ``multimem_*`` op is used."""

    NOTE = "torch symm_mem (CUDA backend, P2P loads/stores; multicast disabled)"

    def __init__(self, ctx, numel: int, dtype: torch.dtype):
        # NVLink multicast must stay off on the shared machines; torch reads this when it maps
        # a symmetric allocation, so it is set before the first one.
        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.group = dist.group.WORLD.group_name
        try:
            symm_mem.enable_symm_mem_for_group(self.group)
        except Exception:  # noqa: BLE001 - newer torch enables groups on first use / deprecates it
            pass
        self.buf = symm_mem.empty(numel, dtype=dtype, device=ctx.device)
        self.handle = symm_mem.rendezvous(self.buf, self.group)
        self.buf.zero_()
        self.out = torch.zeros(numel, dtype=dtype, device=ctx.device)
        self._one_shot_out = getattr(torch.ops.symm_mem, "one_shot_all_reduce_out", None)

    def op(self, method: str, n: int):
        """The call of ``method`` (``symm_mem_one_shot`` / ``symm_mem_two_shot``) on ``n``
        elements (all zeros: in-place sums stay finite)."""
        inp, out, group = self.buf[:n], self.out[:n], self.group
        if method == "symm_mem_two_shot":
            return lambda: torch.ops.symm_mem.two_shot_all_reduce_(inp, "sum", group)
        if self._one_shot_out is not None:
            one = self._one_shot_out
            return lambda: one(inp, "sum", group, out=out)
        return lambda: torch.ops.symm_mem.one_shot_all_reduce(inp, "sum", group)


# ---- the collectives ----------------------------------------------------------------------------


class _Case:
    """One collective at one size: its tensors, the iris-fw and NCCL calls, the check.

    Subclasses set ``collective`` and build, in ``__init__``, the tensors timed after the
    check. ``rows``/``unit``: the layout ``[rows, unit]`` in which each rank's input part is
    picked for the reference (``_contribution``) and the output compared (``_got``)."""

    collective = ""
    reduces = False

    def __init__(self, ctx, nbytes: int, dtype: torch.dtype, full_check_elems: int):
        self.ctx, self.dtype, self.world = ctx, dtype, ctx.world_size
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.n = max(1, nbytes // self.elem)
        self.full_check_elems = full_check_elems

    # data ------------------------------------------------------------------------------------------
    def _random(self, numel: int) -> torch.Tensor:
        gen = torch.Generator(device=self.ctx.device)
        gen.manual_seed(1000 + 7919 * self.ctx.rank + numel % 7907)
        dev = self.ctx.device
        if self.dtype in (torch.int32, torch.int64):
            return torch.randint(-100, 100, (numel,), generator=gen, device=dev, dtype=self.dtype)
        if self.dtype in _FP8:
            return torch.randn(numel, generator=gen, device=dev).to(self.dtype)
        return torch.randn(numel, generator=gen, device=dev, dtype=self.dtype)

    def _pick(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        """``t`` viewed ``[rows, unit]``: all of it, or the first and last :data:`CHECK_SLICE`
        elements of each row when a row is longer than the full-check limit."""
        t = t.reshape(rows, -1)
        if t.shape[1] <= self.full_check_elems:
            return t
        k = min(CHECK_SLICE, t.shape[1] // 2)
        return torch.cat([t[:, :k], t[:, -k:]], dim=1)

    # what subclasses provide ------------------------------------------------------------------------
    total_bytes = 0

    def variants(self, algorithms: list[str]) -> list[tuple[str, str, dict]]:
        """``(method label, algorithm, options)`` of each iris-fw method."""
        return [(a, a, {}) for a in algorithms]

    def iris(self, algorithm: str, **options):  # pragma: no cover - abstract
        raise NotImplementedError

    def check_call(self, algorithm: str, **options) -> torch.Tensor:  # pragma: no cover - abstract
        """Run the method once on check tensors; the output to compare."""
        raise NotImplementedError

    def nccl(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def contribution(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Float64 expected output (picked like :meth:`got`) and, for sums, the sum of the
        magnitudes (what fp32 accumulation error scales with)."""
        raise NotImplementedError  # pragma: no cover

    def got(self, out: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def prepare_timing(self) -> None:
        """Set the timed tensors up after the checks."""

    # the check -----------------------------------------------------------------------------------
    def compare(self, got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None) -> tuple[float, bool]:
        got = got.cpu().double()
        err = (got - ref).abs()
        rel = float(err.max() / ref.abs().max().clamp_min(1e-30)) if err.numel() else 0.0
        if not self.reduces or self.dtype not in _EPS:
            return rel, bool(torch.equal(got, ref))
        tol = 2 * _EPS[self.dtype] * ref.abs() + self.world * 2 ** -23 * scale + 1e-30
        return rel, bool((err <= tol).all())


class AllReduce(_Case):
    collective, reduces = "all_reduce", True

    def __init__(self, ctx, nbytes, dtype, full_check_elems):
        super().__init__(ctx, nbytes, dtype, full_check_elems)
        self.inp = self._random(self.n)
        self.out = torch.empty_like(self.inp)  # check output, then the (zeroed) timed tensor
        self.total_bytes = self.n * self.elem

    def iris(self, algorithm):
        x, ctx = self.out, self.ctx
        return lambda: ccl.all_reduce(x, algorithm=algorithm, ctx=ctx)

    def check_call(self, algorithm):
        self.out.copy_(self.inp)
        ccl.all_reduce(self.out, algorithm=algorithm, ctx=self.ctx)
        return self.out

    def prepare_timing(self):
        self.out.zero_()  # in-place sums of zeros stay zero (no overflow over thousands of calls)

    def nccl(self):
        import torch.distributed as dist

        x = self.out
        return lambda: dist.all_reduce(x)

    def contribution(self):
        return self._pick(self.inp, 1)

    def reference(self, parts):
        wide = torch.stack([p.double() for p in parts])
        return wide.sum(0), wide.abs().sum(0)

    def got(self, out):
        return self._pick(out, 1)


class AllGather(_Case):
    collective = "all_gather"

    def __init__(self, ctx, nbytes, dtype, full_check_elems):
        super().__init__(ctx, nbytes, dtype, full_check_elems)
        self.inp = self._random(self.n)
        self.heap_inp = None
        self.out = torch.empty(self.world * self.n, dtype=dtype, device=ctx.device)
        self.total_bytes = self.world * self.n * self.elem

    def variants(self, algorithms):
        out = [(a, a, {}) for a in algorithms]
        if "pull" in algorithms:  # a heap input: peers read it in place (no staging copy)
            out.append(("pull_zero_copy", "pull", {"heap_input": True}))
        return out

    def _src(self, heap_input):
        if not heap_input:
            return self.inp
        if self.heap_inp is None:  # symmetric: the same heap offset on every rank
            self.heap_inp = self.ctx.empty(self.n, dtype=self.dtype)
            self.heap_inp.copy_(self.inp)
        return self.heap_inp

    def iris(self, algorithm, heap_input=False):
        out, src, ctx = self.out, self._src(heap_input), self.ctx
        return lambda: ccl.all_gather_into_tensor(out, src, algorithm=algorithm, ctx=ctx)

    def check_call(self, algorithm, heap_input=False):
        self.out.zero_()
        ccl.all_gather_into_tensor(self.out, self._src(heap_input), algorithm=algorithm, ctx=self.ctx)
        return self.out

    def nccl(self):
        import torch.distributed as dist

        out, inp = self.out, self.inp
        return lambda: dist.all_gather_into_tensor(out, inp)

    def contribution(self):
        return self._pick(self.inp, 1)

    def reference(self, parts):
        return torch.cat([p.double() for p in parts]), None

    def got(self, out):
        return self._pick(out, self.world)


class ReduceScatter(_Case):
    collective, reduces = "reduce_scatter", True

    def __init__(self, ctx, nbytes, dtype, full_check_elems):
        super().__init__(ctx, nbytes, dtype, full_check_elems)
        self.inp = self._random(self.world * self.n)
        self.out = torch.empty(self.n, dtype=dtype, device=ctx.device)
        self.total_bytes = self.world * self.n * self.elem

    def iris(self, algorithm):
        out, inp, ctx = self.out, self.inp, self.ctx
        return lambda: ccl.reduce_scatter_tensor(out, inp, algorithm=algorithm, ctx=ctx)

    def check_call(self, algorithm):
        self.out.zero_()
        ccl.reduce_scatter_tensor(self.out, self.inp, algorithm=algorithm, ctx=self.ctx)
        return self.out

    def nccl(self):
        import torch.distributed as dist

        out, inp = self.out, self.inp
        return lambda: dist.reduce_scatter_tensor(out, inp)

    def contribution(self):
        return self._pick(self.inp, self.world)

    def reference(self, parts):
        wide = torch.stack([p[self.ctx.rank:self.ctx.rank + 1].double() for p in parts])
        return wide.sum(0), wide.abs().sum(0)

    def got(self, out):
        return self._pick(out, 1)


class AllToAll(_Case):
    collective = "all_to_all"

    def __init__(self, ctx, nbytes, dtype, full_check_elems):
        super().__init__(ctx, nbytes, dtype, full_check_elems)
        self.total = max(self.world, self.n // self.world * self.world)  # equal splits
        self.inp = self._random(self.total)
        self.out = torch.empty(self.total, dtype=dtype, device=ctx.device)
        self.total_bytes = self.total * self.elem

    def iris(self, algorithm):
        out, inp, ctx = self.out, self.inp, self.ctx
        return lambda: ccl.all_to_all_single(out, inp, algorithm=algorithm, ctx=ctx)

    def check_call(self, algorithm):
        self.out.zero_()
        ccl.all_to_all_single(self.out, self.inp, algorithm=algorithm, ctx=self.ctx)
        return self.out

    def nccl(self):
        import torch.distributed as dist

        out, inp = self.out, self.inp
        return lambda: dist.all_to_all_single(out, inp)

    def contribution(self):
        return self._pick(self.inp, self.world)

    def reference(self, parts):
        r = self.ctx.rank
        return torch.cat([p[r:r + 1].double() for p in parts]), None

    def got(self, out):
        return self._pick(out, self.world)


class Broadcast(_Case):
    collective = "broadcast"
    root = 0

    def __init__(self, ctx, nbytes, dtype, full_check_elems):
        super().__init__(ctx, nbytes, dtype, full_check_elems)
        self.inp = self._random(self.n)
        self.out = torch.empty_like(self.inp)  # check output, then the timed tensor
        self.total_bytes = self.n * self.elem

    def iris(self, algorithm):
        x, ctx, root = self.out, self.ctx, self.root
        return lambda: ccl.broadcast(x, root, algorithm=algorithm, ctx=ctx)

    def check_call(self, algorithm):
        self.out.copy_(self.inp)
        ccl.broadcast(self.out, self.root, algorithm=algorithm, ctx=self.ctx)
        return self.out

    def nccl(self):
        import torch.distributed as dist

        x, root = self.out, self.root
        return lambda: dist.broadcast(x, src=root)

    def contribution(self):
        return self._pick(self.inp, 1)

    def reference(self, parts):
        return parts[self.root].double(), None

    def got(self, out):
        return self._pick(out, 1)


CASES = {c.collective: c for c in (AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast)}


# ---- the benchmark ------------------------------------------------------------------------------


def bench_sizes(opts) -> list[int]:
    """``--sizes`` as given; else the harness sweep plus the target sizes inside it; ``--quick``:
    the target sizes inside the sweep's range."""
    if opts.extra.get("explicit_sizes"):
        return list(opts.sizes)
    low, high = min(opts.sizes), max(opts.sizes)
    targets = [s for s in TARGET_SIZES if low <= s <= high]
    if opts.quick:
        return targets or [low]
    return sorted(set(opts.sizes) | set(targets))


def iterations(opts, nbytes: int) -> tuple[int, int]:
    """``(iters, warmup)`` at one size: the harness's up to :data:`BIG_BYTES`, fewer above
    (the per-op time is long there, and each graph replay is :data:`GRAPH_CALLS` ops)."""
    iters, warmup = opts.iters, opts.warmup
    if opts.quick:
        iters, warmup = min(iters, 10), min(warmup, 2)
    if nbytes > BIG_BYTES:
        iters = min(iters, max(MIN_BIG_ITERS, iters * BIG_BYTES // nbytes))
        warmup = min(warmup, 2)
    return iters, warmup


class CclBench:
    name = "ccl"
    description = ("iris_fw.ccl collectives x algorithms, eager and in CUDA graphs, beside NCCL and torch symm_mem "
                   "(latency, bus bandwidth, correctness)")
    plot = [
        {"x": "bytes", "y": "graph_us_per_op", "series": "method", "facet": "collective", "logy": True,
         "xlabel": "bytes per rank", "ylabel": f"us per op (CUDA graph of {GRAPH_CALLS})", "suffix": "_latency"},
        {"x": "bytes", "y": "graph_busbw_GBps", "series": "method", "facet": "collective", "logy": True,
         "xlabel": "bytes per rank", "ylabel": "bus bandwidth GB/s (CUDA graph)", "suffix": "_busbw"},
        {"x": "bytes", "y": "eager_us", "series": "method", "facet": "collective", "logy": True,
         "xlabel": "bytes per rank", "ylabel": "us per op (eager)", "suffix": "_eager_latency"},
    ]

    def run(self, ctx, opts):
        gpu = ctx.device.type == "cuda"
        dtype = parse_dtype(opts.extra.get("dtype"))
        # newer torch renames all_gather_into_tensor / reduce_scatter_tensor; the baselines keep
        # the names iris_fw.ccl mirrors
        warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use `torch\.distributed\.",
                                category=FutureWarning)
        sizes = bench_sizes(opts)
        full_check = FULL_CHECK_BYTES if gpu else 1 << 62
        elem = torch.empty((), dtype=dtype).element_size()
        self.rows, self.host_rows, self.skipped = [], [], {}
        opts.log(f"  {ctx.world_size} ranks, {dtype}, sizes {', '.join(fmt_bytes(s) for s in sizes)}; "
                 f"graphs of {GRAPH_CALLS} ops" + ("" if gpu else " (CPU: eager only)"))

        nccl_why = _nccl_reason(ctx)
        symm, symm_why = None, nccl_why and f"needs NCCL's process group on GPUs ({nccl_why})"
        if symm_why is None:
            largest = max(max(sizes), HOST_BYTES) // elem
            holder = {}
            symm_why = _attempt(ctx, lambda: holder.setdefault("s", SymmMem(ctx, largest, dtype)))
            symm = holder.get("s") if symm_why is None else None
        if symm_why:
            for m in ("symm_mem_one_shot", "symm_mem_two_shot"):
                self._skip("all_reduce", m, "torch_symm_mem", symm_why)

        self._host_times(ctx, opts, dtype, nccl_why, symm)
        for collective in COLLECTIVES:
            algorithms = ccl.algorithms(collective, ctx=ctx)
            if nccl_why:
                self._skip(collective, "nccl", "nccl", nccl_why)
            for nbytes in sizes:
                case = CASES[collective](ctx, nbytes, dtype, full_check // elem)
                self._one(ctx, opts, case, nbytes, algorithms, nccl_why is None, symm)
                del case
                self._fresh_group(ctx)
        self.rows += self.host_rows
        for (collective, method), (impl, why) in self.skipped.items():
            self.rows.append({"collective": collective, "method": method, "impl": impl, "skipped": why})
        del symm
        return self.rows

    # ------------------------------------------------------------------------------------------
    def _skip(self, collective, method, impl, why):
        if (collective, method) not in self.skipped:
            self.skipped[(collective, method)] = (impl, why)

    @staticmethod
    def _fresh_group(ctx):
        """Drop the world group (its kernel configurations' buffers) so the next size starts
        with an empty workspace; the heap reclaims it at the barrier."""
        ccl.destroy_group(ctx=ctx)
        gc.collect()
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        ctx.barrier()

    def _host_times(self, ctx, opts, dtype, nccl_why, symm):
        """Host µs per eager 8 KiB all_reduce call (enqueue only)."""
        case = AllReduce(ctx, HOST_BYTES, dtype, 1 << 62)
        case.prepare_timing()
        calls = {a: ("iris-fw", case.iris(a)) for a in ccl.algorithms("all_reduce", ctx=ctx)}
        if nccl_why is None:
            calls["nccl"] = ("nccl", case.nccl())
        if symm is not None:
            for m in ("symm_mem_one_shot", "symm_mem_two_shot"):
                calls[m] = ("torch_symm_mem", symm.op(m, case.n))
        parts = []
        for method, (impl, fn) in calls.items():
            why = _attempt(ctx, fn)
            if why:
                self._skip("all_reduce", method, impl, why)
                continue
            us = _host_us(ctx, fn)
            nbytes = case.n * case.elem
            self.host_rows.append({"collective": "all_reduce", "method": method, "impl": impl, "bytes": nbytes,
                                   "size": fmt_bytes(nbytes), "host_us": us})
            parts.append(f"{method} {us:.1f}")
        opts.log(f"  host us per eager {fmt_bytes(HOST_BYTES)} all_reduce call: {', '.join(parts)}")
        del case, calls
        self._fresh_group(ctx)

    def _check(self, ctx, case, variants) -> dict:
        """``{label: (max_rel_err, ok)}`` of each iris-fw method that ran; failures go to skipped."""
        refs = case.reference(ctx.bootstrap.all_gather(case.contribution().cpu()))
        results = {}
        for label, algorithm, options in variants:
            got = {}
            why = _attempt(ctx, lambda: got.setdefault("out", case.got(case.check_call(algorithm, **options)).cpu()))
            if why:
                self._skip(case.collective, label, "iris-fw", why)
                continue
            results[label] = case.compare(got["out"], *refs)
        return results

    def _one(self, ctx, opts, case, nbytes, algorithms, nccl, symm):
        gpu = ctx.device.type == "cuda"
        variants = [v for v in case.variants(algorithms) if (case.collective, v[0]) not in self.skipped]
        checks = self._check(ctx, case, variants)
        case.prepare_timing()
        methods = {}  # label -> (impl, eager fn, note)
        for label, algorithm, options in variants:
            if label in checks:
                note = "heap input read in place by peers" if options.get("heap_input") else ""
                methods[label] = ("iris-fw", case.iris(algorithm, **options), note)
        if nccl and (case.collective, "nccl") not in self.skipped:
            methods["nccl"] = ("nccl", case.nccl(), "torch.distributed")
        if symm is not None and case.collective == "all_reduce":
            for m in ("symm_mem_one_shot", "symm_mem_two_shot"):
                if ("all_reduce", m) not in self.skipped:
                    methods[m] = ("torch_symm_mem", symm.op(m, case.n), SymmMem.NOTE)
        fns, graphs = {}, {}
        for label, (impl, fn, _) in list(methods.items()):
            why = _attempt(ctx, fn) if impl != "iris-fw" else None  # iris-fw ran in the check
            if why:
                self._skip(case.collective, label, impl, why)
                del methods[label]
                continue
            fns[(label, "eager")] = (lambda f: lambda i: f())(fn)
            if gpu:
                holder = {}
                why = _attempt(ctx, lambda: holder.setdefault("g", _capture(ctx, fn)))
                if why:
                    self._skip(case.collective, label + " (graph)", impl, why)
                else:
                    graphs[label] = holder["g"]
                    fns[(label, "graph")] = holder["g"]
        iters, warmup = iterations(opts, nbytes)
        times = measure_interleaved(ctx, fns, iters, warmup) if fns else {}
        factor = busbw_factor(case.collective, ctx.world_size)
        msg = case.n * case.elem if case.collective != "all_to_all" else case.total * case.elem
        parts = []
        for label, (impl, _, note) in methods.items():
            eager = times.get((label, "eager"))
            graph = times.get((label, "graph"))
            graph = None if graph is None else graph / GRAPH_CALLS
            err, ok = checks.get(label, (None, None))
            row = {"collective": case.collective, "method": label, "impl": impl, "bytes": msg,
                   "size": fmt_bytes(msg), "total_bytes": case.total_bytes,
                   "dtype": str(case.dtype).removeprefix("torch."),
                   "eager_us": eager, "graph_us_per_op": graph,
                   "eager_busbw_GBps": _busbw(case.total_bytes, factor, eager),
                   "graph_busbw_GBps": _busbw(case.total_bytes, factor, graph),
                   "max_rel_err": err, "ok": ok, "iters": iters, "note": note}
            self.rows.append({k: v for k, v in row.items() if v is not None and v != ""})
            text = f"{label} {eager:.1f}" + (f"/{graph:.2f}" if graph is not None else "")
            if ok is False:
                text += f" WRONG (max rel err {err:.2e})"
            parts.append(text)
        opts.log(f"  {case.collective} {fmt_bytes(msg)} (us eager{'/graph per op' if gpu else ''}): "
                 + ", ".join(parts))
        fns.clear()
        graphs.clear()


def _busbw(total_bytes: int, factor: float, us: float | None) -> float | None:
    if not us:
        return None
    return total_bytes * factor / us / 1e3


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(CclBench())
