"""Raw calls to the GPU driver on raw handles — ``libcuda`` (or ``libamdhip64`` on ROCm) through
ctypes: an event record and a stream's wait on an event (a workspace's side stream,
:class:`iris_fw.engine.scheduler.SideStream`) and a CUDA graph's launch (a call replayed by the
call path, :class:`iris_fw.callpath.Replay`) — no torch object and no torch bookkeeping per call;
the raw handle of torch's current stream they run on (:func:`current_stream`); and, on CUDA, what
a launch in thread-block clusters needs of a compiled kernel's function handle
(:func:`cluster_calls`: its dynamic shared memory allowed, how many clusters the GPU holds at once).

:func:`calls` and :func:`cluster_calls` load them once per process; None where the driver
library or one of its symbols is not found (the callers then take torch's own path, or launch
no clusters).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .errors import IrisError

__all__ = ["ClusterCalls", "DriverCalls", "calls", "cluster_calls", "current_stream"]

#: Per platform: the libraries tried in order and the symbols of event record, stream wait and
#: graph launch.
_CUDA = (("libcuda.so.1", "libcuda.so"), ("cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch"))
_HIP = (("libamdhip64.so",), ("hipEventRecord", "hipStreamWaitEvent", "hipGraphLaunch"))
#: cuda.h's values: ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``,
#: ``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED``, ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``.
_MAX_DYNAMIC_SHARED, _NON_PORTABLE_CLUSTER, _CLUSTER_DIMENSION = 8, 14, 4
#: The largest cluster every sm_90 GPU launches (CUDA's portable size); up to
#: :data:`MAX_CLUSTER` with the function's non-portable attribute set.
PORTABLE_CLUSTER, MAX_CLUSTER = 8, 16


class DriverCalls:
    """``record(event, stream)`` and ``wait(stream, event)`` on raw handles, a nonzero status
    raising :class:`~iris_fw.errors.IrisError` naming the call; ``launch_graph_status(graph_exec,
    stream)``, the driver's graph launch itself, whose caller checks the status (nonzero:
    :meth:`launch_failed`) — a replay's hot path, one Python frame fewer."""

    def __init__(self, record, wait, launch, names):
        self._record, self._wait, self._names = record, wait, names
        self.launch_graph_status = launch

    def record(self, event: int, stream: int) -> None:
        rc = self._record(event, stream)
        if rc:
            raise IrisError(f"{self._names[0]} failed with error {rc}")

    def wait(self, stream: int, event: int) -> None:
        rc = self._wait(stream, event, 0)
        if rc:
            raise IrisError(f"{self._names[1]} failed with error {rc}")

    def launch_failed(self, rc: int) -> None:
        """Raise the :class:`~iris_fw.errors.IrisError` of a graph launch that returned ``rc``."""
        raise IrisError(f"{self._names[2]} failed with error {rc}")


def _symbols(libs, names, argtypes) -> tuple | None:
    """The functions ``names`` (each returning a status, ``int``) of the first of the libraries
    ``libs`` that loads and has them all, their argument types set (``argtypes``, one list per
    name); None where none has them."""
    for name in libs:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        found = tuple(getattr(lib, n, None) for n in names)
        if any(f is None for f in found):
            continue
        for f, types in zip(found, argtypes):
            f.argtypes, f.restype = types, ctypes.c_int
        return found
    return None


@functools.cache
def calls() -> DriverCalls | None:
    """The driver's calls (loaded on first use), or None where they are not found."""
    libs, names = _HIP if torch.version.hip else _CUDA
    vp = ctypes.c_void_p
    found = _symbols(libs, names, ([vp, vp], [vp, vp, ctypes.c_uint], [vp, vp]))
    return None if found is None else DriverCalls(*found, names)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class ClusterCalls:
    """What a launch in thread-block clusters (sm_90 and later) needs of a kernel's raw function
    handle (``CompiledKernel.function``), a nonzero status raising
    :class:`~iris_fw.errors.IrisError` naming the call."""

    def __init__(self, set_attribute, max_clusters):
        self._set, self._max = set_attribute, max_clusters
        self._shared = {}  # function handle -> the dynamic shared memory allowed so far

    def _attribute(self, function: int, attribute: int, value: int) -> None:
        rc = self._set(function, attribute, value)
        if rc:
            raise IrisError(f"cuFuncSetAttribute({attribute}, {value}) failed with error {rc}")

    def allow_shared(self, function: int, nbytes: int) -> None:
        """Let ``function`` launch with ``nbytes`` of dynamic shared memory (beyond 48 KiB it
        must be allowed; Triton allows what it compiled for). Only ever raised: a launch that
        asked for more earlier keeps it."""
        if nbytes > self._shared.get(function, 0):
            self._attribute(function, _MAX_DYNAMIC_SHARED, nbytes)
            self._shared[function] = nbytes

    def allow_cluster(self, function: int, size: int) -> None:
        """Let ``function`` launch in clusters of ``size`` programs (beyond
        :data:`PORTABLE_CLUSTER`, CUDA's non-portable sizes, up to 16)."""
        if size > PORTABLE_CLUSTER:
            self._attribute(function, _NON_PORTABLE_CLUSTER, 1)

    def max_active_clusters(self, function: int, cluster: int, threads: int, shared: int) -> int:
        """How many clusters of ``cluster`` programs of ``function`` (``threads`` a program,
        ``shared`` bytes of dynamic shared memory, allowed first) the GPU holds at once — a
        cluster's programs share one GPC, so this can be less than the SMs divided by the
        cluster size (cuOccupancyMaxActiveClusters)."""
        self.allow_cluster(function, cluster)
        self.allow_shared(function, shared)
        attr = _LaunchAttribute(id=_CLUSTER_DIMENSION)
        attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
        config = _LaunchConfig(shared=shared, attrs=ctypes.pointer(attr), num_attrs=1)
        config.grid[0], config.grid[1], config.grid[2] = cluster, 1, 1
        config.block[0], config.block[1], config.block[2] = threads, 1, 1
        out = ctypes.c_int(0)
        rc = self._max(ctypes.byref(out), function, ctypes.byref(config))
        if rc:
            raise IrisError(f"cuOccupancyMaxActiveClusters(cluster {cluster}, {threads} threads, {shared} B) "
                            f"failed with error {rc}")
        return out.value


@functools.cache
def cluster_calls() -> ClusterCalls | None:
    """The cluster launch's driver calls (CUDA; loaded on first use), or None where they are not
    found (ROCm, no driver)."""
    if torch.version.hip:
        return None
    vp = ctypes.c_void_p
    found = _symbols(_CUDA[0], ("cuFuncSetAttribute", "cuOccupancyMaxActiveClusters"),
                     ([vp, ctypes.c_int, ctypes.c_int], [vp, vp, vp]))
    return None if found is None else ClusterCalls(*found)


def current_stream():
    """``index -> raw handle`` of torch's current stream on device ``index``: torch's C function
    where it has one (no stream object per call), else the public call."""
    try:
        from torch._C import _cuda_getCurrentRawStream
    except ImportError:  # pragma: no cover - CUDA and ROCm builds of torch have it
        return lambda index: torch.cuda.current_stream(index).cuda_stream
    return _cuda_getCurrentRawStream
