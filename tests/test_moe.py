"""iris_fw.ops.moe_dispatch / moe_combine against a float64 reference of all_to_all semantics.

Every rank draws the whole problem (every rank's tokens, routing and weights) from a seed
agreed per call, so each rank builds the reference itself (:func:`iris_fw.moe.moe_reference`):
which (rank, token, k) rows each expert receives, and the top-k weighted sum of the experts'
outputs per token. Dispatch is checked row by row (slot order is not fixed: rows are matched
by the handle's source info; bf16 rows bitwise, fp8 rows and scales against
:func:`iris_fw.moe.quantize_reference`), the counts and the overflow counters exactly; the
experts' outputs are ``(e + 1) * row`` with the rows past the counts poisoned (NaN), and the
combine (into a NaN-poisoned ``out``) is checked against float64. Routings: uniform, skewed
(every token to one expert), empty experts, a rank without tokens, -1 entries, top-1/2/8, odd
hidden sizes, capacity overflow; both modes; bf16 and fp8. Bad or mismatched arguments raise
on every rank. On GPUs the sizes grow and a CUDA graph is replayed with fresh routing.
"""

import time

import numpy as np
import pytest
import torch

from helpers import assert_peers_fail_at_once, boom, capture_graph, cpu_extended, fresh_seed, on_worlds, peer_fails
from iris_fw import callpath
from iris_fw.engine.contract import CollectiveMismatch
from iris_fw.errors import ArgumentError, PeerFailure

FP8 = torch.float8_e4m3fn


def _routing(g, tokens, num_experts, topk, kind, rank):
    """``[tokens, topk]`` int64 expert ids of one rank for a routing ``kind``."""
    if tokens == 0:
        return torch.zeros(0, topk, dtype=torch.int64)
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:topk] for _ in range(tokens)])
    if kind == "skewed":  # every token's first choice is the last expert
        for t in range(tokens):
            row = [e for e in idx[t].tolist() if e != num_experts - 1][:topk - 1]
            idx[t] = torch.tensor([num_experts - 1] + row)
    elif kind == "sparse":  # only even experts: the odd ones get nothing; some slots unused (-1)
        evens = torch.arange(0, num_experts, 2)
        idx = torch.full((tokens, topk), -1, dtype=torch.int64)
        for t in range(tokens):
            pick = evens[torch.randperm(len(evens), generator=g)[:topk]]
            idx[t, :len(pick)] = pick
        idx[torch.rand(tokens, topk, generator=g) < 0.25] = -1
    return idx


def draw(ctx, seed, case):
    """The whole problem of one call, on the CPU: every rank's x, topk_idx, topk_weights."""
    w = ctx.world_size
    g = torch.Generator().manual_seed(seed)
    tokens = [case["tokens"](r) for r in range(w)]
    xs = [(2 * torch.randn(t, case["hidden"], generator=g)).to(case.get("x_dtype", torch.bfloat16)) for t in tokens]
    idxs = [_routing(g, t, case["experts"], case["topk"], case["kind"], r) for r, t in enumerate(tokens)]
    ws = [torch.rand(t, case["topk"], generator=g) for t in tokens]
    return xs, idxs, ws


def _fp8_close(got, want, interp):
    """fp8 values equal up to one e4m3 step; under Triton's interpreter also its known
    mis-roundings (a rounding carry into the exponent lands a binade low: 1.96 -> 1.0; tiny
    subnormals flush)."""
    g, r = got.float(), want.float()
    step = torch.where(r.abs() >= 2 ** -6, 2.0 ** (torch.floor(torch.log2(r.abs().clamp_min(2 ** -6))) - 3), 2.0 ** -9)
    ok = (g - r).abs() <= step
    if interp:
        exp = torch.log2(r.abs().clamp_min(2 ** -6))
        pow2 = (r.abs() >= 2 ** -6) & (exp == torch.floor(exp))
        ok |= pow2 & ((g.abs() - r.abs() / 2).abs() == 0) & (g.sign() == r.sign())
        ok |= (r.abs() < 2 ** -5) & ((g - r).abs() <= 2 ** -5)
    return ok


