"""Back-to-back calls of every collective and op — no synchronize between them, each call on fresh
inputs into its own output — checked against float64: ``scripts/diag_pipelined.py`` under
``iris-fw launch`` at W = 2 and 3. The other tests make one to three calls per case; an
application enqueues hundreds, and ordering bugs between consecutive calls only show there
(on GPUs: 100 calls per case; on CPU ranks, where the interpreter runs each call to its end before
the next, 3 calls and the ops under ``-m extended``)."""

import os
import re
import subprocess
import sys

import pytest

import iris_fw
import iris_fw.testing
from helpers import cpu_extended, world_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "diag_pipelined.py")


def _ranks(n):
    gpus = iris_fw.testing.gpu_count()
    if gpus and not iris_fw.testing.share_gpus() and gpus < n:
        pytest.skip(f"{n} ranks need {n} GPUs, or one shared (IRIS_FW_SHARE_GPUS=1, under CUDA MPS)")
    return n


def _run(n, only):
    calls = "3" if iris_fw.interpreting() else "100"
    res = subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", str(_ranks(n)), SCRIPT, calls, only],
                         capture_output=True, text=True, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    lines = re.findall(r"^(?:\[rank \d+\] )?rank \d+ ([^:\n]+): (.*)$", res.stdout, re.M)
    assert lines, out[-3000:]
    ran = [(case, what) for case, what in lines if not what.startswith("n/a")]
    assert ran and all(re.match(rf"{calls} calls, 0 wrong", what) for _, what in ran), \
        "\n".join(f"{case}: {what}" for case, what in ran if not what.startswith(f"{calls} calls, 0 wrong"))
    return {case for case, _ in ran}


def _worlds(*default):
    """World sizes 2 and 3 (:func:`helpers.world_params`: on CPU ranks ``default`` by default)."""
    return world_params(*default)[1:3]


@pytest.mark.parametrize("n", _worlds(3))
def test_back_to_back_collectives(n):
    cases = _run(n, "ccl.")
    assert any("all_reduce heap" in c for c in cases) and "ccl.reduce_scatter_tensor" in cases, cases


@pytest.mark.parametrize("n", _worlds())
def test_back_to_back_ops(n):
    cases = _run(n, "ops.")
    assert {f"ops.{op} auto" for op in ("gemm_all_reduce", "gemm_reduce_scatter", "gemm_all_scatter",
                                        "all_gather_gemm")} <= cases, cases


@pytest.mark.parametrize("calls", [cpu_extended("3" if iris_fw.interpreting() else "300", id="calls")])
def test_all_gather_gemm_hung_shape(calls):
    """``scripts/diag_agg_hang.py`` at W = 2, every scheduler: ``all_gather_gemm`` back to back at
    the shape that hung on one H100 under MPS (16x4096 per rank @ 4096x8192, 300 calls; on CPU
    ranks a small shape and 3 calls, under ``-m extended``: the back-to-back tests above cover
    the CPU path), every call checked."""
    script = os.path.join(ROOT, "scripts", "diag_agg_hang.py")
    res = subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", str(_ranks(2)), script, calls, "all"],
                         capture_output=True, text=True, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    lines = re.findall(r"^(?:\[rank \d+\] )?rank \d+ ([^:\n]+): (.*)$", res.stdout, re.M)
    ran = {case for case, what in lines if not what.startswith("n/a")}
    assert {"auto", "producer_consumer", "wg_specialized", "copy_engine"} <= ran, out[-3000:]
    assert all(what.startswith(f"{calls} calls, 0 wrong") for case, what in lines if case in ran), out[-3000:]
