"""The local Triton GEMM's split-K path (iris_fw/gemm.py): values against float64 at ragged
shapes, determinism, the counters left at zero (the context's), the tuning table's split rows,
and (GPU) a CUDA-graph replay with fresh inputs."""

from __future__ import annotations

from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

import iris_fw  # noqa: F401  (first: interpreter on CPU-only machines)
from helpers import cpu_extended
from iris_fw import devinfo, gemm
from iris_fw import gemm_tiles as tiles
from iris_fw.errors import ArgumentError
from iris_fw.gemm import CPU_CONFIG, GemmConfig, matmul, parse_row

#: Tolerance relative to the largest |reference| (the result is rounded once to its dtype).
ULPS = {torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9, torch.float32: 1e-5}
GPU = torch.cuda.is_available()


def _device():
    return torch.device("cuda") if GPU else torch.device("cpu")


@pytest.fixture
def ctx():
    """A one-rank context in this process (it holds the split-K counters), closed after the test."""
    with iris_fw.init(heap_size=1 << 20, bootstrap="single") as c:
        yield c


def _config(split):
    if GPU:
        return GemmConfig(16, 64, 64, 1, 4, 3, split_k=split)
    return replace(CPU_CONFIG, split_k=split)


def _check(got, a, b, dtype, what):
    want = a.double().cpu() @ b.double().cpu()
    got = got.double().cpu()
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} elements never written (NaN poison)"
    tol = ULPS[dtype] * max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert err <= tol, f"{what}: max error {err:.4g} > {tol:.4g}"


# (M, N, K, split): ragged tiles and K ranges; a split count above K's BK steps (empty ranges
# on the interpreter's 16-wide K steps: 3 steps, 5 splits); GPUs use the same shapes x 8.
# bf16 at every shape, fp16 and fp32 at one each (the interpreter is slow).
BF16 = torch.bfloat16
CASES = [(37, 21, 70, 3, BF16), (5, 40, 33, 2, BF16), (16, 16, 48, 5, BF16), (1, 3, 100, 4, BF16),
         (37, 21, 70, 3, torch.float16), (37, 21, 70, 3, torch.float32)]