def check_dispatch(ctx, d, xs, idxs, case, capacity):
    """Counts, overflow, the received rows (by source) and their values; returns ``{(rank, t,
    k): dequantized row}`` of the rows this rank received."""
    import iris_fw
    from iris_fw.moe import moe_reference, quantize_reference

    r, w = ctx.rank, ctx.world_size
    experts, topk = case["experts"], case["topk"]
    local = experts // w
    received, _ = moe_reference(xs, idxs, [torch.zeros(i.shape) for i in idxs], experts)
    counts = d.counts.cpu().tolist()
    recv_x = d.x.cpu()
    recv_scales = None if d.scales is None else d.scales.cpu()
    src_r, src_t, src_k = (s.cpu() for s in d.handle.sources())
    stats = d.handle.stats()
    dropped = 0
    rows = {}
    fp8 = d.scales is not None
    refq = [quantize_reference(x) for x in xs] if fp8 else None
    for l in range(local):
        e = r * local + l
        want = received[e]
        assert counts[l] == min(len(want), capacity), (e, counts[l], len(want), capacity)
        dropped += max(0, len(want) - capacity)
        got = [(int(src_r[l, s]), int(src_t[l, s]), int(src_k[l, s])) for s in range(counts[l])]
        assert len(set(got)) == len(got) and set(got) <= set(want), f"expert {e}: got {got}, want {want}"
        if capacity >= len(want):
            assert sorted(got) == want, f"expert {e}: got {sorted(got)}, want {want}"
        for s, (p, t, k) in enumerate(got):
            row = recv_x[l, s]
            if fp8:
                q, sc = refq[p]
                assert torch.equal(recv_scales[l, s], sc[t]), f"expert {e} row {(p, t, k)}: scales differ"
                ok = _fp8_close(row, q[t], iris_fw.interpreting())
                assert bool(ok.all()), f"expert {e} row {(p, t, k)}: fp8 {row[~ok][:4]} vs {q[t][~ok][:4]}"
                deq = row.float() * recv_scales[l, s].repeat_interleave(128)[:row.numel()]
            else:
                assert torch.equal(row, xs[p][t]), f"expert {e} row {(p, t, k)} differs"
                deq = row.double()
            rows[(p, t, k)] = deq.double()
    assert stats["dropped"] == dropped, (stats, dropped)
    assert stats["bad_indices"] == 0
    return rows


def expert_outputs(d, case, rank, world):
    """``expert_out [L, C, H]``: ``(e + 1) * row`` (dequantized) for the received rows, NaN past
    the counts (the combine must not read them)."""
    local = case["experts"] // world
    x = d.x.float()
    if d.scales is not None:
        x = x * d.scales.repeat_interleave(128, dim=2)[:, :, :x.shape[2]]
    scale = torch.arange(rank * local + 1, rank * local + local + 1, dtype=torch.float32, device=x.device)
    out = (x * scale[:, None, None]).to(case.get("x_dtype", torch.bfloat16))
    live = torch.arange(out.shape[1], device=x.device)[None, :] < d.counts[:, None]
    return torch.where(live[:, :, None], out, torch.full_like(out, float("nan")))


def check_combine(ctx, got, d, rows, xs, idxs, ws, case):
    """``got [T, H]`` against the float64 weighted sum of ``(e + 1) * row`` over this rank's rows
    that were not dropped (rows as received by the experts, gathered from every rank)."""
    r = ctx.rank
    everyone = {}
    for part in ctx.bootstrap.all_gather(rows):
        everyone.update(part)
    slot = d.handle.src_slot.cpu()
    want = torch.zeros(xs[r].shape, dtype=torch.float64)
    bound = torch.zeros(xs[r].shape, dtype=torch.float64)
    for t in range(xs[r].shape[0]):
        for k in range(case["topk"]):
            e = int(idxs[r][t, k])
            if e < 0:
                assert int(slot[t, k]) == -1
                continue
            if int(slot[t, k]) < 0:  # dropped past capacity: not received anywhere
                assert (r, t, k) not in everyone
                continue
            term = float(ws[r][t, k]) * (e + 1) * everyone[(r, t, k)]
            want[t] += term
            bound[t] += term.abs()
    err = (got.cpu().double() - want).abs()
    tol = 2 ** -7 * bound + 2 ** -7 * want.abs() + 1e-6
    bad = ~(err <= tol)
    assert not bool(bad.any()), (f"combine: {int(bad.sum())} of {bad.numel()} wrong, max error "
                                 f"{float(err.nan_to_num(float('inf')).max()):.3g}")


