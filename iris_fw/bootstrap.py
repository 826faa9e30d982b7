"""Bootstraps: how ranks find each other and move bytes at set-up time.

A bootstrap moves small Python objects between ranks (all-gather, broadcast, barrier) and
nothing more; kernels never use it. Built-ins:

* ``mpi``    – mpi4py, for programs run under ``mpirun -n N python …``.
* ``torch``  – torch.distributed, for programs run under ``torchrun``; reuses an initialized
  default process group or creates one.
* ``single`` – one rank, no communication.

:func:`choose` picks one from the environment (MPI/PMI variables → ``mpi``; an initialized
torch.distributed or torchrun variables → ``torch``; neither → ``single``) unless the user
names one (``init(bootstrap=…)`` or ``IRIS_FW_BOOTSTRAP``).

**Bounded.** The built-ins never wait for a rank that is gone: their collectives are issued
non-blocking and polled, and while they wait they ask the rank's watchdog
(:mod:`iris_fw.watchdog`, set as ``liveness``) whether a peer was lost, and the rendezvous
store whether a peer aborted (``torch``), raising :class:`~iris_fw.PeerFailure` naming the rank.
A rank that does not arrive at ``iris_fw.init`` within the liveness bound is named by the
others (``torch``: through the store; ``mpi``: ``MPI_Init`` itself waits for every rank).
``abort(reason)`` makes the others stop waiting for this rank (MPI: ``Abort``; torch: the
reason goes into the store, then the group is torn down).
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import time
import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping

from .errors import ArgumentError, IrisError, PeerFailure, WaitTimeout
from .hookspecs import hookimpl

#: Seconds a bootstrap collective may block before it fails (torch's default is 30 min).
DEFAULT_TIMEOUT_S = 300.0

_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "PMI_RANK")
_TORCHRUN_VARS = ("TORCHELASTIC_RUN_ID",)
_TORCH_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Bootstrap(ABC):
    """Base class. Subclasses set ``name`` and ``priority`` and implement the collectives.

    After construction: ``rank``, ``world_size``, ``local_rank``, ``local_world_size``.
    """

    name: ClassVar[str]
    #: Lower is asked first by :func:`choose`.
    priority: ClassVar[int] = 100

    rank: int
    world_size: int
    #: The rank's watchdog (:class:`iris_fw.watchdog.Watchdog`), set by it: collectives that
    #: wait poll it, so a lost peer ends the wait.
    liveness = None
    #: Every rank's :func:`iris_fw.watchdog.process_info`, when the bootstrap learnt it at
    #: arrival (else the watchdog all-gathers it).
    processes = None
    #: Seconds the collective now waiting may take before it raises :class:`~iris_fw.WaitTimeout`
    #: (set by the context around its host exchanges, see :mod:`iris_fw.calls`; None: unbounded
    #: but for lost peers).
    deadline_s: float | None = None
    #: Called with the collective's name between polls (set with ``deadline_s``): raises to end
    #: the wait (a peer that is in another call, or failed).
    interrupt: Callable[[str], None] | None = None

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


class SingleBootstrap(Bootstrap):
    """One rank: the program was not launched for several."""

    name = "single"
    priority = 1000

    def __init__(self):
        self.rank, self.world_size = 0, 1
        self.local_rank, self.local_world_size = 0, 1

    @classmethod
    def detect(cls, environ):
        return True

    @classmethod
    def detected_because(cls, environ):
        return "no MPI or torchrun variables in the environment: one rank"

    def all_gather(self, obj):
        return [obj]

    def broadcast(self, obj, src):
        _check_src(src, 1)
        return obj

    def barrier(self):
        pass


class TorchBootstrap(Bootstrap):
    """torch.distributed. Reuses the default process group if one is initialized, else
    creates one from the environment (``env://``: torchrun's variables). Collectives run on
    a gloo group: the default group itself when its backend is gloo, else a gloo subgroup."""

    name = "torch"
    priority = 10
    #: Open torch bootstraps of this process: the one that created the default process group
    #: hands that duty (destroying it) to another open one when it closes first (contexts made
    #: and dropped in any order share the group).
    _open: "weakref.WeakSet[TorchBootstrap]" = weakref.WeakSet()

    @classmethod
    def available(cls):
        try:
            import torch.distributed as dist
        except ImportError as exc:  # pragma: no cover - torch always has it on Linux
            return False, f"torch.distributed cannot be imported: {exc}"
        if not dist.is_available():
            return False, "this torch build has no torch.distributed"
        return True, ""

    @classmethod
    def detect(cls, environ):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return True
        return any(v in environ for v in _TORCHRUN_VARS) or all(v in environ for v in _TORCH_ENV_VARS)

    @classmethod
    def detected_because(cls, environ):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return "torch.distributed is initialized"
        return "torchrun's variables: " + ", ".join(v for v in (*_TORCHRUN_VARS, *_TORCH_ENV_VARS) if v in environ)

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, arrival_timeout: float | None = None):
        import torch.distributed as dist

        self._dist = dist
        self._owns_default = False
        self._broken = False
        self._abandoned = False
        self._store, self._abort_key = None, None
        timeout = datetime.timedelta(seconds=timeout_s)
        if not dist.is_initialized():
            missing = [v for v in _TORCH_ENV_VARS if v not in os.environ]
            if missing:
                raise IrisError(
                    "bootstrap 'torch' needs an initialized torch.distributed or torchrun's "
                    f"environment; missing: {', '.join(missing)}"
                )
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store = self._arrive(rank, world, arrival_timeout)
            dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world, timeout=timeout)
            self._owns_default = True
        else:
            try:
                self._store = dist.distributed_c10d._get_default_store()
            except Exception:  # a private helper: without it, no abort announcements
                self._store = None
        self._group = None
        if dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        TorchBootstrap._open.add(self)
        if self._store is not None and self._abort_key is None:  # a reused group: count inits as _arrive does
            gen = self._store.add(f"{self._key_prefix()}reused/{self._dist.get_rank()}", 1)
            self._abort_key = f"{self._key_prefix()}reused/{gen}/abort"
        if "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
            self.local_rank = int(os.environ["LOCAL_RANK"])
            self.local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
        else:
            self._set_local_ranks()

    # ---- arrival ----------------------------------------------------------------------------------
    @staticmethod
    def _key_prefix() -> str:
        """Store keys of iris-fw under torchrun's run and restart (the agent's store outlives
        a restart) or the launcher's port."""
        run = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT", "")
        return f"iris_fw/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def _arrive(self, rank: int, world: int, arrival_timeout: float | None):
        """The rendezvous store (the launcher's agent store — torchrun's, ``iris-fw launch``'s
        — else hosted by rank 0, as ``env://`` does), and every rank's arrival in it within
        ``arrival_timeout`` seconds: each rank posts its process description; a rank that does
        not post in time is named. Returns the store for the default group."""
        from .watchdog import arrival_timeout as default_arrival, liveness_timeout, process_info

        bound = arrival_timeout if arrival_timeout is not None else default_arrival(liveness_timeout())
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
        try:
            store = self._dist.TCPStore(addr, port, world_size=None if agent else world,
                                        is_master=(rank == 0 and not agent),
                                        timeout=datetime.timedelta(seconds=bound), wait_for_workers=False,
                                        multi_tenant=True)
        except RuntimeError as exc:
            raise PeerFailure(
                f"rank {rank}: rank 0, which hosts the rendezvous at {addr}:{port}, did not arrive at "
                f"iris_fw.init within {bound:g} s (IRIS_FW_ARRIVAL_TIMEOUT): {exc}", 0) from None
        prefix = self._key_prefix()
        gen = store.add(f"{prefix}gen/{rank}", 1)  # this rank's n-th init: every rank counts alike
        keys = [f"{prefix}{gen}/arrived/{r}" for r in range(world)]
        store.set(keys[rank], pickle.dumps(process_info()))
        deadline = time.monotonic() + bound
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise PeerFailure(
                    f"rank {rank}: rank(s) {missing} of {world} did not arrive at iris_fw.init within {bound:g} s "
                    "(IRIS_FW_ARRIVAL_TIMEOUT; they exited or hang before it, or were started late)", missing[0])
            time.sleep(0.02)
        self.processes = [pickle.loads(store.get(k)) for k in keys]
        store.set_timeout(datetime.timedelta(seconds=DEFAULT_TIMEOUT_S))
        self._store, self._abort_key = store, f"{prefix}{gen}/abort"
        # the group's keys under this init's prefix: a previous group's (a context closed and
        # created again) are never read
        return self._dist.PrefixStore(f"{prefix}{gen}/group", store)

    # ---- collectives ------------------------------------------------------------------------------
    def _run(self, work, what: str) -> None:
        try:
            self._poll(work.is_completed, what)
        except BaseException:  # a lost peer (PeerFailure), KeyboardInterrupt, ...
            self._abandoned = True  # a collective still in flight: the group cannot be torn down
            raise
        try:
            work.wait()
            return
        except RuntimeError as exc:
            cause = exc
        error = self._failed(what, cause)
        raise error from (None if isinstance(error, PeerFailure) else cause)

    def _check_peers(self, what: str) -> None:
        if self._store is not None and self._abort_key is not None:
            try:
                announced = self._store.check([self._abort_key])
            except Exception:  # the store is gone with its host (rank 0): the watchdog will say
                return
            if announced:
                reason = self._store.get(self._abort_key).decode(errors="replace")
                raise PeerFailure(f"rank {self.rank} during the bootstrap's {what}: {reason}")

    def all_gather(self, obj):
        import torch

        data = pickle.dumps(obj)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._run(self._dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64),
                                        group=self._group, async_op=True), "all_gather")
        counts = [int(n) for n in sizes]
        buf = torch.zeros(max(counts), dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty_like(buf) for _ in range(self.world_size)]
        self._run(self._dist.all_gather(out, buf, group=self._group, async_op=True), "all_gather")
        return [pickle.loads(t[:n].numpy().tobytes()) for t, n in zip(out, counts)]

    def broadcast(self, obj, src):
        import torch

        _check_src(src, self.world_size)
        src_global = src if self._group is None else self._dist.get_global_rank(self._group, src)
        data = pickle.dumps(obj) if self.rank == src else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self._run(self._dist.broadcast(size, src=src_global, group=self._group, async_op=True), "broadcast")
        buf = torch.zeros(int(size), dtype=torch.uint8)
        if self.rank == src:
            buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._run(self._dist.broadcast(buf, src=src_global, group=self._group, async_op=True), "broadcast")
        return obj if self.rank == src else pickle.loads(buf.numpy().tobytes())

    def barrier(self):
        self._run(self._dist.barrier(group=self._group, async_op=True), "barrier")

    def abort(self, reason):
        """Announce ``reason`` in the rendezvous store (the others' waits raise it), then tear
        down the groups this bootstrap created."""
        if self._store is not None and self._abort_key is not None:
            try:
                self._store.set(self._abort_key, reason)
            except Exception:
                pass
        print(f"iris_fw: {reason}; aborting", file=sys.stderr, flush=True)
        self._broken = True
        self.close()

    def close(self):
        """Destroy the groups this bootstrap created — or abort them when a peer is lost or
        this rank aborts (destroying a gloo group waits for every peer: a stopped one would
        hold it for the whole timeout). The default group, when another torch bootstrap of
        this process is still open, is left to that one (contexts made and dropped in any order
        share it)."""
        TorchBootstrap._open.discard(self)
        if self._abandoned:  # gloo would wait for the lost peer: leave the group to process exit
            self._group, self._owns_default = None, False
            return
        broken = self._broken or (self.liveness is not None and bool(self.liveness.lost))
        end = self._abort_group if broken else self._dist.destroy_process_group
        if self._group is not None:
            end(self._group)
            self._group = None
        if self._owns_default and self._dist.is_initialized():
            heir = next(iter(TorchBootstrap._open), None)
            if heir is not None:
                heir._owns_default = True
            else:
                end()
            self._owns_default = False

    def _abort_group(self, group=None) -> None:
        abort = getattr(self._dist.distributed_c10d, "_abort_process_group", None)
        if abort is None:  # an older torch: leave the group to process exit rather than wait
            return
        try:
            abort(group)
        except Exception:
            pass


