"""Raw calls to the GPU driver on raw handles — ``libcuda`` (or ``libamdhip64`` on ROCm) through
ctypes: an event record and a stream's wait on an event (a workspace's side stream,
:class:`iris_fw.engine.scheduler.SideStream`) and a CUDA graph's launch (a call replayed by the
call path, :class:`iris_fw.callpath.Replay`) — no torch object and no torch bookkeeping per call;
and the raw handle of torch's current stream they run on (:func:`current_stream`).

:func:`calls` loads them once per process; None where the driver library or one of its
symbols is not found (the callers then take torch's own path).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from .errors import IrisError

__all__ = ["DriverCalls", "calls", "current_stream"]

#: Per platform: the libraries tried in order and the symbols of event record, stream wait and
#: graph launch.
_CUDA = (("libcuda.so.1", "libcuda.so"), ("cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch"))
_HIP = (("libamdhip64.so",), ("hipEventRecord", "hipStreamWaitEvent", "hipGraphLaunch"))


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


_loaded: Any = False


def calls() -> DriverCalls | None:
    """The driver's calls (loaded on first use), or None where they are not found."""
    global _loaded
    if _loaded is not False:
        return _loaded
    libs, names = _HIP if torch.version.hip else _CUDA
    found = None
    for name in libs:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        record, wait, launch = (getattr(lib, n, None) for n in names)
        if record is None or wait is None or launch is None:
            continue
        vp = ctypes.c_void_p
        record.argtypes, record.restype = [vp, vp], ctypes.c_int
        wait.argtypes, wait.restype = [vp, vp, ctypes.c_uint], ctypes.c_int
        launch.argtypes, launch.restype = [vp, vp], ctypes.c_int
        found = DriverCalls(record, wait, launch, names)
        break
    _loaded = found
    return found


def current_stream():
    """``index -> raw handle`` of torch's current stream on device ``index``: torch's C function
    where it has one (no stream object per call), else the public call."""
    try:
        from torch._C import _cuda_getCurrentRawStream
    except ImportError:  # pragma: no cover - CUDA and ROCm builds of torch have it
        return lambda index: torch.cuda.current_stream(index).cuda_stream
    return _cuda_getCurrentRawStream
