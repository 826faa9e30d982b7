"""GEMM + all-reduce (``iris_fw.ops.gemm_all_reduce``): every scheduler (fused in-kernel steps,
unfused step kernels, the library form) x one-shot / two-shot, world sizes 1-4, ragged shapes,
with and without bias, fresh inputs per call, against a float64 reference; dtypes; mismatches
across ranks; CUDA-graph replays (GPU)."""

import pytest
import torch

from helpers import cpu_extended, fresh_seed, on_worlds
from iris_fw import ops
from test_taxonomy import _check

#: Per-rank ``(M, K/W, N)``: ragged (no dimension a multiple of a tile; K odd rules TMA out) and
#: aligned, on the CPU interpreter and on GPUs.
SHAPES = {"cpu": {"ragged": (37, 35, 21), "aligned": (32, 48, 32)},
          "cuda": {"ragged": (999, 1001, 301), "aligned": (256, 1024, 1024)}}
FUSED = ["fused_sequential"]
UNFUSED = ["bulk_sync", "producer_consumer", "wg_specialized"]


def _inputs(ctx, kind, dtype, bias, seed):
    """Every rank's ``(a, b[, bias])`` (each rank draws all of them from the shared seed; the
    bias is the same on every rank)."""
    M, K, N = SHAPES[ctx.device.type][kind]
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(N, generator=g).to(dtype).to(ctx.device) if bias else None
    out = []
    for _ in range(ctx.world_size):
        a = torch.randn(M, K, generator=g).to(dtype).to(ctx.device)
        b = (torch.randn(K, N, generator=g) / K ** 0.5).to(dtype).to(ctx.device)
        out.append((a, b) if shared is None else (a, b, shared))
    return out


def _config(ctx, algorithm, mine):
    """The pattern's default configuration with ``algorithm`` (None: the default)."""
    from dataclasses import replace

    if algorithm is None:
        return None
    pattern = ctx.registries.pattern.get("gemm_all_reduce")
    return replace(pattern.default_config(ctx, pattern.signature(ctx, *mine)), algorithm=algorithm)


def _run(ctx, scheduler, algorithm, dtype=torch.bfloat16, kinds=("ragged", "aligned"), bias=True, calls=2):
    from iris_fw.plugins.gemm_all_reduce import GemmAllReduce

    for kind in kinds:
        inputs = _inputs(ctx, kind, dtype, bias, fresh_seed(ctx))
        mine = tuple(t.clone() for t in inputs[ctx.rank])
        op = ops.plan("gemm_all_reduce", *mine, ctx=ctx, scheduler=scheduler, config=_config(ctx, algorithm, mine))
        for call in range(calls):  # fresh inputs; buffers and device epochs reused
            if call:
                inputs = _inputs(ctx, kind, dtype, bias, fresh_seed(ctx))
                for dst, src in zip(mine, inputs[ctx.rank]):
                    dst.copy_(src)
            for t in op.buffers.values():
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                    t.fill_(float("nan"))
            out = op(*mine)
            ctx.synchronize()
            want = GemmAllReduce.reference(ctx.rank, ctx.world_size, inputs)
            _check(out, want, dtype, f"gemm_all_reduce/{op.scheduler.name}/{op.config.algorithm} {kind} call {call}")
            del out
        del op
        ctx.barrier()


@on_worlds(1, 2)  # (W = 3: test_unfused_schedules by default, this under -m extended on CPU ranks)
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_fused(world, algorithm):
    """Steps inside the persistent kernel: each program reduces its tiles once its peers' same
    programs pushed them."""
    world.run(_run, "fused_sequential", algorithm)


@pytest.mark.parametrize("scheduler,algorithm", [cpu_extended("bulk_sync", "two_shot", id="bulk_sync-two_shot"),
                                                 ("producer_consumer", "one_shot"),
                                                 cpu_extended("wg_specialized", "two_shot", id="wg_specialized-two_shot")])
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])  # (CPU ranks: 2 extended; test_fused runs 2)
def test_unfused_schedules(iris_pool, world_size, scheduler, algorithm):
    """Step 1 in a kernel of its own after the schedule's kernels."""
    iris_pool(world_size).run(_run, scheduler, algorithm, kinds=("ragged",))


