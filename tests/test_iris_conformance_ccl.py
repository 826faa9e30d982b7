"""Iris conformance, collectives and ops: ``shmem.ccl`` (all_gather, all_reduce with every variant
and its preamble/workspace, reduce_scatter keeping ``(M, N)`` with Iris's tile ownership,
column-chunked all_to_all, gemm_reduce_scatter, ``Config``, ``ReduceOp``), ``shmem.ops``
(matmul_all_reduce, all_gather_matmul sharding A along K, matmul_all_gather,
matmul_reduce_scatter, their configs and workspaces) and the tile collectives of
``iris.DeviceContext`` (Iris's tests/context kernels), with Iris's shapes (small on CPU ranks,
Iris's own on GPUs) and a ragged one. References in float64; worlds 1-4 (on CPU ranks one
world per test by default, all with ``-m extended``).
"""

import pytest
import torch
import triton
import triton.language as tl

import iris_fw.compat.iris as iris
from iris_fw.compat.iris.ccl import Config, ReduceOp
from iris_fw.compat.iris.ops import FusedConfig
from helpers import fresh_seed, on_worlds


def _rand(shape, dtype, seed, rank, device, scale=1.0):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed * 131 + rank)) * scale
    if not dtype.is_floating_point:
        t = (t * 8).round()
    return t.to(dtype).to(device)


def _close(got, want64, dtype, what, magnitude, terms=1, sequential=False):
    """``got`` equals the float64 sum ``want64`` of ``terms`` values whose absolute values sum to
    ``magnitude``: rounded once to ``dtype`` after an accumulation in fp32 (16-bit floats) or
    in ``dtype`` itself (wider floats: a rounding per term). ``sequential``: the sum was stored
    in ``dtype`` after every term (atomics; read-add-write under a lock)."""
    if not dtype.is_floating_point:
        assert torch.equal(got.long().cpu(), want64.round().long().cpu()), what
        return
    eps = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 2 ** -23, torch.float64: 2 ** -52}[dtype]
    acc_eps = min(eps, 2 ** -23)  # fp32 accumulation for 16-bit floats
    want, magnitude = want64.cpu(), magnitude.cpu()
    if sequential:
        bound = 2 * eps * max(1, terms) * (magnitude + 1e-3)
    else:
        bound = eps * want.abs() + 2 * acc_eps * max(1, terms) * magnitude + 1e-30
    err = (got.double().cpu() - want).abs()
    bad = err > bound
    assert not torch.any(bad), (f"{what}: {int(bad.sum())} elements off, worst {err[bad].max().item():.3g} "
                                f"(bounds there {bound[bad].min().item():.3g}…)")


#: The default run's dtype at each world size (every dtype runs at every world in -m extended).
DEFAULT_DTYPE = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float32}


def _shapes(ctx, shapes):
    """``shapes``: a list, or ``{"cpu": […], "cuda": […]}`` (Iris's own shapes on GPUs)."""
    return shapes[ctx.device.type] if isinstance(shapes, dict) else shapes


# ---- shmem.ccl -------------------------------------------------------------------------------------


