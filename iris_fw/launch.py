"""``iris-fw launch``: start N ranks of a Python program on this host.

Each rank gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so the ``torch`` bootstrap finds
it, and ``TRITON_INTERPRET=1`` when no GPU is present. The rendezvous store is hosted by the
launcher on 127.0.0.1 at a free port (ranks connect to it as torchrun's workers connect to
their agent's store) and gloo is bound to the loopback interface: nothing the job opens is
reachable from another host. The ranks get one bootstrap (``torch``) and one transport;
exported ``IRIS_FW_*`` settings that contradict the job are refused before anything starts.

The launcher watches every rank: when one fails, the others are stopped within a second
(SIGTERM, then SIGKILL); SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every rank;
every child is reaped; afterwards any /dev/shm segment of the job is removed. Output lines
are prefixed ``[rank N]`` (switchable). The exit code is the first failing rank's (128 + the
signal for a rank killed by one), else 0.
"""

from __future__ import annotations

import datetime
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from . import env
from .interpreter import choose as _choose_interpreter
from .interpreter import interpreting
from .errors import ArgumentError, EnvironmentVariableError, bad_type

#: Signals the launcher forwards to every rank (SIGHUP: the terminal or ssh session that ran it went away).
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: After a failure: seconds the other ranks get between SIGTERM and SIGKILL.
_GRACE_S = 0.5
#: Seconds between two looks at the ranks.
_POLL_S = 0.05
#: Bootstraps a launched rank may use: what the launcher provides (torchrun's variables).
_LAUNCH_BOOTSTRAPS = ("auto", "torch")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    """GPUs kernels will run on here: 0 under the interpreter or without GPUs."""
    import torch

    if interpreting() or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def share_gpus() -> bool:
    """``IRIS_FW_SHARE_GPUS=1``: ranks beyond the GPU count share GPUs round-robin (rank r on GPU
    r mod count). For correctness testing on fewer GPUs than ranks: the ranks' kernels run in
    separate processes and time-slice on a shared GPU, so waits across ranks still complete,
    slowly; timings taken this way mean nothing."""
    return env.get("IRIS_FW_SHARE_GPUS")


def default_world_size() -> int:
    """The number of GPUs when there are any, else 4 CPU ranks."""
    return gpu_count() or 4


def new_shm_prefix() -> str:
    """A /dev/shm name prefix unique to one launch."""
    return f"iris_fw_{secrets.token_hex(4)}_"


