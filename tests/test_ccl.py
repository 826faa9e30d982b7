"""iris_fw.ccl: every collective × algorithm against float64 / exact references.

Each rank function draws fresh random inputs (seeds agreed per call), poisons outputs, runs
several calls back to back with no host synchronization between them (only device-side epochs
order them), then checks every result: integers, max and min exactly; float sums and products
within a few ulps of the output dtype times the magnitude; every rank's all-reduce result
bitwise equal. Sizes are ragged; world sizes 1-4 (3 catches power-of-two assumptions). On GPUs
the sizes grow and every collective is also replayed from a CUDA graph with fresh inputs.

On CPU ranks the collectives other than all_reduce run at world sizes 1 and 3 by default, and
the chunked and many-tile ring cases at 3 (2 under ``-m extended``: no kernel has a branch on the
world size that 2 takes and 3 does not); test_all_reduce_dtypes_and_ops keeps 2, the one world
size where every op runs, and at 3 one dtype per element width. Chunked all-reduces run the ring
by default there (the chunking, :func:`iris_fw.ccl.algorithm.chunked_run`, is every algorithm's),
one_shot's chunks in test_chunks_of_multidimensional_tensors, the other algorithms' under
``-m extended``.
"""

import time

import pytest
import torch

import iris_fw

from helpers import capture_graph, cpu_extended, fresh_seed, on_worlds
from iris_fw import CallMismatch, PeerFailure, WaitTimeout
from iris_fw.engine.contract import CollectiveMismatch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FLOATS = (torch.float32, torch.bfloat16, torch.float16) + FP8
INTS = (torch.int32, torch.int64)
OPS = ("sum", "avg", "max", "min", "prod")
ALL_REDUCE = ("one_shot", "lamport", "two_shot", "ring")


def _n(ctx, small):
    """A ragged element count: ``small`` on the CPU interpreter, ~1 M on GPUs."""
    return small if ctx.device.type == "cpu" else (1 << 20) + small


def _inputs(ctx, n, dtype, op, seed, calls):
    """``calls`` lists of every rank's input (the same on every rank: drawn from ``seed``);
    values chosen so that products stay in range. fp8 inputs are small integers (powers of two
    for products, multiples of the world size for averages), whose results fp8 holds exactly:
    Triton's CPU interpreter mis-rounds fp32 -> fp8 where rounding carries into the exponent."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(calls):
        per_rank = []
        for _ in range(ctx.world_size):
            if dtype in FP8:
                if op == "prod":
                    x = 2.0 ** torch.randint(-1, 2, (n,), generator=g)
                else:
                    x = torch.randint(-2, 3, (n,), generator=g).float() * (ctx.world_size if op == "avg" else 1)
            elif dtype in INTS:
                hi = 3 if op == "prod" else 1000
                x = torch.randint(-hi, hi + 1, (n,), generator=g)
            elif op == "prod":
                x = 1 + 0.25 * torch.rand(n, generator=g)
            else:
                x = torch.randn(n, generator=g) * (2 if dtype in FP8 else 8)
            per_rank.append(x.to(dtype))
        out.append(per_rank)
    return out


def _reference(xs, op, dtype):
    """float64 (int64 for integers) reduction of the per-rank tensors ``xs``."""
    wide = torch.stack([x.to(torch.float64 if dtype not in INTS else torch.int64) for x in xs])
    if op in ("sum", "avg"):
        r = wide.sum(0)
        return r / len(xs) if op == "avg" else r
    if op == "prod":
        return wide.prod(0)
    return wide.amax(0) if op == "max" else wide.amin(0)


def _scale(xs, op):
    """What a float result's rounding error scales with: the sum of the magnitudes of the
    addends (sums), the result's magnitude (products)."""
    mag = torch.stack([x.double().abs() for x in xs])
    if op == "prod":
        return mag.prod(0)
    return mag.sum(0) / (len(xs) if op == "avg" else 1)


def _check(got, want, dtype, op, world, what, scale=None):
    got = got.cpu()
    if dtype in INTS or op in ("max", "min"):
        exact = want.to(got.dtype).to(want.dtype)
        bad = (got.to(want.dtype) != exact).nonzero().flatten()
        assert bad.numel() == 0, (f"{what}: {bad.numel()} of {got.numel()} elements differ, first at "
                                  f"{bad[:4].tolist()}: got {got[bad[:4]].tolist()}, want {exact[bad[:4]].tolist()}")
        return
    eps = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10,
           torch.float8_e4m3fn: 2 ** -3, torch.float8_e5m2: 2 ** -2}[dtype]
    # the result is rounded once to the output dtype; fp32 sums also round per addition
    scale = want.abs() if scale is None else scale
    tol = 2 * eps * want.abs() + world * 2 ** -23 * scale + 1e-30
    err = (got.double() - want).abs()
    assert bool((err <= tol).all()), f"{what}: max error {err.max().item():.3g}, tolerance {tol.max().item():.3g}"