def _iris_tile_owner(M, N, bm, bn, group_m, world, distribution):
    """Iris's test reference, tile by tile: owner rank of every tile number, mapped to (pid_m,
    pid_n) in the kernel's swizzled order (written independently of the compat layer)."""
    tiles_m, tiles_n = -(-M // bm), -(-N // bn)
    total = tiles_m * tiles_n
    per_rank = -(-total // world)
    owner = torch.full((M, N), -1, dtype=torch.int64)
    for tile_id in range(total):
        in_group = group_m * tiles_n
        first = tile_id // in_group * group_m
        height = min(tiles_m - first, group_m)
        pid_m = first + (tile_id % in_group) % height
        pid_n = (tile_id % in_group) // height
        rank = tile_id % world if distribution == 0 else tile_id // per_rank
        owner[pid_m * bm:(pid_m + 1) * bm, pid_n * bn:(pid_n + 1) * bn] = rank
    return owner


def _ccl(ctx, dtype, shapes, full=False):
    shapes = _shapes(ctx, shapes)
    shmem = iris.Iris(context=ctx)
    me, world, dev = ctx.rank, ctx.world_size, ctx.device
    for M, N in shapes:
        seed = fresh_seed(ctx)
        inputs = [_rand((M, N), dtype, seed, r, "cpu") for r in range(world)]
        total = sum(t.double() for t in inputs)
        magnitude = sum(t.double().abs() for t in inputs)
        x = shmem.as_symmetric(inputs[me].to(dev))
        # all_gather: (W*M, N) rows in rank order
        out = shmem.full((world * M, N), -7, dtype=dtype)
        shmem.ccl.all_gather(out, x)
        assert torch.equal(out.cpu(), torch.cat(inputs)), f"all_gather {dtype} {(M, N)}"
        # all_reduce: every variant, out of place and in place; preamble + workspace reuse
        ws = shmem.ccl.all_reduce_preamble(shmem.zeros_like(x), x)
        assert ws.prepared and ws.shape == (M, N) and ws.dtype == dtype
        # every variant in -m extended; by default the three iris-fw algorithms they map to
        for variant in ("atomic", "one_shot", "two_shot", "ring", "spinlock") if full else ("atomic", "two_shot", "ring"):
            out = shmem.full((M, N), -7, dtype=dtype)
            got_ws = shmem.ccl.all_reduce(out, x, config=Config(all_reduce_variant=variant), workspace=ws)
            assert got_ws is ws
            _close(out, total, dtype, f"all_reduce {variant} {dtype} {(M, N)}", magnitude, world)
        inplace = x.clone()
        shmem.ccl.all_reduce(inplace, inplace, op=ReduceOp.SUM)
        _close(inplace, total, dtype, f"all_reduce in place {dtype}", magnitude, world)
        assert torch.equal(x.cpu(), inputs[me]), "all_reduce must not modify its input"
        for op, ref in ((ReduceOp.MAX, torch.stack(inputs).amax(0)), (ReduceOp.MIN, torch.stack(inputs).amin(0)))[:2 if full else 1]:
            out = shmem.zeros_like(x)
            shmem.ccl.all_reduce(out, x, op=op)
            assert torch.equal(out.cpu(), ref), f"all_reduce {op.name} {dtype}"
        # reduce_scatter: (M, N) kept; this rank's tiles (Iris's swizzled order) reduced, others untouched
        for config, layout in [(None, (32, 64, 4, 1)), (Config(block_size_m=16, block_size_n=32, swizzle_size=2,
                                                                all_reduce_distribution=0), (16, 32, 2, 0)),
                               (Config(block_size_m=64, block_size_n=64, all_reduce_distribution=1), (64, 64, 4, 1))
                               ][:3 if full else 2]:
            out = shmem.full((M, N), -7, dtype=dtype)
            shmem.ccl.reduce_scatter(out, x, config=config)
            mine = (_iris_tile_owner(M, N, *layout[:3], world, layout[3]) == me)
            got = out.cpu()
            _close(got[mine], total[mine], dtype, f"reduce_scatter {layout} {dtype} {(M, N)}: owned tiles", magnitude[mine],
                   world)
            assert torch.all(got[~mine] == -7), f"reduce_scatter {layout}: tiles of other ranks were written"
        out = shmem.full((M, N), -7, dtype=dtype)
        shmem.ccl.reduce_scatter(out, x, config=Config(reduce_scatter_variant="inreg"))
        chunk = M * N // world
        flat, ref, mag = out.cpu().view(-1), total.view(-1), magnitude.view(-1)
        part = slice(me * chunk, (me + 1) * chunk)
        _close(flat[part], ref[part], dtype, "reduce_scatter inreg", mag[part], world)
        rest = torch.cat([flat[:me * chunk], flat[(me + 1) * chunk:]])
        assert torch.all(rest == -7), "reduce_scatter inreg: elements outside the rank's chunk were written"
        # all_to_all: column chunks (M, N*W)
        wide = [_rand((M, N * world), dtype, seed + 1, r, "cpu") for r in range(world)]
        out = shmem.full((M, N * world), -7, dtype=dtype)
        shmem.ccl.all_to_all(out, shmem.as_symmetric(wide[me].to(dev)))
        want = torch.cat([wide[s][:, me * N:(me + 1) * N] for s in range(world)], dim=1)
        assert torch.equal(out.cpu(), want), f"all_to_all {dtype} {(M, N)}"
        shmem.barrier()


@on_worlds(3)
def test_ccl(world):
    """Iris's (M, N) shapes on GPUs, a ragged one on CPU ranks (3 ranks and bf16 there by
    default; every world and dtype in :func:`test_ccl_iris_shapes`)."""
    world.run(_ccl, DEFAULT_DTYPE[world.world_size], {"cuda": [(128, 64), (1024, 256), (200, 72)], "cpu": [(12, 20)]})


@pytest.mark.extended
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16, torch.int32], ids=lambda d: str(d)[6:])
def test_ccl_iris_shapes(world, dtype):
    world.run(_ccl, dtype, {"cuda": [(128, 64), (1024, 256), (8192, 8192)], "cpu": [(128, 64), (16, 32), (100, 36)]},
              True, timeout=3000)