@pytest.mark.extended
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
@pytest.mark.parametrize("scheduler", UNFUSED)
def test_unfused_schedules_every_world(world, scheduler, algorithm):
    world.run(_run, scheduler, algorithm)


def _library_and_auto(ctx):
    from iris_fw.plugins.gemm_all_reduce import GemmAllReduce

    _run(ctx, "library", None, kinds=("ragged",))
    _run(ctx, "auto", None, kinds=("ragged",), bias=False, calls=1)
    inputs = _inputs(ctx, "ragged", torch.float32, True, fresh_seed(ctx))
    for scheduler in ("fused_sequential", "library"):
        got = ops.gemm_all_reduce(*inputs[ctx.rank][:2], bias=inputs[ctx.rank][2], scheduler=scheduler)
        ctx.synchronize()
        _check(got, GemmAllReduce.reference(ctx.rank, ctx.world_size, inputs), torch.float32, f"ops {scheduler}")


def test_library_and_auto(iris_pool):
    """The library form (the local product + the all-reduce), and auto (the library form
    until a fused row is measured), also through the cached ``ops`` call."""
    for w in (2, 3):
        iris_pool(w).run(_library_and_auto)


def _library_delivers(ctx):
    """Functional calls under ``library`` return the result in ``out`` or a new tensor, with no
    copy (one rank: the product written there; more: the product in the op's buffer,
    all-reduced from there into it): poisoned ``out`` and op buffers, fresh inputs per call, every result
    against the float64 reference; two consecutive results are distinct tensors off the heap,
    and the second call leaves the first result as it was."""
    from iris_fw import callpath
    from iris_fw.plugins.gemm_all_reduce import GemmAllReduce

    M, K, N = SHAPES[ctx.device.type]["ragged"]
    for bias in (False, True):
        results = []
        for call in range(3):
            inputs = _inputs(ctx, "ragged", torch.float32, bias, fresh_seed(ctx))
            mine = inputs[ctx.rank]
            kwargs = dict(bias=mine[2]) if bias else {}
            if call == 2:  # out=: poisoned, filled and returned
                out = torch.full((M, N), float("nan"), device=ctx.device)
                got = ops.gemm_all_reduce(*mine[:2], scheduler="library", out=out, **kwargs)
                assert got is out
            else:
                got = ops.gemm_all_reduce(*mine[:2], scheduler="library", **kwargs)
            op = callpath.state(ctx).ops.values()[-1].__self__
            assert op.scheduler.name == "library" and op.delivers_into
            for t in op.buffers.values():  # the op's own buffers are not the result
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                    t.fill_(float("nan"))
            ctx.synchronize()
            want = GemmAllReduce.reference(ctx.rank, ctx.world_size, inputs)
            _check(got, want, torch.float32, f"library functional call {call} bias={bias} W={ctx.world_size}")
            assert not ctx.is_symmetric(got) and got.data_ptr() != op.buffers["out"].data_ptr()
            results.append((got, want))
        assert len({r[0].data_ptr() for r in results}) == 3  # no two results alias
        for i, (got, want) in enumerate(results):  # later calls left earlier results alone
            _check(got, want, torch.float32, f"library result {i} after later calls, bias={bias}")
    # out= sharing memory with an input (a [K, K] weight): written only after the product is
    # taken (copied out of the op's buffer), not multiplied into while being read
    g = torch.Generator().manual_seed(fresh_seed(ctx))
    a = [torch.randn(K, K, generator=g) for _ in range(ctx.world_size)]
    b = [(torch.randn(K, K, generator=g) / K ** 0.5) for _ in range(ctx.world_size)]
    want = sum(x.double() @ y.double() for x, y in zip(a, b))
    mine_a, mine_b = a[ctx.rank].to(ctx.device), b[ctx.rank].to(ctx.device)
    got = ops.gemm_all_reduce(mine_a, mine_b, scheduler="library", out=mine_a)
    ctx.synchronize()
    assert got is mine_a
    _check(got, want, torch.float32, f"library out= aliasing the input a, W={ctx.world_size}")
    # out= holding the bias (bias = out[0]): the sum must not overwrite the bias before it is added
    inputs = _inputs(ctx, "ragged", torch.float32, True, fresh_seed(ctx))
    mine = inputs[ctx.rank]
    out = torch.full((M, N), float("nan"), device=ctx.device)
    out[0].copy_(mine[2])
    got = ops.gemm_all_reduce(*mine[:2], bias=out[0], scheduler="library", out=out)
    ctx.synchronize()
    assert got is out
    _check(got, GemmAllReduce.reference(ctx.rank, ctx.world_size, inputs), torch.float32,
           f"library out= holding the bias, W={ctx.world_size}")
    ctx.barrier()


