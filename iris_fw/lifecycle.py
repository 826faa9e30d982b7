"""What outlives one context or ends with the process: the process's live contexts and
calibrations (:class:`ProcessState`, :func:`process`), a context's clean-up when it was never
closed (:func:`release_unclosed`, :class:`AtExit`), and the report of an exception that reaches
the top of the process (:func:`watch_uncaught`: one report naming an iris-fw error that Triton's
interpreter wrapped once per nested jit call).

**Process state.** One object, :class:`ProcessState` (:func:`process`, made on first use —
nothing at import), holds what iris-fw keeps per process rather than per context: the live
contexts in creation order, which back :func:`iris_fw.context.current` (every API's
``ctx=None``) — a registry of the process's contexts is the one place that can answer "which
context?" for a call that names none, and it holds them weakly, so it keeps none alive; the
wait calibration's polls per second per (transport, device), a property of the machine that a
second context reuses instead of measuring again; and whether an exception reached the top of
the process.

Below the context in the layers: it uses a context only through its attributes (``watchdog``,
``calls``, ``transport``, ``bootstrap``, ``closed``)."""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

from . import device as dev
from . import watchdog as _watchdog
from .errors import IrisError, PeerFailure

#: An :class:`iris_fw.Context` (this module sits below it and does not import it).
ContextLike = Any

__all__ = ["AtExit", "ProcessState", "process", "release_unclosed", "watch_uncaught"]


def release_unclosed(watchdog, bootstrap) -> None:
    """What a context that was never closed leaves behind: its watchdog thread, its bootstrap."""
    watchdog.stop()
    bootstrap.close()


class AtExit:
    """At interpreter exit, a context that was not closed tells its peers (its heartbeat says it
    left) and stops its watchdog; a job left broken by a lost peer is aborted through the
    bootstrap (MPI would otherwise wait for the lost rank in ``MPI_Finalize``). Holds the
    context weakly."""

    def __init__(self, ctx: "ContextLike"):
        self._ctx = weakref.ref(ctx)

    def __call__(self) -> None:
        ctx = self._ctx()
        if ctx is None or ctx.closed:
            return
        lost = ctx.watchdog.lost
        ended = [r for r in lost if self._ended(ctx, r)]
        if process().uncaught:  # peers that end after this rank learn that it failed (its call board)
            try:
                ctx.calls.fail(PeerFailure(f"rank {ctx.rank} ended with an uncaught exception", ctx.rank))
            except Exception:
                pass
        ctx.watchdog.stop(heartbeat=_watchdog.HEARTBEAT_EXITED)
        if lost and (set(ended) != set(lost) or process().uncaught):
            # a peer died, or this rank ends with an uncaught exception: the job failed
            ctx.bootstrap.abort(f"rank {ctx.rank} exits after losing rank(s) {sorted(lost)}")
        # else every lost peer ended its program normally, as this rank does: a correct program whose
        # ranks finish at different times, without closing their contexts (no `with` block) — quiet

    @staticmethod
    def _ended(ctx, rank: int) -> bool:
        """Whether ``rank`` left the interpreter normally (its heartbeat says so, its call board
        shows no failure) rather than died or ended with an uncaught exception."""
        try:
            beat = ctx.transport.header_words(rank, dev.HDR_HEARTBEAT.value, 1)[0]
            return beat == _watchdog.HEARTBEAT_EXITED and not ctx.calls.board(rank)[1]
        except Exception:
            return False


def _wrapped_iris_error(exc: BaseException | None) -> BaseException | None:
    """The iris-fw error inside Triton interpreter wrappers (``InterpreterError(repr(e)) from e``,
    once per nested jit call: how an error raised while an interpreted kernel runs — a
    :class:`PeerFailure` from the watchdog's SIGTERM handler — reaches the top), or None."""
    seen = 0
    while exc is not None and type(exc).__name__ == "InterpreterError" and seen < 64:
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return exc if seen and isinstance(exc, IrisError) else None


def _trim_at_interpreter(tb):
    """``tb`` cut before its first frame inside Triton (the user's frames down to the launch)."""
    first, last = tb, None
    while tb is not None and f"{os.sep}triton{os.sep}" not in tb.tb_frame.f_code.co_filename:
        last, tb = tb, tb.tb_next
    if last is None:
        return first
    last.tb_next = None
    return first


def watch_uncaught() -> None:
    """Chain a :data:`sys.excepthook` that notes an uncaught exception (an ending rank then tells
    its peers the job failed), once per process."""
    import sys

    previous = sys.excepthook
    if getattr(previous, "_iris_fw", False):
        return

    def hook(cls, exc, tb):
        process().uncaught = True
        inner = _wrapped_iris_error(exc)
        if inner is not None:  # one report naming the cause, not the interpreter's nested reprs
            cls, exc, tb = type(inner), inner, _trim_at_interpreter(tb)
            exc.__cause__ = exc.__context__ = None
            exc.__suppress_context__ = True
        previous(cls, exc, tb)

    hook._iris_fw = True
    sys.excepthook = hook


class ProcessState:
    """What iris-fw keeps per process rather than per context (the module docstring says why):
    one instance, :func:`process`, made by the first call that needs it."""

    def __init__(self) -> None:
        #: this process's contexts in creation order (weak references; the last open one is
        #: :func:`iris_fw.context.current`); added by :class:`iris_fw.Context`, pruned of closed
        #: and collected ones
        self.contexts: "list[weakref.ref[ContextLike]]" = []
        #: polls per second of a device-side wait, per (transport name, device): measured by the
        #: first context on them, reused by later ones (``Context._calibrate_wait``)
        self.poll_rates: "dict[tuple[str, str], float]" = {}
        #: whether an exception reached the top of this process (the :data:`sys.excepthook`
        #: that :func:`watch_uncaught` chains with the first context sets it)
        self.uncaught = False

    def current(self, required: bool = True) -> "ContextLike | None":
        """The most recently created (or made current) open context; with none, an
        :class:`IrisError` (``required``) or ``None``."""
        contexts = self.contexts
        if contexts:
            last = contexts[-1]()
            if last is not None and not last.closed:
                return last  # the common case, on every collective call without ctx=
        self.prune()
        if not self.contexts:
            if required:
                raise IrisError("no open iris_fw context in this process: call iris_fw.init() first or pass ctx=")
            return None
        return self.contexts[-1]()

    def prune(self, drop: "ContextLike | None" = None) -> None:
        """Forget contexts closed or collected (and ``drop``), so that creating and dropping
        contexts in a loop accumulates nothing."""
        self.contexts[:] = [ref for ref in self.contexts
                            if ref() is not None and ref() is not drop and not ref().closed]

    def make_current(self, ctx: "ContextLike") -> None:
        """``ctx`` becomes :func:`iris_fw.context.current`, as if it had been created last."""
        self.prune(drop=ctx)
        self.contexts.append(weakref.ref(ctx))


@functools.cache
def process() -> ProcessState:
    """This process's :class:`ProcessState` (made on the first call)."""
    return ProcessState()