def _ccl_api(ctx):
    shmem = iris.Iris(context=ctx)
    me, world, dev = ctx.rank, ctx.world_size, ctx.device
    seed = fresh_seed(ctx)
    # gemm_reduce_scatter: column block [tokens, K/W] of Σ input_r @ weight_r (fp32 accumulation)
    T, H, K = 8, 16, 8 * world
    ins = [_rand((T, H), torch.float16, seed, r, "cpu", 0.5) for r in range(world)]
    ws = [_rand((H, K), torch.float16, seed + 1, r, "cpu", 0.5) for r in range(world)]
    got = shmem.ccl.gemm_reduce_scatter(ins[me].to(dev), ws[me].to(dev))
    ref = sum(i.double() @ w.double() for i, w in zip(ins, ws))[:, me * 8:(me + 1) * 8]
    mag = sum(i.double().abs() @ w.double().abs() for i, w in zip(ins, ws))[:, me * 8:(me + 1) * 8]
    assert got.dtype == torch.float16 and got.shape == (T, 8)
    _close(got, ref, torch.float16, "gemm_reduce_scatter", mag, H * world)
    wsp = shmem.ccl.gemm_reduce_scatter_preamble(ins[me].to(dev), ws[me].to(dev))
    assert wsp.output_f32.shape == (T, 8) and wsp.output_f32.dtype == torch.float32
    # Config validation (Iris's), AUTOTUNE, use_gluon refused, ReduceOp
    for bad in [dict(block_size_m=0), dict(all_reduce_variant="bogus"), dict(all_reduce_distribution=2),
                dict(all_reduce_ring_slice_n=48), dict(reduce_scatter_variant="x"), dict(comm_sms=-1)]:
        with pytest.raises(ValueError):
            Config(**bad)
    assert Config().num_xcds == 1 and Config().all_reduce_ring_slice_n == 64
    x = shmem.ones(4, 8)
    out = shmem.zeros(4, 8)
    shmem.ccl.all_reduce(out, x, config=iris.ccl.AUTOTUNE)
    assert torch.all(out == world)
    with pytest.raises(ValueError, match="Gluon"):
        shmem.ccl.all_gather(shmem.zeros(world * 4, 8), x, config=Config(use_gluon=True))
    for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        with pytest.raises(ValueError, match="op must be"):
            shmem.ccl.all_reduce(out, x, op=op)
    with pytest.raises(ValueError, match="same shape"):
        shmem.ccl.reduce_scatter(shmem.zeros(2, 8), x)
    with pytest.raises(ValueError, match="world_size"):
        shmem.ccl.all_gather(shmem.zeros(4, 8), x) if world > 1 else shmem.ccl.all_gather(shmem.zeros(5, 8), x)
    p = shmem.ones(4, 8) * (me + 1)
    shmem.ccl.all_reduce(out, p, op=ReduceOp.PRODUCT)
    assert torch.all(out == float(torch.arange(1, world + 1).prod()))
    # the module-level functions with the host object as third argument
    from iris_fw.compat.iris.ccl.all_gather import all_gather

    g = shmem.zeros(world * 4, 8)
    all_gather(g, x * (me + 1), shmem)
    assert torch.equal(g.cpu(), torch.cat([torch.full((4, 8), float(r + 1)) for r in range(world)]))
    shmem.barrier()


@on_worlds(2)
def test_ccl_api(world):
    world.run(_ccl_api)


# ---- shmem.ops -------------------------------------------------------------------------------------


