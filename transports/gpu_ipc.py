"""``gpu_ipc``: one device allocation per rank, opened by every peer through IPC handles.

One module for both GPU runtimes: the CUDA runtime (``libcudart``) on NVIDIA and the HIP
runtime (``libamdhip64``) on AMD have the same call shapes for what we need
(``Malloc``, ``Free``, ``IpcGetMemHandle``, ``IpcOpenMemHandle`` with lazy peer access,
``IpcCloseMemHandle``, 64-byte handles). The heap comes from the runtime's allocator, not
torch's caching allocator, so an IPC handle names exactly the heap. Rank → GPU is the local
rank.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import weakref

import torch

from iris_fw import devinfo, interpreting
from iris_fw.errors import IrisError
from iris_fw.hookspecs import hookimpl
from iris_fw.launch import share_gpus
from iris_fw.transport_base import Transport

_IPC_HANDLE_BYTES = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess == hipIpcMemLazyEnablePeerAccess
_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking == hipStreamNonBlocking
_MEMCPY_H2D, _MEMCPY_D2H = 1, 2  # cudaMemcpyHostToDevice / DeviceToHost, same values in HIP
_CAPTURE_MODE_RELAXED = 2  # cudaStreamCaptureModeRelaxed == hipStreamCaptureModeRelaxed
#: Bytes of the pinned buffer header words travel through.
_HEADER_IO_BYTES = 1 << 16
#: Heaps are allocated in multiples of this (the GPU's large-page size on CUDA and HIP).
_ALLOC_GRANULE = 2 << 20
#: GPU memory left free beside the heaps (kernels' scratch, torch's tensors), at most a tenth of the GPU.
GPU_RESERVE = 1 << 30


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


class _Runtime:
    """The few GPU runtime calls we need, through ctypes, for CUDA or HIP."""

    def __init__(self):
        self.prefix = "hip" if torch.version.hip else "cuda"
        self.lib = self._load()
        err = getattr(self.lib, f"{self.prefix}GetErrorString")
        err.restype = ctypes.c_char_p
        self._err = err

    def _load(self) -> ctypes.CDLL:
        if self.prefix == "hip":
            names = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"]
            patterns = ["torch/lib/libamdhip64.so*"]
        else:
            names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
            patterns = ["nvidia/cu13/lib/libcudart.so*", "nvidia/cuda_runtime/lib/libcudart.so*", "torch/lib/libcudart*.so*"]
        for name in names:  # already loaded by torch, or on the loader's path
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
        for entry in sys.path:
            for pattern in patterns:
                for path in sorted(glob.glob(os.path.join(entry, pattern))):
                    try:
                        return ctypes.CDLL(path)
                    except OSError:
                        pass
        raise IrisError(f"gpu_ipc: cannot find the {self.prefix} runtime library (tried {names})")

    def __call__(self, fn: str, *args) -> None:
        rc = getattr(self.lib, self.prefix + fn)(*args)
        if rc != 0:
            raise IrisError(f"{self.prefix}{fn} failed with error {rc}: {self._err(rc).decode()}")


class _Allocation:
    """Stands for this rank's heap allocation: it is freed (``Free``) once the transport is
    closed *and* no tensor over it is left (each holds this object), so a heap tensor used
    after ``ctx.close()`` still reads valid memory."""

    __slots__ = ("__weakref__",)


def _free_quietly(rt: "_Runtime", address: int) -> None:
    try:
        rt("Free", ctypes.c_void_p(address))
    except IrisError:  # at interpreter exit the runtime may be gone already
        pass


class _DeviceBlock:
    """Exposes device memory through ``__cuda_array_interface__`` so torch can wrap it; torch
    keeps this object alive exactly as long as the tensor's storage. ``keep``: what must live
    as long (the :class:`_Allocation` for this rank's own heap)."""

    __slots__ = ("__cuda_array_interface__", "keep", "__weakref__")

    def __init__(self, address: int, nbytes: int, keep=None):
        self.keep = keep
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
        }


