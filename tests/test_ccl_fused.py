"""iris_fw.ccl.all_reduce_rmsnorm: fused all-reduce + residual add + RMSNorm against float64.

Each rank draws fresh random inputs (seeds agreed per call; ``residual`` and ``weight`` the same
on every rank, as in tensor parallelism), runs several calls back to back with no host
synchronization, then checks ``out`` and the updated ``residual`` against a float64 reference,
that every rank's results are bitwise equal and that ``x`` is untouched. Ragged token counts
(1, 3, 37 — 9 under the interpreter) and hidden sizes (96: one tile per row; 2500 fp32: several
tiles, and at one token the row is split over programs; 1000). On GPUs a CUDA graph is replayed with fresh inputs.
"""

import pytest
import torch

import iris_fw

from helpers import capture_graph, fresh_seed, on_worlds
from iris_fw.engine.contract import CollectiveMismatch

ALGORITHMS = ("lamport", "one_shot")
EPS = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10}


def _draw(ctx, tokens, hidden, dtype, seed, calls):
    """``calls`` tuples ``(xs, residual, weight)``: every rank's x (``[T, H]``), the shared
    residual and weight, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(calls):
        xs = [(torch.randn(tokens, hidden, generator=g) * 4).to(dtype) for _ in range(ctx.world_size)]
        residual = (torch.randn(tokens, hidden, generator=g) * 2).to(dtype)
        weight = (1 + 0.5 * torch.randn(hidden, generator=g)).to(dtype)
        out.append((xs, residual, weight))
    return out


def _check(ctx, got_out, got_res, xs, residual, weight, eps, what):
    """``got_out`` / ``got_res`` against float64. Error bounds: the result is rounded to its
    dtype (the CPU interpreter truncates: one ulp) — twice for ``out``, which scales the rounded
    residual — plus fp32 rounding of the sum, scaled by the addends' magnitudes."""
    from iris_fw.ccl import all_reduce_rmsnorm_reference

    dtype = got_out.dtype
    want_out, want_h = all_reduce_rmsnorm_reference(None, residual, weight, eps, xs=xs)
    scale = torch.stack([x.double().abs() for x in xs]).sum(0) + residual.double().abs()
    sum_err = (len(xs) + 1) * 2 ** -23 * scale
    ulp = 2 * EPS[dtype]
    err = (got_res.cpu().double() - want_h).abs()
    tol = ulp * want_h.abs() + sum_err + 1e-30
    assert bool((err <= tol).all()), f"{what}: residual max error {err.max().item():.3g}"
    rstd = torch.rsqrt(want_h.pow(2).mean(-1, keepdim=True) + eps)
    err = (got_out.cpu().double() - want_out).abs()
    tol = (2 * ulp + 1e-5) * want_out.abs() + (ulp * want_h.abs() + sum_err) * rstd * weight.double().abs() + 1e-30
    assert bool((err <= tol).all()), f"{what}: out max error {err.max().item():.3g}, tolerance {tol.max().item():.3g}"
    for t, name in ((got_out, "out"), (got_res, "residual")):
        same = ctx.bootstrap.all_gather(t.cpu().contiguous().view(torch.uint8).clone())
        assert all(torch.equal(s, same[0]) for s in same), f"{what}: ranks' {name} differ"


def _fused_rank(ctx, algorithm, cases, calls=3):
    from iris_fw import ccl

    done = []
    for tokens, hidden, dtype in cases:
        eps = 1e-6 if dtype == torch.float32 else 1e-5
        data = _draw(ctx, tokens, hidden, dtype, fresh_seed(ctx), calls)
        dev = ctx.device
        xs = [d[0][ctx.rank].to(dev, copy=True) for d in data]
        res = [d[1].to(dev, copy=True) for d in data]
        ws = [d[2].to(dev, copy=True) for d in data]
        outs = []
        for i in range(calls):  # back to back: only the device orders the calls
            in_place = i == calls - 1
            out, r = ccl.all_reduce_rmsnorm(xs[i], res[i], ws[i], eps, algorithm=algorithm,
                                            out=xs[i] if in_place else None)
            assert r is res[i] and (out is xs[i]) == in_place
            outs.append(out)
        ctx.synchronize()
        for i in range(calls):
            what = f"{algorithm} [{tokens}, {hidden}] {dtype} call {i}"
            _check(ctx, outs[i], res[i], data[i][0], data[i][1], data[i][2], eps, what)
            if i != calls - 1:
                assert torch.equal(xs[i].cpu(), data[i][0][ctx.rank]), f"{what}: x was modified"
        done.append((tokens, hidden, str(dtype)))
    return done