def _run_case(ctx, case, calls=2):
    """``calls`` dispatch/combine pairs with fresh routing each (the plan reused after the first)."""
    from iris_fw.ops import moe_combine, moe_dispatch

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    max_tokens = case["max_tokens"]
    capacity = case.get("capacity")
    for call in range(calls):
        xs, idxs, ws = draw(ctx, fresh_seed(ctx), case)
        x, idx, wt = xs[r].to(dev), idxs[r].to(dev, case.get("idx_dtype", torch.int64)), ws[r].to(dev)
        d = moe_dispatch(x, idx, wt, case["experts"], max_tokens_per_rank=max_tokens, capacity=capacity,
                         dtype=case.get("dtype"), mode=case["mode"])
        ctx.synchronize()
        if call == 0:
            plans = len(callpath.state(ctx).groups[None].configs)
        rows = check_dispatch(ctx, d, xs, idxs, case, capacity or max_tokens * w)
        out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=dev)
        got = moe_combine(expert_outputs(d, case, r, w), d.handle, out=out)
        assert got is out
        ctx.synchronize()
        check_combine(ctx, got, d, rows, xs, idxs, ws, case)
    assert len(callpath.state(ctx).groups[None].configs) == plans, "a repeated shape class must not re-plan"
    return case["name"]


def _case(name, mode, kind="uniform", hidden=40, topk=2, per_rank=2, tokens=None, max_tokens=4, **extra):
    """A case: experts ``per_rank * W`` (filled in per world), ``tokens(r)`` per rank."""
    return dict(name=name, mode=mode, kind=kind, hidden=hidden, topk=topk, per_rank=per_rank,
                tokens=tokens or (lambda r: 3 + r % 2), max_tokens=max_tokens, **extra)


CASES = {
    "uniform_ll": _case("uniform_ll", "low_latency"),
    "uniform_tp": _case("uniform_tp", "throughput", hidden=33, topk=1),
    "skewed_ll_fp8": _case("skewed_ll_fp8", "low_latency", "skewed", hidden=200, dtype=FP8),
    "sparse_tp_fp8": _case("sparse_tp_fp8", "throughput", "sparse", hidden=136, dtype=FP8, idx_dtype=torch.int32),
    "empty_rank_ll": _case("empty_rank_ll", "low_latency", "sparse", hidden=17, tokens=lambda r: 0 if r == 1 else 3),
    "top8_tp": _case("top8_tp", "throughput", topk=8, per_rank=3, hidden=24, tokens=lambda r: 2, max_tokens=2),
    "top8_ll": _case("top8_ll", "low_latency", topk=8, per_rank=4, hidden=24, tokens=lambda r: 2, max_tokens=3),
    "overflow_ll": _case("overflow_ll", "low_latency", "skewed", capacity=2, tokens=lambda r: 3),
    "overflow_tp": _case("overflow_tp", "throughput", "skewed", capacity=1, tokens=lambda r: 2, x_dtype=torch.float16),
    "auto_fp32": _case("auto_fp32", "auto", hidden=1100, x_dtype=torch.float32, tokens=lambda r: 1 + r, max_tokens=5),
}

#: CPU default run per world size (the interpreter's cost kept small); GPUs and -m extended run all.
#: The first case of each list runs two pairs (plan reuse, fresh routing), the others one.
_CPU_RUNS = {1: ["uniform_ll", "sparse_tp_fp8"],
             2: ["skewed_ll_fp8", "overflow_tp", "top8_ll"],
             3: ["empty_rank_ll", "uniform_tp"],
             4: ["uniform_ll", "uniform_tp"]}


def _cases_rank(ctx, names, calls=2, first_only=False):
    done = []
    for i, name in enumerate(names):
        case = dict(CASES[name])
        w = ctx.world_size
        case["experts"] = case["per_rank"] * w
        if case["topk"] > case["experts"]:
            case["topk"] = case["experts"]
        if ctx.device.type != "cpu":  # bigger on GPUs
            case["hidden"] = case["hidden"] * 31 + 1
            case["tokens"] = (lambda f: (lambda r: 16 * f(r) + 3 * (f(r) > 0)))(case["tokens"])
            case["max_tokens"] = 16 * case["max_tokens"] + 3
        done.append(_run_case(ctx, case, calls if i == 0 or not first_only else 1))
    return done


@on_worlds(1, 2, 3)
def test_moe(world, on_gpu):
    """Two dispatch/combine pairs per case, fresh routing each, every value checked."""
    names = list(CASES) if on_gpu else _CPU_RUNS[world.world_size]
    assert world.run(_cases_rank, names, first_only=not on_gpu)[0] == names


@pytest.mark.extended
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_moe_all_cases(iris_pool, world_size):
    """Every case at worlds 2-4, three pairs each."""
    iris_pool(world_size).run(_cases_rank, list(CASES), calls=3)


