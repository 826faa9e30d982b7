"""Ranks sharing a GPU: MPS detection (``iris-fw info``), rank 0's one-time warning when they
would time-slice or starve each other, and the SM share iris-fw's launchers give each rank.
The GPU side (the suite, faults and latency under MPS) is scripts/gpu_mps.sh."""

from __future__ import annotations

import warnings

import pytest
import torch

from iris_fw import devinfo, launch
from iris_fw.errors import IrisWarning


@pytest.fixture
def mps_dir(tmp_path, monkeypatch):
    """A pipe directory with a control pipe, as a running daemon leaves it."""
    (tmp_path / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.delenv(devinfo.MPS_PERCENT_VAR, raising=False)
    return tmp_path


def test_mps_status_needs_daemon_and_pipe(mps_dir, monkeypatch):
    monkeypatch.setattr(devinfo, "_mps_daemons", lambda: [4242])
    assert devinfo.mps_status() == (True, f"MPS control daemon running, pipe {mps_dir / 'control'}")
    monkeypatch.setattr(devinfo, "_mps_daemons", lambda: [])  # a daemon in another pid namespace
    assert devinfo.mps_status() == (True, f"MPS control pipe present (daemon not visible here), pipe {mps_dir / 'control'}")
    (mps_dir / "control").unlink()
    assert devinfo.mps_status() == (False, "no MPS control daemon running")
    monkeypatch.setattr(devinfo, "_mps_daemons", lambda: [4242])
    active, why = devinfo.mps_status()
    assert not active and "CUDA_MPS_PIPE_DIRECTORY" in why and "4242" in why


def test_rank_zero_warns_once_when_ranks_time_slice(mps_dir, monkeypatch):
    monkeypatch.setattr(devinfo, "_mps_daemons", lambda: [])
    (mps_dir / "control").unlink()
    dev = torch.device("cuda", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert devinfo.warn_time_sliced(1, 2, dev) is None  # only rank 0 speaks
        assert devinfo.warn_time_sliced(0, 1, dev) is None  # one rank on its GPU: nothing to say
        text = devinfo.warn_time_sliced(0, 2, dev)
    assert [w.category for w in caught] == [IrisWarning]
    assert "time-slice" in text and "4488" in text and "nvidia-cuda-mps-control -d" in text


def test_under_mps_an_uncapped_share_is_reported(mps_dir, monkeypatch):
    monkeypatch.setattr(devinfo, "_mps_daemons", lambda: [4242])
    dev = torch.device("cuda", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = devinfo.warn_time_sliced(0, 3, dev)
        monkeypatch.setenv(devinfo.MPS_PERCENT_VAR, "25")
        assert devinfo.warn_time_sliced(0, 3, dev) is None  # capped: MPS runs the ranks at once
    assert len(caught) == 1 and f"{devinfo.MPS_PERCENT_VAR}=25" in text


@pytest.mark.parametrize("world, gpus, preset, want", [
    (2, 1, None, "50"), (3, 1, None, "25"), (4, 2, None, "50"), (5, 1, None, "10"), (2, 2, None, None),
    (1, 1, None, None), (3, 1, "5", "5"), (30, 1, None, "3"),
])
def test_launchers_give_each_sharing_rank_an_equal_sm_share(monkeypatch, world, gpus, preset, want):
    """The largest share within an equal split at which torch's 16-bit GEMMs were right on an
    H100 (devinfo.MPS_SHARES_RIGHT: at 33 % they were not), an equal split below the smallest;
    a share the user set is kept."""
    monkeypatch.setattr(launch, "gpu_count", lambda: gpus)
    monkeypatch.setenv("IRIS_FW_SHARE_GPUS", "1")
    if preset is None:
        monkeypatch.delenv(devinfo.MPS_PERCENT_VAR, raising=False)
    else:
        monkeypatch.setenv(devinfo.MPS_PERCENT_VAR, preset)
    env = launch.rank_environ(0, world, 1234, "iris_fw_test_", base={})
    assert env.get(devinfo.MPS_PERCENT_VAR) == want


def test_every_gpu_script_starts_mps_where_ranks_share_a_gpu():
    """scripts/gpu_*.sh source scripts/mps.sh and start the daemon when ranks share a GPU (it
    stops at exit): a run that forgets it time-slices and proves little."""
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    scripts = sorted(glob.glob(os.path.join(root, "scripts", "gpu_*.sh")))
    assert scripts
    for path in scripts:
        text = open(path).read()
        assert "mps.sh" in text and "mps_needed" in text and "mps_start" in text, path
    helper = open(os.path.join(root, "scripts", "mps.sh")).read()
    assert "trap mps_stop EXIT" in helper and "nvidia-cuda-mps-control -d" in helper
