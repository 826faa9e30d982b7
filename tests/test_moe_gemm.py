"""iris_fw.ops.moe_dispatch_gemm / moe_gemm_combine (the fused expert GEMMs) against float64.

Every rank draws the whole problem (every rank's tokens, routing, weights and expert weights)
from a seed agreed per call, as tests/test_moe.py does. The dispatch part is checked as there
(counts, overflow, every received row); ``y [L, C, N]`` row by row against the float64 product
of the received (dequantized) row and the expert's weight; ``h = silu(y)`` with the rows past the
counts poisoned (NaN: the GEMM → combine must not read them) goes through ``moe_gemm_combine``
into a NaN-poisoned ``out``, checked against the float64 weighted sum of ``h_row @ w2[e]`` over
the rows not dropped (gathered from every rank) and, where nothing is dropped or quantized,
against :func:`iris_fw.moe_gemm.moe_gemm_reference` end to end. Routings: uniform, skewed, empty
experts and a rank without tokens, top-1/2/8, ragged hidden and N, overflow; both dispatch modes;
bf16, fp16 and fp8; both schedules. On GPUs the sizes grow and a CUDA graph replays with fresh
routing.
"""

import time

import pytest
import torch

from helpers import (assert_peers_fail_at_once, boom, capture_graph, cpu_extended, fresh_seed, on_worlds, peer_fails,
                     world_params)
from iris_fw.engine.contract import CollectiveMismatch
from iris_fw.errors import ArgumentError
from test_moe import FP8, _case, check_dispatch, draw, fails_then_works, small_routing


def _expert_weights(seed, case, world):
    """Every rank's ``w1 [L, H, N]`` and ``w2 [L, N, H]`` (x's dtype), scaled to keep |y| ~ |x|."""
    g = torch.Generator().manual_seed(seed + 7)
    local, hidden, n = case["experts"] // world, case["hidden"], case["n"]
    dt = case.get("x_dtype", torch.bfloat16)
    w1 = [(torch.randn(local, hidden, n, generator=g) / hidden ** 0.5).to(dt) for _ in range(world)]
    w2 = [(torch.randn(local, n, hidden, generator=g) / n ** 0.5).to(dt) for _ in range(world)]
    return w1, w2


def _silu(v):
    return torch.nn.functional.silu(v)


def check_y(d, rows, w1, case, rank, world):
    """``y[l, s]`` against float64 ``row @ w1[rank][l]`` for the received rows (``rows`` from
    check_dispatch, dequantized)."""
    local = case["experts"] // world
    src_r, src_t, src_k = (s.cpu() for s in d.handle.sources())
    y = d.y.cpu().double()
    counts = d.counts.cpu().tolist()
    for l in range(local):  # one float64 product per expert (a loop of rows is slow on a busy host)
        if counts[l] == 0:
            continue
        w = w1[rank][l].double()
        got = torch.stack([rows[(int(src_r[l, s]), int(src_t[l, s]), int(src_k[l, s]))] for s in range(counts[l])])
        want = got @ w
        tol = 2 ** -7 * (got.abs() @ w.abs()) + 1e-5
        err = (y[l, :counts[l]] - want).abs()
        bad = ~(err <= tol)
        assert not bool(bad.any()), (f"y[{l}]: {int(bad.any(dim=1).sum())} of {counts[l]} rows wrong, max error "
                                     f"{float(err.nan_to_num(float('inf')).max()):.3g}")


def hidden_rows(d, case, rank, world):
    """``h = silu(y)`` in x's dtype, NaN past the counts."""
    h = _silu(d.y.float()).to(d.y.dtype)
    live = torch.arange(h.shape[1], device=h.device)[None, :] < d.counts[:, None]
    return torch.where(live[:, :, None], h, torch.full_like(h, float("nan")))


