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


class PeerFailure(IrisError):
    """Another rank failed: it died, exited without closing its context, stopped responding,
    never arrived, or raised inside a call this rank takes part in. ``rank`` names it (or is
    ``None`` when the failing rank is not known)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank
