"""Every scheduler x every pattern x world sizes 1-4, ragged and aligned shapes, against a
float64 torch reference; dtypes; the SM split; bad input; a consumer whose producer is lost."""

import math

import pytest
import torch

import iris_fw

from helpers import cpu_extended, fresh_seed, on_worlds, world_params
from iris_fw import ops
from iris_fw.gemm import GemmConfig, matmul
from iris_fw.devinfo import num_sms

PATTERNS = ["gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter"]
SCHEDULERS = ["bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized"]

#: Per-rank operand shapes ``(a, b)``; ``W`` is replaced by the world size. Ragged: M, N and K
#: divide no tile (K odd also rules TMA out); aligned: every dimension a multiple of the tiles.
SHAPES = {
    "cpu": {
        "gemm_all_scatter": {"ragged": ((37, 35), (35, 21)), "aligned": ((32, 48), (48, 32))},
        "all_gather_gemm": {"ragged": ((13, 35), (35, 21)), "aligned": ((16, 48), (48, 32))},
        "gemm_reduce_scatter": {"ragged": (("12W", 35), (35, 21)), "aligned": (("16W", 48), (48, 32))},
    },
    "cuda": {
        "gemm_all_scatter": {"ragged": ((999, 1001), (1001, 301)), "aligned": ((1024, 1024), (1024, 512))},
        "all_gather_gemm": {"ragged": ((499, 1001), (1001, 301)), "aligned": ((512, 1024), (1024, 512))},
        "gemm_reduce_scatter": {"ragged": (("300W", 1001), (1001, 301)), "aligned": (("512W", 1024), (1024, 1024))},
    },
}

#: Allowed error relative to the largest reference value: two units in the last place of the
#: output dtype (the CPU interpreter truncates fp32 -> 16-bit; partial sums round once each).
ULPS = {torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9, torch.float32: 1e-5}


def _dims(spec, world):
    return tuple(world * int(d[:-1]) if isinstance(d, str) else d for d in spec)


def _inputs(ctx, pattern, kind, dtype, seed):
    """Every rank's operands (each rank draws all of them from the shared seed)."""
    a_shape, b_shape = (_dims(s, ctx.world_size) for s in SHAPES[ctx.device.type][pattern][kind])
    out = []
    for r in range(ctx.world_size):
        g = torch.Generator().manual_seed(seed + 7919 * r)
        a = torch.randn(a_shape, generator=g).to(dtype).to(ctx.device)
        b = torch.randn(b_shape, generator=g).to(dtype).to(ctx.device)
        out.append((a, b))
    return out


def _poison(op):
    for t in op.buffers.values():
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            t.fill_(float("nan"))


def _check(got, want, dtype, what):
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    got = got.double().cpu()
    want = want.cpu()
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} elements never written (NaN poison)"
    tol = ULPS[dtype] * max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert err <= tol, f"{what}: max error {err:.4g} > {tol:.4g}"


def _run(ctx, pattern, scheduler, dtype, kinds=("ragged", "aligned"), comm_sms=None, calls=2, symmetric=False):
    for kind in kinds:
        inputs = _inputs(ctx, pattern, kind, dtype, fresh_seed(ctx))
        mine = inputs[ctx.rank]
        if symmetric:
            mine = tuple(ctx.as_symmetric(t) for t in mine)
        op = ops.plan(pattern, *mine, ctx=ctx, scheduler=scheduler, comm_sms=comm_sms)
        for call in range(calls):  # a second call with fresh inputs reuses flags (epochs) and buffers
            if call:
                inputs = _inputs(ctx, pattern, kind, dtype, fresh_seed(ctx))
                for dst, src in zip(mine, inputs[ctx.rank]):
                    dst.copy_(src)
            _poison(op)
            out = op(*mine)
            ctx.synchronize()
            want = op.pattern.reference(ctx.rank, ctx.world_size, inputs)
            _check(out, want, dtype, f"{pattern}/{op.scheduler.name} {kind} call {call} rank {ctx.rank}")
            del out
        del op
        ctx.barrier()


#: The (pattern, scheduler) pairs the default CPU run keeps at W = 3 (each pattern and each
#: scheduler at least once: the splits that are not powers of two are the pattern's, whatever the
#: schedule); at W = 1 the same pairs run with aligned shapes (but fused_sequential's: test_engine's).
_CPU_W3 = {("gemm_all_scatter", "bulk_sync"), ("all_gather_gemm", "producer_consumer"),
           ("gemm_reduce_scatter", "wg_specialized"), ("all_gather_gemm", "fused_sequential")}
