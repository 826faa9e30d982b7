"""The benchmark harness: a smoke run on CPU ranks (GPU sizes run through the same command)."""

import csv
import json
import subprocess
import sys

import pytest

from iris_fw.bench import markdown_table, parse_size, size_sweep


def test_sizes_and_tables():
    assert parse_size("4K") == 4096 and parse_size("256MiB") == 256 << 20 and parse_size("1G") == 1 << 30
    assert parse_size("100") == 100
    assert size_sweep(4 << 10, 1 << 30) == [4 << 10 << (2 * i) for i in range(10)]
    table = markdown_table([{"op": "load", "GBps": 351.25}], ["op", "GBps"])
    assert table.splitlines() == ["| op | GBps |", "|---|---|", "| load | 351.2 |"]


@pytest.mark.slow
def test_bench_smoke_run_writes_results(tmp_path, on_gpu):
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_bench.sh (full sizes)")
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "iris_fw.bench", "-n", "2", "--iters", "1", "--warmup", "0", "--max-size", "4K",
           "--out", str(out), "primitives", "all_peers", "atomics", "latency"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("primitives", "all_peers", "atomics", "latency"):
        meta = json.loads((out / f"{name}.json").read_text())
        assert meta["environment"]["world_size"] == 2 and "command" in meta["environment"]
        rows = list(csv.DictReader((out / f"{name}.csv").open()))
        assert rows and all(float(r["time_us"]) > 0 for r in rows), name
        assert (out / f"{name}.md").read_text().startswith("| ")
    ops = {r["op"] for r in csv.DictReader((out / "primitives.csv").open())}
    assert {"load", "get", "store", "put", "copy_engine_pull", "copy_engine_push", "local_copy"} <= ops
    assert (out / "primitives.png").stat().st_size > 1000
    assert "[1/1] 4 KiB" in res.stdout