# ---- bad input ------------------------------------------------------------------------------------


def _bad_call(ctx, what):
    """One bad or mismatched call (``what``); returns the message it raised."""
    from iris_fw.ops import moe_combine, moe_dispatch

    r, dev = ctx.rank, ctx.device
    hidden, experts, topk, tokens = 16, 2 * ctx.world_size, 2, 3
    if what == "hidden" and r == 1:
        hidden = 24
    if what == "experts":
        experts = 3  # not a multiple of the world size 2
    if what == "experts_bool":
        experts = True  # not an int (context's int check: anything with __index__ but a bool)
    x = torch.randn(tokens, hidden, device=dev).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [1, 2]], device=dev)
    wt = torch.rand(tokens, topk, device=dev)
    kwargs = dict(max_tokens_per_rank=4)
    if what == "index" and r == 1:
        idx[1, 1] = experts  # out of range on one rank only
    if what == "negative":
        idx[0, 0] = -2
    if what == "dtype" and r == 0:
        kwargs["dtype"] = FP8
    if what == "capacity" and r == 1:
        kwargs["capacity"] = 3
    if what == "too_many_tokens" and r == 0:
        kwargs["max_tokens_per_rank"] = 2
    if what == "mode" and r == 0:  # the mode auto does not pick here (auto's choice is data per device)
        from iris_fw.moe import auto_mode

        kwargs["mode"] = "low_latency" if auto_mode(dev, 4) == "throughput" else "throughput"
    if what == "topk" and r == 1:
        idx, wt = idx[:, :1].contiguous(), wt[:, :1].contiguous()
    if what in ("stale", "expert_out", "out"):
        if what != "stale":  # a shape class of its own: its first combine is validated on every rank
            kwargs["max_tokens_per_rank"] = 5 if what == "expert_out" else 6
        d1 = moe_dispatch(x, idx, wt, experts, **kwargs)
        d2 = moe_dispatch(x, idx, wt, experts, **kwargs)
        eo = torch.zeros(d2.x.shape, dtype=torch.bfloat16, device=dev)
        with pytest.raises((ArgumentError, CollectiveMismatch)) as info:
            if what == "stale":
                moe_combine(eo, d1.handle)
            elif what == "out":
                moe_combine(eo, d2.handle, out=torch.empty(tokens, hidden + (r == 0), dtype=torch.bfloat16,
                                                           device=dev))
            else:
                moe_combine(eo[:, :, :8] if r == 0 else eo, d2.handle)
        moe_combine(eo, d2.handle)
        ctx.synchronize()
        return str(info.value)
    with pytest.raises((ArgumentError, CollectiveMismatch, TypeError)) as info:
        moe_dispatch(x, idx, wt, experts, **kwargs)
    return str(info.value)


BAD = ["hidden", "experts", "experts_bool", "index", "negative", "dtype", "capacity", "too_many_tokens", "mode", "topk",
       "stale", "expert_out", "out"]


def _bad_rank(ctx):
    msgs = {what: _bad_call(ctx, what) for what in BAD}
    # the ranks still work together afterwards
    from iris_fw.ops import moe_combine, moe_dispatch

    r, dev = ctx.rank, ctx.device
    good = torch.ones(1, 8, device=dev).to(torch.bfloat16)
    d = moe_dispatch(good, torch.tensor([[r]], device=dev), torch.ones(1, 1, device=dev), ctx.world_size,
                     max_tokens_per_rank=np.int64(1))  # an integer type of another library
    out = moe_combine(d.x * 2, d.handle)
    ctx.synchronize()
    assert torch.equal(out.cpu(), torch.full((1, 8), 2.0, dtype=torch.bfloat16))
    return msgs


def test_bad_input_raises_everywhere(iris_pool):
    """A bad or mismatched argument on one rank (or all) raises on every rank, naming the
    argument; no hang; the ranks work together afterwards. One job for every case (each
    case's call raises before any kernel runs)."""
    runs = iris_pool(2).run(_bad_rank)
    expect = {"hidden": "'hidden size (x.shape[1])'", "experts": "multiple of the world size",
              "dtype": "'dtype'", "capacity": "'capacity'", "mode": "'mode'", "topk": "'topk (topk_idx.shape[1])'",
              "negative": "outside [-1, 4)", "stale": "overwritten by dispatch #2"}
    for what in BAD:
        msgs = [run[what] for run in runs]
        if what in expect:
            assert all(expect[what] in m for m in msgs), (what, msgs)
        if what == "index":
            assert "outside [-1, 4)" in msgs[1] and "rank 1 rejected its arguments" in msgs[0], msgs
        if what == "too_many_tokens":
            assert "more than max_tokens_per_rank = 2" in msgs[0] and "rank 0 rejected" in msgs[1], msgs
        if what == "expert_out":
            assert "expert_out must be a [2, 10, 16]" in msgs[0] and "rank 0 rejected" in msgs[1], msgs
        if what == "out":
            assert "out must be a [3, 16] tensor" in msgs[0] and "rank 0 rejected" in msgs[1], msgs
        if what == "experts_bool":
            assert all("num_experts must be an int, got bool" in m for m in msgs), msgs


