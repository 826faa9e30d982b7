"""Fail fast on the host: peer liveness, the causes behind the abort word, and passing them to
every rank — one watchdog thread per rank (see docs/reliability.md, "Fail fast").

**Liveness.** At set-up every rank publishes its host, pid, pid namespace and process start
time (:func:`process_info`). A peer on the same host and pid namespace (always the case for
``host_shm``; the usual one for ``gpu_ipc``) is watched through ``/proc``: a process that is
gone or a zombie is lost at once; one stopped (SIGSTOP, a debugger) for longer than the
liveness bound is lost then. Once the heap exists the thread also advances this rank's
heartbeat word (``HDR_HEARTBEAT``) and reads every peer's: a peer whose heartbeat says it
closed its context is fine, one whose heartbeat says it left the interpreter without closing
is lost at once, and a peer whose process cannot be seen from here is lost when its heartbeat
stood still for the bound. The bound is ``init(liveness_timeout=…)``, ``IRIS_FW_LIVENESS_TIMEOUT``
or :data:`DEFAULT_LIVENESS_TIMEOUT_S`.

**Causes.** The abort word of a heap (``HDR_ABORT``) makes every device wait of that rank give
up. What set it is kept on the host side of the header, after the device barrier's slots: one
*cause record* per rank at fault (kind, time, a text of at most :data:`CAUSE_TEXT_BYTES`
bytes). A wait that timed out or a pointer that failed its check sets the local word from the
device; the watchdog then writes the cause, described on this rank (allocation and source
line included), into every rank's record for this rank and sets every peer's word. A lost
peer sets the local word with a record under the lost rank's number. A host failure inside a
call (:meth:`Watchdog.abort`) does what a device cause does, at once.

The context asks :meth:`Watchdog.failure` at every synchronization; :meth:`Watchdog.clear`
re-arms the job at a barrier, where every rank has reported.

**Signals.** Only where ``iris-fw launch`` asks (``IRIS_FW_LAUNCHER_SIGNALS``, set for its
ranks, or ``Watchdog(..., launcher_signals=True)``) does the watchdog install a SIGTERM handler
(the launcher's SIGTERM after a peer died becomes a :class:`~iris_fw.PeerFailure` naming it);
under ``mpirun``, ``torchrun`` or a program of its own, the library installs no signal handler.
One process-wide measure stays, armed only once a peer is lost and only at interpreter exit: a
faulthandler timer ending the process :data:`EXIT_GRACE_S` later, because a bootstrap's
teardown (``MPI_Finalize``) can wait in C, holding the GIL, for the lost rank (without it,
2 of 5 runs of the mpirun exit tests left a survivor behind long enough to leak MPICH's segment,
one failed; with it, 5 of 5 clean).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import socket
import threading
import time
import weakref

from . import device as dev
from . import diagnostics
from . import env
from .errors import NotOnHeapError, PeerFailure, WaitTimeout

#: Seconds after which a rank that stopped, hangs without a heartbeat, or never arrived is lost.
DEFAULT_LIVENESS_TIMEOUT_S = env.variable("IRIS_FW_LIVENESS_TIMEOUT").default
#: Seconds between two rounds of the watchdog thread (heartbeat, peers' heartbeats, causes).
INTERVAL_S = 0.05
#: Seconds between two looks at the peers' processes through /proc.
PROCESS_INTERVAL_S = 0.2

#: Seconds a process whose job lost a rank may take to exit after its last atexit handler before
#: it is ended (exit code 1): tearing down a bootstrap group can wait for the lost rank.
EXIT_GRACE_S = 5.0

#: Heartbeat values with a meaning (a live heartbeat counts up from 1).
HEARTBEAT_CLOSED = -1
HEARTBEAT_EXITED = -2

#: Cause kinds (slot 0 of a cause record).
CAUSE_TIMEOUT, CAUSE_POINTER, CAUSE_HOST, CAUSE_LOST = 1, 2, 3, 4
_CAUSE_CLASS = {CAUSE_TIMEOUT: WaitTimeout, CAUSE_POINTER: NotOnHeapError, CAUSE_HOST: PeerFailure,
                CAUSE_LOST: PeerFailure}
#: int64 slots of one cause record: kind, time (ns), the sender's barrier generation, text
#: length, text.
CAUSE_SLOTS = 64
CAUSE_TEXT_BYTES = (CAUSE_SLOTS - 4) * 8
_N_ERR_SLOTS = dev.HDR_WAIT_BOUND.value  # slots [0, HDR_WAIT_BOUND): the timeout record
_PTR_FIRST, _PTR_LAST = dev.HDR_PTR_COUNT.value, dev.HDR_PTR_SEEN.value
_STATE_SLOTS = dev.HDR_BARRIER_SLOTS.value  # the header's fixed slots, read in one go


def liveness_timeout(value: float | None = None) -> float:
    """The liveness bound: ``value`` (checked by the caller), else ``IRIS_FW_LIVENESS_TIMEOUT``
    (default :data:`DEFAULT_LIVENESS_TIMEOUT_S`)."""
    return float(value) if value is not None else env.get("IRIS_FW_LIVENESS_TIMEOUT")


def arrival_timeout(liveness: float) -> float:
    """Seconds a rank waits at ``iris_fw.init`` for the others to arrive:
    ``IRIS_FW_ARRIVAL_TIMEOUT``, else the liveness bound (ranks started together arrive within
    the time their imports differ by; raise it where start-up is slow or staggered)."""
    value = env.get("IRIS_FW_ARRIVAL_TIMEOUT")
    return liveness if value is None else value


def cause_slot(world_size: int, rank: int) -> int:
    """First int64 slot of the cause record for ``rank`` in any heap's header."""
    first = (dev.HDR_BARRIER_SLOTS.value + world_size + CAUSE_SLOTS - 1) // CAUSE_SLOTS * CAUSE_SLOTS
    return first + rank * CAUSE_SLOTS