#: The pairs the default CPU run keeps at W = 1 and 2 with ragged shapes: each pattern and each
#: scheduler once more, none of them a pair of ``_CPU_W3`` or of ``_ENGINE_REPLAYS``.
_CPU_W12 = {("gemm_all_scatter", "wg_specialized"), ("all_gather_gemm", "bulk_sync"),
            ("gemm_reduce_scatter", "producer_consumer")}

#: The pairs tests/test_engine.py's replay sweep runs by default on CPU ranks (its ``_CPU_REPLAYS``
#: and fused_sequential with every pattern) at W = 2, and at W = 1 under fused_sequential: ragged
#: and aligned shapes of these SHAPES, fresh inputs per call, poisoned buffers, every result
#: against the pattern's float64 reference — what a case here checks, so those cases run here
#: under ``-m extended`` on CPU ranks.
_ENGINE_REPLAYS = {("gemm_all_scatter", "producer_consumer"), ("all_gather_gemm", "wg_specialized"),
                   ("all_gather_gemm", "copy_engine"), ("gemm_reduce_scatter", "bulk_sync")} | \
    {(p, "fused_sequential") for p in PATTERNS}


def _cpu_cut(size: int, kind: str, pair: tuple, sweep: bool = True) -> bool:
    """Whether a case runs under ``-m extended`` on CPU ranks (the default run's time on CI's two
    cores): the aligned shapes of W = 2 and 3, and at W = 2 the pairs test_engine replays there
    (``_ENGINE_REPLAYS``). In the scheduler x pattern ``sweep``, the default run keeps at W = 3
    the pairs of ``_CPU_W3`` (ragged), at W = 2 those of ``_CPU_W12`` (ragged; test_engine replays
    six more there), at W = 1 those of ``_CPU_W3`` aligned and of ``_CPU_W12`` ragged (test_engine
    replays fused_sequential there, both shapes): every pair runs by default on several ranks
    with ragged shapes (the splits that are not powers of two at W = 3, the edge tiles), every
    scheduler and pattern on one rank, ragged and aligned, and at W = 3. W = 4 is extended as
    everywhere (:func:`helpers.world_params`)."""
    if not iris_fw.interpreting():
        return False
    if (size >= 2 and kind == "aligned") or (size == 2 and pair in _ENGINE_REPLAYS):
        return True
    if not sweep:
        return False
    if size == 1:
        return pair not in (_CPU_W3 if kind == "aligned" else _CPU_W12) or pair[1] == "fused_sequential"
    return pair not in _CPU_W12 if size == 2 else size == 3 and pair not in _CPU_W3


def _world_kinds(pairs=((None, None),), runs=None):
    """``(world, kind[, pattern, scheduler])`` parameters over world sizes 1-4, ragged and aligned
    shapes (and ``pairs`` of pattern and scheduler, the sweep; else ``runs``: the one pair the
    test runs), marked by :func:`_cpu_cut`."""
    out = []
    for w in world_params(1, 2, 3):
        size, marks = (w, ()) if isinstance(w, int) else (w.values[0], w.marks)
        for kind in ("ragged", "aligned"):
            for pair in pairs:
                cut = _cpu_cut(size, kind, pair) if pair[0] is not None else _cpu_cut(size, kind, runs, sweep=False)
                extra = (pytest.mark.extended,) if cut else ()
                values = (size, kind) if pair[0] is None else (size, kind, *pair)
                name = "-".join([f"w{size}", kind, *([] if pair[0] is None else pair)])
                out.append(pytest.param(*values, marks=(*marks, *extra), id=name))
    return out


@pytest.mark.parametrize("world,kind,pattern,scheduler",
                         _world_kinds([(p, s) for p in PATTERNS for s in SCHEDULERS]), indirect=["world"])
def test_scheduler_x_pattern(world, kind, pattern, scheduler):
    world.run(_run, pattern, scheduler, torch.bfloat16, kinds=(kind,))