@pytest.mark.parametrize("m,n,k,split,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_split_k_matches_float64(ctx, m, n, k, split, dtype):
    dev = _device()
    scale = 8 if GPU else 1
    m, n, k = m * scale, n * scale, k * scale
    g = torch.Generator().manual_seed(m * 7919 + n * 31 + k + split)
    a = torch.randn(m, k, generator=g).div_(k ** 0.5).to(dtype).to(dev)
    b = torch.randn(k, n, generator=g).to(dtype).to(dev)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    cfg = _config(split)
    matmul(a, b, out=out, config=cfg, ctx=ctx)
    _check(out, a, b, dtype, f"split-K {split} {m}x{n}x{k} {dtype}")
    # deterministic: the partials are summed in split order whatever split finishes last
    again = torch.full_like(out, float("nan"))
    matmul(a, b, out=again, config=cfg)  # ctx=None: the current context, the same counters
    assert torch.equal(out, again), "split-K results differ between two calls"
    # a column-major a (pointer loads, no TMA) takes the same path
    _check(matmul(a.t().contiguous().t(), b, config=cfg), a, b, dtype, "split-K, column-major a")
    if GPU:
        torch.cuda.synchronize()
    kept = gemm.split_counters(ctx).by_stream
    assert len(kept) == 1, kept
    for counters in kept.values():
        assert int(counters.abs().sum()) == 0, "a split-K tile counter was not reset"


def test_split_counters_belong_to_the_context():
    """The counters hang off the context that made them (``ctx.extensions``), go with it, and a
    call with no context open uses counters of its own; ``ctx=`` takes a context only."""
    dev = _device()
    k = 320 if GPU else 40  # several BK steps of _config's K block: the call splits
    a = torch.randn(24, k, device=dev, dtype=torch.float32)
    b = torch.randn(k, 20, device=dev, dtype=torch.float32)
    cfg = _config(2)
    with iris_fw.init(heap_size=1 << 20, bootstrap="single") as ctx:
        with pytest.raises(TypeError, match="ctx"):
            matmul(a, b, config=cfg, ctx="ctx")
        _check(matmul(a, b, config=cfg), a, b, torch.float32, "split-K, current context")
        assert list(ctx.extensions[gemm.EXTENSION].by_stream) == [(a.device, None if dev.type == "cpu"
                                                                   else torch.cuda.current_stream(dev).cuda_stream)]
        counters = gemm.split_counters(ctx)
        counters.rearm()  # after an abort: zeroed in place, kept
        assert len(counters.by_stream) == 1
    assert not counters.by_stream, "closing the context drops its counters"
    assert iris_fw.context.open_contexts() == []
    _check(matmul(a, b, config=cfg), a, b, torch.float32, "split-K, no context open")


def test_split_k_config_is_checked():
    with pytest.raises(ArgumentError, match="split_k"):
        GemmConfig(16, 16, 16, 1, 4, 1, split_k=0)
    with pytest.raises(ArgumentError, match="split_k"):
        GemmConfig(16, 16, 16, 1, 4, 1, split_k=True)


def test_split_rows_of_the_tuning_table(monkeypatch):
    """The first row whose bounds hold applies; split rows only where the kernel splits
    (:func:`matmul`), never for the patterns' kernels."""
    split = GemmConfig(16, 64, 128, 1, 4, 4, split_k=4)
    plain = GemmConfig(16, 64, 128, 1, 4, 4)
    wide = GemmConfig(64, 64, 128, 1, 4, 4, split_k=2)
    rows = ((gemm.RowBounds(16, None, 8192), split), (gemm.RowBounds(16), plain),
            (gemm.RowBounds(256, 8192), wide))
    monkeypatch.setattr(gemm, "_measured_rows", lambda name: rows)
    dev = torch.device("cpu")
    assert gemm.measured_config(16, dev, n=8192, k=4096, split=True) == split
    assert gemm.measured_config(16, dev, n=8192, k=4096) == plain  # the patterns' kernels
    assert gemm.measured_config(16, dev, n=8192, k=28672, split=True) == plain  # beyond max_k
    assert gemm.measured_config(200, dev, n=8192, k=4096, split=True) == wide
    assert gemm.measured_config(200, dev, n=16384, k=4096, split=True) is None  # beyond max_n
    assert gemm.measured_config(200, dev, n=8192, k=4096) is None
    assert gemm.measured_config(512, dev, n=8192, k=4096, split=True) is None


def test_tuning_table_rows_are_valid():
    """Every row of iris_fw/tuning/gemm.json makes a GemmConfig; split rows stay within
    SPLIT_K_MAX_M rows."""
    from iris_fw import tuning

    table = tuning.load("gemm")
    for device, rows in table["devices"].items():
        for max_m, config in rows:  # [max_m, config]; the config may carry bounds and its measurement
            extra = {k: config[k] for k in (*gemm.ROW_BOUNDS, *gemm.ROW_FLAGS, "measured") if k in config}
            cfg = GemmConfig(**{k: v for k, v in config.items() if k not in extra})
            assert all(v is None or isinstance(v, (int, str)) for v in extra.values()), (device, config)
            assert "local" not in config or (config["local"] is True and "measured" in config), (device, config)
            if cfg.split_k > 1:
                assert max_m is not None and max_m <= gemm.SPLIT_K_MAX_M, (device, config)
        assert [b for b, _ in gemm._measured_rows(device)] == [
            gemm.RowBounds(m, **{k: c[k] for k in gemm.ROW_BOUNDS + gemm.ROW_FLAGS if k in c}) for m, c in rows]
    for device, order in table.get("tile_order", {}).items():
        assert set(order) <= {"group_m", "xcds", "measured"} and order.get("measured"), (device, order)
        assert all(isinstance(order.get(k, 1), int) and order.get(k, 1) >= 1 for k in ("group_m", "xcds")), order
        assert gemm._tile_orders()[device] == gemm.TileOrder(order.get("group_m"), order.get("xcds", 1))
    # AMD Instinct's chiplets: rows by the names torch reports (iris_fw.devinfo), none measured
    assert {name: gemm._tile_orders()[name].xcds for name in ("AMD Instinct MI300X", "AMD Instinct MI355X")} == {
        "AMD Instinct MI300X": 8, "AMD Instinct MI355X": 8}
    assert all("not measured" in table["tile_order"][name]["measured"]
               for name in ("AMD Instinct MI300X", "AMD Instinct MI355X"))


def test_tile_order_from_the_table(monkeypatch):
    """A device's measured GROUP_M replaces the estimated configurations' own; measured rows
    keep theirs. Its chiplet count goes to every configuration (fp32 and the CPU's too)."""
    from iris_fw.gemm import FP32_CONFIG, HOPPER_LARGE, TileOrder, default_config

    gpu, bf16 = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(gemm, "measured_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(gemm, "measured_tile_order", lambda device: gemm.NO_TILE_ORDER)
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=132) == HOPPER_LARGE
    monkeypatch.setattr(gemm, "measured_tile_order", lambda device: TileOrder(group_m=16))
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=132) == replace(HOPPER_LARGE, group_m=16)
    monkeypatch.setattr(gemm, "measured_tile_order", lambda device: TileOrder(xcds=8))
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=304) == replace(HOPPER_LARGE, xcds=8)
    assert default_config(8192, 7168, 8192, torch.float32, gpu) == replace(FP32_CONFIG, xcds=8)
    assert default_config(64, 64, 64, bf16, torch.device("cpu")) == replace(CPU_CONFIG, xcds=8)
    row = GemmConfig(16, 64, 128, 1, 4, 4, split_k=2)
    monkeypatch.setattr(gemm, "measured_config", lambda *args, **kwargs: row)
    assert default_config(16, 8192, 8192, bf16, gpu, split=True) == row


