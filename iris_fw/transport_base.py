"""The base class of transports (the plugins of ``transports/``, installed as
``iris_fw.transports``): how each rank's symmetric heap is allocated and mapped by every peer.

A transport is constructed as ``cls(bootstrap, heap_size)`` (:meth:`Transport.__init__`:
:func:`iris_fw.init` passes the job's bootstrap, already joined, and the heap size in bytes).
Afterwards it exposes:

* ``device`` – the torch device kernels run on (``cuda:N`` or ``cpu``),
* ``heap`` – this rank's heap as a ``uint8`` tensor ``[heap_size]``,
* ``bases`` – every rank's heap base address *as mapped in this process*, a ``list[int]``,
* ``heap_bases`` – the same as an int64 tensor ``[world_size]`` on ``device``,
* ``call_mode`` – how kernels reach peers: 0 (the default) by load/store on translated
  pointers; 1 or 2 through NVSHMEM device calls (:class:`iris_fw.device.DeviceHeaps`), which the
  context compiles into its kernels,

and the methods :meth:`Transport.wrap`, :meth:`Transport.synchronize` and
:meth:`Transport.close`, and :meth:`Transport.header_words` / :meth:`Transport.set_header_words`
(the host's access to heap headers while kernels run: heartbeats and the abort word).
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from .device import HEAP_BASE_ALIGN
from .errors import HeapTooLarge, IrisError


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"64.0 MiB"``, ``"1.0 TiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


class Transport(ABC):
    """Base class of transports: the contract :func:`iris_fw.init` and the context rely on.

    * Class attributes: ``name`` (the registry name), ``interpreted``; class methods
      :meth:`available`, :meth:`check_resources`.
    * The constructor: ``cls(bootstrap, heap_size)`` (:meth:`__init__`).
    * After construction: ``device``, ``heap``, ``bases``, ``heap_bases``, ``call_mode``,
      ``ranks_on_device`` (the module docstring says what each is).
    * The methods :meth:`wrap`, :meth:`synchronize`, :meth:`close`, :meth:`header_words`,
      :meth:`set_header_words`, :meth:`peer_heap`.
    """

    name: ClassVar[str]
    #: Kernels for this transport run under Triton's interpreter (TRITON_INTERPRET=1).
    interpreted: ClassVar[bool] = False

    device: torch.device
    heap: torch.Tensor
    bases: list[int]
    heap_bases: torch.Tensor
    #: NVSHMEM device-call mode of this transport's kernels (``DeviceHeaps.NVSHMEM_CALLS``): 0 but
    #: for ``nvshmem`` across nodes or with ``IRIS_FW_NVSHMEM_CALLS=all``.
    call_mode: int = 0
    #: Ranks whose heaps live on this rank's device, this rank included (more than 1 when ranks
    #: share a GPU): a copy between two of their heaps runs on the device's SMs, not a copy
    #: engine, so it needs SMs that a spinning kernel may hold.
    ranks_on_device: int = 1

    @abstractmethod
    def __init__(self, bootstrap, heap_size: int) -> None:
        """Allocate this rank's heap of ``heap_size`` bytes and map every peer's: set ``device``,
        ``heap``, ``bases`` and ``heap_bases`` (and ``call_mode`` / ``ranks_on_device`` where
        they differ from the defaults). ``bootstrap``: the job's
        :class:`~iris_fw.bootstrap_base.Bootstrap`, already joined (``rank``, ``world_size``,
        ``local_rank``, ``local_world_size`` set); its collectives exchange what the peers need
        to map each other's heaps (every rank constructs its transport at the same point of
        :func:`iris_fw.init`). On failure, release what was allocated and raise (:meth:`close` is
        not called then)."""

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``."""
        return True, ""

    @classmethod
    def check_resources(cls, bootstrap, heap_size: int) -> BaseException | None:
        """Before set-up, on every rank: an exception saying why this host cannot hold a heap
        of ``heap_size`` bytes for this rank (naming the size, what is available and what to
        do), or ``None``. :func:`iris_fw.init` gathers the answers and raises on every rank."""
        return None

    @abstractmethod
    def wrap(self, address: int, nbytes: int) -> tuple[torch.Tensor, Any]:
        """A ``uint8`` tensor ``[nbytes]`` over memory at ``address`` mapped in this process,
        and the object whose lifetime is the tensor's storage's: it supports weak references
        and is released only when the storage (every view of it) is freed."""

    def synchronize(self) -> None:
        """Wait until the work this process queued on ``device`` has finished."""

    @abstractmethod
    def close(self) -> None:
        """Unmap peers' heaps and free this rank's heap. Collective: every rank calls it."""

    # ---- helpers for subclasses --------------------------------------------------------------
    def _check_bases(self) -> None:
        for r, base in enumerate(self.bases):
            if base % HEAP_BASE_ALIGN.value:
                raise IrisError(
                    f"transport {self.name!r}: heap of rank {r} is mapped at {base:#x}, "
                    f"not aligned to {HEAP_BASE_ALIGN.value} bytes"
                )

    def header_words(self, rank: int, slot: int, count: int) -> list[int]:
        """``count`` int64 words from slot ``slot`` of ``rank``'s heap header, as the host sees
        them now — also while kernels run (the watchdog thread reads heartbeats and the abort
        word this way). The default reads host memory; device-memory transports override it."""
        return self._host_words(rank)[slot:slot + count].tolist()

    def set_header_words(self, rank: int, slot: int, values: list[int]) -> None:
        """Write int64 ``values`` from slot ``slot`` of ``rank``'s heap header, visible to
        kernels that are running (see :meth:`header_words`)."""
        self._host_words(rank)[slot:slot + len(values)] = values

    def _host_words(self, rank: int) -> np.ndarray:
        views = self.__dict__.setdefault("_header_views", {})
        view = views.get(rank)
        if view is None:
            view = views[rank] = np.ctypeslib.as_array(
                (ctypes.c_int64 * (self.heap.numel() // 8)).from_address(self.bases[rank]))
        return view
    @staticmethod
    def _too_large(heap_size: int, ranks: int, where: str, free: int, usable: int, advice: str) -> HeapTooLarge:
        """The :class:`HeapTooLarge` of :meth:`check_resources`: ``ranks`` heaps of ``heap_size``
        bytes do not fit ``usable`` of the ``free`` bytes of ``where``."""
        per_rank = usable // max(ranks, 1)
        need = heap_size * ranks
        return HeapTooLarge(
            f"heap_size={heap_size} ({format_bytes(heap_size)}) does not fit: {ranks} rank(s) need "
            f"{format_bytes(need)} of {where}, which has {format_bytes(free)} free; iris-fw uses at most "
            f"{format_bytes(usable)} of it (room to spare). Pass a smaller heap_size (at most "
            f"{per_rank} bytes, {format_bytes(per_rank)}, per rank here) or {advice}"
        )

    def peer_heap(self, peer: int) -> torch.Tensor:
        """``peer``'s whole heap as mapped here, a ``uint8`` tensor ``[heap_size]`` that does
        not own the memory."""
        return self.wrap(self.bases[peer], self.heap.numel())[0]
