"""The context: one rank's view of the job, and :func:`init`, which creates it.

:class:`Context` is assembled from its parts, each in its own module and none importing the
others: the core (:class:`iris_fw.core.ContextCore`: the heap, the peers, ``barrier``, ``agree``,
the bounded waits), the tensor factories (:class:`iris_fw.factories.HeapFactories`) and the trace
sessions (:class:`iris_fw.trace_session.TraceSessions`). What higher layers keep per context (the
call path's caches, the GEMM's split-K counters) hangs off ``ctx.extensions`` without the context
importing them. :func:`resolve` and :func:`current` find the context a call without ``ctx=`` uses
(the process's live contexts are :mod:`iris_fw.lifecycle`'s).
"""

from __future__ import annotations

import logging
from typing import Any

from . import bootstrap_base as _bootstrap
from . import env
from .interpreter import interpreting
from . import watchdog as _watchdog
from .core import ContextCore, check_int, check_seconds, header_bytes
from .errors import ArgumentError, PeerFailure, bad_type
from .factories import HeapFactories
from .heap import ALIGN
from .lifecycle import process
from .registry import Registries, load_registries
from .trace_session import TraceSessions, end_env_trace, start_env_trace

#: The ``iris_fw`` logger: at INFO, :func:`init` says which bootstrap and transport it chose and why.
log = logging.getLogger("iris_fw")

DEFAULT_HEAP_SIZE = 1 << 30


def transport_choice(registry, requested: str | None = None) -> tuple[str, str]:
    """The name of the transport :func:`init` uses, and why: ``requested`` if given (not
    ``"auto"``), else ``IRIS_FW_TRANSPORT``, else ``host_shm`` under the interpreter, ``gpu_ipc``
    when GPUs are present, otherwise ``host_shm``."""
    if requested not in (None, "", "auto"):
        return requested, f"init(transport={requested!r})"
    forced = env.get("IRIS_FW_TRANSPORT") or "auto"
    if forced != "auto":
        return forced, f"IRIS_FW_TRANSPORT={forced}"
    if interpreting():
        return "host_shm", "Triton's interpreter is on (TRITON_INTERPRET=1): CPU ranks share /dev/shm heaps"
    if "gpu_ipc" not in registry:
        return "host_shm", "no gpu_ipc transport is registered"
    ok, why = registry.entry("gpu_ipc").availability()
    return ("gpu_ipc", "GPUs are present and the interpreter is off") if ok else ("host_shm", f"gpu_ipc: {why}")


def choose_transport(registry, requested: str | None = None):
    """The transport class :func:`transport_choice` names (raises if it is not available here)."""
    return registry.require_available(transport_choice(registry, requested)[0])



def check_resources(transport_cls, boot, heap_size: int) -> None:
    """Collective: every rank asks ``transport_cls.check_resources`` whether its host has room for
    its heap; if any rank has not, every rank raises (that rank's error, naming it)."""
    mine = transport_cls.check_resources(boot, heap_size)
    problems = boot.all_gather(mine)
    for rank, problem in enumerate(problems):
        if problem is not None:
            error = mine if mine is not None else type(problem)(f"rank {rank}: {problem}")
            error.everywhere = True  # every rank raises: none needs to abort the others
            raise error