def test_large_rows_bound_m_n_and_k(monkeypatch):
    """A row for large products with short K ([null, {min_m, min_n, max_k, ...}]) applies only
    at and above its M and N and up to its K; the few-row rows before it are read as before."""
    few = GemmConfig(16, 64, 256, 1, 4, 3)
    big = GemmConfig(256, 128, 64, 8, 8, 4)
    table = {"devices": {"GPU X": [[16, {**asdict(few), "measured": "m"}],
                                   [None, {**asdict(big), "min_m": 8192, "min_n": 8192, "max_k": 4096,
                                           "measured": "m"}]]}, "tile_order": {}}
    monkeypatch.setattr(gemm.tuning, "load", lambda name: table)
    gemm._measured_rows.cache_clear()
    gemm._tile_orders.cache_clear()
    try:
        rows = gemm._measured_rows("GPU X")
        assert rows == ((gemm.RowBounds(16), few), (gemm.RowBounds(None, None, 4096, 8192, 8192), big))
        holds = lambda m, n, k: [b.hold(m, n, k) for b, _ in rows]  # noqa: E731
        assert holds(16, 8192, 4096) == [True, False]
        assert holds(16384, 14336, 4096) == [False, True]
        assert holds(8192, 8192, 2048) == [False, True]
        assert holds(16384, 14336, 8192) == [False, False]  # deeper K: the estimate
        assert holds(4096, 14336, 4096) == [False, False]  # fewer rows
        assert holds(16384, 4096, 4096) == [False, False]  # fewer columns (a sharded N)
        assert holds(16384, None, None) == [False, True]  # n and k not given: their bounds hold
    finally:
        gemm._measured_rows.cache_clear()
        gemm._tile_orders.cache_clear()


# ---- the chiplet (XCD) renumbering of the tile order ------------------------------------------


@triton.jit
def _xcd_kernel(out, programs, items, tiles_m, tiles_n, PROGRAMS: tl.constexpr, XCDS: tl.constexpr,
                GROUP_M: tl.constexpr, BLOCK: tl.constexpr):
    """``out[0]``: xcd_program of 0..programs-1; ``out[1]``: xcd_item of 0..items-1 (waves of
    PROGRAMS); ``out[2]``: the linear tile ``pm * tiles_n + pn`` grouped_tile gives 0..items-1."""
    i = tl.arange(0, BLOCK)
    tl.store(out + i, tiles.xcd_program(i, programs, XCDS), mask=i < programs)
    tl.store(out + BLOCK + i, tiles.xcd_item(i, items, PROGRAMS, XCDS), mask=i < items)
    pm, pn = tiles.grouped_tile(i, tiles_m, tiles_n, GROUP_M, XCDS, PROGRAMS)
    tl.store(out + 2 * BLOCK + i, pm * tiles_n + pn, mask=i < tiles_m * tiles_n)