class HeaderIO:
    """Header words of device-memory heaps read and written while kernels run (the watchdog
    thread: heartbeats, the abort word, cause records): copies through a pinned buffer on a
    private non-blocking stream, beside a kernel that spins on the stream torch uses; the
    calling thread's capture mode is relaxed for the copy, so a CUDA graph captured meanwhile by
    another thread is not invalidated. Shared by the device-memory transports."""

    def __init__(self, rt, local: int):
        self._rt, self._local = rt, local
        self._lock = threading.Lock()
        self._stream = self._buffer = None

    def read(self, address: int, count: int) -> list[int]:
        """``count`` int64 words at device ``address``."""
        return self._copy(address, count, None)

    def write(self, address: int, values) -> None:
        """int64 ``values`` to device ``address``."""
        self._copy(address, len(values), list(values))

    def _copy(self, address: int, count: int, values):
        nbytes = 8 * count
        if nbytes > _HEADER_IO_BYTES:
            raise ValueError(f"{count} header words do not fit the {_HEADER_IO_BYTES}-byte buffer")
        rt = self._rt
        with self._lock:
            rt("SetDevice", ctypes.c_int(self._local))
            if self._stream is None:
                stream, buf = ctypes.c_void_p(), ctypes.c_void_p()
                rt("StreamCreateWithFlags", ctypes.byref(stream), ctypes.c_uint(_STREAM_NON_BLOCKING))
                rt("HostAlloc", ctypes.byref(buf), ctypes.c_size_t(_HEADER_IO_BYTES), ctypes.c_uint(0))
                self._stream, self._buffer = stream, buf
            mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
            rt("ThreadExchangeStreamCaptureMode", ctypes.byref(mode))
            try:
                words = (ctypes.c_int64 * count).from_address(self._buffer.value)
                device = ctypes.c_void_p(address)
                if values is None:
                    rt("MemcpyAsync", self._buffer, device, ctypes.c_size_t(nbytes), ctypes.c_int(_MEMCPY_D2H), self._stream)
                else:
                    words[:] = [int(v) for v in values]
                    rt("MemcpyAsync", device, self._buffer, ctypes.c_size_t(nbytes), ctypes.c_int(_MEMCPY_H2D), self._stream)
                rt("StreamSynchronize", self._stream)
                return list(words) if values is None else None
            finally:
                rt("ThreadExchangeStreamCaptureMode", ctypes.byref(mode))

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._rt("StreamDestroy", self._stream)
                self._rt("FreeHost", self._buffer)
                self._stream = self._buffer = None


class DeviceHeapTransport(Transport):
    """The teardown every transport of a device heap shares (gpu_ipc, nvshmem): wait for this
    device, meet the peers (none still reads or writes this heap), drop the heap and the header
    reader, then :meth:`_release` what the transport mapped and allocated. Subclasses set
    ``_bootstrap`` and ``_header_io`` (a :class:`HeaderIO`)."""

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def close(self):
        self.synchronize()
        self._bootstrap.barrier()  # no peer still reads or writes our heap
        self.heap = None
        self._header_io.close()
        self._release()

    def _release(self) -> None:
        """Unmap the peers' heaps and free this rank's (also after a failed set-up)."""
        raise NotImplementedError