def _poison(t):
    return t.fill_(float("nan") if t.dtype.is_floating_point and t.dtype not in FP8 else -7)


# ---- all_reduce ---------------------------------------------------------------------------------


def _all_reduce_rank(ctx, algorithm, dtypes, ops, small):
    """For each dtype, one call per op back to back (the first op twice: the same kernel twice in a
    row), no host synchronization between them; then every call is checked. A sequence of mixed ops
    orders calls through the device's epochs as well as three calls of one op did, at a third of
    the interpreted launches (the CPU run's time budget)."""
    from iris_fw import ccl

    done = []
    for dtype in dtypes:
        if algorithm == "lamport" and dtype in INTS:
            continue
        seq = [op for op in ops if not (op == "avg" and dtype in INTS)]
        seq = seq[:1] + seq  # the first op twice in a row
        n = _n(ctx, small)
        seed = fresh_seed(ctx)
        data = [_inputs(ctx, n, dtype, op, seed + i, 1)[0] for i, op in enumerate(seq)]
        tensors = [d[ctx.rank].to(ctx.device, copy=True) for d in data]
        for t, op in zip(tensors, seq):  # back to back: only the device orders the calls
            ccl.all_reduce(t, op=op, algorithm=algorithm)
        ctx.synchronize()
        failures = []  # every call is checked (the first failure alone hides the pattern)
        for i, (t, op) in enumerate(zip(tensors, seq)):
            want = _reference(data[i], op, dtype)
            try:
                _check(t, want, dtype, op, ctx.world_size, f"{algorithm} {dtype} {op} call {i}", _scale(data[i], op))
            except AssertionError as exc:
                failures.append(str(exc))
            same = ctx.bootstrap.all_gather(t.cpu().view(torch.uint8).clone())
            if not all(torch.equal(s, same[0]) for s in same):
                failures.append(f"{algorithm} {dtype} {op} call {i}: ranks differ")
        assert not failures, "; ".join(failures)
        done.extend((str(dtype), op) for op in seq)
    return done


#: The dtypes of the CPU default run at world size 3: one per element width (the kernels' tiles,
#: and lamport's empty pattern, depend on the width; float or integer only on the checks and on
#: lamport taking floats only), an integer among them. World sizes 1 and 2 (every op) run every
#: dtype; the other dtypes at 3 run in test_all_reduce_other_dtypes_at_three_ranks (extended).
CPU_W3_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64)


def _dtypes_and_ops(world, algorithm, dtypes):
    full = world.world_size == 2 or (world.world_size == 3 and not iris_fw.interpreting())
    ops = OPS if full else ("sum", "max")
    res = world.run(_all_reduce_rank, algorithm, dtypes, ops, 1000 + 37)
    want = {(str(d), op) for d in dtypes for op in ops
            if not (op == "avg" and d in INTS) and not (algorithm == "lamport" and d in INTS)}
    assert set(res[0]) == want, f"ran {sorted(set(res[0]))}, want {sorted(want)}"


@pytest.mark.parametrize("algorithm", ALL_REDUCE)
def test_all_reduce_dtypes_and_ops(world, algorithm):
    """Every dtype and op through every algorithm, ragged size, each dtype's calls back to back
    (every op at world size 2, and at 3 on GPUs; SUM and MAX otherwise). CPU ranks at world
    size 3: one dtype per width (:data:`CPU_W3_DTYPES`), the rest under ``-m extended``."""
    cpu_w3 = iris_fw.interpreting() and world.world_size == 3
    _dtypes_and_ops(world, algorithm, CPU_W3_DTYPES if cpu_w3 else FLOATS + INTS)


@pytest.mark.extended
@pytest.mark.parametrize("algorithm", ALL_REDUCE)
def test_all_reduce_other_dtypes_at_three_ranks(iris_pool, algorithm):
    """CPU ranks: the dtypes test_all_reduce_dtypes_and_ops leaves out at world size 3 (on GPUs
    it runs them all)."""
    if not iris_fw.interpreting():
        pytest.skip("GPUs run every dtype at world size 3 in test_all_reduce_dtypes_and_ops")
    _dtypes_and_ops(iris_pool(3), algorithm, tuple(d for d in FLOATS + INTS if d not in CPU_W3_DTYPES))