def _xcd_program_ref(pid, programs, xcds):
    return (pid % xcds) * (programs // xcds) + min(pid % xcds, programs % xcds) + pid // xcds


def test_xcd_renumbering_is_a_bijection():
    """xcd_program renumbers [0, programs) one to one, each chiplet's programs (pid % XCDS)
    consecutive and in order — for program counts that are and are not multiples of XCDS; xcd_item
    does so within every wave of PROGRAMS items (the last one ragged) and grouped_tile with XCDS
    still visits every tile once."""
    block = 128
    out = torch.empty(3 * block, dtype=torch.int32, device=_device())
    cases = [(p, x) for x in (1, 2, 3, 4, 6, 8) for p in (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 38, 61, 64, 100)]
    for programs, xcds in cases:
        items, wave = min(block, 2 * programs + 3), programs  # two full waves and a ragged third
        tiles_m, tiles_n = (items // 4, 4) if items % 4 == 0 else (items, 1)
        out.fill_(-1)
        _xcd_kernel[(1,)](out, programs, items, tiles_m, tiles_n, PROGRAMS=wave, XCDS=xcds, GROUP_M=2, BLOCK=block)
        got = out[:programs].tolist()
        assert sorted(got) == list(range(programs)), (programs, xcds, got)
        assert got == [_xcd_program_ref(p, programs, xcds) for p in range(programs)]
        for c in range(xcds):  # one chiplet's programs: consecutive numbers, in order
            mine = got[c::xcds]
            assert mine == list(range(mine[0], mine[0] + len(mine))) if mine else True, (programs, xcds, c)
        item = out[block:block + items].tolist()
        assert sorted(item) == list(range(items)), (programs, xcds, item)
        for first in range(0, items, wave):  # within each wave, xcd_program over the wave's items
            count = min(wave, items - first)
            assert item[first:first + count] == [first + _xcd_program_ref(p, count, xcds) for p in range(count)]
        assert sorted(out[2 * block:2 * block + items].tolist()) == list(range(items)), (programs, xcds)


@pytest.fixture
def xcds_table(monkeypatch):
    """``tile_order`` of this machine's device (``"cpu"`` on the interpreter) set to 8 XCDs in
    the GEMM table as the loader returns it (the other tables untouched); caches cleared."""
    from iris_fw import devinfo, tuning

    load = tuning.load
    table = {**load("gemm"), "tile_order": {devinfo.info(_device()).name: {"xcds": 8, "measured": "a test"}}}
    monkeypatch.setattr(tuning, "load", lambda name: table if name == "gemm" else load(name))
    gemm._tile_orders.cache_clear()
    gemm._measured_rows.cache_clear()
    yield
    gemm._tile_orders.cache_clear()
    gemm._measured_rows.cache_clear()


# programs of the persistent grid: below, at, not a multiple of and a multiple of the 8 XCDs
@pytest.mark.parametrize("programs", [5, cpu_extended(8), 19, cpu_extended(24)])
def test_xcds_from_the_table_matches_float64(ctx, xcds_table, monkeypatch, programs):
    """A device whose tile_order row says 8 XCDs: the default configuration carries them and
    the GEMM (split or not) is right at a ragged shape whose tiles fill neither the chiplets nor
    the waves evenly. The grid's program count is forced (the interpreter's would be 4)."""
    dev = _device()
    scale = 8 if GPU else 1
    m, n, k = 70 * scale, 90 * scale, 40 * scale
    monkeypatch.setattr(gemm, "persistent_programs", lambda device, work: max(1, min(work, programs)))
    cfg = gemm.default_config(m, n, k, torch.bfloat16, dev, split=True)
    assert cfg.xcds == 8
    g = torch.Generator().manual_seed(programs)
    a = torch.randn(m, k, generator=g).div_(k ** 0.5).to(torch.bfloat16).to(dev)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16).to(dev)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    _check(matmul(a, b, out=out), a, b, torch.bfloat16, f"XCDS 8, {programs} programs")
    split = replace(_config(2), xcds=8)
    _check(matmul(a, b, out=torch.full_like(out, float("nan")), config=split), a, b, torch.bfloat16,
           f"XCDS 8, split-K 2, {programs} programs")


@pytest.mark.parametrize("pattern,scheduler", [("gemm_all_scatter", "producer_consumer"),
                                               ("all_gather_gemm", "fused_sequential"),
                                               ("gemm_reduce_scatter", "bulk_sync"),
                                               ("gemm_all_reduce", "bulk_sync")])
def test_patterns_with_xcds_match_float64(pattern, scheduler):
    """The patterns' kernels under a tile order with 3 XCDS (waves of the device's programs, 4
    on the interpreter: not a multiple): every tile is computed once and lands where its
    consumer (another kernel or role, with its own program count) expects it."""
    from iris_fw import ops

    dev = _device()
    scale = 8 if GPU else 1
    m, n, k = 45 * scale, 70 * scale, 24 * scale
    g = torch.Generator().manual_seed(3)
    a = torch.randn(m, k, generator=g).div_(k ** 0.5).to(torch.bfloat16).to(dev)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16).to(dev)
    config = replace(_config(1), xcds=3)
    if pattern == "gemm_all_reduce":
        from iris_fw.plugins.gemm_all_reduce import GemmAllReduceConfig

        config = GemmAllReduceConfig(**asdict(config))
    with iris_fw.init(heap_size=1 << 24, bootstrap="single"):
        op = ops.plan(pattern, a, b, scheduler=scheduler, config=config)
        assert op.pattern.bind(op.ctx, op.buffers, a, b).cfg.XCDS == 3
        _check(op(a, b), a, b, torch.bfloat16, f"{pattern} under {scheduler}, XCDS 3")