def _end_unless_cancelled(seconds: float):
    """A watcher process that ends this one (SIGKILL, after a message on stderr) in ``seconds``
    unless it is killed first: MPI's set-up waits in C, holding the GIL, for ranks that may never
    come, so no thread of this process could end the wait. Returns the watcher (kill it when
    set-up is done)."""
    import shlex
    import subprocess

    rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") if v in os.environ), "?")
    text = (f"iris_fw: rank {rank}: MPI set-up (MPI_Init, COMM_WORLD.Dup) did not complete in {seconds:g} s: a rank "
            "of this mpirun job did not start MPI (did every rank call iris_fw.init?); IRIS_FW_ARRIVAL_TIMEOUT "
            "sets this bound")
    script = f"sleep {seconds:g} && echo {shlex.quote(text)} >&2 && kill -9 {os.getpid()}"
    # a session of its own: cancelling it ends the shell and its sleep together
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def _cancel(watcher) -> None:
    """End a watcher of :func:`_end_unless_cancelled` (its shell and sleep) and reap it."""
    import signal

    try:
        os.killpg(watcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    watcher.wait()


class MpiBootstrap(Bootstrap):
    """mpi4py over a duplicate of ``COMM_WORLD`` (``pip install iris-fw[mpi]`` brings mpi4py
    and an MPICH, so ``mpirun`` works with pip alone)."""

    name = "mpi"
    priority = 20

    @classmethod
    def available(cls):
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed (pip install 'iris-fw[mpi]')"
        return True, ""

    @classmethod
    def detect(cls, environ):
        return any(v in environ for v in _MPI_VARS)

    @classmethod
    def detected_because(cls, environ):
        return "MPI launcher variables: " + ", ".join(v for v in _MPI_VARS if v in environ)

    def __init__(self, arrival_timeout: float | None = None):
        from .watchdog import arrival_timeout as default_arrival, liveness_timeout, process_info

        # MPI_Init and COMM_WORLD.Dup wait in C for every rank of the job, without a bound: a
        # rank that never starts MPI (it never calls iris_fw.init) would hang this one for good.
        # A watcher process ends this one if they have not returned in time, naming why.
        bound = arrival_timeout if arrival_timeout is not None else default_arrival(liveness_timeout())
        watcher = _end_unless_cancelled(bound)
        try:
            from mpi4py import MPI

            self._MPI = MPI
            self._comm = MPI.COMM_WORLD.Dup()
            self.rank = self._comm.Get_rank()
            self.world_size = self._comm.Get_size()
            node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank = node.Get_rank()
            self.local_world_size = node.Get_size()
            node.Free()
        finally:  # done, or failed with an error of its own: the watcher must not end this process later
            _cancel(watcher)
        self.processes = self.all_gather(process_info())

    def _run(self, request, what: str) -> None:
        self._poll(request.Test, what)

    @property
    def comm(self):
        """The mpi4py communicator this bootstrap runs on (a duplicate of ``COMM_WORLD``)."""
        return self._comm

    def all_gather(self, obj):
        import numpy as np

        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros(self.world_size, dtype=np.int64)
        self._run(self._comm.Iallgather(np.array([data.size], dtype=np.int64), sizes), "all_gather")
        counts = [int(n) for n in sizes]
        displs = [sum(counts[:r]) for r in range(self.world_size)]
        out = np.empty(sum(counts), dtype=np.uint8)
        self._run(self._comm.Iallgatherv(data, [out, counts, displs, self._MPI.BYTE]), "all_gather")
        return [pickle.loads(out[d:d + n].tobytes()) for d, n in zip(displs, counts)]

    def broadcast(self, obj, src):
        import numpy as np

        _check_src(src, self.world_size)
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if self.rank == src else None
        size = np.array([data.size if data is not None else 0], dtype=np.int64)
        self._run(self._comm.Ibcast(size, root=src), "broadcast")
        buf = data.copy() if data is not None else np.empty(int(size[0]), dtype=np.uint8)
        self._run(self._comm.Ibcast(buf, root=src), "broadcast")
        return obj if self.rank == src else pickle.loads(buf.tobytes())

    def barrier(self):
        self._run(self._comm.Ibarrier(), "barrier")

    def abort(self, reason):
        """Print ``reason`` and end the whole job (``MPI_Abort``: the launcher stops every rank)."""
        print(f"iris_fw: {reason}; aborting the MPI job", file=sys.stderr, flush=True)
        self._MPI.COMM_WORLD.Abort(1)

    def close(self):
        if self._comm is not None and not self._MPI.Is_finalized():
            self._comm.Free()
        self._comm = None


def _check_src(src: Any, world_size: int) -> None:
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
    entries = sorted(registry, key=lambda e: (getattr(e.obj, "priority", 100), e.name))
    passed = []
    for entry in entries:
        if not entry.obj.detect(environ):
            continue
        ok, why = entry.availability()
        if ok:
            explain = getattr(entry.obj, "detected_because", None)
            reason = explain(environ) if explain is not None else "its detect() recognized the environment"
            return entry.obj, reason + "".join(f"; {p}" for p in passed)
        passed.append(f"{entry.name} was detected but is unavailable: {why}")
    raise IrisError("no bootstrap recognizes this environment (is 'single' registered?)" + "".join(f"; {p}" for p in passed))


@hookimpl
def iris_fw_register_bootstraps(registry):
    for cls in (SingleBootstrap, TorchBootstrap, MpiBootstrap):
        registry.register(cls)
