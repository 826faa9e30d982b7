"""Iris's ``iris.host.memory``: the symmetric heap object (``shmem.heap``,
:class:`~iris_fw.compat.iris.host.memory.symmetric_heap.SymmetricHeap`) over iris-fw's heap."""

from .symmetric_heap import Allocator, SymmetricHeap

__all__ = ["Allocator", "SymmetricHeap"]