@pytest.mark.parametrize("split", [1, 3])
def test_local_product_prepared_launch(split):
    """:class:`~iris_fw.gemm.LocalProduct` on the Triton GEMM (a configuration forced; split-K
    with counters of its own): the prepared launch into its buffer, then into fresh outputs
    (``launch_with``, each poisoned), one output again and again (``with_args`` from its second
    call), fresh values in the fixed operands, an output sharing an
    operand's memory (through the buffer, copied), a bias — each against float64. On a GPU the
    calls after the first take the prepared path: the launcher's slow path ran once (Triton
    3.6 re-encodes the TMA descriptors of ``a`` and ``b``: the output is replaced at its moved
    position)."""
    dev, dtype = _device(), torch.bfloat16
    m, n, k = (40, 200, 1000) if GPU else (19, 24, 40)
    gen = torch.Generator().manual_seed(11 + split)

    def fresh(*shape):
        return (torch.randn(*shape, generator=gen) / max(shape[-1], 1) ** 0.5).to(dev, dtype)

    a, b, bias = fresh(m, k), fresh(k, n), fresh(n)
    buffer = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    product = gemm.LocalProduct(a, b, buffer, gemm.storage_of(a, b), config=_config(split))
    assert product(buffer) is buffer
    _check(buffer, a, b, dtype, "into its buffer")
    slow = product._launch.launcher.slow_calls
    for r in range(3):
        a.copy_(fresh(m, k))
        b.copy_(fresh(k, n))
        out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
        assert product(out) is out
        _check(out, a, b, dtype, f"fresh output {r}")
    if GPU:
        assert product._launch.launcher.slow_calls == slow, "a new output took the launcher's slow path"
    fresh_only = gemm.LocalProduct(a, b, torch.empty(m, n, dtype=dtype, device=dev), gemm.storage_of(a, b),
                                   config=_config(split))
    for r in range(3):  # never into its buffer: every call a new output (a functional call without out=)
        out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
        fresh_only(out)
        _check(out, a, b, dtype, f"new output {r}, never into the buffer")
    if GPU:
        assert fresh_only._launch.launcher.slow_calls == 1, "new outputs took the launcher's slow path"
    same = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    for r in range(3):  # one out= in a loop: from its second call a launch of its own
        a.copy_(fresh(m, k))
        same.fill_(float("nan"))
        assert product(same) is same
        _check(same, a, b, dtype, f"the same output, call {r}")
    assert product._last[0] is same and product._last[1] is not None
    if GPU:
        assert product._launch.launcher.slow_calls == slow, "the same output took the launcher's slow path"
    square = fresh(k, k)
    into_a = gemm.LocalProduct(square, square, torch.empty(k, k, dtype=dtype, device=dev),
                               gemm.storage_of(square), config=_config(split))
    want = square.double().cpu() @ square.double().cpu()
    into_a(square)  # out=a: the product reads square while its result lands there
    _check(square, want.to(dtype), torch.eye(k, dtype=dtype), dtype, "into an operand")
    with_bias = gemm.LocalProduct(a, b, torch.empty(m, n, dtype=dtype, device=dev), gemm.storage_of(a, b, bias),
                                  bias, config=_config(split))
    out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    with_bias(out)
    _check(out - bias, a, b, dtype, "with a bias")


