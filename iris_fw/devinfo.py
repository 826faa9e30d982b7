"""The one place that knows the device: SM count, name, architecture, the program count of
persistent kernels, and how many programs of a compiled kernel one SM holds at once. Every
other module asks here (schedulers, the GEMM, benchmarks, tuning).

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


# ---- how many programs of a compiled kernel one SM holds at once -----------------------------

#: 32-bit registers of one SM where the device properties do not say (every NVIDIA GPU from
#: sm_50 through sm_90 and sm_100 has 64K).
REGISTERS_PER_SM = 65536
#: Registers are allocated per warp in units of this many (NVIDIA: 256, i.e. a thread's count
#: rounded up to a multiple of 8).
REGISTER_ALLOC_UNIT = 256
#: Shared memory the CUDA driver reserves per resident program (block), in bytes (sm_80 and later).
SHARED_RESERVED_PER_PROGRAM = 1024
#: Resident programs (blocks) per SM at most (sm_90: 32).
MAX_PROGRAMS_PER_SM = 32
#: Threads of a warp on any GPU at most (AMD's wavefront: 64; NVIDIA's warp: 32): a tile that
#: must give each lane to one thread on any GPU has ``num_warps * WIDEST_WARP`` elements at least.
WIDEST_WARP = 64


@dataclass(frozen=True)
class SMLimits:
    """What one SM holds of resident programs: ``registers`` (32-bit, the register file),
    ``register_unit`` (per-warp allocation granularity), ``shared_bytes`` (shared memory),
    ``shared_reserved`` (bytes the driver reserves per program), ``threads`` (resident threads),
    ``warp_size`` and ``programs`` (resident programs at most)."""

    registers: int
    register_unit: int
    shared_bytes: int
    shared_reserved: int
    threads: int
    warp_size: int
    programs: int


@functools.lru_cache(maxsize=None)
def _cuda_limits(index: int) -> SMLimits:
    props = torch.cuda.get_device_properties(index)
    return SMLimits(registers=getattr(props, "regs_per_multiprocessor", REGISTERS_PER_SM),
                    register_unit=REGISTER_ALLOC_UNIT, shared_bytes=props.shared_memory_per_multiprocessor,
                    shared_reserved=SHARED_RESERVED_PER_PROGRAM, threads=props.max_threads_per_multi_processor,
                    warp_size=props.warp_size, programs=MAX_PROGRAMS_PER_SM)


def sm_limits(device: torch.device) -> SMLimits | None:
    """The :class:`SMLimits` of an NVIDIA GPU; ``None`` on the CPU (nothing is compiled: every
    program "fits") and on AMD GPUs (registers are counted per SIMD there: not modelled)."""
    device = torch.device(device)
    if device.type == "cpu" or torch.version.hip:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_limits(index)


def resident_programs(limits: SMLimits, n_regs: int, num_warps: int, shared_bytes: int) -> int:
    """Programs of a compiled kernel — ``n_regs`` registers a thread, ``num_warps`` warps,
    ``shared_bytes`` of shared memory a program — that one SM of ``limits`` holds at once (the
    least of what its register file, shared memory, threads and program slots allow; 0: not
    even one). A kernel whose programs wait for each other (across ranks) must launch no more
    than this many per SM."""
    unit = limits.register_unit
    per_warp = -(-max(1, n_regs) * limits.warp_size // unit) * unit
    by_regs = limits.registers // (per_warp * num_warps)
    by_shared = limits.shared_bytes // (shared_bytes + limits.shared_reserved)
    by_threads = limits.threads // (num_warps * limits.warp_size)
    return max(0, min(by_regs, by_shared, by_threads, limits.programs))


def trace_clock(device: torch.device) -> str:
    """The clock traced kernels read on ``device`` (their ``TRACE`` constexpr, see
    :mod:`iris_fw.trace`): ``"host"`` under the interpreter, ``"memrealtime"`` on AMD GPUs,
    ``"globaltimer"`` on NVIDIA GPUs."""
    if info(device).type == "cpu":
        return "host"
    return "memrealtime" if torch.version.hip else "globaltimer"


# ---- ranks sharing a GPU: CUDA MPS ------------------------------------------------------------

#: The MPS control daemon's pipe directory when ``CUDA_MPS_PIPE_DIRECTORY`` is unset (CUDA's default).
MPS_DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
#: What ranks sharing a GPU without MPS cost: the signal -> wait_until round trip between two
#: ranks on one H100 (docs/performance.md, 2026-11-25: time-sliced, and under MPS).
SHARED_ROUND_TRIP_US = {"time-sliced": 4488.0, "mps": 2.41}
#: How to start MPS (as the GPU's owner, usually root; every rank must see the same two variables).
MPS_START = ("export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; "
             "mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d")


def _mps_daemons() -> list[int]:
    """Pids of MPS control daemons and servers visible in /proc (their command name is cut to 15
    characters: ``nvidia-cuda-mps``)."""
    import os

    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().startswith("nvidia-cuda-mps"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def mps_status() -> tuple[bool, str]:
    """``(active, why)``: whether CUDA processes started now would be MPS clients — the control
    pipe is in the directory this process would ask (``CUDA_MPS_PIPE_DIRECTORY``, else
    :data:`MPS_DEFAULT_PIPE_DIR`); a daemon seen in /proc only sharpens the message (it may run
    in another pid namespace, as with a container host's MPS)."""
    import os

    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE_DIR
    control = os.path.join(pipe_dir, "control")
    if os.path.exists(control):  # the daemon may run in another pid namespace (a container's host)
        seen = "MPS control daemon running" if _mps_daemons() else "MPS control pipe present (daemon not visible here)"
        return True, f"{seen}, pipe {control}"
    daemons = _mps_daemons()
    if daemons:
        return False, (f"an MPS daemon runs (pids {', '.join(map(str, daemons[:4]))}) but {control} does not exist: "
                       "set CUDA_MPS_PIPE_DIRECTORY to the daemon's pipe directory in every rank")
    return False, "no MPS control daemon running"


#: CUDA MPS's cap on the share of a GPU's SMs one client process may use, in percent. CUDA reads
#: it when the process initializes CUDA, so it must be in a rank's environment when it starts.
MPS_PERCENT_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


#: MPS shares (percent) at which torch's 16-bit GEMMs (cuBLAS) were right on every shape tried,
#: largest first. At the others they were wrong — 75, 45, 40, 36-30, 20 and 15 % on one H100
#: (torch 2.11 + CUDA 13, 2026-11-25; scripts/diag_cublas_share.py, docs/troubleshooting.md) —
#: so a job's default share is the largest of these within an equal split.
MPS_SHARES_RIGHT = (100, 50, 25, 10, 5)


def mps_share(ranks_on_gpu: int) -> str:
    """The :data:`MPS_PERCENT_VAR` value for each of ``ranks_on_gpu`` ranks sharing a GPU: the
    largest of :data:`MPS_SHARES_RIGHT` within an equal split (an equal split below the smallest
    of them). Uncapped, one rank's kernel whose programs wait for another rank's can take every
    SM and starve the rank it waits for: seen on one H100 under MPS, the ring demo's 4096
    programs timed out on rank 0 while rank 1's kernel never started."""
    equal = max(1, 100 // max(1, ranks_on_gpu))
    return str(next((share for share in MPS_SHARES_RIGHT if share <= equal), equal))


def warn_time_sliced(rank: int, ranks_on_gpu: int, device: torch.device) -> str | None:
    """Rank 0 of a job whose ranks share a GPU warns once when they cannot run well at once:
    without MPS their kernels time-slice (a cross-rank wait advances once per slice); under MPS
    without :data:`MPS_PERCENT_VAR` one rank's spinning kernel can starve another. Returns the
    message, or ``None`` when there is nothing to say (one rank per GPU, MPS with a share, or
    another rank than 0)."""
    import os
    import warnings

    from .errors import IrisWarning

    if rank != 0 or ranks_on_gpu <= 1:
        return None
    active, why = mps_status()
    if active and MPS_PERCENT_VAR in os.environ:
        return None
    if active:
        text = (f"{ranks_on_gpu} ranks share {device} under CUDA MPS with no cap on each rank's SMs: a kernel "
                "whose programs wait for another rank's can take every SM and starve the rank it waits for "
                f"(WaitTimeout). Start the ranks with {MPS_PERCENT_VAR}={mps_share(ranks_on_gpu)} "
                "(iris-fw launch sets it)")
    else:
        rt = SHARED_ROUND_TRIP_US
        text = (f"{ranks_on_gpu} ranks share {device} without CUDA MPS ({why}): their kernels time-slice, so every "
                f"wait for another rank advances once per time slice (signal round trip {rt['time-sliced']:g} us "
                f"measured time-sliced vs {rt['mps']:g} us under MPS on one H100); correctness holds, timings "
                f"mean nothing. Start MPS before the job: {MPS_START}")
    warnings.warn(text, IrisWarning, stacklevel=3)
    return text
