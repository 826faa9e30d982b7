"""Call identity: which call each rank is in, so that ranks in different calls say so at once.

Every host exchange of a context (:meth:`~iris_fw.Context.agree`, ``barrier``, ``broadcast``,
``check_symmetry``, ``close``, …) carries the identity of the call — what was called and the
rank's host-call number — and every rank compares the identities it receives: ranks that paired
two different calls raise :class:`~iris_fw.CallMismatch` naming the call of each rank.

Ranks do not always meet in one exchange: one may validate a new call (a host exchange, or a
:mod:`iris_fw.ccl` group's mailbox) while another repeats a call it validated before (no host
exchange: the cache-hit path) and waits on the device, or has gone on to another host call. Two
kinds of evidence end such a wait at once, without anything added to the cache-hit path:

* the **call board**, a few words after the watchdog's records in every rank's heap header
  (written by that rank only, on its slow paths): the host-call number and what the rank is in,
  or the error it failed with. A rank waiting in a group's exchange whose peer has entered a
  later host call, or any waiting rank whose peer failed, knows it will wait in vain;
* **epoch counters**: the per-program call counters of every kernel configuration of a ccl
  group and of every op's kernels live on the symmetric heap, where a waiting rank (its own
  device work finished) reads its peers'. A peer whose counters are ahead of this rank's has
  launched a call this rank did not make.

The rank that finds such evidence raises :class:`~iris_fw.CallMismatch` naming its call and the
peer's, writes the message on its board (peers waiting on the host raise it too) and aborts the
job's device waits (peers waiting on the device raise :class:`~iris_fw.PeerFailure` with it).

A host exchange is bounded: it waits at most :func:`host_timeout` seconds (the wait timeout
plus the liveness bound), then raises :class:`~iris_fw.WaitTimeout` naming the ranks that
did not arrive and the last call each of them was in.
"""

from __future__ import annotations

import time
import weakref
from typing import Callable

import torch

from .errors import CallMismatch, IrisError, PeerFailure, WaitTimeout

#: int64 words of one rank's board: host-call number, failure kind, state, text length, text.
BOARD_SLOTS = 64
_TEXT_BYTES = (BOARD_SLOTS - 4) * 8
#: What a board's ``state`` word says the rank is in.
IDLE, IN_HOST_CALL, IN_GROUP_CALL = 0, 1, 2
#: Failure kinds on a board (0: none) and the error a peer raises for each.
_FAILED = {1: CallMismatch, 2: WaitTimeout, 3: PeerFailure}
_KIND = {cls: kind for kind, cls in _FAILED.items()}
#: How the abort for a call mismatch found while waiting (:meth:`Calls.mismatch`) begins its cause.
_MISMATCH_CAUSE = "CallMismatch: "
#: Seconds between two looks at the peers' boards and counters while a rank waits.
CHECK_INTERVAL_S = 0.1
#: Validated calls named per kernel in a message (the rest: "…").
_MAX_DESCRIBED = 3
#: Marks a host exchange's payload (anything else came from code that uses the bootstrap directly).
_ENVELOPE = "iris_fw host call"


def host_timeout(ctx) -> float:
    """Seconds a host exchange of ``ctx`` waits for its peers: the wait timeout plus the liveness
    bound. A peer may be in a device wait that gives up only after the wait timeout and then
    needs its host to report, and host code runs at the host's pace (a compile, a reference
    computed on one rank): the host bound lets both finish, and stays a bound."""
    return ctx.wait_timeout + ctx.watchdog.timeout


def describe_call(label: str, fields: dict, group=None) -> str:
    """``label(name=value, …)`` (and ``(call #n of the group [...])``): a call as messages name it."""
    def show(v):
        return str(v).replace("torch.", "") if isinstance(v, torch.dtype) else repr(v)

    args = ", ".join(f"{k}={show(v)}" for k, v in fields.items()
                     if v is not None and k not in ("pattern", "device") and (k != "algorithm" or v != "auto"))
    where = f" (call #{group._seq} of the group {list(group.ranks)})" if group is not None else ""
    return f"{label}({args}){where}"