def test_local_product_picks_the_kernel_from_the_table(monkeypatch):
    """The Triton GEMM only on a GPU with a measured row for the shape (``kernel=False``: never);
    ``torch.matmul`` on CPU ranks."""
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    assert gemm.LocalProduct(a, b, torch.empty(4, 16), frozenset()).config is None
    assert gemm.local_kernel(4, 16, 8, cpu, torch.bfloat16) is None
    row = GemmConfig(16, 64, 64, 1, 4, 3)
    rows = {"matched": (gemm.RowBounds(16, local=True), row), "slower": (gemm.RowBounds(256), row)}
    monkeypatch.setattr(gemm, "_measured_rows", lambda name: tuple(rows.values()))
    monkeypatch.setattr(gemm, "info", lambda device: SimpleNamespace(name="a GPU"))
    cuda = torch.device("cuda", 0)
    assert gemm.local_kernel(16, 8192, 4096, cuda, torch.bfloat16) is row  # the first row holding the shape: local
    assert gemm.local_kernel(64, 8192, 4096, cuda, torch.bfloat16) is None  # a row not flagged local: cuBLAS
    assert gemm.measured_config(64, cuda, 8192, 4096) is row  # (the patterns' kernels still take it)
    assert gemm.local_kernel(0, 8192, 4096, cuda, torch.bfloat16) is None
    assert gemm.local_kernel(16, 8192, 4096, cuda, torch.float16) is row
    assert gemm.local_kernel(16, 8192, 4096, cuda, torch.float32) is None  # rows: 16-bit inputs
    del rows["matched"]
    assert gemm.local_kernel(16, 8192, 4096, cuda, torch.bfloat16) is None


# ---- the persistent schedule (GemmConfig.persistent) and its stream-K tail ----------------------


def _persistent(**fields):
    """A persistent configuration: the interpreter's 16x32x16 tiles (two 16-column epilogue
    pieces fit), a GPU's 64x128x32."""
    base = GemmConfig(64, 128, 32, 4, 4, 3) if GPU else replace(CPU_CONFIG, block_n=32)
    return replace(base, persistent=True, **fields)


def test_stream_k_tiles():
    """The tail: the partly filled last wave (and ``waves - 1`` full ones before it); none when
    the tiles fill the waves or without stream-K; every tile when there are fewer."""
    assert gemm.stream_k_tiles(7168, 132, 1) == 40  # 16384x14336 in 128x256 tiles on an H100
    assert gemm.stream_k_tiles(7168, 132, 2) == 172
    assert gemm.stream_k_tiles(7168, 132, 0) == 0
    assert gemm.stream_k_tiles(264, 132, 1) == 0
    assert gemm.stream_k_tiles(100, 132, 1) == 100
    assert gemm.stream_k_tiles(140, 132, 3) == 140


# (M, N, K, programs, fields): ragged tiles and K; programs forced (the interpreter's would be 4):
# one program (the whole product a stream-K tail when it has one), tails whose tiles are split
# over 2-3 programs, runs longer than a tile (a program's first part in one tile, its last in
# another), more programs than tiles, and runs shorter than a tile.
PERSISTENT_CASES = [
    cpu_extended(37, 70, 90, 3, {}),  # (the CPU default's cases cover its paths: plain, flattened, tails)
    (37, 70, 90, 3, {"flatten": True, "epilogue_subtile": 2}),
    cpu_extended(37, 70, 90, 3, {"stream_k": 1}),
    (50, 96, 70, 4, {"stream_k": 2, "flatten": True, "epilogue_subtile": 2}),
    cpu_extended(50, 96, 70, 7, {"stream_k": 1, "warp_specialize": True}),
    (20, 40, 100, 1, {"stream_k": 1}),
    (33, 33, 33, 11, {"stream_k": 2, "epilogue_subtile": 2}),
    cpu_extended(64, 64, 64, 5, {"stream_k": 3, "flatten": True}),
]


@pytest.mark.parametrize("m,n,k,programs,fields", PERSISTENT_CASES, ids=str)
def test_persistent_matches_float64(ctx, monkeypatch, m, n, k, programs, fields):
    """The persistent schedule against float64 at ragged shapes, with its stream-K tail's
    fix-up: bit-identical from call to call (parts summed in program order whoever finishes
    last), the tile counters left at zero; a column-major ``a`` and an output without a TMA
    descriptor (odd row pitch) take the pointer paths."""
    dev = _device()
    scale = 8 if GPU else 1
    m, n, k = m * scale, n * scale, k * scale
    monkeypatch.setattr(gemm, "persistent_programs", lambda device, work: max(1, min(work, programs)))
    g = torch.Generator().manual_seed(m * 7919 + n * 31 + k + programs)
    a = torch.randn(m, k, generator=g).div_(k ** 0.5).to(torch.bfloat16).to(dev)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16).to(dev)
    cfg = _persistent(**fields)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    matmul(a, b, out=out, config=cfg, ctx=ctx)
    _check(out, a, b, torch.bfloat16, f"persistent {fields} {m}x{n}x{k}, {programs} programs")
    again = torch.full_like(out, float("nan"))
    matmul(a, b, out=again, config=cfg)
    assert torch.equal(out, again), "persistent results differ between two calls"
    wide = torch.full((m, n + 1), float("nan"), dtype=torch.bfloat16, device=dev)[:, :n]
    _check(matmul(a.t().contiguous().t(), b, out=wide, config=cfg), a, b, torch.bfloat16,
           "persistent, column-major a, pointer-stored output")
    if GPU:
        torch.cuda.synchronize()
    for counters in gemm.split_counters(ctx).by_stream.values():
        assert int(counters.abs().sum()) == 0, "a stream-K tile counter was not reset"


