"""The benchmark harness: a smoke run on CPU ranks (GPU sizes run through the same command)."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from iris_fw.bench import markdown_table, parse_size, size_sweep


#: The CPU smoke runs of the benchmarks below, as one ``iris-fw bench`` job: each test checks its
#: benchmark's files. On CPU ranks the options of the three former jobs give these benchmarks
#: the same runs (``--quick`` and ``--max-size`` change nothing for protocols and host there:
#: protocols runs 8 KiB and 1 token on CPU ranks, host its CPU_ROUNDS x CPU_CALLS), and one job
#: saves two starts of two interpreted ranks (~10 s each on CI's two cores).
SMOKE = ("primitives", "all_peers", "atomics", "latency")
CPU_JOB = SMOKE + ("protocols", "host")


@pytest.fixture(scope="module")
def cpu_bench(tmp_path_factory):
    """``(results folder, completed process)`` of one ``iris-fw bench`` job of :data:`CPU_JOB` on
    two CPU ranks at 4 KiB, one timed iteration (the tests skip before asking for it on GPUs)."""
    out = tmp_path_factory.mktemp("bench") / "results"
    cmd = [sys.executable, "-m", "iris_fw.bench", "-n", "2", "--iters", "1", "--warmup", "0", "--max-size", "4K",
           "--quick", "--out", str(out), *CPU_JOB]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    return out, res


def test_sizes_and_tables():
    assert parse_size("4K") == 4096 and parse_size("256MiB") == 256 << 20 and parse_size("1G") == 1 << 30
    assert parse_size("100") == 100
    assert size_sweep(4 << 10, 1 << 30) == [4 << 10 << (2 * i) for i in range(10)]
    table = markdown_table([{"op": "load", "GBps": 351.25}], ["op", "GBps"])
    assert table.splitlines() == ["| op | GBps |", "|---|---|", "| load | 351.2 |"]


@pytest.mark.slow
def test_bench_smoke_run_writes_results(request, on_gpu):
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_bench.sh (full sizes)")
    out, res = request.getfixturevalue("cpu_bench")
    for name in SMOKE:
        meta = json.loads((out / f"{name}.json").read_text())
        assert meta["environment"]["world_size"] == 2 and "command" in meta["environment"]
        rows = list(csv.DictReader((out / f"{name}.csv").open()))
        assert rows and all(float(r["time_us"]) > 0 for r in rows), name
        assert all(r["measured"] == "cpu-interpreter" for r in rows), name  # CPU rows say what they are
        assert (out / f"{name}.md").read_text().startswith("| ")
    ops = {r["op"] for r in csv.DictReader((out / "primitives.csv").open())}
    assert {"load", "get", "store", "put", "copy_engine_pull", "copy_engine_push", "local_copy"} <= ops
    assert (out / "primitives.png").stat().st_size > 1000
    assert "[1/1] 4 KiB" in res.stdout
    assert "these times measure the interpreter" in res.stdout


def test_ccl_bench_options():
    from iris_fw.bench import BenchOptions, parse_sizes
    from iris_fw.bench.ccl import TARGET_SIZES, bench_sizes, busbw_factor, iterations, parse_dtype

    assert parse_sizes("8K,256K,1M,8K") == [8 << 10, 256 << 10, 1 << 20]
    opts = BenchOptions(sizes=size_sweep(4 << 10, 1 << 30), iters=30, warmup=5, quick=False, rotate_bytes=0)
    assert set(TARGET_SIZES) <= set(bench_sizes(opts)) and len(bench_sizes(opts)) == 11
    assert iterations(opts, 8 << 10) == (30, 5) and iterations(opts, 1 << 30) == (5, 2)
    opts.quick = True
    assert bench_sizes(opts) == list(TARGET_SIZES) and iterations(opts, 8 << 10) == (10, 2)
    opts.extra = {"explicit_sizes": True}
    assert bench_sizes(opts) == opts.sizes
    assert busbw_factor("all_reduce", 2) == 1.0 and busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("broadcast", 8) == 1.0
    assert parse_dtype(None) is torch.bfloat16 and parse_dtype("fp8_e4m3") is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="--dtype"):
        parse_dtype("fp12")


@pytest.mark.slow
@pytest.mark.extended  # ~25 s of CPU ranks; on GPUs scripts/gpu_ccl.sh runs the bench itself
def test_bench_ccl_smoke_run(tmp_path, on_gpu):
    """``iris-fw bench ccl`` on 2 CPU ranks at the smallest size: a checked, timed row for every
    collective x registered algorithm, the 8 KiB host times, the baselines skipped with a reason."""
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_ccl.sh")
    from iris_fw.bench.ccl import COLLECTIVES
    from iris_fw.registry import load_registries

    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "iris_fw.bench", "-n", "2", "--iters", "1", "--warmup", "0", "--sizes", "4K",
           "--out", str(out), "ccl"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads((out / "ccl.json").read_text())["rows"]
    timed = {(r["collective"], r["method"]): r for r in rows if "eager_us" in r}
    names = load_registries().algorithm.names()
    for collective in COLLECTIVES:
        algorithms = [n.split(".", 1)[1] for n in names if n.startswith(collective + ".")]
        assert algorithms, collective
        for a in algorithms:
            r = timed[(collective, a)]
            assert r["bytes"] == 4096 and r["eager_us"] > 0 and r["ok"] is True, r
            assert r["max_rel_err"] < 1e-2 and r["eager_busbw_GBps"] > 0, r
    assert timed[("all_gather", "pull_zero_copy")]["ok"] is True
    host = {r["method"] for r in rows if "host_us" in r and r["host_us"] > 0}
    assert {"one_shot", "two_shot", "lamport", "ring"} <= host
    skipped = {(r["collective"], r["method"]): r["skipped"] for r in rows if "skipped" in r}
    assert all(skipped.get((c, "nccl")) for c in COLLECTIVES)
    assert skipped[("all_reduce", "symm_mem_one_shot")] and skipped[("all_reduce", "symm_mem_two_shot")]
    assert (out / "ccl.md").read_text().startswith("| ")
    # plots of what was measured only: CPU ranks time eager calls, no CUDA graphs
    assert (out / "ccl_eager_latency.png").exists()
    assert not (out / "ccl_latency.png").exists() and not (out / "ccl_busbw.png").exists()
    assert "all_reduce 4 KiB" in res.stdout


@pytest.mark.slow
def test_bench_protocols_checks_every_algorithm(request, on_gpu):
    """``iris-fw bench protocols``: the round trip first, then every all-reduce algorithm (and
    auto), the tile all-reduce and all_reduce_rmsnorm, each checked against a float64 reference
    on fresh inputs and carrying the run's round trip (the GPU run is scripts/gpu_mps.sh)."""
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_mps.sh (ranks sharing a GPU under MPS)")
    out, _ = request.getfixturevalue("cpu_bench")
    rows = list(csv.DictReader((out / "protocols.csv").open()))
    from iris_fw.registry import load_registries

    algorithms = {n.split(".", 1)[1] for n in load_registries().algorithm.names() if n.startswith("all_reduce.")}
    assert rows[0]["what"] == "round_trip" and float(rows[0]["round_trip_us"]) > 0
    rt = rows[0]["round_trip_us"]
    ar = {r["method"] for r in rows if r["what"] == "all_reduce"}
    assert ar == algorithms | {"auto"}, ar
    assert {r["what"] for r in rows} == {"round_trip", "all_reduce", "tile_all_reduce", "all_reduce_rmsnorm"}
    assert all(r["ok"] == "True" and r["round_trip_us"] == rt for r in rows[1:]), rows