def _chunked_rank(ctx, algorithm, dtype):
    """A small workspace forces several chunks per call; sizes off the tile grid."""
    from iris_fw import ccl

    g = ccl.new_group(list(range(ctx.world_size)), workspace_bytes=1 << 18)
    n = 3 * 4096 + 129 if ctx.device.type == "cpu" else (3 << 20) + 129
    data = _inputs(ctx, n, dtype, "sum", fresh_seed(ctx), 2)
    ts = [d[ctx.rank].to(ctx.device, copy=True) for d in data]
    for t in ts:
        ccl.all_reduce(t, group=g, algorithm=algorithm)
    ctx.synchronize()
    for i, t in enumerate(ts):
        _check(t, _reference(data[i], "sum", dtype), dtype, "sum", ctx.world_size, f"{algorithm} chunked call {i}",
               _scale(data[i], "sum"))
    ccl.destroy_group(g)


@pytest.mark.parametrize("algorithm", [a if a == "ring" else cpu_extended(a) for a in ALL_REDUCE])
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])
def test_all_reduce_chunks(iris_pool, world_size, algorithm):
    """Messages longer than the workspace's largest capacity class go in chunks. (CPU ranks: 3
    by default, 2 under ``-m extended``; the ring by default — every algorithm's chunks are cut
    by the same :func:`~iris_fw.ccl.algorithm.chunked_run`, each algorithm's back-to-back
    launches run in test_all_reduce_dtypes_and_ops —, the others under ``-m extended``.)"""
    iris_pool(world_size).run(_chunked_rank, algorithm, torch.bfloat16)


def _chunked_shapes_rank(ctx):
    """Chunked calls on tensors of several dimensions: chunks start at element offsets of the
    flattened tensors (a row-slice of a ``[W, n]`` output jumped whole rows: out of bounds on
    GPUs, 2026-11-23), for all_reduce, both all-gathers and reduce_scatter, each in a group of
    its own with a small workspace (so every call goes in several chunks)."""
    from iris_fw import ccl

    w, rank = ctx.world_size, ctx.rank
    rows, cols = (3, 4099) if ctx.device.type == "cpu" else (3, (1 << 20) + 99)
    n = rows * cols

    def group():
        return ccl.new_group(list(range(w)), workspace_bytes=1 << 18)

    data = _inputs(ctx, n, torch.float32, "sum", fresh_seed(ctx), 1)[0]
    g = group()
    t = data[rank].to(ctx.device, copy=True).view(rows, cols)
    ccl.all_reduce(t, group=g, algorithm="one_shot")
    ctx.synchronize()
    _check(t.view(-1), _reference(data, "sum", torch.float32), torch.float32, "sum", w, "chunked all_reduce [r, c]",
           _scale(data, "sum"))
    ccl.destroy_group(g)
    for algorithm in ("push", "pull"):
        g = group()
        out = _poison(torch.empty(w, rows, cols, device=ctx.device))
        ccl.all_gather_into_tensor(out, data[rank].to(ctx.device, copy=True).view(rows, cols), group=g,
                                   algorithm=algorithm)
        ctx.synchronize()
        assert torch.equal(out.cpu().view(w, n), torch.stack(data)), f"all_gather {algorithm} of [{rows}, {cols}]"
        ccl.destroy_group(g)
    g = group()
    big = _inputs(ctx, w * n, torch.float32, "sum", fresh_seed(ctx), 1)[0]
    rs = _poison(torch.empty(rows, cols, device=ctx.device))
    ccl.reduce_scatter_tensor(rs, big[rank].to(ctx.device, copy=True).view(w * rows, cols), group=g)
    ctx.synchronize()
    part = slice(rank * n, (rank + 1) * n)
    _check(rs.view(-1), _reference(big, "sum", torch.float32)[part], torch.float32, "sum", w,
           "chunked reduce_scatter [w r, c]", _scale(big, "sum")[part])
    ccl.destroy_group(g)