def check_out(ctx, got, d, h, w2, xs, idxs, ws, case):
    """``got [T, H]`` against float64 ``sum_k w[t, k] * h_row(t, k) @ w2[e_k]`` over the rows
    not dropped (every expert's h rows gathered from their ranks)."""
    r, w = ctx.rank, ctx.world_size
    local = case["experts"] // w
    src_r, src_t, src_k = (s.cpu() for s in d.handle.sources())
    counts = d.counts.cpu().tolist()
    mine = {}
    hc = h.cpu().double()
    for l in range(local):
        for s in range(counts[l]):
            # a clone: pickling a view sends its whole storage ([L, C, N] doubles) once per row
            mine[(int(src_r[l, s]), int(src_t[l, s]), int(src_k[l, s]))] = hc[l, s].clone()
    everyone = {}
    for part in ctx.bootstrap.all_gather(mine):
        everyone.update(part)
    slot = d.handle.src_slot.cpu()
    want = torch.zeros(xs[r].shape, dtype=torch.float64)
    bound = torch.zeros(xs[r].shape, dtype=torch.float64)
    groups = {}  # (owner, l) -> the token, weight and h row of each of this rank's (t, k) it computed
    for t in range(xs[r].shape[0]):
        for k in range(case["topk"]):
            e = int(idxs[r][t, k])
            if e < 0 or int(slot[t, k]) < 0:
                assert (r, t, k) not in everyone
                continue
            groups.setdefault(divmod(e, local), []).append((t, float(ws[r][t, k]), everyone[(r, t, k)]))
    for (owner, l), got_rows in groups.items():  # one float64 product per expert
        wt = w2[owner][l].double()
        ts = torch.tensor([t for t, _, _ in got_rows])
        gate = torch.tensor([g for _, g, _ in got_rows], dtype=torch.float64)[:, None]
        hs = torch.stack([row for _, _, row in got_rows])
        want.index_add_(0, ts, gate * (hs @ wt))
        bound.index_add_(0, ts, gate.abs() * (hs.abs() @ wt.abs()))
    err = (got.cpu().double() - want).abs()
    tol = 2 ** -6 * bound + 1e-5
    bad = ~(err <= tol)
    assert not bool(bad.any()), (f"moe_gemm_combine: {int(bad.sum())} of {bad.numel()} wrong, max error "
                                 f"{float(err.nan_to_num(float('inf')).max()):.3g}")
    return want, bound


def _run_case(ctx, case, calls=1):
    from iris_fw.moe_gemm import moe_gemm_reference
    from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    capacity = case.get("capacity")
    for _ in range(calls):
        seed = fresh_seed(ctx)
        xs, idxs, ws = draw(ctx, seed, case)
        w1, w2 = _expert_weights(seed, case, w)
        x, idx, wt = xs[r].to(dev), idxs[r].to(dev), ws[r].to(dev)
        d = moe_dispatch_gemm(x, idx, wt, w1[r].to(dev), case["experts"], max_tokens_per_rank=case["max_tokens"],
                              capacity=capacity, dtype=case.get("dtype"), mode=case["mode"],
                              schedule=case.get("schedule", "auto"))
        ctx.synchronize()
        rows = check_dispatch(ctx, d, xs, idxs, case, capacity or case["max_tokens"] * w)
        check_y(d, rows, w1, case, r, w)
        h = hidden_rows(d, case, r, w)
        out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=dev)
        got = moe_gemm_combine(h, w2[r].to(dev), d.handle, out=out)
        assert got is out
        ctx.synchronize()
        _, bound = check_out(ctx, got, d, h, w2, xs, idxs, ws, case)
        if capacity is None and case.get("dtype") is None:  # end to end: float64 all the way
            # h went through the x dtype (y and silu rounded): its few units in the last place,
            # times sum |w| |h| |w2| (the bound of the combine check), not |want|, which cancels
            want = moe_gemm_reference(xs, idxs, ws, w1, w2, case["experts"], act=_silu)[r]
            err = (got.cpu().double() - want).abs()
            assert bool((err <= 2 ** -5 * bound + 1e-3).all()), float(err.max())
    return case["name"]


def _gcase(name, mode, kind="uniform", n=24, **kw):
    c = _case(name, mode, kind, **kw)
    c["n"] = n
    return c