def header_slots(world_size: int) -> int:
    """int64 slots the header needs: fixed slots, barrier slots and one cause record per rank."""
    return cause_slot(world_size, world_size)


# ---- processes ----------------------------------------------------------------------------------


#: ``PF_EXITING`` in a process's kernel flags (/proc/PID/stat field 9): the process is exiting.
#: Its heartbeat has stopped, but it may stay visible for long: a GPU process's exit waits for its
#: queued kernels, which may wait for this rank (seen under CUDA MPS: a peer that called
#: ``os._exit(0)`` inside a loop of collectives stayed alive for over 100 s).
_PF_EXITING = 0x4


def _proc_stat(pid: int) -> tuple[str, str, int] | None:
    """``(state, start time, kernel flags)`` of process ``pid`` from /proc, or ``None`` if it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    return rest[0], rest[19], int(rest[6])


def process_info() -> dict:
    """What peers need to watch this process: host, pid, pid namespace, start time."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
        start = _proc_stat(os.getpid())[1]
    except OSError:
        pidns = start = None
    return {"host": socket.gethostname(), "pid": os.getpid(), "pidns": pidns, "start": start}


def _process_state(info: dict, mine: dict) -> str | None:
    """``"alive"``, ``"stopped"`` or ``"gone"`` for a peer's process, or ``None`` when it cannot
    be seen from here (another host or pid namespace, no /proc)."""
    if info.get("start") is None or (info["host"], info["pidns"]) != (mine["host"], mine["pidns"]):
        return None
    stat = _proc_stat(info["pid"])
    if stat is None or stat[1] != info["start"] or stat[0] in ("Z", "X", "x") or stat[2] & _PF_EXITING:
        return "gone"
    return "stopped" if stat[0] in ("T", "t") else "alive"


def _exit_within_grace() -> None:
    """At interpreter exit after a rank was lost: end the process if it is still alive
    :data:`EXIT_GRACE_S` seconds later (a bootstrap's teardown in the interpreter's finalization
    may wait for the lost rank for its whole timeout). A C-level timer: it runs while Python
    cannot."""
    sink = open(os.devnull, "w")
    faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True, file=sink)


# ---- the watchdog -------------------------------------------------------------------------------