def rank_environ(rank: int, world_size: int, port: int, shm_prefix: str, base: dict | None = None) -> dict:
    """The environment of one rank of a single-host job."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        IRIS_FW_SHM_PREFIX=shm_prefix,
        IRIS_FW_LAUNCHER_SIGNALS="1",  # the launcher asks for the watchdog's SIGTERM handler (watchdog.py)
    )
    _choose_interpreter(env)
    gpus = gpu_count()
    if gpus and share_gpus() and world_size > gpus:  # ranks share GPUs: each a share of the SMs (MPS; devinfo.mps_share)
        from .devinfo import MPS_PERCENT_VAR, mps_share

        env.setdefault(MPS_PERCENT_VAR, os.environ.get(MPS_PERCENT_VAR) or mps_share(-(-world_size // gpus)))
    return env


def cleanup_shm(prefix: str, shm_dir: str = "/dev/shm", select=None) -> list[str]:
    """Remove segments whose names start with ``prefix`` (and for which ``select(name)`` holds,
    when given); return what was removed."""
    removed = []
    if not prefix or not os.path.isdir(shm_dir):
        return removed
    for name in os.listdir(shm_dir):
        if name.startswith(prefix) and (select is None or select(name)):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:  # gone meanwhile, or another user's
                pass
    return removed


def job_settings(nprocs: int, environ=None) -> dict:
    """The ``IRIS_FW_*`` settings every rank of an ``nprocs``-rank job gets: the bootstrap and
    the transport resolved once, here. The bootstrap stays ``auto`` unless the environment names
    one: ranks get torchrun's variables, which the ``torch`` bootstrap recognizes, and a plugin
    bootstrap asked before it (a lower ``priority``) may recognize a variable of its own. Raises :class:`EnvironmentVariableError` when the
    environment contradicts the job (or has an invalid ``IRIS_FW_*`` value), with what to do."""
    environ = os.environ if environ is None else environ
    env.in_effect(environ)  # every IRIS_FW_* value parses, or the launcher says which does not
    bootstrap = env.get("IRIS_FW_BOOTSTRAP", environ)
    if bootstrap == "single" and nprocs > 1:
        raise EnvironmentVariableError(
            f"IRIS_FW_BOOTSTRAP=single is set in this environment, but iris-fw launch -n {nprocs} starts one job "
            f"of {nprocs} ranks: with 'single' each rank would run alone, as {nprocs} independent one-rank jobs. "
            "Unset IRIS_FW_BOOTSTRAP (iris-fw launch gives its ranks the 'torch' bootstrap) or launch -n 1")
    if bootstrap not in _LAUNCH_BOOTSTRAPS + ("single",):
        raise EnvironmentVariableError(
            f"IRIS_FW_BOOTSTRAP={bootstrap} is set in this environment, but iris-fw launch starts its ranks with "
            "torchrun's variables (the 'torch' bootstrap); unset it, or start the job with that bootstrap's own "
            "launcher (e.g. mpirun for 'mpi')")
    transport = env.get("IRIS_FW_TRANSPORT", environ)
    interpret = environ.get("TRITON_INTERPRET")
    gpus = 0 if interpret not in (None, "", "0") else gpu_count()
    if transport == "auto":
        transport = "gpu_ipc" if gpus else "host_shm"
    if transport == "gpu_ipc":
        if interpret not in (None, "", "0"):
            raise EnvironmentVariableError(
                f"IRIS_FW_TRANSPORT=gpu_ipc contradicts TRITON_INTERPRET={interpret} (kernels would run on the CPU "
                "interpreter): unset one of them")
        if not gpus:
            raise EnvironmentVariableError("IRIS_FW_TRANSPORT=gpu_ipc is set, but no GPU is visible here; "
                                           "unset it to run CPU ranks (host_shm)")
        if nprocs > gpus and not share_gpus():
            raise ArgumentError(
                f"nprocs: -n {nprocs} needs {nprocs} GPUs (one per rank) and {gpus} are visible; launch -n {gpus}, "
                "or set IRIS_FW_SHARE_GPUS=1 to let ranks share GPUs (correctness tests only)")
    return {"IRIS_FW_BOOTSTRAP": bootstrap, "IRIS_FW_TRANSPORT": transport}


class Rendezvous:
    """The job's rendezvous store: a torch ``TCPStore`` hosted by the launcher, listening on
    127.0.0.1 only, at a port the kernel chose free (bound before anyone is told of it, so no
    other process can take it in between). Ranks connect to it as torchrun's workers connect
    to their agent's store (``TORCHELASTIC_USE_AGENT_STORE=True``)."""

    def __init__(self, timeout_s: float = 300.0):
        import torch.distributed as dist

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            self.port = sock.getsockname()[1]
            # the store's server takes the listening socket over (and closes it when it goes)
            self._store = dist.TCPStore("127.0.0.1", self.port, None, True, datetime.timedelta(seconds=timeout_s),
                                        wait_for_workers=False, master_listen_fd=sock.fileno(), use_libuv=True)
        except BaseException:
            sock.close()
            raise
        sock.detach()

    def environ(self) -> dict:
        """What a rank needs to find the store (and to keep gloo on the loopback interface)."""
        out = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
        if "lo" in (name for _, name in socket.if_nameindex()):
            out["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
        return out

    def close(self) -> None:
        self._store = None


class _Tagger:
    """Copies a rank's stdout or stderr to ours, each line prefixed ``[rank N] `` (whole lines:
    ranks' lines never interleave mid-line)."""

    def __init__(self, rank: int, source, sink, lock: threading.Lock):
        self.prefix = f"[rank {rank}] ".encode()
        self.source, self.sink, self.lock = source, sink, lock
        self.thread = threading.Thread(target=self._copy, name=f"iris-fw launch rank {rank}", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        for line in iter(self.source.readline, b""):
            with self.lock:
                self.sink.write(self.prefix + line + (b"" if line.endswith(b"\n") else b"\n"))
                self.sink.flush()
        self.source.close()


def _binary(stream):
    return getattr(stream, "buffer", stream)


def launch(argv: list[str], nprocs: int, timeout: float | None = None, *, module: bool = False,
           tag_output: bool | None = None) -> int:
    """Run ``python argv…`` (``python -m argv…`` with ``module``) as ``nprocs`` ranks on this host;
    return the job's exit code. ``timeout``: stop the job after so many seconds (exit code 124);
    ``tag_output``: prefix every output line with ``[rank N]`` (default: when ``nprocs > 1``)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise bad_type("nprocs", "an int >= 1", nprocs)
    if nprocs < 1:
        raise ArgumentError(f"nprocs must be >= 1, got {nprocs}")
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ArgumentError(f"argv must name a program (a script, or a module with module=True) and its arguments, "
                            f"got {argv!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ArgumentError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    settings = job_settings(nprocs)
    tag = nprocs > 1 if tag_output is None else bool(tag_output)
    prefix = new_shm_prefix()
    store = Rendezvous() if settings["IRIS_FW_BOOTSTRAP"] != "single" else None
    command = [sys.executable, *(["-m"] if module else []), *argv]
    procs: list[subprocess.Popen] = []
    taggers: list[_Tagger] = []
    locks = (threading.Lock(), threading.Lock())  # one per stream we write to
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _FORWARDED:
            previous[signum] = signal.signal(signum, on_signal)
    code = 0
    try:
        for rank in range(nprocs):
            rank_env = rank_environ(rank, nprocs, store.port if store else free_port(), prefix)
            rank_env.update(settings)
            if store is not None:
                rank_env.update(store.environ())
            if tag:
                rank_env.setdefault("PYTHONUNBUFFERED", "1")  # lines appear as they are printed
            pipe = subprocess.PIPE if tag else None
            proc = subprocess.Popen(command, env=rank_env, start_new_session=True, stdout=pipe, stderr=pipe)
            procs.append(proc)
            if tag:
                taggers += [_Tagger(rank, proc.stdout, _binary(sys.stdout), locks[0]),
                            _Tagger(rank, proc.stderr, _binary(sys.stderr), locks[1])]
        code = _watch(procs, timeout, received)
    finally:
        _stop(procs)
        for tagger in taggers:
            tagger.thread.join(5)
        if store is not None:
            store.close()
        cleanup_shm(prefix)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _describe(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"


def _watch(procs: list[subprocess.Popen], timeout: float | None, received: list[int]) -> int:
    """Wait for every rank; on the first failure, a timeout or a signal, stop the others.
    Returns the job's exit code."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        states = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(states) if c not in (None, 0)]
        if failed:
            rank, returncode = failed[0]
            running = [r for r, c in enumerate(states) if c is None]
            if running:
                print(f"iris-fw launch: rank {rank} failed ({_describe(returncode)}); stopping rank(s) "
                      f"{', '.join(map(str, running))}", file=sys.stderr, flush=True)
            return _exit_code(returncode)
        if all(c == 0 for c in states):
            return 0
        if received:
            signum = received[0]
            print(f"iris-fw launch: got {signal.Signals(signum).name}; forwarding it to the ranks", file=sys.stderr,
                  flush=True)
            _stop(procs, first=signum)
            return 128 + signum
        if deadline is not None and time.monotonic() > deadline:
            print(f"iris-fw launch: timed out after {timeout:g}s; stopping the ranks", file=sys.stderr, flush=True)
            return 124
        time.sleep(_POLL_S)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _stop(procs: list[subprocess.Popen], first: int = signal.SIGTERM) -> None:
    """Send ``first`` to every running rank's process group, SIGKILL what still runs after
    :data:`_GRACE_S`, and reap every rank."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal_group(p, first)
    end = time.monotonic() + _GRACE_S
    for p in alive:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
    for p in procs:
        p.wait()