def _ops(ctx, dtype, shapes, full=True):
    shapes = _shapes(ctx, shapes)
    shmem = iris.Iris(context=ctx)
    me, world, dev = ctx.rank, ctx.world_size, ctx.device
    tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 2e-4}[dtype]

    def check(got, ref, what):
        err = (got.double().cpu() - ref).abs().max().item()
        assert err <= tol * max(1.0, ref.abs().max().item()), f"{what} {dtype}: max error {err:.3g}"

    for M, N, K in shapes:
        seed = fresh_seed(ctx)
        A = [_rand((M, K), dtype, seed, r, "cpu", 0.5) for r in range(world)]
        B = [_rand((K, N), dtype, seed + 1, r, "cpu", 0.5) for r in range(world)]
        a, b = shmem.as_symmetric(A[me].to(dev)), shmem.as_symmetric(B[me].to(dev))
        # matmul_all_reduce: Σ_r A_r @ B_r, every variant
        # every variant where kernels are fast; on CPU ranks by default an explicit algorithm and the op's choice
        for variant in ("one_shot", "two_shot", "atomic") if full or dev.type == "cuda" else ("two_shot", "atomic"):
            C = shmem.full((M, N), float("nan"), dtype=dtype)
            ws = shmem.ops.matmul_all_reduce(C, a, b, config=FusedConfig(all_reduce_variant=variant))
            check(C, sum(x.double() @ y.double() for x, y in zip(A, B)), f"matmul_all_reduce {variant}")
            assert ws.operation == "matmul_all_reduce" and ws.shape == (M, N, K) and ws.prepared
        # all_gather_matmul: A sharded along K — concat_K(A_r[M, K/W]) @ B[K, N] (+ bias[M])
        kl = K // world
        shards = [x[:, :kl].contiguous() for x in A]
        Bfull = _rand((world * kl, N), dtype, seed + 2, 0, "cpu", 0.5)
        bias = _rand((M,), dtype, seed + 3, 0, "cpu")
        ref = torch.cat(shards, dim=1).double() @ Bfull.double()
        C = shmem.full((M, N), float("nan"), dtype=dtype)
        shmem.ops.all_gather_matmul(C, shards[me].to(dev), Bfull.to(dev))
        check(C, ref, "all_gather_matmul")
        shmem.ops.all_gather_matmul(C, shards[me].to(dev), Bfull.to(dev), bias=bias.to(dev))
        check(C, ref + bias.double()[:, None], "all_gather_matmul + bias")
        ws = iris.ops.all_gather_matmul_preamble(shmem, shards[me].to(dev), Bfull.to(dev))
        assert ws.shape == (M, N, world * kl)
        # matmul_all_gather: rows r·M… = A_r @ B (+ bias_r)
        Bs = B[0]  # replicated
        biases = [_rand((M,), dtype, seed + 4, r, "cpu") for r in range(world)]
        C = shmem.full((world * M, N), float("nan"), dtype=dtype)
        shmem.ops.matmul_all_gather(C, a, Bs.to(dev))
        check(C, torch.cat([x.double() @ Bs.double() for x in A]), "matmul_all_gather")
        shmem.ops.matmul_all_gather(C, a, Bs.to(dev), bias=biases[me].to(dev))
        check(C, torch.cat([x.double() @ Bs.double() + bb.double()[:, None] for x, bb in zip(A, biases)]),
              "matmul_all_gather + bias")
        # matmul_reduce_scatter: this rank's tiles (row-major, floor(T/W) each, last takes the rest) of Σ A_r @ B_r
        cfg = FusedConfig(block_size_m=16, block_size_n=16, block_size_k=16)
        C = shmem.full((M, N), float("nan"), dtype=dtype)
        shmem.ops.matmul_reduce_scatter(C, a, b, config=cfg)
        tiles_m, tiles_n = -(-M // 16), -(-N // 16)
        per = tiles_m * tiles_n // world
        owner = torch.empty(M, N, dtype=torch.int64)
        for t in range(tiles_m * tiles_n):
            owner[t // tiles_n * 16:(t // tiles_n + 1) * 16, t % tiles_n * 16:(t % tiles_n + 1) * 16] = min(t // per, world - 1) if per else world - 1
        mine = owner == me
        ref = sum(x.double() @ y.double() for x, y in zip(A, B))
        check(C.cpu()[mine], ref[mine], "matmul_reduce_scatter owned tiles")
        assert torch.all(C.cpu()[~mine] == 0), "matmul_reduce_scatter: tiles of other ranks must be zero"
    # namespace: bias that Iris does not apply is refused; bad shapes raise ValueError
    with pytest.raises(ValueError, match="bias"):
        shmem.ops.matmul_all_reduce(C[:M], a, b, bias=torch.zeros(M, device=dev, dtype=dtype))
    with pytest.raises(ValueError, match="Incompatible"):  # B has K + 1 rows for A's K columns, at any size
        shmem.ops.matmul_all_reduce(shmem.zeros(M, N, dtype=dtype), a, shmem.zeros(K + 1, N, dtype=dtype))
    with pytest.raises(ValueError):
        FusedConfig(block_size_k=0).validate()
    shmem.barrier()


@on_worlds(2)
def test_ops(world):
    """Iris's shapes on GPUs, a ragged one on CPU ranks (2 ranks and fp32 there by default; every
    world and dtype in :func:`test_ops_iris_shapes`)."""
    world.run(_ops, {1: torch.float16, 2: torch.float32, 3: torch.bfloat16, 4: torch.float16}[world.world_size],
              {"cuda": [(64, 64, 128), (512, 256, 512), (1024, 2048, 1024)], "cpu": [(24, 20, 32)]}, False)


@pytest.mark.extended
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_ops_iris_shapes(world, dtype):
    world.run(_ops, dtype, {"cuda": [(64, 64, 128), (512, 256, 512), (1024, 2048, 1024)],
                            "cpu": [(64, 64, 128), (40, 72, 96)]}, timeout=3000)


# ---- DeviceContext tile collectives (Iris's tests/context kernels) -------------------------------------


@triton.jit
def _tile_kernel(inp, tmp, out, locks, ctx_t, M: tl.constexpr, N: tl.constexpr, cur_rank: tl.constexpr,
                 world_size: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, VARIANT: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BN)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None] * N + rn[None, :]
    data = tl.load(inp + offs, mask=mask, other=0.0)
    tile = iris.Tile(pid_m, pid_n, BM, BN, data)
    ctx = iris.DeviceContext.initialize(ctx_t, cur_rank, world_size)
    if VARIANT == "gather0" or VARIANT == "gather1":
        dim: tl.constexpr = 0 if VARIANT == "gather0" else 1
        rows: tl.constexpr = M * world_size if VARIANT == "gather0" else M
        cols: tl.constexpr = N if VARIANT == "gather0" else N * world_size
        ctx.all_gather(tile, iris.make_tensor_view(out, rows, cols, cols, 1), dim)
    elif VARIANT == "atomic":
        ctx.all_reduce_atomic(tile, iris.make_tensor_view(out, M, N, N, 1))
    elif VARIANT == "spinlock":
        ctx.all_reduce_spinlock(tile, iris.make_tensor_view(out, M, N, N, 1), locks)
    elif VARIANT == "ring":
        ctx.all_reduce_ring(tile, iris.make_tensor_view(inp, M, N, N, 1), iris.make_tensor_view(out, M, N, N, 1))
    elif VARIANT == "gather_from":  # read every rank's tile of inp (TileView) into rows r*M… of out
        for r in range(world_size):
            got = ctx.gather(iris.TileView(pid_m, pid_n, BM, BN), iris.make_tensor_view(inp, M, N, N, 1), r)
            tl.store(out + r * M * N + offs, got, mask=mask)
    else:  # flag-synchronized variants: publish the tile in tmp, then signal (as Iris's tests do)
        tl.store(tmp + offs, data, mask=mask, cache_modifier=".wt")
        tl.debug_barrier()
        tl.atomic_xchg(locks + pid, 1, sem="release", scope="sys")
        src = iris.make_tensor_view(tmp, M, N, N, 1)
        dst = iris.make_tensor_view(out, M, N, N, 1)
        if VARIANT == "one_shot":
            ctx.all_reduce_one_shot(tile, src, dst, locks)
        elif VARIANT == "two_shot":
            ctx.all_reduce_two_shot(tile, src, dst, locks)
        else:
            ctx.reduce_scatter(tile, src, dst, locks)


@triton.jit
def _all_to_all_kernel(inp, out, ctx_t, M: tl.constexpr, NW: tl.constexpr, cur_rank: tl.constexpr,
                       world_size: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(NW, BN)
    ctx = iris.DeviceContext.initialize(ctx_t, cur_rank, world_size)
    ctx.all_to_all(iris.TileView(pid // tiles_n, pid % tiles_n, BM, BN), iris.make_tensor_view(inp, M, NW, NW, 1),
                   iris.make_tensor_view(out, M, NW, NW, 1), NW // world_size)


def _tiles(ctx, dtype, shapes):
    shapes = _shapes(ctx, shapes)
    shmem = iris.Iris(context=ctx)
    me, world, dev = ctx.rank, ctx.world_size, ctx.device
    context = shmem.get_device_context()
    for M, N, BM, BN in shapes:
        seed = fresh_seed(ctx)
        inputs = [_rand((M, N), dtype, seed, r, "cpu") for r in range(world)]
        x = shmem.as_symmetric(inputs[me].to(dev))
        total = sum(t.double() for t in inputs)
        magnitude = sum(t.double().abs() for t in inputs)
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        variants = ["gather0", "gather1", "atomic", "spinlock", "ring", "one_shot", "two_shot", "reduce_scatter",
                    "gather_from"]
        for variant in variants:
            if variant == "atomic" and dtype == torch.bfloat16 and dev.type == "cpu":
                continue  # Triton's interpreter has no bf16 atomic add; GPUs run it
            rows, cols = {"gather0": (world * M, N), "gather1": (M, world * N), "gather_from": (world * M, N)}.get(
                variant, (M, N))
            start = 0.0 if variant in ("atomic", "spinlock") else -7.0  # accumulating variants start from 0
            out = shmem.full((rows, cols), start, dtype=dtype)
            tmp = shmem.zeros((M, N), dtype=dtype)
            locks = shmem.zeros(grid[0], dtype=torch.int32)
            shmem.barrier()
            _tile_kernel[grid](x, tmp, out, locks, context, M, N, me, world, BM, BN, variant)
            shmem.barrier()
            got, what = out.cpu(), f"DeviceContext.{variant} {dtype} {(M, N, BM, BN)} (rank {me})"
            if variant == "gather0" or variant == "gather_from":
                assert torch.equal(got, torch.cat(inputs, 0)), what
            elif variant == "gather1":
                assert torch.equal(got, torch.cat(inputs, 1)), what
            elif variant in ("atomic", "spinlock"):
                _close(got, total, dtype, what, magnitude, world, sequential=True)
            elif variant in ("ring", "one_shot"):
                _close(got, total, dtype, what, magnitude, world)
            else:
                tiles_n, total_tiles = triton.cdiv(N, BN), grid[0]
                owned = torch.zeros(M, N, dtype=torch.bool)
                per = total_tiles // world
                for t in range(total_tiles):
                    owner = t % world if variant == "two_shot" else min(t // per, world - 1) if per else world - 1
                    if variant == "two_shot" or owner == me:  # two-shot: the owner writes every rank's output
                        owned[t // tiles_n * BM:(t // tiles_n + 1) * BM, t % tiles_n * BN:(t % tiles_n + 1) * BN] = True
                _close(got[owned], total[owned], dtype, what, magnitude[owned], world)
                assert torch.all(got[~owned] == -7), f"{what}: tiles of other ranks were written"
        # all_to_all: column chunks of (M, N*W)
        wide = [_rand((M, N * world), dtype, seed + 1, r, "cpu") for r in range(world)]
        src = shmem.as_symmetric(wide[me].to(dev))  # written before the barrier: peers read it
        out = shmem.full((M, N * world), -7.0, dtype=dtype)
        shmem.barrier()
        _all_to_all_kernel[(triton.cdiv(M, BM) * triton.cdiv(N * world, BN),)](
            src, out, context, M, N * world, me, world, BM, BN)
        shmem.barrier()
        want = torch.cat([wide[s][:, me * N:(me + 1) * N] for s in range(world)], dim=1)
        assert torch.equal(out.cpu(), want), f"DeviceContext.all_to_all {dtype} {(M, N, BM, BN)}"


@on_worlds(3)
def test_tile_collectives(world):
    """Iris's tests/context shapes on GPUs; on CPU ranks a ragged one of two tiles (3 ranks and
    bf16 there by default; every world and dtype in :func:`test_tile_collectives_iris_shapes`)."""
    world.run(_tiles, DEFAULT_DTYPE[world.world_size],
              {"cuda": [(128, 64, 64, 32), (256, 128, 64, 16), (100, 100, 64, 64)], "cpu": [(20, 12, 16, 16)]})


@pytest.mark.extended
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_tile_collectives_iris_shapes(world, dtype):
    world.run(_tiles, dtype, {"cuda": [(128, 64, 64, 32), (128, 128, 64, 32), (1024, 256, 128, 128),
                                       (2048, 2048, 256, 256), (64, 32, 128, 128)],
                              "cpu": [(128, 64, 64, 32), (32, 32, 16, 16), (64, 32, 128, 128)]}, timeout=3000)
