"""Iris's ``iris.hip`` device queries, answered by torch and :mod:`iris_fw.devinfo` (NVIDIA and
AMD alike). Queries of AMD hardware that NVIDIA GPUs do not have — XCC (chiplet) counts, the
wall-clock rate of ``s_memrealtime`` — and Iris's raw HIP IPC helpers are not provided: each
raises ``NotImplementedError`` saying so (iris-fw's ``gpu_ipc`` transport does the IPC)."""

from __future__ import annotations

import torch

from iris_fw import devinfo as _devinfo


def count_devices() -> int:
    """GPUs visible to this process."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def set_device(device_id: int) -> None:
    """Make ``device_id`` this process's current GPU."""
    torch.cuda.set_device(device_id)


def get_cu_count(device_id: int | None = None) -> int:
    """Compute units (SMs) of GPU ``device_id`` (default: the current one)."""
    index = torch.cuda.current_device() if device_id is None else device_id
    return _devinfo.num_sms(torch.device("cuda", index))


def _amd_only(what: str):
    def query(*args, **kwargs):
        raise NotImplementedError(f"iris.hip.{what} is not provided: an AMD-only hardware query or HIP runtime "
                                  f"helper with no iris-fw counterpart")

    query.__name__ = what
    return query


get_num_xcc = _amd_only("get_num_xcc")
get_wall_clock_rate = _amd_only("get_wall_clock_rate")
get_ipc_handle = _amd_only("get_ipc_handle")
open_ipc_handle = _amd_only("open_ipc_handle")