def _cases():
    """Ragged ``[T, H]`` cases. The many-rows case has 37 rows on GPUs (fewer rows than programs:
    rows split over programs) and 9 under the interpreter, whose 4 programs then take 2-3 rows
    each (the path 37 rows take there, at a quarter of the interpreted rows)."""
    many = 9 if iris_fw.interpreting() else 37
    return [(3, 96, torch.float32), (many, 96, torch.bfloat16), (1, 1000, torch.bfloat16), (1, 2500, torch.float32),
            (3, 2500, torch.float32)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@on_worlds(1, 3)
def test_all_reduce_rmsnorm(world, algorithm):
    """Ragged [T, H], fp32 and bf16, three calls back to back (the last with out=x). (CPU ranks:
    W = 2 under ``-m extended``; the kernels have no branch that 2 takes and 3 does not, and
    test_all_reduce_rmsnorm_chunks runs both algorithms at 2.)"""
    cases = _cases()
    res = world.run(_fused_rank, algorithm, cases)
    assert res[0] == [(t, h, str(d)) for t, h, d in cases]


def test_all_reduce_rmsnorm_fp16_auto(iris_pool):
    """fp16 and algorithm='auto'."""
    iris_pool(2).run(_fused_rank, "auto", [(5, 96, torch.float16), (1, 2500, torch.float16)], calls=2)


def _chunked_rank(ctx, algorithm):
    """A small workspace: the rows go in several launches per call (and a row too long for it
    raises on every rank)."""
    from iris_fw import ccl
    from iris_fw.ccl import WorkspaceFull

    g = ccl.new_group(list(range(ctx.world_size)), workspace_bytes=1 << 18)
    tokens, hidden = 20, 500  # 3 launches: 8 rows (2 per program on CPU ranks), 8, then 4
    data = _draw(ctx, tokens, hidden, torch.float32, fresh_seed(ctx), 2)
    xs = [d[0][ctx.rank].to(ctx.device, copy=True) for d in data]
    res = [d[1].to(ctx.device, copy=True) for d in data]
    outs = [ccl.all_reduce_rmsnorm(x, r, d[2].to(ctx.device), group=g, algorithm=algorithm)[0]
            for x, r, d in zip(xs, res, data)]
    ctx.synchronize()
    for i, d in enumerate(data):
        _check(ctx, outs[i], res[i], d[0], d[1], d[2], 1e-6, f"{algorithm} chunked call {i}")
    long_row = torch.zeros(1, 8192, device=ctx.device)
    with pytest.raises(WorkspaceFull, match="row of 8192"):
        ccl.all_reduce_rmsnorm(long_row, long_row.clone(), torch.ones(8192, device=ctx.device), group=g,
                               algorithm=algorithm)
    ccl.destroy_group(g)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_rmsnorm_chunks(iris_pool, algorithm):
    iris_pool(2).run(_chunked_rank, algorithm)


# ---- bad input ------------------------------------------------------------------------------------


def _bad_rank(ctx, what):
    from iris_fw import ccl

    dev = ctx.device
    tokens, hidden = 2, 64
    if what == "hidden" and ctx.rank == 1:
        hidden = 65
    x = torch.ones(tokens, hidden, device=dev)
    residual = torch.ones(tokens, hidden, device=dev)
    weight = torch.ones(hidden, device=dev)
    kwargs = {}
    if what == "weight" and ctx.rank == 0:
        weight = torch.ones(hidden + 1, device=dev)
    if what == "weight_all":
        weight = torch.ones(1, hidden, device=dev)
    if what == "dtype":
        x, residual = x.int(), residual.int()
    if what == "alias":
        residual = x
    if what == "out_residual":
        kwargs["out"] = residual
    if what == "algorithm":
        kwargs["algorithm"] = "two_shot"
    with pytest.raises((CollectiveMismatch, ValueError, TypeError, KeyError)) as info:
        ccl.all_reduce_rmsnorm(x, residual, weight, **kwargs)
    # the group still works afterwards
    x, residual, weight = (torch.full((3, 40), 1.0, device=dev), torch.zeros(3, 40, device=dev),
                           torch.ones(40, device=dev))
    out, _ = ccl.all_reduce_rmsnorm(x, residual, weight)
    ctx.synchronize()
    assert torch.allclose(out.cpu(), torch.ones(3, 40)) and torch.all(residual.cpu() == ctx.world_size)
    return str(info.value)


@pytest.mark.parametrize("what", ["hidden", "weight", "weight_all", "dtype", "alias", "out_residual", "algorithm"])
def test_bad_input_raises_everywhere(iris_pool, what):
    """A bad argument on one rank (or all) raises on every rank, naming it; no hang."""
    import time

    t0 = time.monotonic()
    msgs = iris_pool(2).run(_bad_rank, what)
    assert time.monotonic() - t0 < 60
    if what == "hidden":
        assert all("'hidden'" in m and "ranks 0" in m and "ranks 1" in m for m in msgs), msgs
    if what == "weight":
        assert "weight must have shape [H] = [64]" in msgs[0] and "rank 0 rejected its arguments" in msgs[1], msgs
    if what == "weight_all":
        assert all("weight must have shape" in m for m in msgs), msgs


def _names_rank(ctx):
    from iris_fw import ccl

    return sorted(ccl.algorithms("all_reduce_rmsnorm", ctx=ctx))


def test_algorithms_registered(iris_pool):
    assert iris_pool(1).run(_names_rank)[0] == ["lamport", "one_shot"]


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------


def _graph_rank(ctx, algorithm, tokens, hidden):
    from iris_fw import ccl

    w, r, dev, dtype = ctx.world_size, ctx.rank, ctx.device, torch.bfloat16
    x = torch.empty(tokens, hidden, dtype=dtype, device=dev)
    residual = torch.empty(tokens, hidden, dtype=dtype, device=dev)
    weight = torch.empty(hidden, dtype=dtype, device=dev)
    out = torch.empty(tokens, hidden, dtype=dtype, device=dev)
    reps = 3  # back-to-back calls inside the graph, each on its own residual copy
    residuals = [torch.empty_like(residual) for _ in range(reps)]
    outs = [torch.empty_like(out) for _ in range(reps)]

    def fn():
        for i in range(reps):
            residuals[i].copy_(residual)
            ccl.all_reduce_rmsnorm(x, residuals[i], weight, out=outs[i], algorithm=algorithm)

    g = torch.Generator().manual_seed(fresh_seed(ctx))

    def draw():
        xs = [(torch.randn(tokens, hidden, generator=g) * 4).to(dtype) for _ in range(w)]
        res = (torch.randn(tokens, hidden, generator=g) * 2).to(dtype)
        wt = (1 + 0.5 * torch.randn(hidden, generator=g)).to(dtype)
        x.copy_(xs[r])
        residual.copy_(res)
        weight.copy_(wt)
        return xs, res, wt

    draw()
    graph = capture_graph(ctx, fn)  # plans and validates outside the capture
    for k in range(4):
        xs, res, wt = draw()
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        ctx.synchronize()
        for i in range(reps):
            _check(ctx, outs[i], residuals[i], xs, res, wt, 1e-6, f"graph {algorithm} replay {k} call {i}")
        ctx.barrier()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("tokens,hidden", [(1, 8192), (7, 4096), (128, 8192), (3, 16384), (33, 1000)])
def test_graph_replay(iris_pool, on_gpu, algorithm, tokens, hidden):
    """Captured once, replayed with fresh inputs: correct every time (GPU only)."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    iris_pool(2).run(_graph_rank, algorithm, tokens, hidden)