def test_warp_specialize_reaches_blackwell_only(monkeypatch):
    """``warp_specialize`` goes to the kernel on sm_100 and later (and the interpreter), not on
    Hopper (Triton's Hopper pass gives no partitions and can fail) nor on AMD."""
    cfg = _persistent(warp_specialize=True)
    for arch, want in (("sm_90", False), ("sm_80", False), ("sm_100", True), ("sm_120", True), ("gfx942", False),
                       ("cpu", True)):
        monkeypatch.setattr(gemm, "info", lambda device, arch=arch: devinfo.DeviceInfo("cuda", "X", arch, 132, 0))
        assert gemm.warp_specializes(cfg, torch.device("cpu")) is want, arch
    assert not gemm.warp_specializes(_persistent(), torch.device("cpu"))


def test_persistent_config_is_checked():
    with pytest.raises(ArgumentError, match="persistent"):
        GemmConfig(16, 32, 16, 1, 4, 1, stream_k=1)
    with pytest.raises(ArgumentError, match="persistent"):
        GemmConfig(16, 32, 16, 1, 4, 1, flatten=True)
    with pytest.raises(ArgumentError, match="split_k"):
        GemmConfig(16, 32, 16, 1, 4, 1, split_k=2, persistent=True)
    with pytest.raises(ArgumentError, match="epilogue_subtile"):
        GemmConfig(16, 32, 16, 1, 4, 1, persistent=True, epilogue_subtile=4)  # 8-column pieces
    with pytest.raises(ArgumentError, match="stream_k"):
        GemmConfig(16, 32, 16, 1, 4, 1, persistent=True, stream_k=-1)
    with pytest.raises(ArgumentError, match="persistent must be a bool"):
        GemmConfig(16, 32, 16, 1, 4, 1, persistent=1)


