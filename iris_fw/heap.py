"""The symmetric heap allocator.

Every rank runs the same deterministic first-fit allocator over its own heap, so the same
sequence of allocations gives the same offsets on every rank — symmetry without any
communication per allocation (each peer's heap is mapped once, at start). Blocks are
aligned to :data:`ALIGN` bytes.

A tensor gives its block back when its storage is freed (the tensor and every view of it
are gone). *When* that happens is up to Python's garbage collector and may differ between
ranks (a reference cycle — Triton's interpreter makes them — lives until the next
collection). So a freed block is only *pending*: the context's next barrier all-gathers the
pending offsets and every rank reclaims exactly the blocks every rank has freed, in the same
order. The free lists therefore stay identical on all ranks whatever the GC does.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from .errors import HeapOutOfMemory

#: Alignment of every block, in bytes (also the minimum block size).
ALIGN = 256

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The heap's and the context's tensor factories: an allocation site names the frame above them.
_ALLOCATORS = frozenset({"tensor", "alloc", "_new", "empty", "zeros", "ones", "full", "arange", "rand", "randn",
                         "empty_like", "zeros_like", "ones_like", "full_like", "as_symmetric"})


@dataclass(frozen=True)
class Block:
    """A live allocation: byte ``offset`` and ``size`` in the heap, ``seq`` (the allocation's
    index on this rank), and ``site`` ("file:line" of the user code that asked for it, after the
    iris_fw function that allocated when it was iris_fw's own)."""

    offset: int
    size: int
    seq: int
    site: str
    what: str


def _caller_site() -> str:
    """``file:line`` of the first frame outside the iris_fw package, preceded by the iris_fw
    function that allocated (``iris_fw/engine/scheduler.py:94 (workspace) for host.py:88``) when
    the allocation was iris_fw's own: a flag named in a timeout then says which op it belongs to."""
    frame, inner = sys._getframe(1), None
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        if inner is None and frame.f_code.co_name not in _ALLOCATORS:
            inner = frame
        frame = frame.f_back
    outer = "<unknown>" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    if inner is None:
        return outer
    rel = os.path.relpath(inner.f_code.co_filename, os.path.dirname(_PACKAGE_DIR))
    return f"{rel}:{inner.f_lineno} ({inner.f_code.co_name}) for {outer}"


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to just past its last one (strides included)."""
    n = t.numel()
    if not n:
        return 0
    if t.is_contiguous():  # (the common case, on a collective's hit path: no generator)
        return n * t.element_size()
    return t.element_size() * (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())))


def _align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class SymmetricHeap:
    """First-fit allocator over ``[start, size)`` of one rank's heap.

    ``wrap(address, nbytes) -> (uint8 tensor, owner)`` makes a tensor over heap memory whose
    ``owner`` lives exactly as long as the tensor's storage (see
    :meth:`iris_fw.transport_base.Transport.wrap`).
    """

    def __init__(self, base: int, size: int, start: int, wrap: Callable, on_alloc: Callable | None = None):
        self.base = base
        self.size = size
        self.start = _align_up(start)
        self._wrap = wrap
        self._on_alloc = on_alloc
        # free list: sorted offsets, with sizes alongside
        self._free_offsets: list[int] = [self.start]
        self._free_sizes: dict[int, int] = {self.start: size - self.start}
        self._live: dict[int, Block] = {}
        self._pending: dict[int, Block] = {}  # freed here, not yet reclaimed
        self._seq = 0
        # the allocations since the last barrier, in order: (offset, size, dtype) — see sequence_digest
        self._sequence = hashlib.blake2b(digest_size=16)
        self.closed = False

    # ---- accounting ------------------------------------------------------------------------
    @property
    def bytes_used(self) -> int:
        """Bytes in blocks whose tensors are alive on this rank."""
        return sum(b.size for b in self._live.values())

    @property
    def bytes_pending(self) -> int:
        """Bytes freed on this rank and waiting to be reclaimed at a barrier."""
        return sum(b.size for b in self._pending.values())

    @property
    def largest_free(self) -> int:
        return max(self._free_sizes.values(), default=0)

    def free_list_digest(self) -> int:
        """A hash of the free list: equal on every rank while the heap is symmetric."""
        return hash(tuple((o, self._free_sizes[o]) for o in self._free_offsets))

    def sequence_digest(self, restart: bool = False) -> bytes:
        """A digest of the allocations this rank made since the last ``restart``, in order —
        offset, size and dtype (the part of ``what`` before the shape): equal on every rank
        while they allocate the same sequence. Unlike the free list, it sees two ranks
        allocating the same sizes in another order, or the same bytes as different dtypes.
        ``restart``: begin a new window after this one (each barrier compares one window)."""
        digest = self._sequence.digest()
        if restart:
            self._sequence = hashlib.blake2b(digest_size=16)
        return digest

    def recent(self, count: int = 3) -> list[Block]:
        """The ``count`` most recent live allocations."""
        return sorted(self._live.values(), key=lambda b: b.seq)[-count:]

    def blocks(self) -> list[Block]:
        """Live blocks in offset order."""
        return [self._live[o] for o in sorted(self._live)]

    def block_at(self, offset: int) -> Block | None:
        """The live block containing byte ``offset``, if any."""
        for block in list(self._live.values()):  # a snapshot: the watchdog thread asks too
            if block.offset <= offset < block.offset + block.size:
                return block
        return None

    # ---- allocation --------------------------------------------------------------------------
    def alloc(self, nbytes: int, what: str = "", site: str | None = None) -> Block:
        """Reserve ``nbytes`` (rounded up to :data:`ALIGN`); raises :class:`HeapOutOfMemory`."""
        size = _align_up(max(int(nbytes), 1))
        for i, offset in enumerate(self._free_offsets):
            free = self._free_sizes[offset]
            if free >= size:
                break
        else:
            raise HeapOutOfMemory(
                f"symmetric heap out of memory: requested {nbytes} bytes ({size} aligned) for "
                f"{what or 'a tensor'}; heap size {self.size} bytes, {self.bytes_used} in use "
                f"(+{self.start} header), {self.bytes_pending} freed but not yet reclaimed (a "
                f"barrier reclaims them), largest free block {self.largest_free} bytes"
            )
        del self._free_offsets[i]
        del self._free_sizes[offset]
        if free > size:
            bisect.insort(self._free_offsets, offset + size)
            self._free_sizes[offset + size] = free - size
        block = Block(offset, size, self._seq, site or _caller_site(), what)
        self._seq += 1
        self._live[offset] = block
        if self._on_alloc is not None:
            try:
                self._on_alloc(block)
            except BaseException:
                del self._live[offset]
                self._insert_free(block.offset, block.size)
                raise
        self._sequence.update(f"{block.offset},{block.size},{what.split('[')[0]};".encode())
        return block

    def free(self, offset: int) -> None:
        """Mark the block at ``offset`` freed on this rank; :meth:`reclaim` makes it reusable."""
        if self.closed:
            return
        self._pending[offset] = self._live.pop(offset)

    def pending_offsets(self) -> list[int]:
        """Offsets freed on this rank and not yet reclaimed, sorted."""
        return sorted(self._pending)

    def reclaim(self, offsets) -> None:
        """Return the pending blocks at ``offsets`` (those freed on every rank) to the free
        list, coalescing with free neighbours. Every rank calls it with the same offsets."""
        for offset in sorted(offsets):
            block = self._pending.pop(offset)
            self._insert_free(block.offset, block.size)

    def reclaim_freed_everywhere(self, per_rank_pending) -> None:
        """:meth:`reclaim` the blocks that every rank has freed, given each rank's
        :meth:`pending_offsets` (as gathered at a collective point)."""
        self.reclaim(set.intersection(*(set(pending) for pending in per_rank_pending)))

    def _insert_free(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self._free_offsets, start)
        # merge with the following free block
        if i < len(self._free_offsets) and self._free_offsets[i] == start + size:
            nxt = self._free_offsets.pop(i)
            size += self._free_sizes.pop(nxt)
        # merge with the preceding free block
        if i > 0 and self._free_offsets[i - 1] + self._free_sizes[self._free_offsets[i - 1]] == start:
            self._free_sizes[self._free_offsets[i - 1]] += size
        else:
            self._free_offsets.insert(i, start)
            self._free_sizes[start] = size

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new contiguous tensor ``shape``/``dtype`` on the heap; its block is freed when the
        tensor's storage is."""
        numel = 1
        for d in shape:
            numel *= d
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * elem
        block = self.alloc(nbytes, what=f"{str(dtype).replace('torch.', '')}{list(shape)}", site=_caller_site())
        raw, owner = self._wrap(self.base + block.offset, block.size)
        finalizer = weakref.finalize(owner, self.free, block.offset)
        finalizer.atexit = False
        del owner
        return raw[:nbytes].view(dtype).view(shape)

    def offset_of(self, t: torch.Tensor) -> int | None:
        """Byte offset of ``t``'s first element in this heap, or ``None`` unless every element
        of ``t`` lies in the heap's allocatable part. (A tensor without elements reports
        ``data_ptr() == 0``; its place is that of its storage.)"""
        if t.numel():
            offset = t.data_ptr() - self.base
        else:
            offset = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size() - self.base
        if self.start <= offset and offset + span_bytes(t) <= self.size:
            return offset
        return None
