"""The one place that knows the device: SM count, name, architecture, and the program count of
persistent kernels. Every other module asks here (schedulers, the GEMM, benchmarks, tuning).

On the CPU (Triton's interpreter) a "device" has :data:`CPU_PROGRAMS` programs: they run one
after another, so a few keep the tests quick while still exercising multi-program paths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

#: Programs per kernel on the CPU interpreter (they run one after another).
CPU_PROGRAMS = 4


@dataclass(frozen=True)
class DeviceInfo:
    """What kernels and tuning tables need to know about a device.

    ``name`` is the key of tuning tables (``"NVIDIA H200"``, ``"cpu"``); ``arch`` is
    ``"sm_90"``-style on NVIDIA, the gfx name on AMD, ``"cpu"`` on the interpreter."""

    type: str
    name: str
    arch: str
    sms: int
    memory_bytes: int


@functools.lru_cache(maxsize=None)
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "gfx").split(":")[0]
    else:
        arch = f"sm_{props.major}{props.minor}"
    return DeviceInfo("cuda", props.name, arch, props.multi_processor_count, props.total_memory)


_CPU = DeviceInfo("cpu", "cpu", "cpu", CPU_PROGRAMS, 0)


def info(device: torch.device) -> DeviceInfo:
    """The :class:`DeviceInfo` of ``device`` (cached per GPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return _CPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_info(index)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors (compute units) of ``device``; :data:`CPU_PROGRAMS` on the CPU."""
    return info(device).sms


def persistent_programs(device: torch.device, work: int) -> int:
    """Programs of a persistent kernel over ``work`` items: at most one per SM, at least one."""
    return max(1, min(int(work), num_sms(device)))


def trace_clock(device: torch.device) -> str:
    """The clock traced kernels read on ``device`` (their ``TRACE`` constexpr, see
    :mod:`iris_fw.trace`): ``"host"`` under the interpreter, ``"memrealtime"`` on AMD GPUs,
    ``"globaltimer"`` on NVIDIA GPUs."""
    if info(device).type == "cpu":
        return "host"
    return "memrealtime" if torch.version.hip else "globaltimer"
