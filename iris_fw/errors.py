"""Exceptions raised by iris-fw. All derive from :class:`IrisError`."""

from __future__ import annotations


class IrisError(RuntimeError):
    """Base class of iris-fw's errors."""


class WaitTimeout(IrisError, TimeoutError):
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
# ---- bad input -------------------------------------------------------------------------------
# Every error iris-fw raises for bad input is one of these (or a subclass): an IrisError that is
# also the builtin a Python user expects, so ``except ValueError`` and ``except iris_fw.IrisError``
# both catch it. Messages name the argument, what was expected and what was given.


class ArgumentError(IrisError, ValueError):
    """An argument has a value iris-fw cannot use (out of range, wrong shape, wrong device, …)."""


class ArgumentTypeError(IrisError, TypeError):
    """An argument has the wrong type."""


class EnvironmentVariableError(ArgumentError):
    """An ``IRIS_FW_*`` environment variable has a value iris-fw does not accept, or contradicts
    another setting (see :mod:`iris_fw.env`)."""


class HeapTooLarge(IrisError, MemoryError):
    """The symmetric heap asked of :func:`iris_fw.init` does not fit the memory this host has for
    it (``/dev/shm`` for ``host_shm``, free GPU memory for ``gpu_ipc``)."""


class CollectiveMismatch(IrisError, ValueError):
    """Ranks called one collective operation with different arguments (the message names the
    ranks and the argument that differ). Raised on every rank."""


class CallMismatch(CollectiveMismatch):
    """Ranks are in different calls: one called another collective, skipped one, or repeated a
    call it had validated before while another rank's arguments changed (the message names the
    call each rank is in). Raised on every rank that takes part."""


class ContextClosed(IrisError):
    """A closed context (or one of its groups or ops) was used."""


def bad_value(name: str, expected: str, got) -> ArgumentError:
    """``ArgumentError("<name> must be <expected>, got <got>")``."""
    return ArgumentError(f"{name} must be {expected}, got {got!r}")


def bad_type(name: str, expected: str, got) -> ArgumentTypeError:
    """``ArgumentTypeError("<name> must be <expected>, got <type> <value>")``."""
    return ArgumentTypeError(f"{name} must be {expected}, got {type(got).__name__} {_short(got)}")


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class IrisWarning(UserWarning):
    """Something works but not as the user likely expects (e.g. ranks time-slicing on a shared
    GPU without MPS); said once, on rank 0."""