def _fresh_and_recurring_rank(ctx):
    """One-chunk calls on inputs that are new at every call (a functional op's fresh result
    all-reduced in place), mixed with two that recur (an engine's double buffer), more of them
    than a call keeps prepared launches for: every result against the float64 reference, each
    recurring buffer's values its own call's."""
    from iris_fw import ccl
    from iris_fw.ccl import algorithm as al

    n, w, rank = _n(ctx, 301), ctx.world_size, ctx.rank
    calls = 3 * al.PREPARED_PER_CALL + 2
    data = _inputs(ctx, n, torch.float32, "sum", fresh_seed(ctx), calls)
    recurring = [torch.empty(n, device=ctx.device) for _ in range(2)]
    kept = []
    for i in range(calls):
        t = recurring[i % 2] if i % 3 == 0 else torch.empty(n, device=ctx.device)
        t.copy_(data[i][rank])
        ccl.all_reduce(t, algorithm="one_shot")
        ctx.synchronize()
        _check(t, _reference(data[i], "sum", torch.float32), torch.float32, "sum", w, f"all_reduce call {i}",
               _scale(data[i], "sum"))
        kept.append(t)  # fresh inputs stay alive: no data_ptr is reused
    out = [_poison(torch.empty(w, n, device=ctx.device)) for _ in range(3)]
    for i, o in enumerate(out):  # a new output and a new input at every call
        ccl.all_gather_into_tensor(o, data[i][rank].to(ctx.device, copy=True))
    ctx.synchronize()
    for i, o in enumerate(out):
        assert torch.equal(o.cpu(), torch.stack(data[i])), f"all_gather call {i}"
    ctx.barrier()


def test_fresh_and_recurring_inputs(iris_pool):
    iris_pool(2).run(_fresh_and_recurring_rank)


@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])
def test_chunks_of_multidimensional_tensors(iris_pool, world_size):
    """Chunk offsets count elements of the flattened tensors, whatever their shape. (CPU ranks: 3
    by default, 2 under ``-m extended``.)"""
    iris_pool(world_size).run(_chunked_shapes_rank)


def _many_tiles_rank(ctx, algorithm):
    """Every program carries several tiles (on the CPU: 13 tiles of a segment over 4 programs)
    and one rank enters late, so a tile whose flag or data is not its own shows."""
    import time

    from iris_fw import ccl

    n = 6 * 4096 + 37 if ctx.device.type == "cpu" else (4 << 20) + 37
    data = _inputs(ctx, n, torch.float32, "sum", fresh_seed(ctx), 2)
    ts = [d[ctx.rank].to(ctx.device, copy=True) for d in data]
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.5)
    for t in ts:
        ccl.all_reduce(t, algorithm=algorithm)
    ctx.synchronize()
    for i, t in enumerate(ts):
        _check(t, _reference(data[i], "sum", torch.float32), torch.float32, "sum", ctx.world_size,
               f"{algorithm} many tiles call {i}", _scale(data[i], "sum"))


@pytest.mark.parametrize("algorithm,w", [cpu_extended("ring", 2, id="ring-2"), ("ring", 3), ("one_shot", 2),
                                         ("two_shot", 2)])
def test_all_reduce_many_tiles_per_program(iris_pool, algorithm, w):
    """Regression (2x H200, ring's first call wrong): the ring's per-step flags held only the
    call's epoch, which a program's first tile already satisfied for its later tiles. (CPU
    ranks: the ring at 3 by default, at 2 under ``-m extended``.)"""
    iris_pool(w).run(_many_tiles_rank, algorithm)


# ---- all_gather / reduce_scatter / all_to_all -----------------------------------------------------


def _all_gather_rank(ctx, algorithm, heap_input):
    from iris_fw import ccl

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float8_e5m2):
        n = _n(ctx, 777)
        data = _inputs(ctx, n, dtype, "sum", fresh_seed(ctx), 2)
        if heap_input:
            ins = [ctx.empty(n, dtype=dtype) for _ in data]
            for t, d in zip(ins, data):
                t.copy_(d[ctx.rank])
        else:
            ins = [d[ctx.rank].to(ctx.device, copy=True) for d in data]
        outs = [_poison(torch.empty(ctx.world_size, n, dtype=dtype, device=ctx.device)) for _ in data]
        for o, i in zip(outs, ins):
            ccl.all_gather_into_tensor(o, i, algorithm=algorithm)
        ctx.synchronize()
        for k, o in enumerate(outs):
            want = torch.stack(data[k])
            assert torch.equal(o.cpu().view(torch.uint8), want.view(torch.uint8)), f"{algorithm} {dtype} call {k}"
        del ins


@pytest.mark.parametrize("algorithm,heap_input", [("push", False), ("pull", False), ("pull", True)])
@on_worlds(1, 3)
def test_all_gather(world, algorithm, heap_input):
    """Push and pull, a staged and an in-place (heap) input, bit-exact."""
    world.run(_all_gather_rank, algorithm, heap_input)


def _reduce_scatter_rank(ctx):
    from iris_fw import ccl

    for dtype, op in ((torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.int32, "max"), (torch.float8_e4m3fn, "sum"),
                      (torch.int64, "prod")):
        n = _n(ctx, 555)
        data = _inputs(ctx, ctx.world_size * n, dtype, op, fresh_seed(ctx), 2)
        outs = [_poison(torch.empty(n, dtype=dtype, device=ctx.device)) for _ in data]
        for o, d in zip(outs, data):
            ccl.reduce_scatter_tensor(o, d[ctx.rank].to(ctx.device, copy=True), op=op)
        ctx.synchronize()
        for k, o in enumerate(outs):
            part = slice(ctx.rank * n, (ctx.rank + 1) * n)
            want = _reference(data[k], op, dtype)[part]
            _check(o, want, dtype, op, ctx.world_size, f"reduce_scatter {dtype} {op} call {k}", _scale(data[k], op)[part])


@on_worlds(1, 3)
def test_reduce_scatter(world):
    world.run(_reduce_scatter_rank)


def _all_to_all_rank(ctx, even):
    from iris_fw import ccl

    w, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(fresh_seed(ctx))
    rows = torch.randint(0, 9 if ctx.device.type == "cpu" else 900, (w, w), generator=g)  # rows[i][j]: i -> j
    if even:
        rows[:] = 5
    else:
        rows[0][w - 1] = 0  # an empty chunk
    width = 3
    sent = [[torch.randn(int(rows[i][j]), width, generator=g) for j in range(w)] for i in range(w)]
    inp = torch.cat(sent[r]).to(ctx.device)
    out = _poison(torch.empty(int(rows[:, r].sum()), width, device=ctx.device))
    if even:
        ccl.all_to_all_single(out, inp)
    else:
        ccl.all_to_all_single(out, inp, output_split_sizes=rows[:, r].tolist(), input_split_sizes=rows[r].tolist())
    ctx.synchronize()
    want = torch.cat([sent[i][r] for i in range(w)])
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("even", [True, False], ids=["equal", "ragged"])
@on_worlds(1, 3)
def test_all_to_all_single(world, even):
    world.run(_all_to_all_rank, even)


# ---- rooted ---------------------------------------------------------------------------------------


def _rooted_rank(ctx):
    from iris_fw import ccl

    w, r = ctx.world_size, ctx.rank
    root = w - 1  # not rank 0
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        n = _n(ctx, 301)
        data = _inputs(ctx, n, dtype, "sum", fresh_seed(ctx), 1)[0]
        # broadcast
        t = data[r].to(ctx.device, copy=True)
        ccl.broadcast(t, src=root)
        # reduce (the root's tensor only)
        red = data[r].to(ctx.device, copy=True)
        ccl.reduce(red, dst=root, op="sum")
        # gather / scatter
        gl = [_poison(torch.empty(n, dtype=dtype, device=ctx.device)) for _ in range(w)] if r == root else None
        ccl.gather(data[r].to(ctx.device, copy=True), gl, dst=root)
        mine = _poison(torch.empty(n, dtype=dtype, device=ctx.device))
        sl = [d.to(ctx.device, copy=True) for d in data] if r == root else None
        ccl.scatter(mine, sl, src=root)
        ctx.synchronize()
        assert torch.equal(t.cpu(), data[root]), f"broadcast {dtype}"
        if r == root:
            _check(red, _reference(data, "sum", dtype), dtype, "sum", w, f"reduce {dtype}", _scale(data, "sum"))
            for p in range(w):
                assert torch.equal(gl[p].cpu(), data[p]), f"gather {dtype} from {p}"
        else:
            assert torch.equal(red.cpu(), data[r]), f"reduce changed a non-root's tensor ({dtype})"
        assert torch.equal(mine.cpu(), data[r]), f"scatter {dtype}"


@on_worlds(1, 3)
def test_rooted(world):
    """broadcast, reduce, gather, scatter from/to the last rank."""
    world.run(_rooted_rank)


def _bad_list_rank(ctx):
    from iris_fw import ccl

    t = torch.ones(10, device=ctx.device)
    root = ctx.world_size - 1
    short = [torch.empty(10, device=ctx.device)] if ctx.rank == root else None  # one tensor, not W
    with pytest.raises((ValueError, CollectiveMismatch)) as info:
        ccl.gather(t, short, dst=root)
    return str(info.value)


