"""``host_shm``: one POSIX shared-memory segment per rank, mapped by every rank, tensors on
the CPU. Kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), where pointers are
host addresses; the same ``heap_bases`` translation as on GPUs makes remote loads, stores
and atomics real (interpreter atomics are hardware atomics, so they are atomic across
processes too).

Segments are created ``0600`` under ``/dev/shm`` with unguessable names
(``IRIS_FW_SHM_PREFIX`` + 128 random bits) and unlinked as soon as every rank has mapped
them, so a crash after set-up leaks nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets

import numpy as np
import torch

from iris_fw import interpreting
from iris_fw.errors import IrisError
from iris_fw.hookspecs import hookimpl
from iris_fw.transport import Transport

SHM_DIR = "/dev/shm"
DEFAULT_PREFIX = "iris_fw_"


def _interpreter_problem() -> str:
    """Why Triton's interpreter cannot run our kernels here, or ``""``."""
    if not interpreting():
        return (
            "needs TRITON_INTERPRET=1 set before kernels are defined (import iris_fw first, "
            "or export IRIS_FW_TRANSPORT=host_shm)"
        )
    import triton

    triton_version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    numpy_version = tuple(int(x) for x in np.__version__.split(".")[:2])
    if triton_version < (3, 9) and numpy_version >= (2, 4):
        return (
            f"Triton {triton.__version__}'s interpreter fails on numpy {np.__version__} "
            "(persistent loops); install numpy<2.4 or triton>=3.9"
        )
    return ""


class HostShmTransport(Transport):
    name = "host_shm"
    interpreted = True
    #: Segment-name prefix; ``IRIS_FW_SHM_PREFIX`` overrides it (launchers set it per job).
    shm_prefix = DEFAULT_PREFIX

    @classmethod
    def available(cls):
        if not os.path.isdir(SHM_DIR) or not os.access(SHM_DIR, os.W_OK):
            return False, f"{SHM_DIR} is missing or not writable"
        problem = _interpreter_problem()
        return (not problem), problem

    def __init__(self, bootstrap, heap_size: int):
        self.device = torch.device("cpu")
        self._maps: list[mmap.mmap | None] = []
        prefix = os.environ.get("IRIS_FW_SHM_PREFIX") or self.shm_prefix
        name = f"{prefix}{secrets.token_hex(16)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, heap_size)
            own = mmap.mmap(fd, heap_size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        problem = None
        try:
            names = bootstrap.all_gather(name)
            for r, peer_name in enumerate(names):
                if r == bootstrap.rank:
                    self._maps.append(own)
                    continue
                self._maps.append(self._map_peer(peer_name, heap_size, r))
        except OSError as exc:
            problem = (
                f"rank {bootstrap.rank} could not map a peer's segment ({exc}); host_shm needs "
                "every rank on one host"
            )
        finally:
            # Every rank reports whether it mapped every segment; then each unlinks its own.
            problems = bootstrap.all_gather(problem)
            os.unlink(path)
        failed = [p for p in problems if p]
        if failed:
            self._release()
            raise IrisError("host_shm set-up failed: " + "; ".join(failed))
        self._arrays = [np.frombuffer(m, dtype=np.uint8) for m in self._maps]
        self.bases = [int(a.ctypes.data) for a in self._arrays]
        self._check_bases()
        self.heap = torch.from_numpy(self._arrays[bootstrap.rank])
        self.heap_bases = torch.tensor(self.bases, dtype=torch.int64)

    @staticmethod
    def _map_peer(name: str, heap_size: int, rank: int) -> mmap.mmap:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            if os.fstat(fd).st_size != heap_size:
                raise OSError(f"segment of rank {rank} has {os.fstat(fd).st_size} bytes, expected {heap_size}")
            return mmap.mmap(fd, heap_size)
        finally:
            os.close(fd)

    def wrap(self, address, nbytes):
        owner = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
        return torch.from_numpy(owner), owner

    def close(self):
        self.heap = None
        self._arrays = []
        self.__dict__.pop("_header_views", None)
        self._release()

    def _release(self):
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                # A tensor over this mapping is still referenced; the segment is already
                # unlinked, so the memory goes when the last reference (or the process) does.
                pass
        self._maps = []


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(HostShmTransport)