def _debug_rank(ctx):
    """In a debug context (``iris_fw.init(debug=True)``, what ``IRIS_FW_DEBUG=1`` gives) the
    kernel counts invalid indices on every call (the host checks only a plan's first call): a bad
    index on a later call raises on every rank."""
    import iris_fw
    from iris_fw.ops import moe_dispatch

    r = ctx.rank
    sub = iris_fw.init(heap_size=1 << 24, transport=ctx.transport.name, debug=True)
    try:
        dev = sub.device
        x = torch.randn(2, 8, device=dev).to(torch.bfloat16)
        idx = torch.tensor([[0], [1]], device=dev)
        wt = torch.ones(2, 1, device=dev)
        moe_dispatch(x, idx, wt, 2, max_tokens_per_rank=2, ctx=sub)
        if r == 0:
            idx[1, 0] = 7
        with pytest.raises((ArgumentError, CollectiveMismatch)) as info:
            moe_dispatch(x, idx, wt, 2, max_tokens_per_rank=2, ctx=sub)
    finally:
        sub.close()
    return str(info.value)


def test_auto_mode_table():
    """``mode="auto"``: the tuning table's rows by max_tokens_per_rank (data, not code)."""
    from iris_fw.moe import auto_mode

    cpu = torch.device("cpu")
    assert auto_mode(cpu, 1) == auto_mode(cpu, 256) == "low_latency"
    assert auto_mode(cpu, 257) == auto_mode(cpu, 4096) == "throughput"
    from iris_fw import tuning
    from iris_fw.moe import _table

    # CUDA devices: throughput at every size (measured faster at decode on one H100, tuning/moe.json)
    rows = tuning.device_rows(_table(), "NVIDIA H100 80GB HBM3", "cuda")
    assert tuning.bounded(rows, 1) == tuning.bounded(rows, 4096) == "throughput"


def test_debug_index_check_in_kernel(iris_pool):
    msgs = iris_pool(2).run(_debug_rank)
    assert "found by the dispatch kernel" in msgs[0] and "rank 0 rejected" in msgs[1], msgs


# ---- token counts that differ per rank and per call ---------------------------------------------

#: Each rank's token count per call (rank r takes entry r % 3): differing per rank, changing
#: between calls, 0 included (a rank without tokens, then every rank without tokens).
_VARYING = [(3, 0, 2), (1, 4, 0), (0, 0, 0), (4, 2, 1)]


def _varying_rank(ctx, mode):
    """One plan for every call: the cache key holds only what the ranks agree on, so no rank
    validates (a host exchange) while a peer launches. Every call's values are checked."""
    r, w = ctx.rank, ctx.world_size
    old, ctx.wait_timeout = ctx.wait_timeout, 30.0  # a rank left waiting in an exchange fails sooner
    try:
        for counts in _VARYING:
            case = _case("varying", mode, hidden=12, tokens=lambda p, c=counts: c[p % len(c)], max_tokens=4)
            case["experts"] = case["per_rank"] * w
            _run_case(ctx, case, calls=1)
    finally:
        ctx.wait_timeout = old
    g = callpath.state(ctx).groups[None]   # (a pooled rank may hold other tests' collectives too)
    assert len([k for k in g.configs if k[0] == "moe"]) == 1, [k for k in g.configs if k[0] == "moe"]
    assert len([k for k in g.calls if k[0] == "moe"]) == 1, list(g.calls)
    return True


@pytest.mark.parametrize("mode", ["low_latency", cpu_extended("throughput")])
def test_token_count_differs_per_rank_and_call(iris_pool, mode):
    """Decode-style calls: T differs per rank and changes from call to call (0 included)."""
    assert iris_pool(3).run(_varying_rank, mode) == [True] * 3


