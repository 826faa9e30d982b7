"""Transports: how each rank's symmetric heap is allocated and mapped by every peer.

A transport is constructed with a bootstrap and a heap size. Afterwards it exposes:

* ``device`` – the torch device kernels run on (``cuda:N`` or ``cpu``),
* ``heap`` – this rank's heap as a ``uint8`` tensor ``[heap_size]``,
* ``bases`` – every rank's heap base address *as mapped in this process*, a ``list[int]``,
* ``heap_bases`` – the same as an int64 tensor ``[world_size]`` on ``device``,

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
from .errors import IrisError


class Transport(ABC):
    """Base class of transports; see the module docstring for the attributes."""

    name: ClassVar[str]
    #: Kernels for this transport run under Triton's interpreter (TRITON_INTERPRET=1).
    interpreted: ClassVar[bool] = False

    device: torch.device
    heap: torch.Tensor
    bases: list[int]
    heap_bases: torch.Tensor

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``."""
        return True, ""

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

    def peer_heap(self, peer: int) -> torch.Tensor:
        """``peer``'s whole heap as mapped here, a ``uint8`` tensor ``[heap_size]`` that does
        not own the memory."""
        return self.wrap(self.bases[peer], self.heap.numel())[0]
