"""Communication groups: the ranks a collective runs over, their symmetric workspace, and the
host exchange that validates a call once.

A :class:`Group` is created collectively by *every* rank of the context (as
``torch.distributed.new_group`` is), including ranks outside it, because its workspace is a
symmetric heap block: ``ccl.new_group(ranks)``. The world group is created by the first
collective call on it. A group holds:

* ``heap_bases`` — the members' heap bases in group order (int64 ``[world_size]``, zeros after
  the members; with the context's switches, a :class:`iris_fw.device.DeviceHeaps`), so every device function of :mod:`iris_fw.tilecomm` runs unchanged with the
  group rank and group size;
* a workspace (``workspace_bytes``, default :func:`default_workspace_bytes`) from which each
  *kernel configuration* (algorithm × dtype × capacity class) carves its own counters, arrival
  slots and receive buffers on first use — identically on every member, since members make the
  same calls in the same order (validated); configurations never share buffers, so a call of
  one never races a peer still in a call of another;
* a *mailbox* at the workspace's start: the members' host exchange. A call whose arguments the
  group has not seen posts its fields there and reads every member's (bounded by the context's
  ``wait_timeout``); a mismatch or a rejected argument raises on every member naming the ranks
  and the argument. Later calls with the same arguments skip it: a call costs a dictionary
  look-up and a kernel launch.

Only members take part in a group's calls; the exchange goes through the members' heaps, not
the bootstrap, so it needs no other rank.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Callable

import torch

from ..callpath import MAX_CACHED_CALLS, CallCache
from ..call_identity import CHECK_INTERVAL_S, IN_GROUP_CALL, describe_call
from ..core import check_reports
from ..errors import ArgumentError, CallMismatch, IrisError, WaitTimeout

#: Bytes of one mailbox message (pickled fields); two per member, used by exchange parity.
MAILBOX_BYTES = 1 << 16
#: Alignment of the buffers carved from a workspace.
CARVE_ALIGN = 256
#: Workspace of a group unless given: a quarter of the heap, at most this many bytes.
MAX_DEFAULT_WORKSPACE = 256 << 20


def default_workspace_bytes(ctx) -> int:
    """A group's workspace unless ``workspace_bytes`` is given: ``IRIS_FW_CCL_WORKSPACE`` bytes,
    else a quarter of the heap up to :data:`MAX_DEFAULT_WORKSPACE`."""
    from .. import env

    size = env.get("IRIS_FW_CCL_WORKSPACE")
    if size is not None:
        return size
    return min(ctx.heap_size // 4, MAX_DEFAULT_WORKSPACE)


class WorkspaceFull(IrisError, MemoryError):
    """A group's workspace has no room for another kernel configuration."""


class Group:
    """The ranks of a collective (global ranks in group order), seen from one rank.

    Attributes: ``ranks`` (tuple of global ranks), ``size``, ``rank`` (this rank's index in
    ``ranks``, ``None`` for a non-member), ``heap_bases`` (a :class:`iris_fw.device.DeviceHeaps`
    with the context's switches: members' bases in group order, then zeros),
    ``workspace`` (uint8, symmetric), ``ctx``."""

    def __init__(self, ctx, ranks: tuple[int, ...], workspace_bytes: int):
        self.ctx = ctx
        self.ranks = ranks
        self.size = len(ranks)
        self.rank = ranks.index(ctx.rank) if ctx.rank in ranks else None
        # members' bases in group order, then zeros up to the world size: a device pointer check
        # (iris_fw.device.translate) reports a peer index outside the group instead of reading past
        self.heap_bases = ctx.heap_bases._replace(bases=torch.cat([
            ctx.heap_bases.bases[list(ranks)],
            torch.zeros(ctx.world_size - self.size, dtype=torch.int64, device=ctx.device)]))
        need = self.min_workspace_bytes()
        if workspace_bytes < need:
            raise ArgumentError(f"workspace_bytes must be at least {need} for a group, got {workspace_bytes}")
        self.workspace = ctx.zeros(workspace_bytes, dtype=torch.uint8)
        self._used = self._mailbox_bytes()
        self._seq = 0
        #: the call being planned (its description names the kernels it makes, see iris_fw.call_identity)
        self.planning = ""
        #: prepared calls: key -> launch function (a call whose key is here was validated): the
        #: group's one call cache (:class:`iris_fw.callpath.CallCache`)
        self.calls = CallCache(MAX_CACHED_CALLS, lru=False)
        #: kernel configurations: key -> whatever the algorithm keeps for it
        self.configs: dict = {}

    def reset(self) -> None:
        """Start afresh after an abort (every rank of the context, at the barrier that re-arms
        the job; it meets the others once more before any uses a group): the workspace zeroed,
        kernel configurations and validated calls forgotten, the mailbox at sequence 0."""
        self.ctx.transport.synchronize()
        self.workspace.zero_()
        self._used = self._mailbox_bytes()
        self._seq = 0
        self.calls.clear()
        self.configs.clear()

    # ---- workspace ------------------------------------------------------------------------------
    @staticmethod
    def _mailbox_bytes() -> int:
        return 2 * MAILBOX_BYTES + CARVE_ALIGN

    @classmethod
    def min_workspace_bytes(cls) -> int:
        """The smallest workspace a group can have (its mailbox and one buffer)."""
        return cls._mailbox_bytes() + CARVE_ALIGN

    @property
    def member(self) -> bool:
        return self.rank is not None

    def carve(self, numel: int, dtype: torch.dtype, what: str) -> torch.Tensor:
        """A zeroed ``[numel]`` tensor of ``dtype`` from the workspace (symmetric: every member
        carves the same sequence). Raises :class:`WorkspaceFull` naming ``what``."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        start = (self._used + CARVE_ALIGN - 1) // CARVE_ALIGN * CARVE_ALIGN
        if start + nbytes > self.workspace.numel():
            raise WorkspaceFull(
                f"ccl group {list(self.ranks)}: no room for {what} ({nbytes} bytes) in the workspace of "
                f"{self.workspace.numel()} bytes ({start} used); create the group with a larger "
                f"workspace_bytes (ccl.new_group) or set IRIS_FW_CCL_WORKSPACE")
        self._used = start + nbytes
        return self.workspace[start:start + nbytes].view(dtype)

    def config(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The kernel configuration under ``key``, made (carving its buffers) on first use."""
        cfg = self.configs.get(key)
        if cfg is None:
            cfg = self.configs[key] = make()
        return cfg

    # ---- host exchange (the mailbox) ------------------------------------------------------------
    def _box(self, parity: int) -> torch.Tensor:
        return self.workspace[parity * MAILBOX_BYTES:(parity + 1) * MAILBOX_BYTES]

    def _seq_word(self) -> torch.Tensor:
        return self.workspace[2 * MAILBOX_BYTES:2 * MAILBOX_BYTES + 8].view(torch.int64)

    def _post(self, seq: int, payload: bytes) -> None:
        blob = len(payload).to_bytes(8, "little") + payload
        box = self._box(seq % 2)
        box[:len(blob)].copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        self.ctx.transport.synchronize()
        self._seq_word().fill_(seq)
        self.ctx.transport.synchronize()

    def _read(self, peer: int, seq: int, deadline: float, call: str) -> bytes | None:
        word = self.ctx.peer_view(self._seq_word(), self.ranks[peer])
        pause, checked = 20e-6, time.monotonic()
        while int(word.item()) < seq:
            now = time.monotonic()
            if now > deadline:
                return None
            self.ctx.watchdog.check(f"the group {list(self.ranks)}'s exchange")  # a lost member: raise now
            if now - checked >= CHECK_INTERVAL_S:  # a member in another call, or failed: raise now
                checked = now
                self.ctx.calls.check(call, [self.ranks[peer]], group=True,
                                     joined=lambda _p: int(word.item()) >= seq)
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
        box = self.ctx.peer_view(self._box(seq % 2), self.ranks[peer])
        size = int.from_bytes(bytes(box[:8].cpu().numpy()), "little")
        return bytes(box[8:8 + size].cpu().numpy())

    def exchange(self, label: str, fields: dict, error: BaseException | None = None, extra: Any = None) -> list:
        """Members only, one exchange: every member's ``fields`` must be equal and no member may
        have rejected its arguments (``error``), else every member raises (see
        :func:`iris_fw.core.check_reports`); returns every member's ``extra`` in group order
        (per-rank values that legitimately differ, e.g. all-to-all split sizes). A member that
        does not post within the context's ``wait_timeout`` makes the others raise
        :class:`~iris_fw.WaitTimeout` naming it."""
        if not self.member:
            raise ArgumentError(f"{label}: rank {self.ctx.rank} is not in the group {list(self.ranks)}")
        self._seq += 1
        rejected = None if error is None else f"{type(error).__name__}: {error}"
        call = describe_call(label, fields, self)
        payload = pickle.dumps((rejected, fields, extra, call))
        if len(payload) + 8 > MAILBOX_BYTES:
            raise ArgumentError(f"{label}: the call's description ({len(payload)} bytes) does not fit the "
                                f"group's mailbox ({MAILBOX_BYTES - 8} bytes)")
        calls = self.ctx.calls
        calls.enter(IN_GROUP_CALL, call)
        self._post(self._seq, payload)
        deadline = time.monotonic() + self.ctx.wait_timeout
        reports, missing = [], []
        try:
            for p in range(self.size):
                got = self._read(p, self._seq, deadline, call)
                if got is None:
                    missing.append(self.ranks[p])
                    reports.append(None)
                else:
                    reports.append(pickle.loads(got))
        except CallMismatch:
            raise
        except BaseException as exc:  # a lost member, a peer's failure: the others waiting for this rank hear of it
            calls.fail(exc)
            raise
        if missing:
            raise calls.fail(WaitTimeout(
                f"{call}: rank(s) {missing} of the group {list(self.ranks)} did not enter the call within "
                f"{self.ctx.wait_timeout:g} s (a rank skipped it, called another collective, or repeated "
                f"a call with arguments it had already validated while this rank's differ)"))
        calls.leave()
        labels = [c for _, _, _, c in reports]
        names = [c.split(" (call #")[0].split("(")[0] for c in labels]
        if any(n != names[0] for n in names[1:]):
            groups: dict = {}
            for r, c in zip(self.ranks, labels):
                groups.setdefault(c, []).append(r)
            raise CallMismatch("ranks called different collectives on the group "
                               f"{list(self.ranks)}: " + "; ".join(f"rank{'s' if len(rs) > 1 else ''} "
                                                                   f"{', '.join(map(str, rs))}: {c}"
                                                                   for c, rs in groups.items()))
        check_reports(label, [(why, f) for why, f, _, _ in reports], error, ranks=self.ranks)
        return [x for _, _, x, _ in reports]

    def sync(self, label: str) -> None:
        """Members only: return once every member's device work queued so far has finished and
        every member got here (one exchange without fields)."""
        self.exchange(label, {})

    def __repr__(self) -> str:
        return f"<iris_fw.ccl.Group ranks={list(self.ranks)} rank={self.rank}>"
