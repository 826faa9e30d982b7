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
"""

from __future__ import annotations

import datetime
import os
import socket
import weakref
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

from .errors import ArgumentError, IrisError
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

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        import torch.distributed as dist

        self._dist = dist
        self._owns_default = False
        timeout = datetime.timedelta(seconds=timeout_s)
        if not dist.is_initialized():
            missing = [v for v in _TORCH_ENV_VARS if v not in os.environ]
            if missing:
                raise IrisError(
                    "bootstrap 'torch' needs an initialized torch.distributed or torchrun's "
                    f"environment; missing: {', '.join(missing)}"
                )
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                self._init_from_agent_store(timeout)
            else:
                dist.init_process_group(backend="gloo", init_method="env://", timeout=timeout)
            self._owns_default = True
        self._group = None
        if dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        TorchBootstrap._open.add(self)
        if "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
            self.local_rank = int(os.environ["LOCAL_RANK"])
            self.local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
        else:
            self._set_local_ranks()

    def _init_from_agent_store(self, timeout: datetime.timedelta) -> None:
        """The default group over the store a launcher hosts (``iris-fw launch``, torchrun),
        under a prefix new to each group this rank creates: keys of a previous group (a context
        closed and created again) are never read."""
        dist = self._dist
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout)
        generation = store.add(f"iris_fw/groups_created/{rank}", 1)  # equal on every rank: inits are collective
        dist.init_process_group(backend="gloo", store=dist.PrefixStore(f"iris_fw/{generation}", store), rank=rank,
                                world_size=world_size, timeout=timeout)

    def all_gather(self, obj):
        out = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj, src):
        _check_src(src, self.world_size)
        box = [obj]
        self._dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def barrier(self):
        self._dist.barrier(group=self._group)

    def close(self):
        TorchBootstrap._open.discard(self)
        if self._group is not None:
            self._dist.destroy_process_group(self._group)
            self._group = None
        if self._owns_default and self._dist.is_initialized():
            heir = next(iter(TorchBootstrap._open), None)
            if heir is not None:
                heir._owns_default = True
            else:
                self._dist.destroy_process_group()
            self._owns_default = False


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

    def __init__(self):
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        self.rank = self._comm.Get_rank()
        self.world_size = self._comm.Get_size()
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_world_size = node.Get_size()
        node.Free()

    @property
    def comm(self):
        """The mpi4py communicator this bootstrap runs on (a duplicate of ``COMM_WORLD``)."""
        return self._comm

    def all_gather(self, obj):
        return self._comm.allgather(obj)

    def broadcast(self, obj, src):
        _check_src(src, self.world_size)
        return self._comm.bcast(obj, root=src)

    def barrier(self):
        self._comm.Barrier()

    def abort(self, reason):
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
