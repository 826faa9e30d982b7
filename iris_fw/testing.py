"""Testing helpers: run a function on every rank of a real multi-process job from pytest.

:class:`RankPool` starts ``world_size`` rank processes once (spawned, each with an
:func:`iris_fw.init` context — host_shm on a CPU, gpu_ipc on GPUs) and runs functions
``fn(ctx, *args)`` on all of them, returning each rank's result or raising with every
failing rank's traceback. Between two functions every rank has finished the first, so
tests need no barrier at their end. After each function the pool checks that no heap
block leaked and no device-side wait timed out unreported.

Used as a pytest plugin (``pytest_plugins = ["iris_fw.testing"]``) it provides the
fixtures ``iris_pool`` (a factory: ``iris_pool(world_size)``) and ``on_gpu``.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

import pytest

from . import env
from .info import find_mpirun  # noqa: F401  (tests find mpirun here)
from .launch import Rendezvous, cleanup_shm, free_port, gpu_count, new_shm_prefix, rank_environ, share_gpus

#: Device-side wait bound of the pools' contexts. Generous: the ranks of a test reach a kernel
#: tens of seconds apart when the host is loaded (the CPU interpreter on CI's 2 cores, or GPU
#: test workers compiling the same kernels at once: a first fp32 GEMM compile outlasted a 30 s
#: wait on one H200 with six workers). Tests of timeouts set their own short bound.
POOL_WAIT_TIMEOUT_S = 120.0
#: In a rank's error: its GPU context is unusable (an illegal memory access poisons it for good).
_POISONED = "AcceleratorError"
#: After one rank fails, seconds the others get to report before the pool is killed.
_FAILURE_GRACE_S = 10.0
#: Seconds to wait for a lost rank's process to finish exiting, for its exit status.
_EXIT_WAIT_S = 3.0


def torchrun(n: int) -> list[str]:
    """The command prefix of a torchrun job of ``n`` ranks on a free port of its own (jobs of
    parallel test workers would all take torchrun's default 29500: EADDRINUSE)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port", str(free_port())]


class RankFailure(AssertionError):
    """One or more ranks raised (or the pool died); the message holds every traceback."""


def _exit_with_parent(period_s: float = 1.0) -> None:
    """Exit this rank process when the process that started it is gone (a test run killed
    while the rank ran a long job would otherwise leave it computing until the job ends)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="iris_fw-parent-watch", daemon=True).start()


def _close_others(ctx) -> None:
    """Close the contexts a function left open (Iris-style programs never close theirs), on every
    rank alike whether the function passed or failed there, so none serves a later function; a
    close that fails does not hide the function's own result."""
    from iris_fw.context import open_contexts

    for other in open_contexts():
        if other is not ctx:
            try:
                other.close()
            except BaseException:  # noqa: BLE001 - the function's outcome is what the pool reports
                pass


def _worker(conn, env: dict, heap_size: int, wait_timeout: float, threads: int) -> None:
    _exit_with_parent()
    os.environ.update(env)
    import iris_fw  # first: its import sets the interpreter switch
    import torch

    torch.set_num_threads(threads)  # the pool's ranks share the host's cores (RankPool)
    faulthandler.enable()  # a rank that dies in native code says where, on its stderr

    try:
        ctx = iris_fw.init(heap_size=heap_size, wait_timeout=wait_timeout)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    # The collection after each function (the leak check below) visits every tracked object: with
    # torch, Triton and iris-fw imported that took 0.15-0.3 s a function on CI's CPU ranks, 0.45 s
    # once a test imported transformers (well over a minute of the default run). What exists now
    # lives as long as the rank: frozen, later collections skip it (as they skip the modules a
    # function imports, frozen after it; a suspected leak is judged after a full collection).
    gc.freeze()
    conn.send(("ready", ctx.device.type))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        path, payload = msg
        for entry in path:
            if entry not in sys.path:
                sys.path.append(entry)
        # every rank finished the previous function and passed on its causes (below): re-arm an
        # abort a test left behind (a test that caught its expected error without a barrier)
        ctx.watchdog.clear()
        # calls without ctx= use the pool's context, whatever contexts an earlier function left open
        ctx.make_current()
        try:
            fn, args, kwargs = pickle.loads(payload)
            used = ctx.heap.bytes_used
            modules = len(sys.modules)
            result = fn(ctx, *args, **kwargs)
            ctx.synchronize()  # raises WaitTimeout if a wait gave up unreported
            for ext in list(ctx.extensions.values()):  # cached ops and ccl groups hold heap buffers
                ext.clear()
            _close_others(ctx)
            del fn, args, kwargs
            gc.collect()
            if ctx.heap.bytes_used > used:  # a frozen object gone since may hold it: every object, then
                gc.unfreeze()
                gc.collect()
                gc.freeze()
            if ctx.heap.bytes_used > used:  # fewer is fine: a re-armed job drops what it cached before
                raise AssertionError(
                    "heap blocks still live after the test: "
                    + ", ".join(f"{b.what} from {b.site}" for b in ctx.heap.blocks())
                )
            conn.send(("ok", result))
            del result
            if len(sys.modules) > modules:  # modules the function imported (e.g. transformers)
                gc.freeze()
        except BaseException:
            text = traceback.format_exc()
            try:  # this rank's device cause reaches every peer before anyone starts the next function
                ctx.transport.synchronize()
                ctx.watchdog.sync_point()
            except BaseException:
                pass
            for ext in list(ctx.extensions.values()):  # nothing a failed function cached serves the next one
                ext.clear()
            _close_others(ctx)  # as the ranks that succeeded do: their closes meet ours
            conn.send(("error", text))
    ctx.close()


class RankPool:
    """``world_size`` rank processes, each with a context, that run functions on request."""

    def __init__(self, world_size: int, heap_size: int, wait_timeout: float = POOL_WAIT_TIMEOUT_S,
                 start_timeout: float = 300.0):
        self.world_size = world_size
        self.broken = False
        self._prefix = new_shm_prefix()
        self._rendezvous = Rendezvous()  # on 127.0.0.1, as iris-fw launch's
        spawn = mp.get_context("spawn")
        self._conns, self._procs = [], []
        # the host's cores split between the ranks of every pool running at once (pytest-xdist's
        # workers each hold pools): float64 references on a GPU machine's 16 cores with ~18 ranks
        # of 16 threads each ran many times slower than with their share
        pools = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        threads = max(1, (os.cpu_count() or 1) // (world_size * pools))
        for rank in range(world_size):
            parent, child = spawn.Pipe()
            env = rank_environ(rank, world_size, self._rendezvous.port, self._prefix, base={})
            env.update(self._rendezvous.environ())
            proc = spawn.Process(target=_worker, args=(child, env, heap_size, wait_timeout, threads), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        replies = self._collect(start_timeout)
        failures = [(r, rep) for r, rep in enumerate(replies) if rep is None or rep[0] != "ready"]
        if failures:
            self.close()
            raise RankFailure(self._describe("starting the pool", failures))
        self.device_type = replies[0][1]

    def run(self, fn: Callable, *args: Any, timeout: float | None = None, **kwargs: Any) -> list:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results by rank. ``timeout``:
        seconds ``fn`` may take before the pool is killed (default ``IRIS_FW_TEST_TIMEOUT``, read now)."""
        if timeout is None:
            timeout = env.get("IRIS_FW_TEST_TIMEOUT")
        if self.broken:
            raise RankFailure("this pool was killed after an earlier failure")
        payload = pickle.dumps((fn, args, kwargs))
        for conn in self._conns:
            conn.send((list(sys.path), payload))
        replies = self._collect(timeout)
        failures = [(r, rep) for r, rep in enumerate(replies) if rep is None or rep[0] != "ok"]
        if failures:
            if any(rep is None or rep[0] == "lost" for rep in replies) or any(
                    _POISONED in str(rep[1]) for _, rep in failures if rep):
                # a rank is stuck (in a collective with a failed rank) or gone, or a device fault
                # poisoned a rank's GPU context (every later CUDA call there fails): start afresh
                self.close()
            raise RankFailure(self._describe(getattr(fn, "__qualname__", repr(fn)), failures))
        return [rep[1] for rep in replies]

    def _collect(self, timeout: float) -> list:
        replies: list = [None] * self.world_size
        deadline = time.monotonic() + timeout
        while any(r is None for r in replies):
            now = time.monotonic()
            if now > deadline:
                break
            for rank, conn in enumerate(self._conns):
                if replies[rank] is None:
                    if conn.poll(0.01):
                        try:
                            replies[rank] = conn.recv()
                        except EOFError:
                            replies[rank] = ("lost", f"rank {rank} exited ({self._exit_status(rank)})")
                    elif not self._procs[rank].is_alive():
                        replies[rank] = ("lost", f"rank {rank} died ({self._exit_status(rank)})")
            if any(r is not None and r[0] != "ok" for r in replies):
                deadline = min(deadline, now + _FAILURE_GRACE_S)
        return replies

    def _exit_status(self, rank: int) -> str:
        """How rank ``rank``'s process ended: its exit code or the signal that killed it (waits a
        little for a process still exiting)."""
        proc = self._procs[rank]
        proc.join(_EXIT_WAIT_S)
        code = proc.exitcode
        if code is None:
            return "still exiting"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def _describe(self, what: str, failures: list) -> str:
        parts = [f"{what} failed on {len(failures)} of {self.world_size} ranks"]
        for rank, rep in failures:
            text = rep[1] if rep is not None else "no reply in time (stuck; pool killed)"
            parts.append(f"--- rank {rank} ---\n{text}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop the ranks (cleanly if they answer) and remove any segment they left."""
        if self.broken:
            return
        self.broken = True
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        cleanup_shm(self._prefix)
        self._rendezvous.close()


class _Pools:
    def __init__(self, heap_size: int, worlds: set[int] | None = None):
        self.heap_size = heap_size
        self.worlds = worlds
        self._pools: dict[int, RankPool] = {}

    def __call__(self, world_size: int) -> RankPool:
        gpus = gpu_count()
        if gpus and world_size > gpus and not share_gpus():
            pytest.skip(f"world size {world_size} needs {world_size} GPUs, {gpus} visible")
        if self.worlds is not None and world_size not in self.worlds:
            pytest.skip(f"world size {world_size} runs in another partition (--iris-worlds)")
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            pool = self._pools[world_size] = RankPool(world_size, self.heap_size)
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


# ---- partitions by world size -------------------------------------------------------------------

#: Fixture and parameter names that fix a test's world size.
_WORLD_PARAMS = ("world", "world_size")


def pytest_addoption(parser):
    parser.addoption(
        "--iris-worlds", default=None, metavar="LIST",
        help="run only this partition of the suite: world sizes (e.g. '2' or '1,other'); a test whose world "
             "parameter is not listed is deselected, a pool of an unlisted size skips, and tests that start no "
             "rank pool run only where 'other' is listed. Several partitions run side by side (scripts/gpu_mps.sh).")


def _worlds(config) -> tuple[set[int], bool] | None:
    text = config.getoption("--iris-worlds", default=None)
    if not text:
        return None
    parts = {p.strip() for p in text.split(",") if p.strip()}
    return {int(p) for p in parts if p != "other"}, "other" in parts


def pytest_collection_modifyitems(config, items):
    chosen = _worlds(config)
    if chosen is None:
        return
    sizes, other = chosen
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        world = next((params[k] for k in _WORLD_PARAMS if isinstance(params.get(k), int)), None)
        uses_pool = "iris_pool" in getattr(item, "fixturenames", ())
        if world is not None and uses_pool:
            ok = world in sizes
        else:
            ok = uses_pool or other
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def on_gpu() -> bool:
    """True when the suite runs on GPUs (gpu_ipc), False on the CPU (host_shm)."""
    return gpu_count() > 0


@pytest.fixture(scope="session")
def iris_pool(on_gpu, request):
    """``iris_pool(world_size)`` → a :class:`RankPool` of that size, started once a session."""
    chosen = _worlds(request.config)
    pools = _Pools(heap_size=(1 << 30) if on_gpu else (64 << 20), worlds=None if chosen is None else chosen[0])
    yield pools
    pools.close()