def test_rooted_bad_list_raises_everywhere(iris_pool):
    """The root's list of the wrong length raises on every rank, naming the root's argument."""
    msgs = iris_pool(2).run(_bad_list_rank)
    assert all("gather_list" in m for m in msgs), msgs


def _barrier_rank(ctx):
    from iris_fw import ccl

    for _ in range(3):
        ccl.barrier()
    work = ccl.barrier(async_op=True)
    work.wait()
    work.synchronize()
    assert work.is_completed()


@on_worlds(1, 3)
def test_barrier(world):
    world.run(_barrier_rank)


# ---- groups, async, validation --------------------------------------------------------------------


def _group_rank(ctx):
    from iris_fw import ccl

    members = [0, 2]
    g = ccl.new_group(members)  # every rank, as torch.distributed.new_group
    assert g.rank == (members.index(ctx.rank) if ctx.rank in members else None)
    if ctx.rank in members:
        t = torch.full((1000,), float(ctx.rank + 1), device=ctx.device)
        work = ccl.all_reduce(t, group=members, async_op=True)  # the list finds the group
        work.wait()
        ctx.synchronize()
        assert torch.all(t.cpu() == 4.0)
        with pytest.raises(ValueError, match="was not created"):
            ccl.all_reduce(t, group=[0, 1, 2][:2] if ctx.world_size > 3 else [0, 1])
    else:
        t = torch.ones(10, device=ctx.device)
        with pytest.raises(ValueError, match="not in the group"):
            ccl.all_reduce(t, group=g)
    ccl.destroy_group(g)


def test_groups(iris_pool):
    """A subgroup: members reduce, a non-member's call raises, unknown groups raise."""
    iris_pool(3).run(_group_rank)


def _mismatch_rank(ctx, what):
    from iris_fw import ccl

    n = 64 + (ctx.rank if what == "numel" else 0)
    dtype = torch.float32 if (what != "dtype" or ctx.rank == 0) else torch.bfloat16
    op = "max" if (what == "op" and ctx.rank == 1) else "sum"
    t = torch.ones(n, dtype=dtype, device=ctx.device)
    if what == "device" and ctx.rank == 1:
        t = torch.ones(n, device="meta")
    if what == "contiguous" and ctx.rank == 1:
        t = torch.ones(n, 2, device=ctx.device).t()[0]
    if what == "prepared":  # ccl.prepared validates across ranks like the call (rank 1's numel differs)
        with pytest.raises(CollectiveMismatch) as info:
            ccl.prepared("all_reduce", torch.ones(64 + ctx.rank, device=ctx.device))
        return str(info.value)
    if what == "splits":
        inp = torch.ones(ctx.world_size * 2, device=ctx.device)
        out = torch.empty(ctx.world_size * 2, device=ctx.device)
        ins = [2] * ctx.world_size
        if ctx.rank == 0:
            ins = [1, 3] + [2] * (ctx.world_size - 2)
        with pytest.raises(ValueError, match="sends"):
            ccl.all_to_all_single(out, inp, input_split_sizes=ins, output_split_sizes=[2] * ctx.world_size)
        return str(what)
    with pytest.raises((CollectiveMismatch, ValueError, TypeError)) as info:
        ccl.all_reduce(t, op=op)
    return str(info.value)


@pytest.mark.parametrize("what", ["numel", "dtype", "op", "device", "contiguous", "splits", "prepared"])
def test_mismatch_raises_everywhere(iris_pool, what):
    """One rank's different argument raises on every rank, naming the ranks and the argument."""
    import time

    t0 = time.monotonic()
    msgs = iris_pool(2).run(_mismatch_rank, what)
    assert time.monotonic() - t0 < 30
    if what in ("numel", "dtype", "op", "prepared"):
        name = "numel" if what == "prepared" else what
        assert all(name in m and "ranks 0" in m and "ranks 1" in m for m in msgs), msgs
    if what in ("device", "contiguous"):
        assert "rank 1 rejected its arguments" in msgs[0] and what in msgs[1].lower().replace("meta", "device"), msgs


def _missing_rank(ctx):
    from iris_fw import ccl

    ccl.new_group()  # the world group, created by every rank
    start = time.monotonic()
    if ctx.rank == 0:
        t = torch.ones(10, device=ctx.device)
        with pytest.raises(CallMismatch, match=r"rank 1 is in iris_fw.ccl.destroy_group\(\) .* while rank 0 is in "
                                               r"iris_fw.ccl.all_reduce\(dtype=float32, numel=10"):
            ccl.all_reduce(t)
        assert time.monotonic() - start < 5  # the call board, not the wait timeout
    ccl.destroy_group()
    try:
        ctx.barrier()  # re-arms the job (rank 0 aborted the waits of its peers)
    except PeerFailure:
        ctx.barrier()


