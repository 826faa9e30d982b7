"""The ``mpi`` bootstrap: mpi4py, for programs run under ``mpirun -n N python …``."""

from __future__ import annotations

import os
import pickle
import sys

from iris_fw.bootstrap_base import Bootstrap, check_src

_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "PMI_RANK")


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

    def __init__(self, *, arrival_timeout: float | None = None):
        from iris_fw.watchdog import arrival_timeout as default_arrival, liveness_timeout, process_info

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

        check_src(src, self.world_size)
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

