"""The base class of bootstraps (the plugins of ``bootstraps/``, installed as
``iris_fw.bootstraps``): how ranks find each other and move bytes at set-up time.

A bootstrap moves small Python objects between ranks (all-gather, broadcast, barrier) and
nothing more; kernels never use it. Its contract is :class:`Bootstrap`: the class attributes
``name`` and ``priority``, the constructor ``cls(arrival_timeout=None)``, the collectives, and
the liveness interface a rank's watchdog uses (:meth:`Bootstrap.attach_liveness`,
:meth:`Bootstrap.known_processes`).

:func:`choose` picks one from the environment (the built-ins: MPI/PMI variables → ``mpi``; an
initialized torch.distributed or torchrun variables → ``torch``; neither → ``single``) unless
the user names one (``init(bootstrap=…)`` or ``IRIS_FW_BOOTSTRAP``).

**Bounded.** The built-ins never wait for a rank that is gone: their collectives are issued
non-blocking and polled, and while they wait they ask the rank's watchdog
(:mod:`iris_fw.watchdog`, attached with :meth:`Bootstrap.attach_liveness`) whether a peer was
lost, and the rendezvous store whether a peer aborted (``torch``), raising
:class:`~iris_fw.PeerFailure` naming the rank. A rank that does not arrive at ``iris_fw.init``
within the liveness bound is named by the others (``torch``: through the store; ``mpi``:
``MPI_Init`` itself waits for every rank). ``abort(reason)`` makes the others stop waiting for
this rank (MPI: ``Abort``; torch: the reason goes into the store, then the group is torn down).
"""

from __future__ import annotations

import os
import socket
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping

from .errors import ArgumentError, IrisError, PeerFailure, WaitTimeout

#: Seconds a bootstrap collective may block before it fails (torch's default is 30 min).
DEFAULT_TIMEOUT_S = 300.0