def test_persistent_row_selects_the_schedule(monkeypatch):
    """A row of the table with ``"persistent": true`` (and its fields) is read by the one loader
    into a persistent configuration, which :func:`matmul` runs with the persistent kernel; the
    patterns' kernels never get it."""
    big = GemmConfig(128, 256, 64, 8, 8, 4, persistent=True, flatten=True, stream_k=1, epilogue_subtile=2)
    row = {k: v for k, v in asdict(big).items() if k != "xcds"}
    table = {"devices": {"cpu": [[None, {**row, "min_m": 64, "min_n": 64, "measured": "a test"}]]},
             "tile_order": {}}
    monkeypatch.setattr(gemm.tuning, "load", lambda name: table)
    gemm._measured_rows.cache_clear()
    gemm._tile_orders.cache_clear()
    try:
        cpu = torch.device("cpu")
        assert gemm.measured_config(64, cpu, 64, 32, split=True) == big
        # the patterns' kernels (no split) skip the row: they run their own tile loops
        assert gemm.measured_config(64, cpu, 64, 32) is None
        launched = []
        monkeypatch.setattr(gemm, "_persistent_launch", lambda *args: launched.append(args[3]) or (
            (1,), (), {}, {}))
        monkeypatch.setattr(gemm, "_matmul_persistent_kernel", {(1,): lambda: None})
        a = torch.randn(64, 32, dtype=torch.bfloat16)
        matmul(a, torch.randn(32, 64, dtype=torch.bfloat16), config=gemm.measured_config(64, cpu, 64, 32, True))
        assert launched == [big]
    finally:
        gemm._measured_rows.cache_clear()
        gemm._tile_orders.cache_clear()


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("warm_stream", [True, False], ids=["stream_counters", "graph_counters"])
@pytest.mark.parametrize("schedule", ["split_k", "stream_k_all", "stream_k_tail"])
def test_split_k_graph_replay_fresh_inputs(ctx, warm_stream, schedule):
    """A split-K matmul — or the persistent schedule's stream-K tail (every tile of a small
    product, or the last wave's of a larger one: fp32 parts allocated in the call, so in the
    graph's pool) — captured once (twice in the graph), replayed with fresh inputs each time: on
    a stream that ran it before (its counters, reset by each call) or on a fresh capture stream
    (the graph's own counters, zeroed by a captured memset)."""
    dev = torch.device("cuda")
    m, n, k = (1000, 2000, 1000) if schedule == "stream_k_tail" else (40, 200, 1000)
    a = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
    b = torch.empty(k, n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    out2 = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    cfg = _config(4) if schedule == "split_k" else _persistent(flatten=True, stream_k=1, epilogue_subtile=2)
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    if warm_stream:
        with torch.cuda.stream(s):  # the capture stream's counters are made outside the capture
            matmul(a.normal_(), b.normal_(), out=out, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        matmul(a, b, out=out, config=cfg)
        matmul(a, b, out=out2, config=cfg)
    for seed in range(3):
        g = torch.Generator(device=dev).manual_seed(seed)
        a.copy_(torch.randn(m, k, generator=g, device=dev) / k ** 0.5)
        b.copy_(torch.randn(k, n, generator=g, device=dev))
        out.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, a, b, torch.bfloat16, f"graph replay {seed}")
        assert torch.equal(out, out2), "two captured calls differ"


def test_tune_script_smoke(tmp_path):
    """scripts/tune_gemm.py (the GPU sweep behind the split-K rows) runs end to end on the
    interpreter and writes rows the table accepts."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "tune_gemm.py")
    spec = importlib.util.spec_from_file_location("tune_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gemm_tuning_rows.json").read_text())
    (device_rows,) = rows.values()
    for max_m, config in device_rows:  # the table's row format (bounds, flags and note in the config)
        assert isinstance(max_m, int)
        bounds, cfg = parse_row(max_m, config)  # what the table's loader makes of it
        assert bounds.max_m == max_m and isinstance(cfg, GemmConfig)
    records = [json.loads(line) for line in (tmp_path / "gemm_tune.jsonl").read_text().splitlines()]
    assert records and all(not r["wrong"] for r in records), records


def test_tune_script_large_smoke(tmp_path, monkeypatch):
    """``scripts/tune_gemm.py --large`` runs end to end on the interpreter, and the rows it
    proposes (large products with short K) are rows the table and its reader accept, read as
    their bounds say."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "tune_gemm.py")
    spec = importlib.util.spec_from_file_location("tune_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--large", "--quick", "--out", str(tmp_path)]) == 0
    expected = devinfo.info(torch.device("cuda" if torch.cuda.is_available() else "cpu")).name
    assert json.loads((tmp_path / "gemm_large_rows.json").read_text()).keys() == {expected}
    records = [json.loads(line) for line in (tmp_path / "gemm_large.jsonl").read_text().splitlines()]
    assert records and all(not r["wrong"] for r in records) and any(r["current"] for r in records), records
    # the candidates are valid configurations, the estimate's first
    gpu_like = GemmConfig(128, 256, 64, 16, 8, 3)
    cands = mod.large_candidates(gpu_like, quick=False)
    assert cands[0] == gpu_like and 20 <= len(cands) <= 40 and len(set(cands)) == len(cands)
    assert any(c.persistent and c.stream_k for c in cands) and any(c.persistent and not c.stream_k for c in cands)
    # rows from a (made-up) sweep result: the short-K shape's row first; each applies as bounded
    a, b = GemmConfig(256, 128, 64, 8, 8, 4), GemmConfig(128, 256, 64, 8, 8, 4)
    rows = mod.large_rows({(8192, 8192, 8192): (b, 1500.0, 1540.0, 1541.0),
                           (16384, 14336, 4096): (a, 2700.0, 2705.8, 2842.6)}, "GPU X")
    assert [r[1]["max_k"] for r in rows] == [4096, 8192] and all(r[0] is None for r in rows)
    table = {**gemm.tuning.load("gemm"), "devices": {"GPU X": rows}}
    gemm.tuning.check("gemm", table)
    monkeypatch.setattr(gemm.tuning, "load", lambda name: table)
    gemm._measured_rows.cache_clear()
    gemm._tile_orders.cache_clear()
    try:
        (b1, c1), (b2, c2) = gemm._measured_rows("GPU X")
        assert (c1, c2) == (a, b)
        assert b1.hold(16384, 14336, 4096) and not b1.hold(8192, 8192, 8192) and b2.hold(8192, 8192, 8192)
        assert not any(bounds.hold(256, 8192, 4096) for bounds in (b1, b2))  # few-row products: not these rows
    finally:
        gemm._measured_rows.cache_clear()
        gemm._tile_orders.cache_clear()