def _later_bad_rank(ctx, what):
    """A later call (the plan's cache hit, no exchange) whose token-count check fails on rank 0
    only: rank 0 raises naming the argument and aborts the peers at once; they raise
    PeerFailure naming rank 0 (not a WaitTimeout after the bound); the ranks work on after the
    re-arming barrier."""
    from iris_fw.ops import moe_combine, moe_dispatch

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    x = torch.randn(2, 8, device=dev).to(torch.bfloat16)
    idx = torch.tensor([[r], [(r + 1) % w]], device=dev)
    wt = torch.ones(2, 1, device=dev)
    d = moe_dispatch(x, idx, wt, w, max_tokens_per_rank=2)
    moe_combine(d.x, d.handle, out=torch.empty(2, 8, dtype=torch.bfloat16, device=dev))
    ctx.synchronize()
    old, ctx.wait_timeout = ctx.wait_timeout, 60.0
    start = time.monotonic()
    try:
        if r == 0:
            with pytest.raises(ArgumentError) as info:
                if what == "tokens":
                    moe_dispatch(torch.zeros(3, 8, dtype=torch.bfloat16, device=dev), idx.repeat(2, 1)[:3],
                                 wt.repeat(2, 1)[:3], w, max_tokens_per_rank=2)
                else:
                    d = moe_dispatch(x, idx, wt, w, max_tokens_per_rank=2)
                    moe_combine(d.x, d.handle, out=torch.empty(1, 8, dtype=torch.bfloat16, device=dev))
        else:
            with pytest.raises(PeerFailure) as info:
                d = moe_dispatch(x, idx, wt, w, max_tokens_per_rank=2)
                moe_combine(d.x, d.handle, out=torch.empty(2, 8, dtype=torch.bfloat16, device=dev))
                ctx.synchronize()
        elapsed = time.monotonic() - start
    finally:
        ctx.wait_timeout = old
    try:
        ctx.barrier()  # re-arms the job (rank 0 aborted its peers' waits)
    except PeerFailure:
        ctx.barrier()
    d = moe_dispatch(x, idx, wt, w, max_tokens_per_rank=2)
    out = moe_combine(d.x * 3, d.handle)
    ctx.synchronize()
    assert torch.equal(out.cpu(), (x * 3).cpu())
    return str(info.value), elapsed


@pytest.mark.parametrize("what", ["tokens", "out"])
def test_later_bad_token_count_aborts_peers(iris_pool, what):
    runs = iris_pool(2).run(_later_bad_rank, what)
    (m0, t0), (m1, t1) = runs
    want = "more than max_tokens_per_rank = 2" if what == "tokens" else "out must be a [2, 8] tensor"
    assert want in m0 and "rank 0" in m1 and want in m1, runs
    assert t0 < 20 and t1 < 20, runs  # at once, not after the wait timeout (60 s)


# ---- a host failure inside the launch of a cached call -------------------------------------------


def small_routing(ctx, seed):
    """A tiny ragged call for the host-failure tests: rank r has ``1 + r`` tokens of hidden 12,
    top-2 of ``2 W`` experts; returns ``x, idx, wt, experts``."""
    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    gen = torch.Generator().manual_seed(seed + r)
    tokens, experts = 1 + r, 2 * w
    x = torch.randn(tokens, 12, generator=gen).to(dev, torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(tokens)]).to(dev)
    wt = torch.rand(tokens, 2, generator=gen).to(dev)
    return x, idx, wt, experts


def fails_then_works(ctx, call, inject, where, x, wt):
    """:func:`helpers.peer_fails` (rank W-1 fails on its host ``where``), then one more call on
    every rank after the re-arming barrier, checked against float64: ``call`` computes experts
    that double their rows, so ``out[t] = 2 x[t] sum_k w[t, k]``. Returns peer_fails' results."""
    results = peer_fails(ctx, call, inject, where)
    out = call(False)
    ctx.synchronize()
    want = 2 * x.double() * wt.double().sum(1, keepdim=True)
    torch.testing.assert_close(out.double(), want, rtol=2 ** -6, atol=1e-6)
    return results