def _stuck_rank(ctx):
    from iris_fw import ccl

    ccl.new_group()
    old, ctx.wait_timeout = ctx.wait_timeout, 1.0
    try:
        if ctx.rank == 0:
            t = torch.ones(10, device=ctx.device)
            with pytest.raises(WaitTimeout, match=r"rank\(s\) \[1\] .* did not enter"):
                ccl.all_reduce(t)
        else:
            time.sleep(2.5)  # busy on its host for longer than the wait timeout (a loaded host's too)
    finally:
        ctx.wait_timeout = old
    ccl.destroy_group()
    ctx.barrier()


def test_missing_rank_is_named_at_once(iris_pool):
    """A rank that skips a collective and goes on to another: the others raise at once, naming
    the call each rank is in."""
    iris_pool(2).run(_missing_rank)


def test_busy_rank_times_out(iris_pool):
    """A rank busy on its host: the others raise within the wait timeout, naming it."""
    iris_pool(2).run(_stuck_rank)


def _algorithms_rank(ctx):
    from iris_fw import ccl

    assert set(ccl.algorithms("all_reduce", ctx=ctx)) >= {"one_shot", "two_shot", "lamport", "ring"}
    t = torch.ones(8, dtype=torch.int32, device=ctx.device)
    with pytest.raises(ValueError, match="floating"):
        ccl.all_reduce(t, algorithm="lamport")


def test_algorithm_choice(iris_pool):
    iris_pool(2).run(_algorithms_rank)


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------


def _graph_rank(ctx, collective):
    from iris_fw import ccl

    w, r, n = ctx.world_size, ctx.rank, (1 << 16) + 37
    dev = ctx.device
    x = torch.empty(n, dtype=torch.bfloat16, device=dev)
    big = torch.empty(w * n, dtype=torch.bfloat16, device=dev)
    small = torch.empty(n, dtype=torch.bfloat16, device=dev)
    calls = {
        "all_reduce_lamport": lambda: ccl.all_reduce(small.copy_(x), algorithm="lamport"),
        "all_reduce_one_shot": lambda: ccl.all_reduce(small.copy_(x), algorithm="one_shot"),
        "all_reduce_two_shot": lambda: ccl.all_reduce(small.copy_(x), algorithm="two_shot"),
        "all_reduce_ring": lambda: ccl.all_reduce(small.copy_(x), algorithm="ring"),
        "all_gather": lambda: ccl.all_gather_into_tensor(big, x),
        "reduce_scatter": lambda: ccl.reduce_scatter_tensor(small, big),
        "broadcast": lambda: ccl.broadcast(small.copy_(x), src=w - 1),
    }
    if collective == "all_reduce_prepared":  # (prepared once, outside the capture: x summed into small)
        reduce = ccl.prepared("all_reduce", small, ctx=ctx)
        calls[collective] = lambda: reduce(x, small)
    fn = calls[collective]
    g = torch.Generator().manual_seed(fresh_seed(ctx))

    def draw():
        per_rank = [torch.randn(n, generator=g).to(torch.bfloat16) for _ in range(w)]
        x.copy_(per_rank[r])
        if collective == "reduce_scatter":
            full = [torch.randn(w * n, generator=g).to(torch.bfloat16) for _ in range(w)]
            big.copy_(full[r])
            return full
        return per_rank

    draw()
    graph = capture_graph(ctx, fn)  # plans and validates outside the capture
    for _ in range(4):
        data = draw()
        small.fill_(float("nan"))
        big_before = big.clone()
        graph.replay()
        ctx.synchronize()
        if collective.startswith("all_reduce"):
            want = _reference(data, "sum", torch.bfloat16)
            _check(small, want, torch.bfloat16, "sum", w, collective, _scale(data, "sum"))
        elif collective == "all_gather":
            assert torch.equal(big.cpu(), torch.cat(data))
        elif collective == "reduce_scatter":
            want = _reference(data, "sum", torch.bfloat16)[r * n:(r + 1) * n]
            _check(small, want, torch.bfloat16, "sum", w, collective, _scale(data, "sum")[r * n:(r + 1) * n])
            assert torch.equal(big, big_before)
        else:
            assert torch.equal(small.cpu(), data[w - 1])
        ctx.barrier()