CASES = {
    "uniform_ll": _gcase("uniform_ll", "low_latency", hidden=40, n=24),
    "uniform_tp_bulk": _gcase("uniform_tp_bulk", "throughput", hidden=33, n=17, topk=1, schedule="bulk_sync"),
    "skewed_ll_fp8": _gcase("skewed_ll_fp8", "low_latency", "skewed", hidden=136, n=20, dtype=FP8),
    "sparse_tp_empty_rank": _gcase("sparse_tp_empty_rank", "throughput", "sparse", hidden=24, n=40,
                                   tokens=lambda r: 0 if r == 1 else 3),
    "top8_ll": _gcase("top8_ll", "low_latency", topk=8, per_rank=4, hidden=24, n=16, tokens=lambda r: 2,
                      max_tokens=3),
    "overflow_ll_fp16": _gcase("overflow_ll_fp16", "low_latency", "skewed", capacity=2, tokens=lambda r: 3,
                               x_dtype=torch.float16, hidden=20, n=18),
    "overflow_tp_fp8": _gcase("overflow_tp_fp8", "throughput", "skewed", capacity=1, tokens=lambda r: 2, hidden=130,
                              n=16, dtype=FP8),
    "top8_tp_pc": _gcase("top8_tp_pc", "throughput", topk=8, per_rank=3, hidden=24, n=20, tokens=lambda r: 2,
                         max_tokens=2, schedule="producer_consumer"),
}

#: CPU default run per world size (the interpreter's cost kept small); GPUs and -m extended run all.
_CPU_RUNS = {1: ["uniform_ll", "uniform_tp_bulk"],
             2: ["skewed_ll_fp8", "overflow_tp_fp8", "top8_ll"],
             3: ["sparse_tp_empty_rank", "overflow_ll_fp16"],
             4: ["top8_tp_pc"]}


def _cases_rank(ctx, names, calls=1):
    done = []
    for i, name in enumerate(names):
        case = dict(CASES[name])
        w = ctx.world_size
        case["experts"] = case["per_rank"] * w
        case["topk"] = min(case["topk"], case["experts"])
        if ctx.device.type != "cpu":  # bigger on GPUs
            case["hidden"] = case["hidden"] * 31 + 1
            case["n"] = case["n"] * 17 + 3
            case["tokens"] = (lambda f: (lambda r: 16 * f(r) + 3 * (f(r) > 0)))(case["tokens"])
            case["max_tokens"] = 16 * case["max_tokens"] + 3
        done.append(_run_case(ctx, case, calls + (i == 0)))
    return done


@on_worlds(1, 3)
def test_moe_gemm(world, on_gpu):
    """The fused GEMMs, every value checked; the first case twice (the plan reused, fresh routing)."""
    names = list(CASES) if on_gpu else _CPU_RUNS[world.world_size]
    assert world.run(_cases_rank, names)[0] == names


@pytest.mark.extended
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_moe_gemm_all_cases(iris_pool, world_size):
    iris_pool(world_size).run(_cases_rank, list(CASES), calls=2)


def test_tile_config_table(monkeypatch):
    """Tiles are data (iris_fw/tuning/moe_gemm.json): block_m by the mean rows per expert, the first
    row whose bound holds; block_k must divide an fp8 scale group."""
    import torch

    from iris_fw import moe_gemm

    cpu = torch.device("cpu")
    assert moe_gemm.tile_config(cpu, 3).block_m == 16 and moe_gemm.FP8_GROUP % moe_gemm.tile_config(cpu).block_k == 0
    row = dict(block_n=16, block_k=16, num_warps=4, num_stages=1, dispatch_programs=2)
    table = {"defaults": {"cpu": dict(row, block_m=[[8, 16], [32, 32], [None, 64]])}, "devices": {}}
    monkeypatch.setattr(moe_gemm, "_table", lambda: table)
    assert [moe_gemm.tile_config(cpu, m).block_m for m in (1, 8, 9, 32, 33, None)] == [16, 16, 32, 32, 64, 64]
    table["defaults"]["cpu"]["block_k"] = 48
    with pytest.raises(ValueError, match="must divide 128"):
        moe_gemm.tile_config(cpu)


# ---- bad input ------------------------------------------------------------------------------------