@on_worlds(1, 2)
@pytest.mark.parametrize("pattern", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_warp_specialized(world, pattern):
    """Taxonomy #5 (the patterns with Gluon pieces). CPU ranks run its interpreter fallback (the
    two roles in turn in each program); the Gluon kernel itself is compile-checked only
    (tests/compile_matrix.py), not run here. On CPU ranks W = 3 (about 45 s) and 4 are extended."""
    world.run(_run, pattern, "warp_specialized", torch.bfloat16)


def test_warp_specialized_mma_path(monkeypatch):
    """The Gluon GEMM tile's tensor-core path: mma_v2 (measured), wgmma on request on Hopper only;
    ``IRIS_FW_GLUON_MMA`` overrides it with a known path only; a debug context on a GPU is
    refused while planning (the Gluon kernel cannot compile the pointer checks). GPU-only
    kernels: no launch here."""
    from types import SimpleNamespace

    from iris_fw import gluon_tiles as gtiles
    from iris_fw.errors import ArgumentError, EnvironmentVariableError
    from iris_fw.schedulers import warp_specialized as wsm

    # mma_v2 everywhere: measured faster than this wgmma tile on an H100 (run 34)
    assert [gtiles.mma_path(a) for a in ("sm_90", "sm_80", "sm_100", "sm_120", "cpu")] == ["mma_v2"] * 5
    assert gtiles.WGMMA_ARCHS == ("sm_90",)
    ctx = SimpleNamespace(device=torch.device("cpu"))
    assert wsm.WarpSpecialized.mma_path(ctx) == "mma_v2"
    monkeypatch.setenv("IRIS_FW_GLUON_MMA", "wgmma")
    with pytest.raises(ArgumentError, match="needs a Hopper GPU"):  # the compiler would abort elsewhere
        wsm.WarpSpecialized.mma_path(ctx)
    monkeypatch.setattr(wsm, "info", lambda device: SimpleNamespace(arch="sm_90"))
    assert wsm.WarpSpecialized.mma_path(ctx) == "wgmma"
    monkeypatch.setenv("IRIS_FW_GLUON_MMA", "auto")
    assert wsm.WarpSpecialized.mma_path(ctx) == "mma_v2"
    monkeypatch.setenv("IRIS_FW_GLUON_MMA", "tcgen05")
    with pytest.raises(EnvironmentVariableError, match="IRIS_FW_GLUON_MMA"):
        wsm.WarpSpecialized.mma_path(ctx)
    monkeypatch.delenv("IRIS_FW_GLUON_MMA")
    plan = SimpleNamespace(num_tiles=4)
    sched = wsm.WarpSpecialized()
    assert sched.grids(SimpleNamespace(device=torch.device("cpu"), debug=True), plan, None)
    with pytest.raises(ArgumentError, match="IRIS_FW_DEBUG"):
        sched.grids(SimpleNamespace(device=torch.device("cuda"), debug=True), plan, None)


def test_warp_specialized_declines_patterns_without_gluon_pieces(iris_pool):
    iris_pool(1).run(_declines, "gemm_all_scatter", "warp_specialized", "has no Gluon pieces")


def _declines(ctx, pattern, scheduler, message):
    a = torch.randn(16, 16, device=ctx.device, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as info:
        ops.plan(pattern, a, a, scheduler=scheduler)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize("world,kind", _world_kinds(runs=("all_gather_gemm", "copy_engine")), indirect=["world"])
def test_copy_engine_all_gather_gemm(world, kind):
    """The copy-engine scheduler (communicate-first patterns with copies only). (CPU ranks: W = 2
    under ``-m extended``: test_engine replays it there.)"""
    world.run(_run, "all_gather_gemm", "copy_engine", torch.bfloat16, kinds=(kind,))


# (the dtypes do not depend on the world size. CPU ranks: W = 3 under -m extended, and W = 1, where auto
# picks the library form — torch's product on CPU ranks, as test_functional_calls_deliver_without_a_copy[library] runs it)
@on_worlds(2)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_dtypes_auto_scheduler(world, pattern, dtype):
    world.run(_run, pattern, "auto", dtype, kinds=("ragged",), calls=1)


def _split_extremes(ctx, pattern, scheduler):
    sms = num_sms(ctx.device)
    for comm in (1, sms - 1):
        _run(ctx, pattern, scheduler, torch.bfloat16, kinds=("ragged",), comm_sms=comm, calls=1)


def _split_pairs():
    """Each pattern once and each scheduler with an SM split at least once on CPU ranks by default
    (the split is the scheduler's; the patterns' tiles are the same under both); the other pairs
    under ``-m extended`` there, every pair on GPUs."""
    keep = {("gemm_all_scatter", "producer_consumer"), ("all_gather_gemm", "wg_specialized"),
            ("gemm_reduce_scatter", "producer_consumer")}
    for pattern in PATTERNS:
        for scheduler in ("producer_consumer", "wg_specialized"):
            yield (pattern, scheduler) if (pattern, scheduler) in keep else \
                cpu_extended(pattern, scheduler, id=f"{pattern}-{scheduler}")


@pytest.mark.parametrize("pattern,scheduler", list(_split_pairs()))
def test_sm_split_extremes(iris_pool, pattern, scheduler):
    iris_pool(2).run(_split_extremes, pattern, scheduler)


def _symmetric_inputs(ctx, pattern):
    _run(ctx, pattern, "auto", torch.bfloat16, kinds=("aligned",), calls=1, symmetric=True)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_heap_inputs(iris_pool, pattern):
    iris_pool(2).run(_symmetric_inputs, pattern)


def _functional_api(ctx):
    seed = fresh_seed(ctx)
    for pattern, fn in (("gemm_all_scatter", ops.gemm_all_scatter), ("all_gather_gemm", ops.all_gather_gemm),
                        ("gemm_reduce_scatter", ops.gemm_reduce_scatter)):
        inputs = _inputs(ctx, pattern, "ragged", torch.bfloat16, seed)
        out = fn(*inputs[ctx.rank])
        ctx.synchronize()
        ref = ctx.registries.pattern.get(pattern).reference(ctx.rank, ctx.world_size, inputs)
        _check(out, ref, torch.bfloat16, f"ops.{pattern}")
        del out
    ctx.barrier()


def test_functional_api(iris_pool):
    iris_pool(2).run(_functional_api)


def _bad_inputs(ctx):
    dev = ctx.device
    a = torch.randn(8, 6, device=dev, dtype=torch.bfloat16)
    b = torch.randn(6, 4, device=dev, dtype=torch.bfloat16)
    cases = [
        (lambda: ops.gemm_all_scatter(a, torch.randn(5, 4, device=dev, dtype=torch.bfloat16)), "must agree on K"),
        (lambda: ops.gemm_all_scatter(a, b.float()), "b must have dtype torch.bfloat16"),
        (lambda: ops.gemm_all_scatter(a.int(), b), "a must have dtype float16, bfloat16, float32"),
        (lambda: ops.gemm_all_scatter(a[0], b), "a must have 2 dimensions"),
        (lambda: ops.gemm_all_scatter(a, "b"), "b must be a torch.Tensor"),
        (lambda: ops.gemm_reduce_scatter(torch.randn(ctx.world_size * 3 + 1, 6, device=dev, dtype=torch.bfloat16), b),
         "must divide evenly over the"),
        (lambda: ops.gemm_all_scatter(a, b, scheduler="nope"), "no scheduler named 'nope'; registered: bulk_sync"),
        (lambda: ops.gemm_all_scatter(a, b, scheduler="wg_specialized", comm_sms=0), "comm_sms must be an int in"),
        (lambda: ops.gemm_all_scatter(a, b, scheduler="fused_sequential", comm_sms=2), "comm_sms does not apply to fused_sequential"),
        (lambda: ops.gemm_all_scatter(a, b, config=(128, 128)), "config must be an iris_fw.gemm.GemmConfig"),
        (lambda: ops.gemm_all_scatter(a, b, scheduler="copy_engine"),
         "scheduler 'copy_engine' cannot run gemm_all_scatter: it runs communicate-first patterns"),
        (lambda: ops.all_gather_gemm(a, b, scheduler="copy_engine", comm_sms=4), "comm_sms does not apply to copy_engine"),
        (lambda: GemmConfig(100, 128, 64, 8, 8, 3), "GemmConfig.block_m must be a power of two"),
    ]
    cases.append((lambda: ops.plan("all_gather_gemm", a, b)(a[:4], b), "was planned for inputs"))
    for fn, message in cases:
        with pytest.raises((ValueError, TypeError, KeyError)) as info:
            fn()
        assert message in str(info.value), f"expected {message!r} in {info.value!s}"
    ctx.barrier()


def test_bad_inputs_name_the_argument(iris_pool):
    iris_pool(2).run(_bad_inputs)


def _lost_producer(ctx):
    """A consumer kernel whose producer never runs gives WaitTimeout naming the flags."""
    import iris_fw
    from iris_fw.engine.scheduler import launch_consumer

    a = torch.randn(16, 16, device=ctx.device, dtype=torch.bfloat16)
    op = ops.plan("gemm_all_scatter", a, a, scheduler="producer_consumer")
    plan = op.pattern.bind(ctx, op.buffers, a, a)
    old, ctx.wait_timeout = ctx.wait_timeout, 0.5
    try:
        launch_consumer(ctx, plan, op.workspace, sync=True, queue=False)
        with pytest.raises(iris_fw.WaitTimeout) as info:
            ctx.synchronize()
    finally:
        ctx.wait_timeout = old
    text = str(info.value)
    assert f"rank {ctx.rank}" in text and "int64" in text, text
    del op, plan
    ctx.barrier()


def test_lost_producer_times_out_naming_the_flag(iris_pool):
    iris_pool(1).run(_lost_producer)


def _consumer_first(ctx, pattern, kind):
    """``producer_consumer`` with its consumer kernel run to its end *before* its producer kernel
    starts — the interpreter runs each launch to its end in launch order, so this is the
    dispatch order that hung on one H100 under MPS (the consumer's programs resident on every SM
    before the producer had one), made certain: every item is then produced by the consumer
    program that needs it (``helps``), and the producer finds every item claimed. Without it
    the consumer waits for flags nobody sets until WaitTimeout. Two calls (the epochs and claims
    of a second call), results against float64."""
    import iris_fw.schedulers.producer_consumer as pc

    real_producer, real_consumer = pc.launch_producer, pc.launch_consumer
    launches, deferred = [], []

    def producer(*a, **k):  # deferred until the consumer has run
        launches.append(("producer", k))
        deferred.append((a, k))

    def consumer(*a, **k):
        launches.append(("consumer", k))
        real_consumer(*a, **k)
        for a2, k2 in deferred:
            real_producer(*a2, **k2)
        deferred.clear()

    pc.launch_producer, pc.launch_consumer = producer, consumer
    try:
        inputs = _inputs(ctx, pattern, kind, torch.bfloat16, fresh_seed(ctx))
        mine = inputs[ctx.rank]
        op = ops.plan(pattern, *mine, ctx=ctx, scheduler="producer_consumer")
        for call in range(2):
            if call:
                inputs = _inputs(ctx, pattern, kind, torch.bfloat16, fresh_seed(ctx))
                for dst, src in zip(mine, inputs[ctx.rank]):
                    dst.copy_(src)
            _poison(op)
            launches.clear()
            out = op(*mine)
            assert [name for name, _ in launches] == ["producer", "consumer"], launches
            kw = launches[1][1]
            assert kw["helps"] and kw["entry"] and kw["exit"], kw  # it may produce: it has the barriers
            ctx.synchronize()
            want = op.pattern.reference(ctx.rank, ctx.world_size, inputs)
            _check(out, want, torch.bfloat16, f"{pattern} consumer first, {kind} call {call} rank {ctx.rank}")
            del out
        del op
        ctx.barrier()
    finally:
        pc.launch_producer, pc.launch_consumer = real_producer, real_consumer


@pytest.mark.parametrize("kind", ["ragged", cpu_extended("aligned")])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_consumer_before_producer_makes_progress(iris_pool, pattern, kind):
    """The GPU hang of ``all_gather_gemm`` under MPS (docs/gpu-tests.md, 2026-11-25 third
    session), by construction on CPU ranks: the consumer kernel runs entirely before its producer.
    Ragged shapes (items cut by masks at every edge), and aligned ones (under ``-m extended`` on
    CPU ranks)."""
    iris_pool(2).run(_consumer_first, pattern, kind)


def _auto_choice(ctx):
    from iris_fw.engine.auto import lookup

    a = torch.randn(16, 16, device=ctx.device, dtype=torch.bfloat16)
    defaults = {"gemm_all_scatter": "fused_sequential", "all_gather_gemm": "producer_consumer",
                "gemm_reduce_scatter": "fused_sequential"}
    if ctx.world_size == 1:  # one rank: a plain GEMM, the library form (auto.json, "one_rank")
        defaults = dict.fromkeys(defaults, "library")
    for pattern, expected in defaults.items():
        op = ops.plan(pattern, a, a)
        tuned = lookup(op.pattern, op.signature, ctx)
        if ctx.device.type != "cuda":
            assert tuned.scheduler == expected
        assert (op.scheduler.name, op.comm_sms) == (tuned.scheduler, tuned.comm_sms), (pattern, op.scheduler.name)
        if tuned.config is not None:
            assert op.config == op.pattern.Config(**tuned.config), (pattern, op.config)
        del op
    ctx.barrier()


def test_auto_scheduler_choice(iris_pool):
    for w in (1, 2):
        iris_pool(w).run(_auto_choice)


#: Per pattern: local operand shapes ``(a, b)`` at world size W, chosen so that
#: ``out`` has the shape of operand ``alias`` (``out=`` that operand must still be right).
ALIAS_SHAPES = {
    "gemm_all_scatter": (lambda w: ((12, 4 * w), (4 * w, 4)), 0),  # out [12, 4W] = a
    "all_gather_gemm": (lambda w: ((6, 6 * w), (6 * w, 5)), 1),  # out [6W, 5] = b
    "gemm_reduce_scatter": (lambda w: ((4 * w, 4), (4, 7)), 1),  # out [4, 7] = b
    "gemm_all_reduce": (lambda w: ((5, 5), (5, 5)), 0),  # out [5, 5] = a
}


#: What a functional call under each schedule writes its result with: straight into ``out`` or
#: a new tensor (``library_into``, a kernel's replaced ``result_arg``, a ``finish_into``), or
#: copied out of the op's buffer (peers write it: gemm_all_scatter under a kernel schedule).
DELIVERS = {
    "library": {"gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"},
    # (gemm_all_reduce: one-shot at W <= 2, where only this rank writes its output)
    "fused_sequential": {"all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"},
    "producer_consumer": {"all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"},
    # (the patterns with Gluon pieces only; its kernel takes pointers where the plan had descriptors)
    "warp_specialized": {"all_gather_gemm", "gemm_reduce_scatter"},
}


def _delivers(ctx, scheduler):
    """Functional calls under ``scheduler`` write their result straight into ``out`` or a new
    tensor where :data:`DELIVERS` says so (no ``clone``; under ``library`` on one rank no
    ``copy_`` either, and ``all_gather_gemm`` does not copy its input; more ranks:
    ``gemm_all_reduce`` and ``gemm_reduce_scatter`` no ``copy_``, their collective or kernel
    writing the tensor), else copy it out of the op's buffer. Op buffers poisoned after each
    call, fresh inputs per call, float64 references, results that do not alias, ``out=`` an
    operand (the kernels must not write it while they read it), the torch ops of a hit counted."""
    from torch.overrides import TorchFunctionMode

    from iris_fw import callpath

    class Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    w = ctx.world_size
    fns = {"gemm_all_scatter": ops.gemm_all_scatter, "all_gather_gemm": ops.all_gather_gemm,
           "gemm_reduce_scatter": ops.gemm_reduce_scatter, "gemm_all_reduce": ops.gemm_all_reduce}
    for pattern, fn in fns.items():
        if scheduler == "warp_specialized" and ctx.registries.pattern.get(pattern).pieces.gluon is None:
            continue
        delivers = pattern in DELIVERS[scheduler]
        what = f"ops.{pattern} {scheduler}"
        ref = ctx.registries.pattern.get(pattern).reference
        shapes, alias = ALIAS_SHAPES[pattern]
        results = []
        for call in range(3):
            g = [torch.Generator().manual_seed(fresh_seed(ctx) + 7919 * r) for r in range(w)]
            inputs = [tuple(torch.randn(s, generator=g[r]) for s in shapes(w)) for r in range(w)]
            mine = tuple(t.to(ctx.device) for t in inputs[ctx.rank])
            if call == 2:  # out=: poisoned, filled and returned
                out = torch.full(tuple(mine[alias].shape), float("nan"), device=ctx.device)
                got = fn(*mine, scheduler=scheduler, out=out)
                assert got is out
            else:
                got = fn(*mine, scheduler=scheduler)
            op = callpath.state(ctx).ops.values()[-1].__self__
            assert op.scheduler.name == scheduler and op.delivers_into == delivers, (what, op.delivers_into)
            for t in op.buffers.values():  # the op's own buffers are not the result
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                    t.fill_(float("nan"))
            ctx.synchronize()
            want = ref(ctx.rank, w, inputs)
            _check(got, want, torch.float32, f"{what} call {call} W={w}")
            assert not ctx.is_symmetric(got) and got.data_ptr() != op.buffers["out"].data_ptr()
            results.append((got, want))
            ctx.barrier()  # (peers' kernels write into the buffers poisoned above: the next call first)
        assert len({r[0].data_ptr() for r in results}) == 3, pattern  # no two results alias
        for i, (got, want) in enumerate(results):  # later calls left earlier results alone
            _check(got, want, torch.float32, f"{what} result {i} after later calls")
        # a hit's torch ops: no clone of a delivered result, a copy of one in the workspace (a clone,
        # or a copy into the new tensor the call path made first to replay the call: GPUs); one
        # rank: the product alone (and the new tensor)
        with Count() as count:
            fn(*mine, scheduler=scheduler)
        if delivers:
            assert "clone" not in count.seen, (what, count.seen)
        else:
            assert "clone" in count.seen or "copy_" in count.seen, (what, count.seen)
        if w > 1 and pattern in ("gemm_all_reduce", "gemm_reduce_scatter"):
            assert "copy_" not in count.seen, (what, count.seen)
        if w == 1 and scheduler == "library":
            assert [f for f in count.seen if f in ("clone", "copy_", "matmul")] == ["matmul"], (what, count.seen)
        ctx.barrier()
        # out= sharing an operand's memory: right values (the product is not written while read)
        for which in sorted({alias} | ({0} if w == 1 and pattern != "gemm_all_scatter" else set())):
            g = [torch.Generator().manual_seed(fresh_seed(ctx) + 7919 * r) for r in range(w)]
            dims = shapes(w)
            if which == 0 and pattern != "gemm_all_scatter":  # one rank: a square a = out
                dims = ((dims[0][0], dims[1][1]), (dims[1][1], dims[1][1]))
            inputs = [tuple(torch.randn(s, generator=g[r]) for s in dims) for r in range(w)]
            want = ref(ctx.rank, w, inputs)
            mine = tuple(t.to(ctx.device) for t in inputs[ctx.rank])
            got = fn(*mine, scheduler=scheduler, out=mine[which])
            ctx.synchronize()
            assert got is mine[which]
            _check(got, want, torch.float32, f"{what} out= operand {which}, W={w}")
            ctx.barrier()
    ctx.barrier()


@pytest.mark.parametrize("scheduler", ["library", "fused_sequential", "producer_consumer",
                                       cpu_extended("warp_specialized")])
def test_functional_calls_deliver_without_a_copy(iris_pool, scheduler):
    """One rank (a plain GEMM into out= or the new tensor) and two ranks."""
    for w in (1, 2):
        iris_pool(w).run(_delivers, scheduler)


def _local_matmul(ctx):
    for (m, n, k) in ((37, 21, 35), (32, 48, 64), (1, 5, 3)):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            g = torch.Generator().manual_seed(m * n * k)
            a = torch.randn(m, k, generator=g).to(dtype).to(ctx.device)
            b = torch.randn(k, n, generator=g).to(dtype).to(ctx.device)
            out = torch.full((m, n), float("nan"), dtype=dtype, device=ctx.device)
            matmul(a, b, out=out)
            _check(out, a.double() @ b.double(), dtype, f"matmul {m}x{n}x{k} {dtype}")
            _check(matmul(a.t().contiguous().t(), b), a.double() @ b.double(), dtype, "matmul, column-major a")


def test_local_matmul(iris_pool):
    iris_pool(1).run(_local_matmul)


def test_default_split_bounds():
    from iris_fw.engine.contract import Pieces, Plan
    from iris_fw.engine.scheduler import default_comm_sms

    def plan(comm_bytes, flops, tiles=1):
        return Plan(pattern="p", pieces=Pieces(None, None, None, None), args=(), cfg=(), num_tiles=tiles, num_warps=4,
                    num_stages=1, comm_bytes=comm_bytes, flops=flops, result=None)

    assert default_comm_sms(plan(0, 10**12), 132) == 1
    assert default_comm_sms(plan(10**12, 1), 132) == 66
    mid = default_comm_sms(plan(96 << 20, 2 * 8192 * 7168 * 8192), 132)
    assert 1 < mid < 66 and mid == math.ceil((96 << 20) / (2 * 8192 * 7168 * 8192 / (132 * 5.5e12)) / 25e9)
    # nothing to move, but 2048 tiles of an 8192^3 GEMM (1.5 ms): one program cannot walk them
    # in time (1 us each), two can
    walk = 2048 * 1e-6 / (2 * 8192**3 / (132 * 5.5e12))
    assert walk > 1 and default_comm_sms(plan(0, 2 * 8192**3, tiles=2048), 132) == math.ceil(walk) == 2


def _current_context(ctx):
    """ops without ctx= use the newest open context, also after another one was closed."""
    import iris_fw
    from iris_fw import context

    assert context.current() is ctx
    with iris_fw.init(heap_size=1 << 20, transport="host_shm" if ctx.device.type == "cpu" else None) as other:
        assert context.current() is other
    assert context.current() is ctx


def test_current_context_after_another_closes(iris_pool):
    iris_pool(2).run(_current_context)


def test_default_config_counts_waves(monkeypatch):
    """The tile rule at the taxonomy's local shapes (what measured best on H200, 132 SMs) and
    with fewer programs (a two-role schedule's compute side). The measured rows of
    ``tuning/gemm.json`` are left out: they need the device's name (a CPU-only torch has none)."""
    import iris_fw.gemm
    from iris_fw.gemm import CPU_CONFIG, FP32_CONFIG, HOPPER_LARGE, HOPPER_SMALL, default_config

    monkeypatch.setattr(iris_fw.gemm, "measured_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(iris_fw.gemm, "measured_tile_order", lambda device: iris_fw.gemm.NO_TILE_ORDER)

    gpu, bf16 = torch.device("cuda"), torch.bfloat16
    expected = {(8192, 7168, 8192): HOPPER_LARGE, (4096, 2048, 8192): HOPPER_LARGE, (1024, 2048, 8192): HOPPER_SMALL,
                (8192, 1152, 36864): HOPPER_SMALL, (16384, 3584, 4096): HOPPER_LARGE, (8192, 8192, 7168): HOPPER_LARGE}
    for (m, n, k), cfg in expected.items():
        assert default_config(m, n, k, bf16, gpu, programs=132) == cfg, (m, n, k)
    # 256 wide tiles on 116 compute programs take 3 waves; 512 narrow ones take 5 (cheaper)
    assert default_config(4096, 2048, 8192, bf16, gpu, programs=116) == HOPPER_SMALL
    assert default_config(4096, 2048, 8192, torch.float32, gpu, programs=116) == FP32_CONFIG
    assert default_config(4096, 2048, 8192, bf16, torch.device("cpu")) == CPU_CONFIG
    # a measured tile order (tuning/gemm.json 'tile_order') replaces the estimate's GROUP_M
    monkeypatch.setattr(iris_fw.gemm, "measured_tile_order", lambda device: iris_fw.gemm.TileOrder(group_m=16))
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=132).group_m == 16


def test_copy_engine_chunks_ready_only_when_copied():
    """all_gather_gemm's copy steps: a chunk (row block) is declared ready only once every one
    of its rows has been copied, and all are ready after the last step (ragged shards too)."""
    import triton

    from iris_fw.plugins.all_gather_gemm import AllGatherGemm

    class Ctx:
        def __init__(self, rank, world):
            self.rank, self.world_size = rank, world

        def peer_view(self, t, r):
            return torch.arange(t.shape[0]) + r * t.shape[0]  # row numbers of rank r's shard

    for world, Ms, BM in ((1, 37, 16), (2, 64, 16), (3, 13, 16), (4, 100, 32), (4, 2048, 128)):
        M, tiles_m = Ms * world, triton.cdiv(Ms * world, BM)
        for rank in range(world):
            shift = (rank * Ms) // BM
            staged = set()
            steps = AllGatherGemm._copies(Ctx(rank, world), {}, torch.empty(Ms, 1), torch.arange(M), Ms, BM, shift)
            for step in steps:
                assert torch.equal(step.dst, step.src), "a step copies a shard's rows to the same rows of staging"
                staged.update(step.src.tolist())
                for seq in range(step.ready):
                    pm = (seq + shift) % tiles_m
                    assert set(range(pm * BM, min(M, pm * BM + BM))) <= staged, (world, Ms, rank, seq)
            assert steps[-1].ready == tiles_m and staged == set(range(M))


def _new_shard_each_call(ctx):
    """``all_gather_gemm`` under a kernel schedule with a new ``a_shard`` tensor per call (the
    plan, keyed by ``b``, is a hit): each call's ``stage_in`` copies that call's shard into the
    heap buffer peers read, not the planning input's."""
    w = ctx.world_size
    b = torch.randn(8, 5, generator=torch.Generator().manual_seed(3)).to(ctx.device)
    for call in range(2):
        shards = [torch.randn(4, 8, generator=torch.Generator().manual_seed(fresh_seed(ctx) + 7919 * r))
                  for r in range(w)]
        got = ops.all_gather_gemm(shards[ctx.rank].to(ctx.device), b, scheduler="fused_sequential")
        ctx.synchronize()
        _check(got, torch.cat(shards).double() @ b.double().cpu(), torch.float32,
               f"all_gather_gemm/fused_sequential call {call} on a new shard, W={w}")
    ctx.barrier()


def test_all_gather_gemm_new_shard_each_call(iris_pool):
    iris_pool(2).run(_new_shard_each_call)