class Watchdog:
    """Liveness and abort causes for one rank; see the module docstring.

    Created by :func:`iris_fw.init` once the bootstrap is up (so its collectives can give up on
    a lost peer), attached to the context once the heap exists, stopped at ``close``."""

    def __init__(self, bootstrap, timeout_s: float, *, launcher_signals: bool | None = None):
        """``launcher_signals``: install the SIGTERM handler (None: as
        ``IRIS_FW_LAUNCHER_SIGNALS`` says, which ``iris-fw launch`` sets for its ranks);
        otherwise this library installs no signal handler."""
        self.rank, self.world_size = bootstrap.rank, bootstrap.world_size
        self._signals = env.get("IRIS_FW_LAUNCHER_SIGNALS") if launcher_signals is None else bool(launcher_signals)
        self.timeout = timeout_s
        infos = bootstrap.known_processes()
        self.processes = infos if infos is not None else bootstrap.all_gather(process_info())
        self._me = self.processes[self.rank]
        self._lost: dict[int, str] = {}
        self._stopped_since: dict[int, float] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._lock = threading.RLock()
        self._ctx = None
        self._propagated = False
        #: barriers this rank completed; a cause record carries its sender's (see clear)
        self.generation = 0
        self._reported: set = set()  # cause records (origin, time) this rank's host has raised
        self._closing = False
        self._beat = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"iris_fw watchdog rank {self.rank}", daemon=True)
        self._thread.start()
        bootstrap.attach_liveness(self)
        self._old_term = None
        if (self._signals and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            self._old_term = signal.signal(signal.SIGTERM, self._terminated)

    def _terminated(self, signum, frame) -> None:
        """SIGTERM while the job runs — what mpirun and torchrun send the other ranks when one
        died: if a peer is lost (looked for now), raise :class:`PeerFailure` naming it, so this
        rank's error says why it stops; else terminate as SIGTERM would have."""
        try:
            self._check_processes(time.monotonic())
        except Exception:
            pass
        if self._lost:
            rank, why = min(self._lost.items())
            raise PeerFailure(f"rank {self.rank} was sent SIGTERM (its launcher stops the job): {why}", rank)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # ---- lifecycle --------------------------------------------------------------------------------
    def attach(self, ctx) -> None:
        """Start heartbeats and cause propagation on ``ctx``'s heap (its header is initialized)."""
        with self._lock:
            self._ctx = weakref.ref(ctx)
            self._write(self.rank, dev.HDR_HEARTBEAT.value, [1])

    def closing(self) -> None:
        """This rank is closing its context: its heartbeat says so (peers stop watching it) and
        stops; peers' heartbeats and processes are still watched until :meth:`stop`."""
        with self._lock:
            self._closing = True
            if self._context() is not None:
                self._write(self.rank, dev.HDR_HEARTBEAT.value, [HEARTBEAT_CLOSED])

    def stop(self, heartbeat: int | None = None) -> None:
        """Stop the thread and leave the heap alone from now on; ``heartbeat``: a last value for
        this rank's heartbeat word (:data:`HEARTBEAT_EXITED` at interpreter exit)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self._old_term is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._terminated:
                signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        with self._lock:
            if heartbeat is not None and self._context() is not None:
                try:
                    self._write(self.rank, dev.HDR_HEARTBEAT.value, [heartbeat])
                except Exception:  # the heap is already gone (a failed close)
                    pass
            self._ctx = None

    def _context(self):
        return self._ctx() if self._ctx is not None else None

    # ---- liveness ---------------------------------------------------------------------------------
    @property
    def lost(self) -> dict[int, str]:
        """Ranks found lost, with why."""
        return dict(self._lost)

    def check(self, what: str = "") -> None:
        """Raise :class:`PeerFailure` if a peer was lost (bootstrap collectives call this while
        they wait, so they never wait for a rank that is gone)."""
        if self._lost:
            rank, why = min(self._lost.items())
            where = f" during {what}" if what else ""
            raise PeerFailure(f"rank {self.rank}{where}: {why}", rank)

    def confirm(self, seconds: float = 1.0) -> None:
        """Look at the peers' processes now, and for up to ``seconds`` more, and raise as
        :meth:`check` does if one is lost (after a bootstrap error that may mean a lost peer)."""
        end = time.monotonic() + seconds
        while True:
            self._check_processes(time.monotonic())
            self.check()
            if time.monotonic() > end:
                return
            time.sleep(0.05)

    def _lose(self, rank: int, why: str) -> None:
        with self._lock:
            if rank in self._lost:
                return
            if not self._lost:
                atexit.register(_exit_within_grace)
            self._lost[rank] = why
            if self._context() is not None:
                self._record(self.rank, rank, CAUSE_LOST, why)
                self._write(self.rank, dev.HDR_ABORT.value, [dev.ABORT_BY_HOST.value])

    def _check_processes(self, now: float) -> None:
        for r, info in enumerate(self.processes):
            if r == self.rank or r in self._lost:
                continue
            state = _process_state(info, self._me)
            if state == "gone":
                with self._lock:
                    beat = (self._read(r, dev.HDR_HEARTBEAT.value, 1)[0] if self._context() is not None
                            else self._beats.get(r, (None,))[0])
                if beat == HEARTBEAT_CLOSED:
                    continue
                how = ("left the interpreter without closing its iris_fw context (sys.exit, an uncaught "
                       "exception, or the end of the program)" if beat == HEARTBEAT_EXITED else
                       "died or is exiting without closing its iris_fw context (killed by a signal, crashed, "
                       "or os._exit)")
                self._lose(r, f"rank {r} (pid {info['pid']}) {how}")
            elif state == "stopped":
                since = self._stopped_since.setdefault(r, now)
                if now - since >= self.timeout:
                    self._lose(r, f"rank {r} (pid {info['pid']}) has been stopped (SIGSTOP or a debugger) "
                                  f"for {now - since:.1f} s (liveness_timeout {self.timeout:g} s)")
            else:
                self._stopped_since.pop(r, None)

    def _watch_heartbeats(self, now: float) -> None:
        for r, info in enumerate(self.processes):
            if r == self.rank or r in self._lost:
                continue
            beat = self._read(r, dev.HDR_HEARTBEAT.value, 1)[0]
            last = self._beats.get(r)
            if last is None or last[0] != beat:
                self._beats[r] = (beat, now)
                last = (beat, now)
            if beat == HEARTBEAT_EXITED:
                self._lose(r, f"rank {r} (pid {info['pid']}) left the interpreter without closing its iris_fw "
                              "context (sys.exit, an uncaught exception, or the end of the program)")
            elif beat != HEARTBEAT_CLOSED and _process_state(info, self._me) is None and now - last[1] >= self.timeout:
                self._lose(r, f"rank {r} sent no heartbeat for {now - last[1]:.1f} s (stopped, hung, or "
                              f"unreachable; liveness_timeout {self.timeout:g} s)")

    def _run(self) -> None:
        last_processes = 0.0
        while not self._stop.wait(INTERVAL_S):
            try:
                now = time.monotonic()
                with self._lock:
                    if self._context() is not None:
                        if not self._closing:
                            self._beat += 1
                            self._write(self.rank, dev.HDR_HEARTBEAT.value, [self._beat])
                            self._propagate()
                        self._watch_heartbeats(now)
                if now - last_processes >= PROCESS_INTERVAL_S:
                    self._check_processes(now)
                    last_processes = now
            except Exception:  # the context is closing under us; the next round decides
                if self._stop.is_set():
                    return

    # ---- header access ----------------------------------------------------------------------------
    def _read(self, rank: int, slot: int, count: int) -> list[int]:
        return self._context().transport.header_words(rank, slot, count)

    def _write(self, rank: int, slot: int, values: list[int]) -> None:
        self._context().transport.set_header_words(rank, slot, values)

    def _record(self, rank: int, origin: int, kind: int, text: str) -> int:
        """Write the cause record for ``origin`` into ``rank``'s header."""
        data = text.encode()[:CAUSE_TEXT_BYTES]
        data += b"\0" * (-len(data) % 8)
        words = [int.from_bytes(data[i:i + 8], "little", signed=True) for i in range(0, len(data), 8)]
        slot = cause_slot(self.world_size, origin)
        stamp = time.time_ns()
        self._write(rank, slot + 1, [stamp, self.generation, len(data.rstrip(b"\0"))] + words)
        self._write(rank, slot, [kind])
        return stamp

    def _records(self) -> list[tuple[int, int, int, str, int]]:
        """This rank's cause records sent since its last barrier (their sender's barrier count
        at least this rank's, see :meth:`clear`): ``(time, origin, kind, text, generation)``,
        earliest first."""
        first = cause_slot(self.world_size, 0)
        words = self._read(self.rank, first, CAUSE_SLOTS * self.world_size)
        out = []
        for origin in range(self.world_size):
            rec = words[origin * CAUSE_SLOTS:(origin + 1) * CAUSE_SLOTS]
            if rec[0] and rec[2] >= self.generation:
                raw = b"".join(w.to_bytes(8, "little", signed=True) for w in rec[4:])
                out.append((rec[1], origin, rec[0], raw[:rec[3]].decode(errors="replace"), rec[2]))
        return sorted(out)

    # ---- causes -----------------------------------------------------------------------------------
    def _local_causes(self, state: list[int]) -> list[tuple[type, int, str]]:
        """This rank's own device causes in its header ``state``: ``(class, kind, text)``."""
        ctx = self._context()
        out = []
        if state[dev.HDR_ERR_FLAG.value] or state[dev.HDR_ERR_COUNT.value]:
            out.append((WaitTimeout, CAUSE_TIMEOUT, diagnostics.describe_timeout(ctx, state[:_N_ERR_SLOTS])))
        if state[dev.HDR_PTR_FLAG.value] or state[dev.HDR_PTR_COUNT.value]:
            out.append((NotOnHeapError, CAUSE_POINTER, diagnostics.describe_bad_pointer(ctx, state)))
        return out

    def _propagate(self) -> None:
        """If this rank's device set the abort word with a cause of its own, describe it here
        and pass it on to every rank (once until :meth:`clear`)."""
        if self._propagated:
            return
        state = self._read(self.rank, 0, _STATE_SLOTS)
        if state[dev.HDR_ERR_FLAG.value] == -1:  # a record being written: the next round
            return
        causes = self._local_causes(state)
        if causes:
            self._send(causes[0][1], causes[0][2])

    def _send(self, kind: int, text: str) -> None:
        self._propagated = True
        for r in range(self.world_size):
            if r in self._lost:
                continue
            stamp = self._record(r, self.rank, kind, text)
            if r == self.rank and kind == CAUSE_HOST:  # this host raised it already
                self._reported.add((self.rank, stamp))
            word = dev.ABORT_BY_HOST.value if r == self.rank else dev.ABORT_FROM_RANK.value + self.rank
            self._write(r, dev.HDR_ABORT.value, [word])

    def sync_point(self) -> None:
        """Pass on a device cause of this rank now (before the host reports or exchanges)."""
        with self._lock:
            if self._context() is not None:
                self._propagate()

    def abort(self, text: str) -> None:
        """A host failure on this rank inside a call other ranks take part in: set the abort
        word here and on every peer, with ``text`` as the cause (their waits give up at once
        and their hosts raise :class:`PeerFailure` naming this rank)."""
        with self._lock:
            if self._context() is not None and not self._propagated:
                self._send(CAUSE_HOST, f"rank {self.rank} failed: {text}")

    @property
    def aborted(self) -> bool:
        """Whether this rank's abort word is set."""
        with self._lock:
            return self._context() is not None and self._read(self.rank, dev.HDR_ABORT.value, 1)[0] != 0

    def host_failure(self) -> tuple[int, str] | None:
        """``(origin, text)`` of the first host failure inside a call (:meth:`abort`, the call
        path's :func:`iris_fw.callpath.fail`) recorded on this rank since its last barrier, while
        the abort word is set; else None. The record outlives the failed rank's call board, which
        its next host call (the re-arming barrier) overwrites."""
        with self._lock:
            if self._context() is None or self._read(self.rank, dev.HDR_ABORT.value, 1)[0] == 0:
                return None
            hosts = [(origin, text) for _, origin, kind, text, _ in self._records() if kind == CAUSE_HOST]
        return hosts[0] if hosts else None

    def failure(self, consume: bool = True) -> BaseException | None:
        """The error this rank's host should raise after its device work finished, or ``None``:
        its own timed-out wait or failed pointer check; else the job's first cause when a wait
        of this rank gave up because the abort word was set, or when another rank's wait timed
        out or pointer failed its check (each reported once per rank: its results may depend on
        what that rank did not deliver). A lost peer, or a host failure on another rank inside
        a call, is reported where it matters: a wait of this rank that gave up (this rank's
        work needed that rank's part), a host collective — a call that failed on every rank's
        host (bad arguments everywhere) launched nothing that waits, and raises nothing more.
        ``consume``: forget what was reported; the abort word stays set until :meth:`clear`."""
        records: list = []
        with self._lock:
            state = self._read(self.rank, 0, _STATE_SLOTS)
            causes = [(cls, text) for cls, _, text in self._local_causes(state)]
            gave_up = state[dev.HDR_GAVE_UP.value]
            origin = None
            if not causes and (gave_up or state[dev.HDR_ABORT.value]):
                records = self._records()
                fresh = [r for r in records if r[2] not in (CAUSE_LOST, CAUSE_HOST) and (r[1], r[0]) not in self._reported]
                first = records[0] if gave_up and records else (fresh[0] if fresh else None)
                if first is not None:
                    _, origin, kind, text, _ = first
                    more = f" (and {len(records) - 1} later cause(s))" if len(records) > 1 else ""
                    tail = f"; {gave_up} wait(s) of rank {self.rank} gave up" if gave_up else ""
                    causes.append((_CAUSE_CLASS.get(kind, PeerFailure), f"{text}{more}{tail}"))
                elif gave_up:
                    causes.append((PeerFailure, f"{gave_up} wait(s) of rank {self.rank} gave up: the job was "
                                                "aborted (no cause recorded)"))
            if consume and (causes or gave_up):
                self._write(self.rank, 0, [0] * _N_ERR_SLOTS)
                self._write(self.rank, _PTR_FIRST, [0] * (_PTR_LAST - _PTR_FIRST + 1))
                self._write(self.rank, dev.HDR_GAVE_UP.value, [0])
                self._reported.update((r[1], r[0]) for r in (records or self._records()))
        if not causes:
            return None
        cls = causes[0][0]
        err = cls("; ".join(text for _, text in causes))
        if cls is PeerFailure:
            err.rank = origin
        return err

    def clear(self, generation: int | None = None) -> None:
        """Re-arm this rank: clear its own records, the cause records it has seen and its abort
        word — which stays set while a peer is lost or when a newer cause arrived.

        ``generation``: in a barrier, the largest barrier count the ranks reported. Cause
        records are not erased then but hidden (:meth:`_records` shows those carrying this
        rank's count or a later one): a peer that already left the barrier may abort again at
        once, and its record, carrying the next count, must neither be erased by this rank nor
        lost to a race with it; every rank's count becomes ``generation + 1``. ``None``: every
        rank is idle (between two functions of a test pool): all cause records are erased."""
        with self._lock:
            if generation is not None:
                self.generation = generation + 1
            if self._context() is None:
                return
            self._write(self.rank, 0, [0] * _N_ERR_SLOTS)
            self._write(self.rank, _PTR_FIRST, [0] * (_PTR_LAST - _PTR_FIRST + 1))
            self._write(self.rank, dev.HDR_GAVE_UP.value, [0])
            if generation is None:
                for origin in range(self.world_size):
                    self._write(self.rank, cause_slot(self.world_size, origin), [0])
            self._propagated = False
            self._reported.clear()
            self._write(self.rank, dev.HDR_ABORT.value, [0])
            # a peer writes its record before its word: one that raced with the line above is seen here
            newer = self._records()
            for r, why in self._lost.items():
                self._record(self.rank, r, CAUSE_LOST, why)
            if newer or self._lost:
                self._write(self.rank, dev.HDR_ABORT.value, [dev.ABORT_BY_HOST.value])
