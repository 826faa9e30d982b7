"""The demo under iris-fw launch, mpirun and torchrun; nothing left behind when a rank dies."""

import os
import subprocess
import sys

import pytest

import iris_fw.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "ring_exchange.py")
KILL = os.path.join(ROOT, "tests", "scripts", "kill_rank.py")
TIMEOUT = 300


def _ranks(n):
    """``n`` CPU ranks, ``n`` ranks sharing the GPUs (``IRIS_FW_SHARE_GPUS=1``), or one rank per
    visible GPU (at most 4)."""
    gpus = iris_fw.testing.gpu_count()
    return min(gpus, 4) if gpus and not iris_fw.testing.share_gpus() else n


def _two_ranks():
    n = _ranks(2)
    if n < 2:
        pytest.skip("needs two ranks: two GPUs, or one shared (IRIS_FW_SHARE_GPUS=1, under CUDA MPS)")
    return n


def _shm():
    return {n for n in os.listdir("/dev/shm") if n.startswith("iris_fw")}


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def _check_demo(res, bootstrap, n):
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"ring all-gather on {n} ranks" in res.stdout and f", {bootstrap}, " in res.stdout, res.stdout
    assert "correct on every rank" in res.stdout, res.stdout


@pytest.mark.slow
def test_demo_under_iris_fw_launch():
    n = _ranks(3)
    before = _shm()
    _check_demo(_run([sys.executable, "-m", "iris_fw", "launch", "-n", str(n), DEMO]), "torch", n)
    assert _shm() <= before


@pytest.mark.slow
def test_demo_under_torchrun():
    n = _ranks(2)
    res = _run([*iris_fw.testing.torchrun(n), DEMO])
    _check_demo(res, "torch", n)


@pytest.mark.slow
def test_demo_under_mpirun():
    n = _ranks(2)
    mpirun = iris_fw.testing.find_mpirun()
    if mpirun is None:
        pytest.skip("no mpirun on PATH (pip install 'iris-fw[mpi]')")
    _check_demo(_run([mpirun, "-n", str(n), sys.executable, DEMO]), "mpi", n)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["after-setup", "during-setup"])
def test_killed_rank_leaves_no_segments(how):
    n = _two_ranks()
    before = _shm()
    res = _run([sys.executable, "-m", "iris_fw", "launch", "-n", str(n), KILL, how])
    assert res.returncode != 0 and "rank 1: killing myself" in res.stdout, res.stdout + res.stderr
    assert _shm() <= before, f"left behind: {_shm() - before}"


@pytest.mark.extended  # (iris-fw launch's killed ranks above: the same clean-up, in the default run)
def test_killed_rank_under_torchrun_leaves_no_segments():
    n = _two_ranks()
    before = _shm()
    res = _run([*iris_fw.testing.torchrun(n), KILL])
    assert res.returncode != 0 and "rank 1: killing myself" in res.stdout, res.stdout + res.stderr
    assert _shm() <= before, f"left behind: {_shm() - before}"
