"""Exceptions raised by iris-fw. All derive from :class:`IrisError`."""

from __future__ import annotations


class IrisError(RuntimeError):
    """Base class of iris-fw's errors."""


class WaitTimeout(IrisError):
    """A device-side wait gave up after its bound; the message says who waited for what."""


class HeapOutOfMemory(IrisError, MemoryError):
    """The symmetric heap has no free block large enough for a request."""


class SymmetryError(IrisError):
    """Ranks allocated different sequences on their symmetric heaps."""


class NotOnHeapError(IrisError, ValueError):
    """A tensor that must live on the symmetric heap does not."""