def _launch_fails(ctx, op):
    """Rank W-1 raises on its host inside the launch of a repeated (cached) dispatch + combine —
    ``op`` ``"dispatch"``: the dispatch's launch; ``"combine"``: the combine's first launch, after
    its dispatch ran everywhere — after the ranks agreed on the call: every peer raises
    PeerFailure naming that rank at once (:func:`helpers.peer_fails`), not after the wait bound.
    After the re-arming barrier the ranks work on: a call's values against float64."""
    from iris_fw import moe as moe_module
    from iris_fw.ops import moe_combine, moe_dispatch

    x, idx, wt, experts = small_routing(ctx, 4321)
    made = {}

    def call(bad):
        d = moe_dispatch(x, idx, wt, experts, max_tokens_per_rank=4)
        made["plan"] = d.handle.plan
        return moe_combine(d.x * 2, d.handle)

    def inject(mp):
        if op == "dispatch":
            mp.setattr(moe_module.MoePlan, "dispatch", boom)
        else:
            mp.setattr(made["plan"], "_push", boom)  # the combine's first launcher

    return fails_then_works(ctx, call, inject, "launch", x, wt)


@pytest.mark.parametrize("op", ["dispatch", "combine"])
@pytest.mark.parametrize("world_size", [2, cpu_extended(3)])
def test_a_host_failure_in_a_launch_fails_every_peer_at_once(iris_pool, world_size, op):
    results = iris_pool(world_size).run(_launch_fails, op)
    assert_peers_fail_at_once(results, "injected host failure")


def _plan_fails(ctx):
    """Rank W-1 raises on its host while it makes the MoePlan of a new shape class — after the
    ranks agreed on the call, after its buffers were allocated, before the plan's allocation
    barrier that its peers wait in: every peer raises PeerFailure naming that rank at once (the
    call path's abort, seen by the barrier), not at the failed rank's later re-arming barrier
    (which the allocation barrier used to pair with: a CallMismatch or a hang later). After the
    re-arming barrier the ranks work on."""
    from iris_fw import moe as moe_module
    from iris_fw.ops import moe_combine, moe_dispatch

    x, idx, wt, experts = small_routing(ctx, 1234)
    calls = [0]

    def call(bad):
        calls[0] += 1
        # the third call (the failing one) and later ones: a shape class of its own, planned anew
        d = moe_dispatch(x, idx, wt, experts, max_tokens_per_rank=4 if calls[0] <= 2 else 5)
        return moe_combine(d.x * 2, d.handle)

    def inject(mp):
        mp.setattr(moe_module, "KernelLauncher", boom)  # the plan's launchers, made after its buffers

    return fails_then_works(ctx, call, inject, "plan", x, wt)


@pytest.mark.parametrize("world_size", [2, cpu_extended(3)])
def test_a_host_failure_while_planning_fails_every_peer_at_once(iris_pool, world_size):
    results = iris_pool(world_size).run(_plan_fails)
    assert_peers_fail_at_once(results, "injected host failure")
    assert all(isinstance(text, str) and "CallMismatch" not in text for _, _, text in results), results


# ---- src_slot complete when the dispatch ends (throughput) ----------------------------------------


def _src_slot_rank(ctx):
    """Throughput mode writes a source's ``src_slot`` from the receivers' scatter kernels: it is
    complete when the dispatch ends (rank 1's scatter is held back 1 s; rank 0 reads its
    src_slot right after its dispatch), -1 exactly for the rows dropped past capacity."""
    from iris_fw.moe import plan
    from iris_fw.ops import moe_dispatch

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    case = _case("src_slot", "throughput", "skewed", hidden=8, tokens=lambda p: 3, capacity=2, max_tokens=3)
    case["experts"] = experts = case["per_rank"] * w
    xs, idxs, ws = draw(ctx, fresh_seed(ctx), case)
    x, idx, wt = xs[r].to(dev), idxs[r].to(dev), ws[r].to(dev)
    kwargs = dict(max_tokens_per_rank=3, capacity=2, mode="throughput")
    made = plan(x, idx, wt, experts, **kwargs)
    if r == 1:
        scatter = made._scatter

        class Late:
            def launch_on(self, *args):
                time.sleep(1.0)
                return scatter.launch_on(*args)

        made._scatter = Late()
    d = moe_dispatch(x, idx, wt, experts, **kwargs)
    ctx.synchronize()
    slot = d.handle.src_slot.cpu()
    src = [s.cpu() for s in d.handle.sources()]
    counts = d.counts.cpu()
    everyone = ctx.bootstrap.all_gather((slot, src, counts))
    local = experts // w
    for e in range(experts):
        owner, l = divmod(e, local)
        _, (sr, st, sk), cnt = everyone[owner]
        rows = [(p, t, k) for p in range(w) for t in range(3) for k in range(case["topk"]) if int(idxs[p][t, k]) == e]
        assert int(cnt[l]) == min(len(rows), 2)
        for s in range(int(cnt[l])):  # every received row's source knows its slot
            p, t, k = int(sr[l, s]), int(st[l, s]), int(sk[l, s])
            assert int(everyone[p][0][t, k]) == s, (e, s, (p, t, k), everyone[p][0])
        # every other row of this expert was dropped: -1 at its source
        got = {(int(sr[l, s]), int(st[l, s]), int(sk[l, s])) for s in range(int(cnt[l]))}
        for p, t, k in rows:
            if (p, t, k) not in got:
                assert int(everyone[p][0][t, k]) == -1, (e, (p, t, k))
    assert bool((slot[idxs[r] < 0] == -1).all())
    return True