def _encode(text: str) -> list[int]:
    data = text.encode()[:_TEXT_BYTES]
    n = len(data)
    data += b"\0" * (-n % 8)
    return [n] + [int.from_bytes(data[i:i + 8], "little", signed=True) for i in range(0, len(data), 8)]


def _decode(words: list[int]) -> str:
    n = max(0, min(words[0], _TEXT_BYTES))
    raw = b"".join(w.to_bytes(8, "little", signed=True) for w in words[1:])
    return raw[:n].decode(errors="replace")


class Calls:
    """One rank's call identity: its board, its host-call number, the epoch counters of its
    groups and ops, and the checks a waiting rank makes (see the module docstring)."""

    def __init__(self, ctx, slot: int):
        self._ctx = weakref.ref(ctx)
        self.slot = slot
        #: host exchanges this rank has entered
        self.host_seq = 0
        self._told = False
        #: owner (a ccl group, an op) -> [(description, int64 counters on the heap)]
        self._counters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    # ---- the board --------------------------------------------------------------------------------
    def _write(self, state: int, text: str, kind: int = 0) -> None:
        ctx = self._ctx()
        words = _encode(text)
        ctx.transport.set_header_words(ctx.rank, self.slot + 3, words)
        ctx.transport.set_header_words(ctx.rank, self.slot, [self.host_seq, kind, state])

    def board(self, rank: int) -> tuple[int, int, int, str]:
        """``rank``'s board: ``(host-call number, failure kind, state, text)``."""
        words = self._ctx().transport.header_words(rank, self.slot, BOARD_SLOTS)
        return words[0], words[1], words[2], _decode(words[3:])

    def enter(self, state: int, text: str) -> None:
        """This rank enters a host call (``IN_HOST_CALL``, counted) or a group's exchange."""
        if state == IN_HOST_CALL:
            self.host_seq += 1
        self._write(state, text)

    def leave(self) -> None:
        self._write(IDLE, "")

    def fail(self, error: BaseException) -> BaseException:
        """Put ``error`` on this rank's board (peers waiting for this rank in a call of this rank's
        host-call number or a later one raise it); returns it."""
        self._write(IDLE, str(error), _KIND.get(type(error), _KIND[PeerFailure]))
        return error

    def rearm(self) -> None:
        """Every rank re-armed the job (the barrier after an abort): the epoch counters of calls
        that were in flight may differ across ranks, and the groups and ops that own them start
        afresh (they track their new counters again)."""
        self._counters.clear()
        self._told = False

    # ---- epoch counters ---------------------------------------------------------------------------
    def track(self, owner, description: str, counters: torch.Tensor) -> None:
        """Watch ``counters`` (int64 on the heap, per-program call counts of a kernel of
        ``owner``) for peers that are ahead; ``description`` names the call(s) that run it."""
        self._counters.setdefault(owner, []).append((description, counters))

    def describe(self, owner, counters: torch.Tensor, description: str) -> None:
        """Add ``description`` (another validated call that runs ``counters``' kernel)."""
        rows = self._counters.get(owner, [])
        for i, (text, c) in enumerate(rows):
            if c is counters and description and description not in text:
                if text.count("; ") >= _MAX_DESCRIBED - 1:  # a kernel shared by many calls: name a few
                    if not text.endswith("…"):
                        rows[i] = (f"{text}; …", c)
                else:
                    rows[i] = (f"{text}; {description}", c)

    def _idle(self) -> bool:
        ctx = self._ctx()
        if ctx.device.type != "cuda":
            return True
        return not torch.cuda.is_current_stream_capturing() and torch.cuda.current_stream(ctx.device).query()

    def ahead(self, peers) -> tuple[int, str] | None:
        """``(peer, description)`` of a peer that launched a kernel this rank did not (its epoch
        counters are ahead of this rank's), or None. Only while this rank's device is idle and the
        job is not aborted (a call in flight at an abort leaves counters unequal until the re-arm)."""
        ctx = self._ctx()
        if not peers or not self._counters or ctx.watchdog.aborted or not self._idle():
            return None
        for owner, rows in list(self._counters.items()):
            members = getattr(owner, "ranks", None)
            for description, counters in rows:
                mine = counters.cpu()
                for p in peers:
                    if members is not None and p not in members:
                        continue
                    theirs = ctx.peer_view(counters, p).cpu()
                    if bool((theirs > mine).any()):
                        return p, description
        return None

    # ---- checks while waiting ---------------------------------------------------------------------
    def check(self, mine: str, peers, group: bool = False, recovering: bool = False,
              joined: Callable[[int], bool] | None = None) -> None:
        """Raise if a peer in ``peers`` will not join this rank's call ``mine``: it failed (its
        board: in this host call or a later one, or — while the job is aborted and this is not
        the barrier that recovers from it (``recovering``) — inside a call before this one, see
        :func:`iris_fw.callpath.fail`), it launched a kernel this rank did not, or (``group``: this
        rank waits in a group's exchange) it entered a later host call — :class:`~iris_fw.PeerFailure`
        with the abort's cause where the job was aborted by another rank's host failure inside a call
        (:meth:`~iris_fw.watchdog.Watchdog.host_failure`: the failed rank's board no longer says so once
        it entered its re-arming barrier), else :class:`CallMismatch`. Called between polls of a
        wait.

        Counters ahead are evidence only from a peer that has not joined this exchange: one that
        has (``joined(peer)``, a group's exchange: its post is there; a host call: its board's
        host-call number has reached this one) may have completed it — every post arrived after
        this rank's last poll — and launched the next kernel before this rank polls again. Read
        after the counters, so a peer seen ahead and not joined had not joined when it launched."""
        ctx = self._ctx()
        aborted = None
        for p in peers:
            seq, kind, state, text = self.board(p)
            if kind and seq < self.host_seq and kind == _KIND[PeerFailure] and not recovering:
                if aborted is None:
                    aborted = ctx.watchdog.aborted
                if aborted:
                    seq = self.host_seq  # the job was aborted by this failure and not re-armed yet
            if kind and seq >= self.host_seq:  # (an older failure: the peer has recovered or will be lost)
                cls = _FAILED.get(kind, PeerFailure)
                error = cls(f"rank {ctx.rank} in {mine}: rank {p} failed: {text}")
                if isinstance(error, PeerFailure):
                    error.rank = p
                error.from_peer = p  # (not this rank's own timeout)
                raise error
            if group and state == IN_HOST_CALL and seq > self.host_seq:
                failed = ctx.watchdog.host_failure()
                if failed is not None and failed[0] != ctx.rank and f"failed: {_MISMATCH_CAUSE}" not in failed[1]:
                    # the job was aborted by a rank's host failure inside a call (its board, overwritten by
                    # its next host call — the re-arming barrier —, no longer says so): that failure is why
                    # the peer went on, and what this rank raises (an abort for a call mismatch found
                    # while waiting: the mismatch below, as before)
                    origin, text = failed
                    error = PeerFailure(f"rank {ctx.rank} in {mine}: {text}")
                    error.rank = error.from_peer = origin
                    raise error
                raise self.mismatch(f"rank {p} is in {text} (its host call #{seq}) while rank {ctx.rank} is in {mine}: "
                                    f"rank {p} went on without this call (it skipped it, or called another collective)")
        found = self.ahead(peers)
        if found is not None and not self._told:
            p, description = found
            if joined(p) if joined is not None else self.board(p)[0] >= self.host_seq:
                return  # it is in this exchange (or done with it): its counters are its next call's
            raise self.mismatch(
                f"rank {p} launched a call this rank did not make — {description} — while rank {ctx.rank} "
                f"is in {mine} "
                f"(rank {p} repeated a validated call while this rank's arguments changed — a shape or dtype "
                "differs on one rank — or it called another collective)")

    def mismatch(self, text: str) -> CallMismatch:
        """A :class:`CallMismatch` found while waiting: on the board, and the job's device waits
        aborted (a peer waiting on the device raises it as the cause)."""
        error = self.fail(CallMismatch(text))
        self._ctx().abort(f"{_MISMATCH_CAUSE}{text}")
        self._told = True  # (until the re-arm: the peer's counters stay ahead)
        return error

    # ---- host exchanges ---------------------------------------------------------------------------
    def host_call(self, what: str, obj=None, detail: str | None = None) -> list:
        """One host exchange of every rank (the bootstrap's all-gather) carrying this call's
        identity ``what``; returns every rank's ``obj``. Ranks in different calls raise
        :class:`CallMismatch`; a rank that does not arrive within :func:`host_timeout` is named
        in a :class:`WaitTimeout`. ``detail``: the call as the board shows it (default ``what``).

        A peer found to be in a call of its own while this rank waits (its epoch counters are
        ahead) is told at once (the board, the abort word), but this rank goes on waiting in the
        exchange — the peer, its wait aborted, comes to its next host call and completes this one
        (leaving the bootstrap in step), or is lost — and then raises the mismatch."""
        ctx = self._ctx()
        boot = ctx.bootstrap
        self.enter(IN_HOST_CALL, detail or what)
        seq = self.host_seq
        peers = [r for r in range(ctx.world_size) if r != ctx.rank]
        bound = host_timeout(ctx)
        last, found = [time.monotonic()], []
        recovering = what.startswith("Context.barrier") or what == "Context.close"

        def interrupt(_what: str) -> None:
            now = time.monotonic()
            if not found and now - last[0] >= CHECK_INTERVAL_S:
                last[0] = now
                try:
                    self.check(detail or what, peers, recovering=recovering)
                except CallMismatch as exc:  # on the board and the peers aborted: wait for them to come
                    found.append(exc)

        boot.deadline_s, boot.interrupt = bound, interrupt
        try:
            reports = boot.all_gather((_ENVELOPE, seq, what, detail or what, obj))
        except WaitTimeout as exc:
            if found:
                raise found[0] from None
            if getattr(exc, "from_peer", None) is not None:
                raise
            raise self.fail(self._timed_out(seq, what, bound)) from None
        except IrisError:
            if found:
                raise found[0] from None
            raise
        finally:
            boot.deadline_s = boot.interrupt = None
        if found:
            raise found[0]
        ids = [(r[1], r[2], r[3]) if isinstance(r, tuple) and len(r) == 5 and r[0] == _ENVELOPE else None
               for r in reports]
        if any(i is None or i[:2] != (seq, what) for i in ids):
            groups: dict = {}
            for r, i in enumerate(ids):
                text = (f"{i[2]} (host call #{i[0]})" if i is not None
                        else "an exchange of its own through ctx.bootstrap (not an iris-fw host call)")
                groups.setdefault(text, []).append(r)
            detail_text = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {t}"
                                    for t, rs in groups.items())
            self.leave()
            raise CallMismatch(f"ranks are in different calls ({detail_text}): every rank must make the same "
                               "collective calls in the same order")
        self.leave()
        return [r[4] for r in reports]

    def _timed_out(self, seq: int, what: str, bound: float) -> WaitTimeout:
        ctx = self._ctx()
        late = []
        for p in range(ctx.world_size):
            if p == ctx.rank:
                continue
            pseq, kind, state, text = self.board(p)
            if pseq < seq or (pseq == seq and state != IN_HOST_CALL):
                where = {IN_HOST_CALL: f"its last host call, #{pseq}, was {text}",
                         IN_GROUP_CALL: f"it is in {text}"}.get(state,
                                                                f"its last host call was #{pseq}; it is in none now")
                late.append(f"rank {p} ({where})")
        who = "; ".join(late) if late else "a rank (the bootstrap did not complete)"
        return WaitTimeout(f"rank {ctx.rank}: {what} (host call #{seq}) waited {bound:g} s (the wait timeout plus "
                           f"the liveness bound) for {who}: it did not arrive — it is busy, hangs, or skipped "
                           "the call")
