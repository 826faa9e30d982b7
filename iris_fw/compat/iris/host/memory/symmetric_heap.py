"""Iris's ``shmem.heap`` (``iris.host.memory.symmetric_heap.SymmetricHeap``) and its
``allocator``, over an iris-fw context's symmetric heap (:class:`iris_fw.heap.SymmetricHeap`).

iris-fw maps every peer's whole heap when the context is created, so there is nothing to
refresh after an allocation (``refresh_peer_access`` does nothing) and a block's offset is the
same on every rank as long as every rank allocates the same sizes in the same order (as in
Iris). Blocks return to the heap when their tensors die (collectively reclaimed at the next
barrier), where Iris's torch allocator is a bump allocator that never frees.
"""

from __future__ import annotations

import logging as _logging

import torch

from iris_fw import heap as _fw_heap

from ...logging import log_with_rank


def _context(owner):
    return owner.ctx


class Allocator:
    """``shmem.heap.allocator``: Iris's allocator queries, answered by iris-fw's heap."""

    def __init__(self, shmem):
        self._shmem = shmem

    @property
    def heap_size(self) -> int:
        return _context(self._shmem).heap_size

    @property
    def heap_offset(self) -> int:
        """Bytes of the heap in use (iris-fw's heap reuses freed blocks: this is not a bump
        pointer, and it cannot be set back)."""
        return _context(self._shmem).heap.bytes_used

    def get_base_address(self) -> int:
        """This rank's heap base address (as mapped in this process)."""
        ctx = _context(self._shmem)
        return ctx.transport.bases[ctx.rank]

    def get_minimum_allocation_size(self) -> int:
        """Bytes of the smallest block (iris-fw's block alignment)."""
        return _fw_heap.ALIGN

    def get_device(self) -> torch.device:
        return _context(self._shmem).device

    def owns_tensor(self, tensor) -> bool:
        return _context(self._shmem).is_symmetric(tensor)

    def allocate(self, num_elements: int, dtype: torch.dtype, alignment: int = 1024) -> torch.Tensor:
        return self._shmem.heap.allocate(num_elements, dtype, alignment)


class SymmetricHeap:
    """``shmem.heap``: allocation and queries of this rank's symmetric heap (Iris's names)."""

    def __init__(self, shmem):
        self._shmem = shmem
        ctx = _context(shmem)
        self.heap_size = ctx.heap_size
        self.cur_rank = ctx.rank
        self.num_ranks = ctx.world_size
        self.device_id = ctx.device.index if ctx.device.index is not None else 0
        self.allocator = Allocator(shmem)

    @property
    def heap_bases(self) -> torch.Tensor:
        return _context(self._shmem).heap_bases.bases

    def allocate(self, num_elements: int, dtype: torch.dtype, alignment: int = 1024) -> torch.Tensor:
        """A flat uninitialized tensor ``[num_elements]`` on the heap whose address is a multiple
        of ``alignment`` bytes (a power of two). Every rank must allocate the same sizes in the
        same order (the offsets then agree), as in Iris; like Iris's, the call ends in a barrier
        of every rank (see ``Iris._settle``)."""
        if isinstance(num_elements, bool) or not isinstance(num_elements, int) or num_elements < 0:
            raise ValueError(f"num_elements must be a non-negative int, got {num_elements!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a positive power of two (bytes), got {alignment!r}")
        ctx = _context(self._shmem)
        log_with_rank(_logging.DEBUG, f"SymmetricHeap.allocate: num_elements={num_elements} dtype={dtype}", ctx.rank,
                      ctx.world_size)
        if alignment <= _fw_heap.ALIGN:
            return self._shmem._settle(ctx.empty(num_elements, dtype=dtype))
        # blocks are ALIGN-aligned (heap bases are page-aligned): over-allocate and start at the
        # first multiple of `alignment`; the offset is the same on every rank
        itemsize = torch.empty((), dtype=dtype).element_size()
        raw = ctx.empty(num_elements * itemsize + alignment - _fw_heap.ALIGN, dtype=torch.uint8)
        skip = -raw.data_ptr() % alignment
        return self._shmem._settle(raw[skip:skip + num_elements * itemsize].view(dtype))

    def get_device(self) -> torch.device:
        return _context(self._shmem).device

    def on_symmetric_heap(self, tensor) -> bool:
        return _context(self._shmem).is_symmetric(tensor)

    def is_symmetric(self, tensor) -> bool:
        return _context(self._shmem).is_symmetric(tensor)

    def get_heap_bases(self) -> torch.Tensor:
        return _context(self._shmem).heap_bases.bases

    def refresh_peer_access(self) -> None:
        """Nothing to do: iris-fw maps every peer's whole heap when the context is created."""

    def as_symmetric(self, external_tensor: torch.Tensor) -> torch.Tensor:
        """A copy on the heap (as Iris's torch allocator makes; see ``Iris.as_symmetric``)."""
        return self._shmem.as_symmetric(external_tensor)

    def close(self) -> None:
        """Nothing to do here: the heap goes with the host object's context (see
        ``iris.Iris``: a dropped host object is closed collectively at the next ``iris.iris()``)."""