def init(
    heap_size: int = DEFAULT_HEAP_SIZE,
    transport: str | None = None,
    bootstrap: str | None = None,
    *,
    wait_timeout: float | None = None,
    debug: bool | None = None,
    registries: Registries | None = None,
    liveness_timeout: float | None = None,
) -> "Context":
    """Create this rank's context. Collective: every rank calls it with the same arguments.

    :param heap_size: bytes of symmetric heap per rank.
    :param transport: a transport name (``"gpu_ipc"``, ``"host_shm"``, a plugin's), or
        ``None``/``"auto"``: ``IRIS_FW_TRANSPORT``, else GPUs present → ``gpu_ipc``, otherwise
        ``host_shm``.
    :param bootstrap: a bootstrap name (``"mpi"``, ``"torch"``, ``"single"``, a plugin's), or
        ``None``/``"auto"``: ``IRIS_FW_BOOTSTRAP``, else chosen from the environment.
    :param wait_timeout: seconds a device-side wait polls before it gives up and the host
        raises :class:`WaitTimeout` (default ``IRIS_FW_WAIT_TIMEOUT`` or 30).
    :param debug: check every allocation's offset across ranks, and compile the device
        primitives' pointer checks into this context's kernels on GPUs (they are always on under
        the interpreter); default ``IRIS_FW_DEBUG``. See :class:`iris_fw.device.DeviceHeaps`.
    :param registries: use these registries instead of loading the installed plugins.
    :param liveness_timeout: seconds after which a rank that stopped, hangs without a heartbeat
        or never arrived is reported lost by the others (default ``IRIS_FW_LIVENESS_TIMEOUT`` or
        10; a rank that dies or exits is noticed at once). See :mod:`iris_fw.watchdog`.

    A set-up failure on one rank calls the bootstrap's ``abort`` (MPI: ``Abort``; torch: the
    reason is published in the rendezvous store and the group torn down), so the other ranks
    fail within seconds instead of waiting in a collective.
    """
    heap_size = check_int(heap_size, "heap_size", 1)
    env.in_effect()  # every IRIS_FW_* variable set parses (a bad one is named here, not deep in set-up)
    if wait_timeout is None:
        wait_timeout = env.get("IRIS_FW_WAIT_TIMEOUT")
    wait_timeout = check_seconds(wait_timeout, "wait_timeout")
    if debug is None:
        debug = env.get("IRIS_FW_DEBUG")
    elif not isinstance(debug, bool):
        raise bad_type("debug", "a bool or None", debug)
    for name, value in (("transport", transport), ("bootstrap", bootstrap)):
        if value is not None and not isinstance(value, str):
            raise bad_type(name, "a plugin name (str) or None", value)
    liveness = _watchdog.liveness_timeout(None if liveness_timeout is None else
                                          check_seconds(liveness_timeout, "liveness_timeout"))
    regs = registries if registries is not None else load_registries()
    transport_name, transport_why = transport_choice(regs.transport, transport)
    transport_cls = regs.transport.require_available(transport_name)
    boot_cls, boot_why = _bootstrap.choice(regs.bootstrap, bootstrap)
    # the Bootstrap contract's constructor (iris_fw.bootstrap_base.Bootstrap)
    boot = boot_cls(arrival_timeout=_watchdog.arrival_timeout(liveness))
    log.info("rank %d of %d: bootstrap %s (%s); transport %s (%s)", boot.rank, boot.world_size, boot_cls.name,
             boot_why, transport_name, transport_why)
    try:
        watchdog = _watchdog.Watchdog(boot, liveness)
    except BaseException:
        boot.close()
        raise
    try:
        need = header_bytes(boot.world_size) + ALIGN
        if heap_size < need:
            raise ArgumentError(
                f"heap_size={heap_size} is too small: {boot.world_size} ranks need at least {need} "
                f"bytes ({need - ALIGN} of header plus one {ALIGN}-byte block)"
            )
        check_resources(transport_cls, boot, heap_size)
        tr = transport_cls(boot, heap_size)
    except BaseException as exc:
        _abort_setup(boot, watchdog, exc)
        raise
    try:
        return Context(tr, boot, heap_size, wait_timeout=wait_timeout, debug=debug, registries=regs,
                       watchdog=watchdog)
    except BaseException as exc:
        _abort_setup(boot, watchdog, exc)
        raise


def _abort_setup(boot, watchdog, exc: BaseException) -> None:
    """A set-up failure on this rank: unless every rank failed the same way (a collective
    failure) or a peer is already lost, make the others stop waiting for this rank (the
    bootstrap's abort), then release the bootstrap."""
    watchdog.stop()
    if not getattr(exc, "everywhere", False) and not isinstance(exc, PeerFailure) and not watchdog.lost:
        try:
            boot.abort(f"rank {boot.rank} failed during iris_fw.init: {type(exc).__name__}: {exc}")
        except Exception:
            pass
    try:
        boot.close()
    except Exception:
        pass



def resolve(ctx: Any) -> "Context":
    """``ctx`` when it is a :class:`Context`, the :func:`current` one for ``None``; anything else
    is an :class:`~iris_fw.errors.ArgumentTypeError` naming ``ctx`` (what every ``ctx=`` takes)."""
    if ctx is None:
        return current()
    if not isinstance(ctx, Context):
        raise bad_type("ctx", "an iris_fw.Context (from iris_fw.init) or None", ctx)
    return ctx


def current() -> "Context":
    """The most recently created context of this process that is still open."""
    return process().current()


def open_contexts() -> "list[Context]":
    """This process's open contexts, oldest first (the last is :func:`current`)."""
    state = process()
    state.prune()
    return [ref() for ref in state.contexts]


class Context(ContextCore, HeapFactories, TraceSessions):
    """One rank's handle on the job. Use :func:`init` to create it; it is also a context
    manager, and :meth:`close` is idempotent.

    Attributes: ``rank``, ``world_size``, ``local_rank``, ``device``, ``heap_bases`` (the
    argument every device primitive takes, a :class:`iris_fw.device.DeviceHeaps`: ``.bases``,
    int64 ``[world_size]`` on ``device``, every rank's heap base as mapped in this process,
    with this context's compile-time switches: pointer checks (``debug`` or the interpreter)
    and the transport's NVSHMEM call mode), ``heap_size``, ``transport``, ``bootstrap``,
    ``registries`` (the plugins this context was created with), ``extensions``.

    Its methods come from its parts: the heap, peers, barriers, ``agree`` and waits from
    :class:`~iris_fw.core.ContextCore`; ``empty``/``zeros``/… and ``as_symmetric`` from
    :class:`~iris_fw.factories.HeapFactories`; ``trace`` from
    :class:`~iris_fw.trace_session.TraceSessions`. ``IRIS_FW_TRACE=path`` traces the context's
    whole life (a session opened here, closed by :meth:`close`).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        start_env_trace(self)

    def close(self) -> None:
        """Free the heap and unmap peers. Collective; calling it again does nothing."""
        if not self.closed:
            end_env_trace(self)
        super().close()
