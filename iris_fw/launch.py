"""``iris-fw launch``: start N ranks of a Python program on this host.

Each rank gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so the ``torch`` bootstrap finds
it, and ``TRITON_INTERPRET=1`` when no GPU is present. If a rank fails, the others are
stopped; afterwards any /dev/shm segment the job left (a rank killed during set-up) is
removed. The exit code is the first failing rank's, else 0.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

from . import _choose_interpreter, env, interpreting

_GRACE_S = 5.0
_POLL_S = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    """GPUs kernels will run on here: 0 under the interpreter or without GPUs."""
    import torch

    if interpreting() or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def share_gpus() -> bool:
    """``IRIS_FW_SHARE_GPUS=1``: ranks beyond the GPU count share GPUs round-robin (rank r on GPU
    r mod count). For correctness testing on fewer GPUs than ranks: the ranks' kernels run in
    separate processes and time-slice on a shared GPU, so waits across ranks still complete,
    slowly; timings taken this way mean nothing."""
    return env.get("IRIS_FW_SHARE_GPUS")


def default_world_size() -> int:
    """The number of GPUs when there are any, else 4 CPU ranks."""
    return gpu_count() or 4


def new_shm_prefix() -> str:
    """A /dev/shm name prefix unique to one launch."""
    return f"iris_fw_{secrets.token_hex(4)}_"


def rank_environ(rank: int, world_size: int, port: int, shm_prefix: str, base: dict | None = None) -> dict:
    """The environment of one rank of a single-host job."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        IRIS_FW_SHM_PREFIX=shm_prefix,
    )
    _choose_interpreter(env)
    return env


def cleanup_shm(prefix: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove segments whose names start with ``prefix``; return what was removed."""
    removed = []
    if not prefix or not os.path.isdir(shm_dir):
        return removed
    for name in os.listdir(shm_dir):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def launch(argv: list[str], nprocs: int, timeout: float | None = None) -> int:
    """Run ``python argv…`` as ``nprocs`` ranks; return the job's exit code."""
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    port, prefix = free_port(), new_shm_prefix()
    procs = [
        subprocess.Popen([sys.executable, *argv], env=rank_environ(r, nprocs, port, prefix), start_new_session=True)
        for r in range(nprocs)
    ]
    deadline = None if timeout is None else time.monotonic() + timeout
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                code = failed[0].returncode if failed else 124
                if not failed:
                    print(f"iris-fw launch: timed out after {timeout}s; stopping the ranks", file=sys.stderr)
                _stop(procs)
                break
            time.sleep(_POLL_S)
        else:
            code = next((p.returncode for p in procs if p.returncode), 0)
    finally:
        _stop(procs)
        cleanup_shm(prefix)
    return code if code >= 0 else 128 - code


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + _GRACE_S
    for p in alive:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