def test_src_slot_complete_after_dispatch(iris_pool):
    assert iris_pool(2).run(_src_slot_rank) == [True, True]


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------


def _graph_rank(ctx, mode, fp8):
    from iris_fw.ops import moe_combine, moe_dispatch

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    case = dict(name="graph", mode=mode, kind="uniform", hidden=7168 // 4, topk=4, experts=8 * w,
                tokens=lambda p: 64, max_tokens=64, dtype=FP8 if fp8 else None)
    xs, idxs, ws = draw(ctx, fresh_seed(ctx), case)
    x, idx, wt = xs[r].to(dev), idxs[r].to(dev), ws[r].to(dev)
    out = torch.empty_like(x)
    state = {}

    def step():
        d = moe_dispatch(x, idx, wt, case["experts"], max_tokens_per_rank=64, dtype=case["dtype"], mode=mode)
        xe = d.x.float()
        if d.scales is not None:
            xe = xe * d.scales.repeat_interleave(128, dim=2)[:, :, :x.shape[1]]
        scale = torch.arange(r * 8 + 1, r * 8 + 9, dtype=torch.float32, device=dev)
        moe_combine((xe * scale[:, None, None]).to(x.dtype), d.handle, out=out)
        state["d"] = d

    graph = capture_graph(ctx, step)
    for rep in range(3):
        xs, idxs, ws = draw(ctx, fresh_seed(ctx), case)
        x.copy_(xs[r])
        idx.copy_(idxs[r])
        wt.copy_(ws[r])
        out.fill_(float("nan"))
        graph.replay()
        ctx.synchronize()
        d = state["d"]
        rows = check_dispatch(ctx, d, xs, idxs, case, 64 * w)
        check_combine(ctx, out, d, rows, xs, idxs, ws, case)
        ctx.barrier()


@pytest.mark.parametrize("mode", ["low_latency", "throughput"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@on_worlds(2, 3)
def test_graph_replay_fresh_routing(world, on_gpu, mode, fp8):
    """A captured dispatch + combine replayed with new tokens, routing and weights each time."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    world.run(_graph_rank, mode, fp8)


# ---- the benchmark --------------------------------------------------------------------------------


def _bench_rank(ctx):
    from iris_fw.bench import BenchOptions
    from iris_fw.bench.moe import MoeBench

    opts = BenchOptions(sizes=[], iters=1, warmup=0, quick=True, rotate_bytes=1 << 16, log=lambda msg: None,
                        extra={"dtype": "fp8"})
    return MoeBench().run(ctx, opts)


def test_bench_rows(iris_pool, on_gpu):
    """``iris-fw bench moe``'s plugin on one CPU rank (``--dtype fp8``): a checked, timed row per
    method, the NCCL baseline skipped with a reason."""
    if on_gpu:
        pytest.skip("the GPU run is `iris-fw bench moe` (docs/moe.md)")
    rows = iris_pool(1).run(_bench_rank)[0]
    timed = [r for r in rows if "eager_us" in r]
    gemm = ("dispatch_then_gemm", "dispatch_gemm_fused", "layer_unfused", "layer_fused")
    assert {(r["method"], r["dtype"]) for r in timed} == {(m, d) for m in ("low_latency", "throughput", "copy",
                                                                         "torch_local", *gemm) for d in ("fp8",)}, rows
    assert all(r["gb_per_s"] > 0 for r in timed if r["method"] in ("low_latency", "throughput", "copy")), rows
    assert all(r["ok"] is True and r["dropped"] == 0 for r in timed if "ok" in r), rows
    assert {r["method"] for r in timed if "ok" in r} == {"low_latency", "throughput", "layer_fused"}, rows
    assert all(r["speedup"] > 0 for r in timed if r["method"] in ("dispatch_gemm_fused", "layer_fused")), rows
    skipped = {r["method"]: r["skipped"] for r in rows if "skipped" in r}
    assert "NCCL" in skipped["torch_a2a"], skipped
