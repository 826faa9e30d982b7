"""``host_shm``: one POSIX shared-memory segment per rank, mapped by every rank, tensors on
the CPU. Kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), where pointers are
host addresses; the same ``heap_bases`` translation as on GPUs makes remote loads, stores
and atomics real (interpreter atomics are hardware atomics, so they are atomic across
processes too).

Segments are created ``0600`` under ``/dev/shm`` with unguessable names
(``IRIS_FW_SHM_PREFIX`` + owner pid + 128 random bits) and unlinked as soon as every rank has
mapped them, so a crash after set-up leaks nothing; a segment whose owner died during set-up is
removed by the next set-up with the same prefix on the host (:func:`remove_stale_segments`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import secrets

import numpy as np
import torch

from iris_fw import env, interpreting
from iris_fw.errors import IrisError, NotOnHeapError
from iris_fw.hookspecs import hookimpl
from iris_fw.launch import cleanup_shm
from iris_fw.transport_base import Transport

SHM_DIR = "/dev/shm"
#: Share of /dev/shm's free space the heaps of one host may take (the rest: room to spare).
SHM_USABLE = 0.9
DEFAULT_PREFIX = env.variable("IRIS_FW_SHM_PREFIX").default


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


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


def segment_tag(pid: int) -> str:
    """The owner part of a segment name: ``<pid namespace>-<pid>`` (the name ends with
    ``_<128 random bits>``), so a later set-up can tell a dead owner's segment."""
    return f"{_pid_namespace()}-{pid}"


def remove_stale_segments(prefix: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove segments named ``prefix`` + owner tag + random bits whose owner process (in this
    pid namespace) no longer exists: what a rank killed between creating its segment and
    unlinking it leaves (under any launcher; ``iris-fw launch`` also removes them at once).
    Returns the names removed."""
    pattern = re.compile(re.escape(prefix) + re.escape(_pid_namespace()) + r"-(\d+)_[0-9a-f]{32}")

    def owner_dead(name: str) -> bool:
        match = pattern.fullmatch(name)
        if match is None:
            return False
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        return False  # the owner lives (or belongs to another user): not ours to judge

    return cleanup_shm(prefix, shm_dir, select=owner_dead)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_setup_segments(prefix: str, names: list, bootstrap, shm_dir: str = SHM_DIR) -> None:
    """After a failed set-up: unlink ``names`` and the segments whose owner is a rank the
    bootstrap's watchdog found lost (dead, or a zombie its launcher has not reaped yet)."""
    for name in {n for n in names if isinstance(n, str) and n.startswith(prefix) and "/" not in n}:
        _unlink(os.path.join(shm_dir, name))
    watchdog = getattr(bootstrap, "liveness", None)
    lost = getattr(watchdog, "lost", None) or {}
    infos = getattr(watchdog, "processes", None) or getattr(bootstrap, "processes", None) or []
    tags = {segment_tag(infos[r]["pid"]) for r in lost if r < len(infos) and "pid" in infos[r]}
    if tags:
        cleanup_shm(prefix, shm_dir, select=lambda n: n[len(prefix):].split("_", 1)[0] in tags)


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

    @classmethod
    def check_resources(cls, bootstrap, heap_size):
        """Segments are sparse: creating one always works, and a page that /dev/shm has no room
        for kills the process with SIGBUS when first touched. So the heaps of every rank on this
        host must fit :data:`SHM_USABLE` of the free space of /dev/shm, checked up front."""
        try:
            st = os.statvfs(SHM_DIR)
        except OSError as exc:
            return IrisError(f"host_shm: cannot stat {SHM_DIR} ({exc})")
        free = st.f_bavail * st.f_frsize
        usable = int(free * SHM_USABLE)
        ranks = bootstrap.local_world_size
        if heap_size * ranks <= usable:
            return None
        return cls._too_large(heap_size, ranks, SHM_DIR, free, usable,
                              "give the machine more shared memory (docker run --shm-size=..., "
                              "or mount -o remount,size=... /dev/shm)")

    def __init__(self, bootstrap, heap_size: int):
        self.device = torch.device("cpu")
        self._maps: list[mmap.mmap | None] = []
        prefix = env.get("IRIS_FW_SHM_PREFIX") if env.is_set("IRIS_FW_SHM_PREFIX") else self.shm_prefix
        remove_stale_segments(prefix)
        name = f"{prefix}{segment_tag(os.getpid())}_{secrets.token_hex(16)}"
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
        problem, names = None, []
        try:
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
            # Every rank reports whether it mapped every segment; then each unlinks its own.
            problems = bootstrap.all_gather(problem)
        except BaseException:
            # set-up failed under us (a peer lost, an interrupt): the job will not run, so no
            # segment of it is needed — this rank's, every peer's whose name it learnt, and those
            # of the peers found dead (which cannot unlink theirs)
            _remove_setup_segments(prefix, [name, *names], bootstrap)
            raise
        finally:
            _unlink(path)
        failed = [p for p in problems if p]
        if failed:
            for m in self._maps:  # no tensor exists yet: unmap now
                m.close()
            self._release()
            raise IrisError("host_shm set-up failed: " + "; ".join(failed))
        self._arrays = [np.frombuffer(m, dtype=np.uint8) for m in self._maps]
        self.bases = [int(a.ctypes.data) for a in self._arrays]
        self._heap_size = heap_size
        #: every tensor over a heap holds this: the job's mappings outlive the context while a
        #: tensor, or a kernel given one, may still reach them (no SIGSEGV after close)
        self._keep = tuple(self._maps)
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
        for r, base in enumerate(self.bases):
            if base <= address and address + nbytes <= base + self._heap_size:
                break
        else:
            raise NotOnHeapError(f"host_shm.wrap: [{address:#x}, +{nbytes}) lies in no heap mapped here")
        raw = (ctypes.c_uint8 * nbytes).from_buffer(self._keep[r], address - base)
        raw.keep = self._keep  # the mappings live as long as this tensor's storage
        owner = np.ctypeslib.as_array(raw)
        return torch.from_numpy(owner), owner

    def close(self):
        self.heap = None
        self._arrays = []
        self.__dict__.pop("_header_views", None)
        self._release()

    def _release(self):
        # Unmapping happens when the last reference to a mapping goes: here, unless a tensor
        # over a heap is still alive (it keeps every mapping of the job, see wrap); then when it
        # goes. The segments are unlinked already, so their memory goes with the last mapping.
        self._maps = []
        self._keep = ()


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(HostShmTransport)