@pytest.mark.parametrize("world_size", [1, cpu_extended(2), 3])
def test_library_functional_call_delivers_without_a_copy(iris_pool, world_size):
    """One rank (no all-reduce) and two and three ranks (all-reduced from the op's buffer; CPU
    ranks: 2 under ``-m extended``, the same path as 3)."""
    iris_pool(world_size).run(_library_delivers)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_dtypes(iris_pool, dtype):
    iris_pool(2).run(_run, "fused_sequential", None, dtype=dtype, kinds=("ragged",), calls=1)


def _mismatch(ctx, what):
    M, K, N = SHAPES[ctx.device.type]["ragged"]
    last = ctx.rank == ctx.world_size - 1
    a = torch.randn(M, K + (1 if what == "K" and last else 0), device=ctx.device)
    b = torch.randn(a.shape[1], N + (3 if what == "N" and last else 0), device=ctx.device)
    bias = None if what == "bias" and last else torch.randn(b.shape[1], device=ctx.device)
    if what == "bias_shape" and last:
        bias = torch.randn(N + 1, device=ctx.device)
    with pytest.raises(ValueError) as err:
        ops.gemm_all_reduce(a, b, bias=bias, scheduler="fused_sequential")
    text = str(err.value)
    assert str(ctx.world_size - 1) in text, text
    return text


@pytest.mark.parametrize("what", ["K", "N", "bias", "bias_shape"])
def test_mismatch_raises_everywhere(iris_pool, what):
    """Ranks disagreeing on a shape, or one passing a bias the others do not (or a bias of the
    wrong length), raise on every rank naming the rank."""
    iris_pool(3).run(_mismatch, what)


def _graph(ctx, algorithm, scheduler):
    from iris_fw.plugins.gemm_all_reduce import GemmAllReduce

    inputs = _inputs(ctx, "ragged", torch.bfloat16, True, fresh_seed(ctx))
    mine = tuple(t.clone() for t in inputs[ctx.rank])
    op = ops.plan("gemm_all_reduce", *mine, ctx=ctx, scheduler=scheduler, config=_config(ctx, algorithm, mine))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(*mine)
    torch.cuda.current_stream().wait_stream(s)
    ctx.synchronize()
    ctx.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(*mine)
    for replay in range(4):  # fresh inputs before every replay, no host synchronization between replays
        inputs = _inputs(ctx, "ragged", torch.bfloat16, True, fresh_seed(ctx))
        for dst, src in zip(mine, inputs[ctx.rank]):
            dst.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        ctx.synchronize()
        _check(out, GemmAllReduce.reference(ctx.rank, ctx.world_size, inputs), torch.bfloat16,
               f"{scheduler}/{algorithm} graph replay {replay}")
        ctx.barrier()
    del g, op, out


@pytest.mark.parametrize("scheduler,algorithm", [("fused_sequential", "one_shot"), ("fused_sequential", "two_shot"),
                                                 ("producer_consumer", "two_shot"), ("library", None)])
def test_graph_replay(iris_pool, on_gpu, scheduler, algorithm):
    """A captured call replayed with fresh inputs (device-side epochs, no host integers)."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    iris_pool(2).run(_graph, algorithm, scheduler)
