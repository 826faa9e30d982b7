"""The local Triton GEMM's split-K path (iris_fw/gemm.py): values against float64 at ragged
shapes, determinism, the counters left at zero (the context's), the tuning table's split rows,
and (GPU) a CUDA-graph replay with fresh inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import iris_fw  # noqa: F401  (first: interpreter on CPU-only machines)
from iris_fw import gemm
from iris_fw.errors import ArgumentError
from iris_fw.gemm import CPU_CONFIG, GemmConfig, matmul

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
        assert list(ctx.extensions[gemm.EXTENSION].by_stream) == [(dev, None if dev.type == "cpu"
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
    rows = (((16, None, 8192), split), ((16, None, None), plain), ((256, 8192, None), wide))
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
        for max_m, config in rows:  # [max_m, config]; the config may carry max_n / max_k and its measurement
            extra = {k: config[k] for k in ("max_n", "max_k", "measured") if k in config}
            cfg = GemmConfig(**{k: v for k, v in config.items() if k not in extra})
            assert all(v is None or isinstance(v, (int, str)) for v in extra.values()), (device, config)
            if cfg.split_k > 1:
                assert max_m <= gemm.SPLIT_K_MAX_M, (device, config)
        assert [b for b, _ in gemm._measured_rows(device)] == [(m, c.get("max_n"), c.get("max_k")) for m, c in rows]
    for device, order in table.get("tile_order", {}).items():
        assert isinstance(order["group_m"], int) and order["group_m"] >= 1 and order.get("measured"), (device, order)


def test_tile_order_from_the_table(monkeypatch):
    """A device's measured GROUP_M replaces the estimated configurations' own; measured rows
    keep theirs."""
    from iris_fw.gemm import HOPPER_LARGE, default_config

    gpu, bf16 = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(gemm, "measured_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(gemm, "measured_group_m", lambda device: None)
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=132) == HOPPER_LARGE
    monkeypatch.setattr(gemm, "measured_group_m", lambda device: 16)
    assert default_config(8192, 7168, 8192, bf16, gpu, programs=132) == replace(HOPPER_LARGE, group_m=16)
    row = GemmConfig(16, 64, 128, 1, 4, 4, split_k=2)
    monkeypatch.setattr(gemm, "measured_config", lambda *args, **kwargs: row)
    assert default_config(16, 8192, 8192, bf16, gpu, split=True) == row


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("warm_stream", [True, False], ids=["stream_counters", "graph_counters"])
def test_split_k_graph_replay_fresh_inputs(ctx, warm_stream):
    """A split-K matmul captured once (twice in the graph), replayed with fresh inputs each
    time: on a stream that ran split-K before (its counters, reset by each call) or on a fresh
    capture stream (the graph's own counters, zeroed by a captured memset)."""
    dev = torch.device("cuda")
    m, n, k = 40, 200, 1000
    a = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
    b = torch.empty(k, n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    out2 = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    cfg = _config(4)
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
    for max_m, config in device_rows:  # the table's row format, bounds and note in the config
        assert isinstance(max_m, int)
        GemmConfig(**{k: v for k, v in config.items() if k not in ("max_n", "max_k", "measured")})
    records = [json.loads(line) for line in (tmp_path / "gemm_tune.jsonl").read_text().splitlines()]
    assert records and all(not r["wrong"] for r in records), records