def _bad_rank(ctx):
    """Bad or mismatched weights, h and a stale handle raise on every rank, naming the argument;
    the ranks work together afterwards."""
    from iris_fw.ops import moe_combine, moe_dispatch, moe_dispatch_gemm, moe_gemm_combine

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    x = torch.randn(3, 16, device=dev).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [1, 2]], device=dev)
    wt = torch.rand(3, 2, device=dev)
    experts, local = 2 * w, 2
    kw = dict(max_tokens_per_rank=4)
    w1 = torch.randn(local, 16, 8, device=dev).to(torch.bfloat16)
    msgs = {}
    with pytest.raises((ArgumentError, CollectiveMismatch)) as info:  # N differs between the ranks
        moe_dispatch_gemm(x, idx, wt, w1[:, :, :4 + 4 * r], experts, **kw)
    msgs["n"] = str(info.value)
    with pytest.raises((ArgumentError, CollectiveMismatch)) as info:  # wrong hidden on rank 1
        moe_dispatch_gemm(x, idx, wt, torch.zeros(local, 15 + r, 8, dtype=torch.bfloat16, device=dev), experts, **kw)
    msgs["weight"] = str(info.value)
    d1 = moe_dispatch_gemm(x, idx, wt, w1, experts, **kw)
    d2 = moe_dispatch_gemm(x, idx, wt, w1, experts, **kw)
    w2 = torch.randn(local, 8, 16, device=dev).to(torch.bfloat16)
    with pytest.raises((ArgumentError, CollectiveMismatch)) as info:
        moe_gemm_combine(d1.y, w2, d1.handle)
    msgs["stale"] = str(info.value)
    with pytest.raises((ArgumentError, CollectiveMismatch)) as info:
        moe_gemm_combine(d2.y, w2.float() if r == 0 else w2, d2.handle)
    msgs["w2"] = str(info.value)
    got = moe_gemm_combine(d2.y, w2, d2.handle)
    ctx.synchronize()
    assert got.shape == (3, 16) and bool(torch.isfinite(got).all())
    # a plain dispatch's handle, with an identity weight: moe_gemm_combine is moe_combine — bit for bit in
    # low_latency (the same rows, the same reduction), within bf16 rounding in throughput (whose combine sums
    # per expert rank first; the GEMM -> combine gets its own [T, K, H] buffer there)
    eye = torch.eye(16, device=dev).to(torch.bfloat16).expand(local, 16, 16)
    want = (x.double() * wt.double().sum(1, keepdim=True)).cpu()
    for mode in ("low_latency", "throughput"):
        d = moe_dispatch(x, idx, wt, experts, mode=mode, **kw)
        fused = moe_gemm_combine(d.x, eye, d.handle)
        plain = moe_combine(d.x, d.handle)
        ctx.synchronize()
        assert torch.allclose(fused.cpu().double(), want, rtol=2 ** -6, atol=1e-6), (mode, fused, want)
        assert mode == "throughput" or torch.equal(fused.cpu(), plain.cpu()), (fused, plain)
    return msgs


def test_bad_input_raises_everywhere(iris_pool):
    runs = iris_pool(2).run(_bad_rank)
    for m in (run["n"] for run in runs):
        assert "weight N (weight.shape[2])" in m, runs
    assert "weight must be a [2, 16, 8]" in runs[0]["weight"] and "rank 0 rejected" in runs[1]["weight"], runs
    assert all("overwritten by dispatch #2" in run["stale"] for run in runs), runs
    assert "weight must be a [2, 8, 16]" in runs[0]["w2"] and "rank 0 rejected" in runs[1]["w2"], runs


# ---- a host failure inside the launch of a cached call -------------------------------------------


def _launch_fails(ctx, op):
    """Rank W-1 raises on its host inside the launch of a repeated (cached) moe_dispatch_gemm +
    moe_gemm_combine — ``op`` ``"dispatch_gemm"``: the GEMM's launch, after its dispatch ran;
    ``"gemm_combine"``: the GEMM → combine's launch — after the ranks agreed on the call: every
    peer raises PeerFailure naming that rank at once (:func:`helpers.peer_fails`). After the
    re-arming barrier the ranks work on: a call's values against float64 (identity experts times
    2: ``out[t] = 2 x[t] sum_k w[t, k]``)."""
    from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

    x, idx, wt, experts = small_routing(ctx, 8765)
    hidden, local = x.shape[1], 2
    w1 = torch.eye(hidden, device=ctx.device).to(torch.bfloat16).expand(local, hidden, hidden)
    w2 = (2 * w1).contiguous()
    made = {}

    def call(bad):
        d = moe_dispatch_gemm(x, idx, wt, w1, experts, max_tokens_per_rank=4)
        made["plan"] = d.handle.plan
        return moe_gemm_combine(d.y, w2, d.handle)

    def inject(mp):
        calls = made["plan"].gemm_calls if op == "dispatch_gemm" else made["plan"].gemm_combines
        mp.setattr(calls.values()[0], "launch", boom)  # the call's cached entry: its GEMM launcher

    return fails_then_works(ctx, call, inject, "launch", x, wt)