class GpuIpcTransport(DeviceHeapTransport):
    name = "gpu_ipc"

    @classmethod
    def available(cls):
        if not torch.cuda.is_available():
            return False, "no GPU visible to torch (torch.cuda.is_available() is False)"
        if interpreting():
            return False, "TRITON_INTERPRET=1 is set: kernels would run on the CPU interpreter"
        try:
            _Runtime()
        except IrisError as exc:
            return False, str(exc)
        return True, ""

    @staticmethod
    def _gpu_of(bootstrap) -> tuple[int, int]:
        """``(GPU index, ranks of this host on that GPU)`` for this rank: its local rank, modulo
        the GPU count under ``IRIS_FW_SHARE_GPUS=1``. Raises when the rank has no GPU."""
        count = torch.cuda.device_count()
        local, ranks = bootstrap.local_rank, 1
        if count and share_gpus():
            local %= count
            ranks = len(range(local, bootstrap.local_world_size, count))
        if local >= count:
            raise IrisError(
                f"local rank {local} has no GPU: {count} visible on this host "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
                "launch at most one rank per GPU (or set IRIS_FW_SHARE_GPUS=1 to share GPUs, for testing)"
            )
        return local, ranks

    @classmethod
    def check_resources(cls, bootstrap, heap_size):
        """The heaps of the ranks on this rank's GPU must fit its free memory, less a reserve for
        kernels and torch (:data:`GPU_RESERVE`, at most a tenth of the GPU)."""
        try:
            local, ranks = cls._gpu_of(bootstrap)
        except IrisError as exc:
            return exc
        free, total = torch.cuda.mem_get_info(local)
        usable = max(0, free - min(GPU_RESERVE, total // 10))
        alloc = -(-heap_size // _ALLOC_GRANULE) * _ALLOC_GRANULE
        if alloc * ranks <= usable:
            return None
        return cls._too_large(heap_size, ranks, f"GPU {local}'s memory ({torch.cuda.get_device_name(local)})",
                              free, usable, "free GPU memory (other processes on this GPU: nvidia-smi)")

    def __init__(self, bootstrap, heap_size: int):
        local, ranks_on_gpu = self._gpu_of(bootstrap)
        self.device = torch.device("cuda", local)
        self.ranks_on_device = ranks_on_gpu
        devinfo.warn_time_sliced(bootstrap.rank, ranks_on_gpu, self.device)
        torch.cuda.set_device(self.device)
        self._rt = rt = _Runtime()
        rt("SetDevice", ctypes.c_int(local))
        self._rank = bootstrap.rank
        self._bootstrap = bootstrap
        ptr = ctypes.c_void_p()
        # A whole number of allocation granules: the runtime may place a smaller block inside a
        # shared granule at a 1 KiB-aligned address (seen for a 1 MiB heap on H200), which
        # breaks the heap's alignment and would make its IPC handle name the granule.
        alloc = self._size = -(-heap_size // _ALLOC_GRANULE) * _ALLOC_GRANULE
        try:
            rt("Malloc", ctypes.byref(ptr), ctypes.c_size_t(alloc))
        except IrisError as exc:
            raise IrisError(f"gpu_ipc: cannot allocate a heap of {heap_size} bytes on {self.device}: {exc}") from None
        self._own = ptr.value
        self._allocation = _Allocation()
        # at interpreter exit the process's end frees it (peers may still be reading it)
        weakref.finalize(self._allocation, _free_quietly, rt, self._own).atexit = False
        self._opened: list[int] = []
        handle = _IpcHandle()
        rt("IpcGetMemHandle", ctypes.byref(handle), ctypes.c_void_p(self._own))
        handles = bootstrap.all_gather(bytes(ctypes.string_at(ctypes.addressof(handle), _IPC_HANDLE_BYTES)))
        self.bases, problem = [], None
        for r, raw in enumerate(handles):
            if r == bootstrap.rank:
                self.bases.append(self._own)
                continue
            peer = _IpcHandle()
            ctypes.memmove(ctypes.addressof(peer), raw, _IPC_HANDLE_BYTES)
            mapped = ctypes.c_void_p()
            try:
                rt("IpcOpenMemHandle", ctypes.byref(mapped), peer, ctypes.c_uint(_IPC_LAZY_ENABLE_PEER_ACCESS))
            except IrisError as exc:
                problem = f"rank {bootstrap.rank} cannot open the heap of rank {r}: {exc}"
                self.bases.append(0)
                continue
            self._opened.append(mapped.value)
            self.bases.append(mapped.value)
        problems = [p for p in bootstrap.all_gather(problem) if p]
        if problems:
            self._release()
            raise IrisError("gpu_ipc set-up failed: " + "; ".join(problems))
        self._check_bases()
        self.heap = self.wrap(self._own, heap_size)[0]
        self.heap_bases = torch.tensor(self.bases, dtype=torch.int64, device=self.device)
        self._header_io = HeaderIO(self._rt, local)

    # ---- header words while kernels run (the watchdog thread) --------------------------------------
    def header_words(self, rank, slot, count):
        return self._header_io.read(self.bases[rank] + 8 * slot, count)

    def set_header_words(self, rank, slot, values):
        self._header_io.write(self.bases[rank] + 8 * slot, values)

    def wrap(self, address, nbytes):
        own = self._allocation is not None and self._own <= address < self._own + self._size
        owner = _DeviceBlock(address, nbytes, self._allocation if own else None)
        tensor = torch.as_tensor(owner, device=self.device)
        return tensor, owner

    def _release(self):
        for address in self._opened:
            self._rt("IpcCloseMemHandle", ctypes.c_void_p(address))
        self._opened = []
        self._bootstrap.barrier()  # every peer closed its mapping of our heap
        # Freed now, or when the last tensor over it goes (see _Allocation).
        self._allocation = None


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(GpuIpcTransport)