@pytest.mark.parametrize("collective", ["all_reduce_lamport", "all_reduce_one_shot", "all_reduce_two_shot",
                                        "all_reduce_ring", "all_reduce_prepared", "all_gather", "reduce_scatter",
                                        "broadcast"])
def test_graph_replay(iris_pool, on_gpu, collective):
    """Captured once, replayed with fresh inputs: correct every time (GPU only)."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    iris_pool(2).run(_graph_rank, collective)


def _prepared_rank(ctx):
    """``ccl.prepared``: an all-reduce in place and from one tensor into another, an all-gather
    and a reduce-scatter into replaced outputs, each called several times without host
    synchronization; the sources left alone; a bad collective name raises."""
    from iris_fw import ccl
    from iris_fw.errors import ArgumentError

    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    n = _n(ctx, 333)
    dtype = torch.float32
    data = _inputs(ctx, n, dtype, "sum", fresh_seed(ctx), 3)
    t = torch.empty(n, dtype=dtype, device=dev)
    reduce = ccl.prepared("all_reduce", t, ctx=ctx)
    srcs = [d[r].to(dev, copy=True) for d in data]
    dsts = [_poison(torch.empty(n, dtype=dtype, device=dev)) for _ in data]
    t.copy_(srcs[0])
    reduce()  # in place
    for s, d in zip(srcs[1:], dsts[1:]):
        reduce(s, d)  # from s into d
    ctx.synchronize()
    _check(t, _reference(data[0], "sum", dtype), dtype, "sum", w, "prepared all_reduce in place", _scale(data[0], "sum"))
    for k in (1, 2):
        _check(dsts[k], _reference(data[k], "sum", dtype), dtype, "sum", w, f"prepared all_reduce into call {k}",
               _scale(data[k], "sum"))
        assert torch.equal(srcs[k].cpu(), data[k][r]), "the all-reduce's source changed"

    inp = torch.empty(n, dtype=dtype, device=dev)
    outs = [_poison(torch.empty(w * n, dtype=dtype, device=dev)) for _ in range(2)]
    gather = ccl.prepared("all_gather_into_tensor", outs[0], inp, ctx=ctx)
    for k, o in enumerate(outs):
        inp.copy_(data[k][r])
        gather(None, o)
        ctx.synchronize()  # (inp refilled next)
        assert torch.equal(o.cpu(), torch.cat(data[k])), f"prepared all_gather call {k}"

    full = [d[r].to(dev, copy=True).repeat(w) for d in data[:2]]
    parts = [_poison(torch.empty(n, dtype=dtype, device=dev)) for _ in range(2)]
    scatter = ccl.prepared("reduce_scatter_tensor", parts[0], full[0], ctx=ctx)
    scatter()
    scatter(full[1], parts[1])
    ctx.synchronize()
    for k in range(2):
        want = _reference([x.repeat(w) for x in data[k]], "sum", dtype)[r * n:(r + 1) * n]
        _check(parts[k], want, dtype, "sum", w, f"prepared reduce_scatter call {k}",
               _scale([x.repeat(w) for x in data[k]], "sum")[r * n:(r + 1) * n])
    with pytest.raises(ArgumentError, match="input is fixed"):
        gather(torch.empty_like(inp), outs[0])
    # inside a trace session (the traced variant), prepared inside one (the plain variant on the
    # first call after it), and the plain one again after it: right every time
    def in_place(calls, what):
        for call in calls:
            t.copy_(srcs[0])
            call()
            ctx.synchronize()
            _check(t, _reference(data[0], "sum", dtype), dtype, "sum", w, f"prepared all_reduce {what}",
                   _scale(data[0], "sum"))

    with ctx.trace(None):
        traced = ccl.prepared("all_reduce", t, ctx=ctx)
        in_place((reduce, traced), "traced")
    assert traced.entry is None
    in_place((traced, reduce), "after tracing")
    assert traced.entry is reduce.entry
    with pytest.raises(ArgumentError, match="collective must be one of"):
        ccl.prepared("all_to_all_single", t, t, ctx=ctx)
    with pytest.raises(TypeError, match="takes 2 tensor"):
        ccl.prepared("reduce_scatter_tensor", t, ctx=ctx)
    with pytest.raises(TypeError, match="takes no op"):
        ccl.prepared("all_gather_into_tensor", outs[0], inp, op="sum", ctx=ctx)


@on_worlds(1, 3)
def test_prepared(world):
    world.run(_prepared_rank)