@pytest.mark.parametrize("op", ["dispatch_gemm", "gemm_combine"])
@pytest.mark.parametrize("world_size", world_params(2)[1:3])  # CPU ranks: 3 under -m extended
def test_a_host_failure_in_a_launch_fails_every_peer_at_once(iris_pool, world_size, op):
    results = iris_pool(world_size).run(_launch_fails, op)
    assert_peers_fail_at_once(results, "injected host failure")


# ---- a host failure while planning ----------------------------------------------------------------


def _plan_fails(ctx, where):
    """Rank W-1 raises on its host while it makes a plan, after the ranks agreed on the call and
    after its buffers were allocated, before the allocation barrier its peers wait in —
    ``where`` ``"dispatch_gemm"``: the fused dispatch's MoePlan of a new shape class;
    ``"gemm_combine"``: that plan's GEMM -> combine state (made by its first moe_gemm_combine):
    every peer raises PeerFailure naming that rank at once (:func:`helpers.peer_fails`). After
    the re-arming barrier the ranks work on."""
    from iris_fw import moe as moe_module
    from iris_fw import moe_gemm
    from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

    x, idx, wt, experts = small_routing(ctx, 9753)
    hidden, local = x.shape[1], 2
    w1 = torch.eye(hidden, device=ctx.device).to(torch.bfloat16).expand(local, hidden, hidden)
    w2 = (2 * w1).contiguous()
    calls = [0]

    def call(bad):
        calls[0] += 1
        # the third call (the failing one) and later ones: a shape class of its own, planned anew
        d = moe_dispatch_gemm(x, idx, wt, w1, experts, max_tokens_per_rank=4 if calls[0] <= 2 else 5)
        return moe_gemm_combine(d.y, w2, d.handle)

    def inject(mp):
        if where == "dispatch_gemm":
            mp.setattr(moe_module, "KernelLauncher", boom)  # the MoePlan's launchers, made after its buffers
            return
        real = moe_gemm.KernelLauncher

        def launcher(kernel, *args, **kwargs):  # the GEMM -> combine state's, made after its buffers
            if kernel is moe_module._combine_reduce_kernel:
                boom()
            return real(kernel, *args, **kwargs)

        mp.setattr(moe_gemm, "KernelLauncher", launcher)

    return fails_then_works(ctx, call, inject, "plan", x, wt)


@pytest.mark.parametrize("where", ["dispatch_gemm", "gemm_combine"])
@pytest.mark.parametrize("world_size", world_params(2)[1:3])  # CPU ranks: 3 under -m extended
def test_a_host_failure_while_planning_fails_every_peer_at_once(iris_pool, world_size, where):
    results = iris_pool(world_size).run(_plan_fails, where)
    assert_peers_fail_at_once(results, "injected host failure")


# ---- schedule= ------------------------------------------------------------------------------------

_SCHEDULE_ERROR = "schedule must be 'auto' or one of ('producer_consumer', 'bulk_sync')"


def _schedule_case(ctx):
    """One rank's call data for the schedule tests: ``call(schedule, max_tokens)`` makes a
    moe_dispatch_gemm + moe_gemm_combine (identity experts times 2; ``max_tokens`` picks the shape
    class) and returns its output; ``want`` its value. (A hidden size no other test of the pooled
    ranks uses: their cached plans are not these.)"""
    from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    gen = torch.Generator().manual_seed(1357 + r)
    tokens, experts, hidden, local = 2, 2 * w, 20, 2
    x = torch.randn(tokens, hidden, generator=gen).to(dev, torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(tokens)]).to(dev)
    wt = torch.rand(tokens, 2, generator=gen).to(dev)
    w1 = torch.eye(hidden, device=dev).to(torch.bfloat16).expand(local, hidden, hidden)
    w2 = (2 * w1).contiguous()

    def call(schedule, max_tokens=2):
        d = moe_dispatch_gemm(x, idx, wt, w1, experts, max_tokens_per_rank=max_tokens, schedule=schedule)
        return moe_gemm_combine(d.y, w2, d.handle)

    return call, 2 * x.double() * wt.double().sum(1, keepdim=True)