class Bootstrap(ABC):
    """Base class of every bootstrap: the contract :func:`iris_fw.init` and the watchdog rely on.

    * Class attributes: ``name`` (the registry name) and ``priority`` (lower is asked first by
      :func:`choose`); class methods :meth:`available`, :meth:`detect`, :meth:`detected_because`.
    * The constructor: ``cls(arrival_timeout=None)`` (keyword). ``arrival_timeout``: seconds the
      ranks wait for each other at set-up before naming those that did not arrive (None: the
      bootstrap's own bound). After construction: ``rank``, ``world_size``, ``local_rank``,
      ``local_world_size``.
    * The collectives :meth:`all_gather`, :meth:`broadcast`, :meth:`barrier`, and :meth:`abort`,
      :meth:`close`.
    * The liveness interface: :meth:`attach_liveness` (the rank's watchdog attaches itself;
      waiting collectives then poll it, see :meth:`_poll`) and :meth:`known_processes` (every
      rank's process description when the bootstrap learnt it at arrival).
    """

    name: ClassVar[str]
    #: Lower is asked first by :func:`choose`.
    priority: ClassVar[int] = 100

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    #: The rank's watchdog once attached (:meth:`attach_liveness`): collectives that wait poll it,
    #: so a lost peer ends the wait.
    liveness = None
    #: Every rank's :func:`iris_fw.watchdog.process_info`, when the bootstrap learnt it at
    #: arrival (see :meth:`known_processes`).
    processes = None
    #: Seconds the collective now waiting may take before it raises :class:`~iris_fw.WaitTimeout`
    #: (set by the context around its host exchanges, see :mod:`iris_fw.call_identity`; None: unbounded
    #: but for lost peers).
    deadline_s: float | None = None
    #: Called with the collective's name between polls (set with ``deadline_s``): raises to end
    #: the wait (a peer that is in another call, or failed).
    interrupt: Callable[[str], None] | None = None

    @abstractmethod
    def __init__(self, *, arrival_timeout: float | None = None) -> None:
        """Join the job: set ``rank``, ``world_size``, ``local_rank``, ``local_world_size``,
        waiting at most ``arrival_timeout`` seconds (None: the bootstrap's own bound) for the
        other ranks to arrive."""

    # ---- the liveness interface ---------------------------------------------------------------
    def attach_liveness(self, liveness) -> None:
        """Called once by the rank's watchdog (:class:`iris_fw.watchdog.Watchdog`): from now on
        waiting collectives ask ``liveness.check(what)`` between polls and
        ``liveness.confirm(seconds)`` after a failure, so a lost peer ends the wait with a
        :class:`~iris_fw.PeerFailure` naming it."""
        self.liveness = liveness

    def known_processes(self) -> list | None:
        """Every rank's :func:`iris_fw.watchdog.process_info` (indexed by rank) when this
        bootstrap learnt it at arrival, else None (the watchdog all-gathers it)."""
        return self.processes

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """``(True, "")`` when this bootstrap can be constructed here, else ``(False, why)``."""
        return True, ""

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether the environment says the program was launched for this bootstrap."""
        return False

    @classmethod
    def detected_because(cls, environ: Mapping[str, str]) -> str:
        """Why :meth:`detect` recognized ``environ`` (for ``iris-fw info`` and the log)."""
        return f"its detect() recognized the environment (priority {cls.priority})"

    @abstractmethod
    def all_gather(self, obj: Any) -> list:
        """Every rank's ``obj`` (picklable), indexed by rank."""

    @abstractmethod
    def broadcast(self, obj: Any, src: int) -> Any:
        """``src``'s ``obj`` on every rank."""

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    def close(self) -> None:
        """Release what this bootstrap created (never what it only reused)."""

    def _set_local_ranks(self) -> None:
        """Derive ``local_rank`` / ``local_world_size`` from the host names of all ranks."""
        hosts = self.all_gather(socket.gethostname())
        mine = hosts[self.rank]
        same = [r for r, h in enumerate(hosts) if h == mine]
        self.local_rank = same.index(self.rank)
        self.local_world_size = len(same)

    def abort(self, reason: str) -> None:
        """Best-effort: make the other ranks stop instead of waiting for this one."""

    def _poll(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()``, asking the watchdog (and :meth:`_check_peers`) between polls,
        with pauses growing from 20 us to 2 ms."""
        pause, checked = 0.0, time.monotonic()
        start, bound, interrupt = checked, self.deadline_s, self.interrupt
        while not done():
            now = time.monotonic()
            if now - checked >= 0.05:
                checked = now
                if self.liveness is not None:
                    self.liveness.check(f"the bootstrap's {what}")
                self._check_peers(what)
                if interrupt is not None:
                    interrupt(what)
                if bound is not None and now - start > bound:
                    raise WaitTimeout(f"rank {self.rank}: the bootstrap's {what} did not complete within {bound:g} s")
            time.sleep(pause)
            pause = min(max(2 * pause, 20e-6), 2e-3)

    def _check_peers(self, what: str) -> None:
        """Raise :class:`PeerFailure` if a peer announced it aborted (``torch``: the store)."""

    def _failed(self, what: str, exc: BaseException) -> IrisError:
        """The error for a collective that failed under us: a lost peer (the watchdog looks
        again for a second) or an abort a peer announced, else ``exc`` wrapped."""
        try:
            self._check_peers(what)
            if self.liveness is not None:
                self.liveness.confirm(1.0)
            self._check_peers(what)
        except PeerFailure as lost:
            return lost
        return IrisError(f"bootstrap {self.name!r}: {what} failed on rank {self.rank}: {exc}")


def check_src(src: Any, world_size: int) -> None:
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < world_size:
        raise ArgumentError(f"src must be a rank in [0, {world_size}), got {src!r}")



def choose(registry, requested: str | None = None, environ: Mapping[str, str] | None = None) -> type[Bootstrap]:
    """The bootstrap class to use: ``requested`` (or ``IRIS_FW_BOOTSTRAP``) when given, else
    the first available one, by priority, whose ``detect`` recognizes the environment."""
    return choice(registry, requested, environ)[0]


def choice(registry, requested: str | None = None,
           environ: Mapping[str, str] | None = None) -> tuple[type[Bootstrap], str]:
    """:func:`choose`'s bootstrap class and why it was chosen (which variables it recognized,
    and which detected bootstraps were passed over as unavailable)."""
    from . import env

    environ = os.environ if environ is None else environ
    if requested not in (None, "", "auto"):
        return registry.require_available(requested), f"init(bootstrap={requested!r})"
    forced = env.get("IRIS_FW_BOOTSTRAP", environ) or "auto"
    if forced != "auto":
        return registry.require_available(forced), f"IRIS_FW_BOOTSTRAP={forced}"
    entries = sorted(registry, key=lambda e: (e.obj.priority, e.name))  # Bootstrap subclasses (hookspecs)
    passed = []
    for entry in entries:
        if not entry.obj.detect(environ):
            continue
        ok, why = entry.availability()
        if ok:
            return entry.obj, entry.obj.detected_because(environ) + "".join(f"; {p}" for p in passed)
        passed.append(f"{entry.name} was detected but is unavailable: {why}")
    raise IrisError("no bootstrap recognizes this environment (is 'single' registered?)" + "".join(f"; {p}" for p in passed))