@pytest.mark.extended
def test_bench_gemm_all_reduce_rows_say_what_ran(tmp_path, on_gpu):
    """On CPU ranks no row is named after cuBLAS or NCCL (neither ran) and no plot is empty."""
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_bench.sh")
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "iris_fw.bench", "-n", "2", "--iters", "1", "--warmup", "0", "--quick",
           "--out", str(out), "gemm_all_reduce"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads((out / "gemm_all_reduce.json").read_text())["rows"]
    methods = {r["method"] for r in rows}
    assert {"torch.matmul+host_gather", "torch.matmul+iris_ccl"} <= methods, methods
    assert not [m for m in methods if "cublas" in m or "nccl" in m], methods
    assert all(r["mode"] == "eager" and r["baseline"] == "torch.matmul+host_gather" for r in rows if "us" in r and r["us"])


@pytest.mark.slow
def test_host_bench_runs_every_call_path(request, on_gpu):
    """``iris-fw bench host`` on CPU ranks: every collective and op runs and gets a row beside its
    reference (the numbers measure the interpreter; the GPU run is the measurement)."""
    if on_gpu:
        pytest.skip("the GPU run is `iris-fw bench host` on the lead's card")
    out, _ = request.getfixturevalue("cpu_bench")
    rows = {r["call"]: r for r in csv.DictReader((out / "host.csv").open())}
    assert all(r["measured"] == "cpu-interpreter" for r in rows.values())
    timed = {c for c, r in rows.items() if r["host_us"] and float(r["host_us"]) > 0}
    for prefix in ("torch add_", "bare prepared launch", "ccl.all_gather_into_tensor", "ccl.reduce_scatter_tensor",
                   "ccl.all_reduce 8 KiB plain (auto)", "ops.gemm_all_reduce", "ops.gemm_all_scatter",
                   "ops.gemm_reduce_scatter", "ops.all_gather_gemm", "ops.flash_decode", "torch.matmul"):
        assert any(c.startswith(prefix) for c in timed), (prefix, sorted(rows))
    for algorithm in ("one_shot", "two_shot", "ring"):
        assert f"ccl.all_reduce 8 KiB heap ({algorithm})" in timed, sorted(rows)
    for op in ("gemm_all_reduce", "all_gather_gemm"):  # the one-kernel schedule's rows
        assert any(c.startswith(f"ops.{op}") and c.endswith("fused_sequential") for c in timed), sorted(rows)
    assert all(r["reference"] for c, r in rows.items() if c.startswith(("ccl.", "ops."))), rows