def _bad_schedule_rank(ctx):
    """A bad ``schedule=`` raises a ValueError naming ``schedule`` and the accepted values on every
    rank: on a first call (a shape class without a plan) through the validation exchange —
    passed by one rank (its peers: a CollectiveMismatch naming it) or by every rank (the same
    error everywhere, nothing aborted) —; on a cached call passed by every rank, the same error
    everywhere (each rank aborts the job: its peers could be in the call; ``ctx.barrier()``
    re-arms it). The ranks work on after each."""
    call, want = _schedule_case(ctx)
    r = ctx.rank
    got = {}
    # (each case a shape class of its own: the check after each caches its plan)
    for what, schedule, max_tokens in (("first_one", "bogus" if r == 1 else "auto", 3), ("first_all", "eager", 4),
                                       ("cached_all", None, 5)):
        if what == "cached_all":
            call("auto", max_tokens)  # planned and cached on every rank
            ctx.synchronize()
        with pytest.raises(ValueError) as info:
            call(schedule, max_tokens)
        got[what] = (type(info.value).__name__, str(info.value))
        if what == "cached_all":
            ctx.barrier()  # re-arms the job
        out = call("auto", max_tokens)
        ctx.synchronize()
        torch.testing.assert_close(out.double(), want, rtol=2 ** -6, atol=1e-6)
    return got


def test_bad_schedule_raises_everywhere(iris_pool):
    runs = iris_pool(2).run(_bad_schedule_rank)
    (kind0, first0), (kind1, first1) = runs[0]["first_one"], runs[1]["first_one"]
    assert kind1 == "ArgumentError" and f"{_SCHEDULE_ERROR}, got 'bogus'" in first1, runs
    assert kind0 == "CollectiveMismatch" and "rank 1 rejected its arguments" in first0, runs
    assert f"{_SCHEDULE_ERROR}, got 'bogus'" in first0, runs
    for what, bad in (("first_all", "'eager'"), ("cached_all", "None")):
        want = ("ArgumentError", f"moe_dispatch_gemm: {_SCHEDULE_ERROR}, got {bad}")
        assert runs[0][what] == runs[1][what] == want, runs


def _cached_bad_schedule(ctx):
    """A bad ``schedule=`` on rank W-1 only, at a cached call (its peers on the cached path, in
    the call's kernels): rank W-1 raises the ValueError, its peers PeerFailure naming it and the
    error, at once (:func:`helpers.peer_fails`); the ranks work on after the re-arming barrier."""
    call, want = _schedule_case(ctx)
    results = peer_fails(ctx, lambda bad: call("bogus" if bad else "auto"), None, "argument")
    out = call("auto")
    ctx.synchronize()
    torch.testing.assert_close(out.double(), want, rtol=2 ** -6, atol=1e-6)
    return results


@pytest.mark.parametrize("world_size", world_params(2)[1:3])  # CPU ranks: 3 under -m extended
def test_a_bad_schedule_on_a_cached_call_fails_every_peer_at_once(iris_pool, world_size):
    results = iris_pool(world_size).run(_cached_bad_schedule)
    assert_peers_fail_at_once(results, _SCHEDULE_ERROR)


# ---- two I sizes and two plans alternating ------------------------------------------------------


#: (max_tokens_per_rank, I) per call: two plans (two shape classes) alive at once, each alternating two I.
_ALTERNATING = [(4, 8), (4, 24), (5, 8), (5, 24), (4, 8), (4, 24), (5, 24)]


def _alternating_rank(ctx, mode):
    """moe_gemm_combine with two intermediate sizes I alternating on each of two plans alive at
    once, rank 1 entering every GEMM -> combine 0.5 s after rank 0: every call's values are
    right on every rank. (A plan's GEMM -> combine barrier slots once had an epoch counter per
    I: a call of the second I passed its barriers at once on rank 1's arrivals from the first
    I's call, and rank 0 summed rank 1's stale rows.) ``h = [x, 0]`` and ``weight = scale(I) *
    [eye; noise]``: ``out[t] = scale(I) * x[t] * sum_k w[t, k]``."""
    from iris_fw.ops import moe_dispatch, moe_gemm_combine

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    gen = torch.Generator().manual_seed(2468 + r)
    tokens, experts, hidden, local = 3, 2 * w, 8, 2
    x = torch.randn(tokens, hidden, generator=gen).to(dev, torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(tokens)]).to(dev)
    wt = torch.rand(tokens, 2, generator=gen).to(dev)
    scale = {8: 2.0, 24: 3.0}
    plans = set()
    for max_tokens, i_dim in _ALTERNATING:
        d = moe_dispatch(x, idx, wt, experts, max_tokens_per_rank=max_tokens, mode=mode)
        plans.add(id(d.handle.plan))
        h = torch.zeros(local, d.x.shape[1], i_dim, dtype=torch.bfloat16, device=dev)
        h[:, :, :hidden] = d.x
        weight = torch.randn(local, i_dim, hidden, generator=gen).to(dev, torch.bfloat16)  # rows past H: h is 0
        weight[:, :hidden, :] = scale[i_dim] * torch.eye(hidden, device=dev).to(torch.bfloat16)
        if r == 1:
            time.sleep(0.5)  # CPU ranks launch on the host: rank 0 is in the call long before rank 1
        out = moe_gemm_combine(h, weight, d.handle)
        ctx.synchronize()
        want = scale[i_dim] * x.double() * wt.double().sum(1, keepdim=True)
        torch.testing.assert_close(out.double().cpu(), want.cpu(), rtol=2 ** -6, atol=1e-6,
                                   msg=lambda m, c=(max_tokens, i_dim): f"call {c} on rank {r}: {m}")
    assert len(plans) == 2
    return True


@pytest.mark.parametrize("mode", ["low_latency", cpu_extended("throughput")])
def test_two_sizes_alternating(iris_pool, mode):
    assert iris_pool(2).run(_alternating_rank, mode) == [True, True]


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------


def _graph_rank(ctx, mode, fp8):
    from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    case = dict(name="graph", mode=mode, kind="uniform", hidden=7168 // 4, n=512 + 48, topk=4, experts=8 * w,
                tokens=lambda p: 64, max_tokens=64, dtype=FP8 if fp8 else None)
    seed = fresh_seed(ctx)
    xs, idxs, ws = draw(ctx, seed, case)
    w1, w2 = _expert_weights(seed, case, w)
    x, idx, wt = xs[r].to(dev), idxs[r].to(dev), ws[r].to(dev)
    w1d, w2d = w1[r].to(dev), w2[r].to(dev)
    out = torch.empty_like(x)
    state = {}

    def step():
        d = moe_dispatch_gemm(x, idx, wt, w1d, case["experts"], max_tokens_per_rank=64, dtype=case["dtype"],
                              mode=mode)
        h = _silu(d.y.float()).to(x.dtype)
        moe_gemm_combine(h, w2d, d.handle, out=out)
        state["d"], state["h"] = d, h

    graph = capture_graph(ctx, step)
    for _ in range(3):
        seed = fresh_seed(ctx)
        xs, idxs, ws = draw(ctx, seed, case)
        x.copy_(xs[r])
        idx.copy_(idxs[r])
        wt.copy_(ws[r])
        out.fill_(float("nan"))
        graph.replay()
        ctx.synchronize()
        d = state["d"]
        rows = check_dispatch(ctx, d, xs, idxs, case, 64 * w)
        check_y(d, rows, w1, case, r, w)
        check_out(ctx, out, d, state["h"], w2, xs, idxs, ws, case)
        ctx.barrier()


@pytest.mark.parametrize("mode", ["low_latency", "throughput"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@on_worlds(2, 3)
def test_graph_replay_fresh_routing(world, on_gpu, mode, fp8):
    """A captured moe_dispatch_gemm + silu + moe_gemm_combine replayed with new tokens, routing
    and weights each time (the two-stream schedule inside the graph)."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    world.run(_graph_rank, mode, fp8)
