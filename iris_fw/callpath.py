"""The one call path of every collective call: :mod:`iris_fw.ccl`'s collectives, ``iris_fw.ops.*``
(taxonomy ops, ``gemm_all_reduce``), ``flash_decode`` and the Iris compat layer on top of them.

A call goes::

    key (cheap, from the arguments) ──hit──► prepared launch
        └─miss─► check locally ─► agree across ranks ─► plan ─► cache (one bounded CallCache) ─┘

* **Hit**: one dictionary look-up of the key (a fingerprint of the arguments: shapes, dtypes,
  devices, options) in the op's :class:`CallCache`, then the prepared launch — nothing checked
  twice, nothing bound twice.
* **Miss** (:func:`plan_call`): the arguments are checked locally; every rank's check and the
  call's fields meet in one exchange (``ctx.agree`` for ops, a group's mailbox for ccl and
  flash-decode), so a bad argument on one rank raises on every rank naming it; then the call is
  planned (algorithm, workspace, launchers) and cached.
* **Failure**: a host-side exception on this rank after the ranks agreed — inside the plan, or
  inside the launch of a hit — aborts the job's device waits (:meth:`~iris_fw.Context.abort`,
  :func:`fail`): the peers, already in the call's kernels or about to enter them, stop waiting at
  once and raise :class:`~iris_fw.PeerFailure` naming this rank, instead of waiting for the
  timeout. A rejection found by the agreement is raised by every rank alike and aborts nothing.

**Replay** (:class:`Replay`): a call that may be replayed (an ``iris_fw.ops`` call, a
collective, a flash-decode call: every effect on the device, the result one of its arguments —
a call without ``out=`` has its new result made first and writes it, so it comes back with the
same addresses whenever torch's allocator hands the result's address back) and comes back with
every tensor at the same address, the same strides and the same TF32 switch captures itself as
a CUDA graph on its third such call (:data:`CAPTURE_AFTER` eager calls first), on a side
stream, and is one graph launch from then on — in place of its prepared launches and their
Python — if its quickest replay took less host time than its quickest eager call, timed in
turn over the calls after the capture (:data:`REPLAY_TRIALS`; a call of one launch is often
quicker launched as it is; it then stays eager). A call that is not like that, or
anything that would make the eager call differ — a trace session, Triton launch hooks
(:func:`~iris_fw.kernel_launcher.triton_launch_hooked`), the caller's own graph capture, a
capture that fails — runs eagerly. The graphs live with the cached call (dropped with it, and
when the job re-arms after an abort); per-call state is on the device, so a replay does what
the call does. A capture that fails turns replay off for the context. A call nested in a call
being captured that fails aborts nothing: the capturing call runs again eagerly, and its
failure aborts the peers as any call's does. ``IRIS_FW_GRAPH_REPLAY=0`` (or
``state(ctx).replay = False``) turns it off.

Caches: one :class:`CallCache` per op — the context's ``ops`` cache of :class:`~iris_fw.engine.op.Op`
objects (``IRIS_FW_OP_CACHE_SIZE``), and per :mod:`iris_fw.ccl` group its ``calls`` (collectives
and flash-decode, :data:`MAX_CACHED_CALLS`). They hang off the context (:func:`state`) without
the context importing this module; the context clears them when it re-arms or closes.
"""

from __future__ import annotations

import enum
import time
import warnings
from collections import OrderedDict
from typing import Any, Callable

import torch

from . import driver, env
from .errors import ArgumentError
from .kernel_launcher import triton_launch_hooked

__all__ = ["CAPTURE_AFTER", "EXTENSION", "MAX_CACHED_CALLS", "MAX_GRAPHS", "REPLAY_TRIALS", "CallCache", "CallPaths",
           "PLAIN", "Replay", "address_key", "call", "fail", "plan_call", "state"]

#: Prepared calls a ccl group keeps (least recently used dropped; validated again when called again).
MAX_CACHED_CALLS = 1024
#: Eager calls with the same addresses before the next is captured as a CUDA graph (:class:`Replay`):
#: the first compiles and resolves the launches, the second shows the addresses repeat.
CAPTURE_AFTER = 2
#: Graphs one cached call keeps (one per set of addresses: ping-pong buffers take two, a layer's
#: weights one per layer of a model); beyond it, calls on other addresses run eagerly.
MAX_GRAPHS = 64
#: Sets of addresses a cached call counts before it forgets them (calls that never repeat).
MAX_SEEN = 256
#: Replays timed against as many eager calls, taken in turn after the capture, before the call
#: keeps replaying (its quickest replay quicker on the host than its quickest eager call) or
#: runs eagerly for good (0: keep replaying untimed). In turn, so that both meet the same
#: state of the host and the device; the quickest of each, so that a preempted call decides
#: nothing.
REPLAY_TRIALS = 4
#: The key under which a context holds its :class:`CallPaths` (``ctx.extensions``).
EXTENSION = "iris_fw.callpath"


class CallCache:
    """Prepared calls by key, at most ``capacity``: beyond it the least recently used entry is
    dropped (``lru``), or the oldest (``lru=False``: a hit costs no reordering — for caches large
    enough that order rarely matters). Every rank makes the same calls in the same order, so
    every rank keeps and drops the same entries; a dropped call is validated across ranks again
    when it comes back."""

    __slots__ = ("capacity", "lru", "_entries", "_recent", "_replays")

    def __init__(self, capacity: int, lru: bool = True):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ArgumentError(f"a call cache's capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.lru = lru
        self._entries: OrderedDict = OrderedDict()
        #: the entry made most recently used (the last one): a hit on it again — a loop of one
        #: call — reorders nothing
        self._recent = None
        #: the :class:`Replay` of an entry's calls, by the entry's ``id`` (an int: hashed in no
        #: time, where a key of dtypes and sizes is hashed again; made at the entry's first call
        #: that may be replayed, dropped with the entry, whose ``id`` it keeps while it lives)
        self._replays: dict = {}

    def get(self, key, default=None):
        """The entry under ``key`` (made most recently used), else ``default``. ``key`` None, or
        unhashable (an argument the full checks will report): ``default``."""
        if key is None:
            return default
        entries = self._entries
        try:
            entry = entries.get(key)
        except TypeError:
            return default
        if entry is None:
            return default
        if self.lru and entry is not self._recent:
            entries.move_to_end(key)
            self._recent = entry
        return entry

    def put(self, key, entry):
        """Keep ``entry`` under ``key`` (None: not kept); returns ``entry``."""
        if key is not None:
            entries = self._entries
            try:
                old = entries.get(key)
                entries[key] = entry
            except TypeError:  # unhashable (an argument the full checks reported): not kept
                return entry
            entries.move_to_end(key)
            self._recent = entry
            if old is not None:
                self._replays.pop(id(old), None)
            while len(entries) > self.capacity:
                self._replays.pop(id(entries.popitem(last=False)[1]), None)
        return entry

    __setitem__ = put

    def __contains__(self, key) -> bool:
        try:
            return key in self._entries
        except TypeError:
            return False

    def __iter__(self):
        return iter(list(self._entries))

    def values(self):
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (local; every rank does it at the same point)."""
        self._entries.clear()
        self._recent = None
        self._replays.clear()


# ---- replay ----------------------------------------------------------------------------------------


#: Values a replay key takes as they are (with their type).
PLAIN = (bool, int, float, str, enum.Enum, torch.dtype)


def address_key(args) -> tuple | None:
    """What a captured call bakes in of its arguments: each GPU tensor's address, shape, strides
    and dtype, plain values with their type (``True`` is not ``1``), tuples and lists element by
    element; None where an argument is anything else — a host tensor or an object whose contents
    the call may read on the host."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                return None
            parts.append((a.data_ptr(), a.shape, a.stride(), a.dtype))
        elif a is None:
            parts.append(a)
        elif isinstance(a, PLAIN):
            parts.append((type(a), a))
        elif isinstance(a, (tuple, list)):
            inner = address_key(a)
            if inner is None:
                return None
            parts.append(inner)
        else:
            return None
    return tuple(parts)


class _Torch:
    """torch's CUDA state as a replay reads it per call — whether the current stream is
    capturing, the current device, the TF32 switch of cuBLAS, the current stream's raw handle —
    through torch's C functions where it has them (a fraction of the public wrappers' host
    time), else the public calls."""

    def __init__(self):
        c = torch._C
        try:
            self.capturing, self.device, self.tf32 = (c._cuda_isCurrentStreamCapturing, c._cuda_getDevice,
                                                      c._get_cublas_allow_tf32)
            self.capturing(), self.device(), self.tf32()
        except (AttributeError, RuntimeError):  # pragma: no cover - a torch without them
            self.capturing, self.device = torch.cuda.is_current_stream_capturing, torch.cuda.current_device
            self.tf32 = lambda: torch.backends.cuda.matmul.allow_tf32
        self.stream = driver.current_stream()


class Replay:
    """The CUDA graphs of a cached call's entry ``fn`` (module docstring, "Replay"; kept beside the
    entry in its :class:`CallCache`): ``graphs`` maps the call's address key (``addresses``, with
    the device and the TF32 switch of cuBLAS) to ``[graph, at, graph_exec, eager_s, replay_s,
    trials]`` — the captured call, which argument it returned (None: nothing), its executable
    graph's raw handle (launched straight through the driver, :func:`iris_fw.driver.calls`; None:
    ``graph.replay()``), the least host time of its eager calls and of its replays since the
    capture, and the timed calls still to make: :data:`REPLAY_TRIALS` replays and as many eager
    calls, in turn. After them the call keeps replaying only if its quickest replay took less host
    time than its quickest eager call; else it runs eagerly for good (``off``: a one-launch call is
    often quicker launched than a graph). :meth:`run` replays where it can (while ``paths.replay``:
    the context's :class:`CallPaths`), else calls ``fn``."""

    __slots__ = ("fn", "paths", "fresh", "addresses", "graphs", "seen", "off")

    def __init__(self, fn, paths: "CallPaths", fresh: tuple | None = None, addresses: Callable | None = None):
        self.fn = fn
        self.paths = paths
        #: ``(i, make)`` where the call's result slot is its ``i``-th argument (:func:`call`)
        self.fresh = fresh
        #: ``args -> key`` of all that a captured call bakes in of its arguments, or None where
        #: it may not be captured (:func:`call`'s ``replay``); None: :func:`address_key`
        self.addresses = addresses
        self.graphs: dict = {}
        #: address key -> eager calls so far
        self.seen: dict = {}
        #: eager for good: a capture failed, the result was not one of the arguments, or a
        #: replay took no less host time than an eager call
        self.off = False

    def run(self, ctx, args):
        """The call on ``args``: replayed where captured for these addresses, captured on the
        :data:`CAPTURE_AFTER` + 1-th call with them, else run eagerly."""
        paths = self.paths
        cuda = paths.torch
        if self.off or not paths.replay or cuda is None or ctx.tracer is not None or cuda.capturing() \
                or triton_launch_hooked():
            return self.fn(*args)
        fresh = self.fresh
        if fresh is not None and args[fresh[0]] is None:  # a call that returns a new tensor: made first
            i = fresh[0]
            made = fresh[1](self.fn, args)
            if made is None:  # the call's result is new whatever it is given: never replayed
                return self.fn(*args)
            args = (*args[:i], made, *args[i + 1:])
        addresses = self.addresses
        key = address_key(args) if addresses is None else addresses(args)
        if key is None:
            return self.fn(*args)
        device = cuda.device()
        key = (device, cuda.tf32(), key)
        found = self.graphs.get(key)
        if found is not None:
            trial = found[5]  # a call still timed: replays and eager calls in turn
            if trial:
                if trial & 1:
                    return self._timed_eager(found, args)
                t0 = time.perf_counter()
            if found[2] is None:
                found[0].replay()
            else:  # (the driver's call itself, its status checked here: one frame fewer)
                rc = paths.launch_graph(found[2], cuda.stream(device))
                if rc:
                    paths.driver.launch_failed(rc)
            paths.replayed += 1
            if trial:
                self._timed(found, time.perf_counter() - t0)
            at = found[1]
            return None if at is None else args[at]
        seen = self.seen.get(key, 0)
        if seen < CAPTURE_AFTER or len(self.graphs) >= MAX_GRAPHS:
            if not seen and len(self.seen) >= MAX_SEEN:
                self.seen.clear()
            self.seen[key] = seen + 1
            return self.fn(*args)
        del self.seen[key]
        return self._capture(key, args)

    def _timed(self, found, seconds: float) -> None:
        """A timed replay took ``seconds``; after the last timed call, replay for good if the
        quickest replay took less host time than the quickest eager call, else eager for good."""
        found[4] = min(found[4], seconds)
        self._trial_done(found)

    def _timed_eager(self, found, args):
        """A timed eager call, between the timed replays (the call on the same arguments)."""
        t0 = time.perf_counter()
        result = self.fn(*args)
        found[3] = min(found[3], time.perf_counter() - t0)
        self._trial_done(found)
        return result

    def _trial_done(self, found) -> None:
        found[5] -= 1
        if not found[5] and found[4] >= found[3]:
            self.off = True
            self.graphs.clear()

    def _capture(self, key, args):
        """Capture the call on ``args`` (on a side stream, thread-local capture mode: nothing
        runs), keep the graph and replay it — or, where capturing failed or the call returned
        something other than one of its arguments (a new tensor from the graph's memory), drop
        it, run the call eagerly and never capture it again."""
        paths = self.paths
        graph = torch.cuda.CUDAGraph()
        if paths.side is None:
            paths.side = torch.cuda.Stream()
        side = paths.side
        side.wait_stream(torch.cuda.current_stream())
        result, at, failed = None, None, False
        paths.capturing += 1  # (a call nested in this one that fails does not abort the job: see call)
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    result = self.fn(*args)
                finally:
                    with warnings.catch_warnings():  # (torch warns of an empty graph: a call that launched nothing)
                        warnings.simplefilter("ignore")
                        graph.capture_end()
        except Exception:  # (an error the eager call raises again, or one of capturing)
            failed = True
            # what a failed capture leaves in torch's allocator is torch's to clean up: the
            # context captures nothing more
            paths.replay = False
        finally:
            paths.capturing -= 1
        if not failed and result is not None:
            at = next((i for i, a in enumerate(args) if a is result), None)
            failed = at is None
        if failed:
            self.off = True
            self.graphs.clear()
            del graph
            return self.fn(*args)
        graph_exec = None
        if paths.driver is not None and hasattr(graph, "raw_cuda_graph_exec"):
            graph_exec = graph.raw_cuda_graph_exec() or None
        self.graphs[key] = [graph, at, graph_exec, float("inf"), float("inf"), 2 * REPLAY_TRIALS]
        graph.replay()
        return result


class CallPaths:
    """What the call path keeps per context: ``ops`` (the :class:`CallCache` of
    ``iris_fw.ops.<name>(...)`` calls), ``groups`` (the :mod:`iris_fw.ccl` groups by their
    ranks, ``None`` for the world; each group holds the cache of its collective calls) and
    ``replay`` (whether calls that may be replayed are: a GPU context, ``IRIS_FW_GRAPH_REPLAY``,
    not ``IRIS_FW_DEBUG``)."""

    def __init__(self, ctx):
        self.ops = CallCache(env.get("IRIS_FW_OP_CACHE_SIZE"))
        self.groups: dict = {}
        self.replay = ctx.device.type == "cuda" and bool(env.get("IRIS_FW_GRAPH_REPLAY")) and not ctx.debug
        #: what a replay calls (:class:`_Torch`, :func:`iris_fw.driver.calls`): made where it replays
        self.torch = _Torch() if self.replay else None
        self.driver = driver.calls() if self.replay else None
        #: the driver's graph launch, ``(graph_exec, stream) -> status`` (:class:`iris_fw.driver.DriverCalls`)
        self.launch_graph = None if self.driver is None else self.driver.launch_graph_status
        #: the stream captures run on (made at the first); captures in progress
        self.side = None
        self.capturing = 0
        #: calls replayed so far (graph launches: e.g. ``iris-fw bench host``'s ``replayed`` column)
        self.replayed = 0

    def groups_once(self) -> list:
        """Every group once (the world's is also under ``None``)."""
        return list({id(g): g for g in self.groups.values()}.values())

    def rearm(self) -> None:
        """After an abort (the context's re-arming barrier): the per-call device state of calls in
        flight may differ across ranks, so every cached op is dropped and every group starts afresh."""
        self.ops.clear()
        for group in self.groups_once():
            group.reset()

    def close(self) -> None:
        """The context closes: nothing cached may launch over its heaps any more."""
        self.ops.clear()
        self.groups.clear()

    clear = close


def state(ctx) -> CallPaths:
    """The :class:`CallPaths` of ``ctx`` (made on first use)."""
    ext = ctx.extensions
    found = ext.get(EXTENSION)
    if found is None:
        found = ext[EXTENSION] = CallPaths(ctx)
    return found


def fail(ctx, label: str, exc: BaseException) -> None:
    """A host failure of this rank inside the call ``label``, after the ranks agreed on it: abort
    the job's device waits (peers in the call's kernels raise :class:`~iris_fw.PeerFailure`
    naming this rank at once) and put it on this rank's call board (peers waiting for this rank
    in a host exchange raise it too). Raises nothing itself."""
    from .errors import CallMismatch, PeerFailure

    if getattr(exc, "_iris_fw_told", False) or ctx.closed or isinstance(exc, (PeerFailure, CallMismatch)) \
            or getattr(exc, "from_peer", None) is not None:
        return  # told already, or a peer's failure (the peer told the job)
    try:
        exc._iris_fw_told = True  # one abort per failure, however many call paths it crosses
    except AttributeError:
        pass
    text = f"{label}: {type(exc).__name__}: {exc}"
    try:
        ctx.abort(text)
        board = PeerFailure(f"rank {ctx.rank} failed: {text}")
        board.rank = ctx.rank
        ctx.calls.fail(board)
    except Exception:  # pragma: no cover - a closing transport: the original error matters
        pass


def plan_call(ctx, label: str, check: Callable[[], tuple], agree: Callable[[dict, BaseException | None, Any], Any],
              plan: Callable[[Any, Any], Any], settle: Callable[[BaseException | None], None] | None = None):
    """The miss path: ``check()`` validates the arguments on this rank and returns ``(fields,
    state, extra)``; ``agree(fields, error, extra)`` is the cross-rank exchange (it raises on every
    rank when a rank rejected its arguments or the fields differ, and returns what it gathered);
    ``plan(state, agreed)`` makes the prepared call. A failure inside ``plan`` — after every rank
    agreed, so the peers go on into the call — aborts the peers (:func:`fail`).

    With ``settle`` (e.g. :func:`settled`), every rank — one whose ``plan`` failed too, with its
    failure — calls ``settle(failure)`` after planning, which raises on every rank if a rank
    failed: no rank goes into the call before every rank planned (its peer-visible buffers
    zeroed), and nothing needs aborting."""
    fields, st, extra, error = {}, None, None, None
    try:
        fields, st, extra = check()
    except Exception as exc:  # every rank must hear of it, or they would wait for this one
        error = exc
    agreed = agree(fields, error, extra)
    if settle is None:
        try:
            return plan(st, agreed)
        except BaseException as exc:
            fail(ctx, label, exc)
            raise
    made, failure = None, None
    try:
        made = plan(st, agreed)
    except Exception as exc:  # the peers hear of it in the settling exchange
        failure = exc
    settle(failure)
    return made


def settled(ctx, label: str, failure: BaseException | None) -> None:
    """The settling exchange of a plan whose buffers peers write into (:func:`plan_call`'s
    ``settle``): this rank's queued device work — the zero fills of the plan's flags and state —
    finishes, then one host exchange; a rank whose planning failed re-raises its failure, the
    others raise :class:`~iris_fw.PeerFailure` naming it. Without it a peer that planned sooner
    could launch and write into this rank's state before its fill ran (the fill then wipes it)."""
    from .errors import PeerFailure

    if failure is None:
        try:
            ctx.transport.synchronize()
        except Exception as exc:  # a device fault here: the peers must still hear of it
            failure = exc
    why = None if failure is None else f"{type(failure).__name__}: {failure}"
    reports = ctx.calls.host_call(f"{label}: planned", why)
    if failure is not None:
        raise failure
    failed = [(r, text) for r, text in enumerate(reports) if text]
    if failed:
        rank, text = failed[0]
        error = PeerFailure(f"rank {ctx.rank} in {label}: rank {rank} failed while planning the call: {text}")
        error.rank = error.from_peer = rank
        raise error


def call(ctx, cache: CallCache, key, prepare: Callable[[Any], Callable], on, label: str, *args,
         replay: bool | Callable = False, fresh: tuple | None = None):
    """One call: the prepared entry under ``key`` in ``cache`` — made by ``prepare(on)`` (which
    goes through :func:`plan_call`; ``on``: what it plans on, e.g. a ccl group) on a miss; ``key``
    None: prepared and not kept — called on ``args``; its result is returned. A host failure in
    the entry aborts the peers (:func:`fail`).

    ``replay``: True where this call may be replayed as a CUDA graph (:class:`Replay`: every
    effect on the device, its result one of ``args`` or None), e.g. a functional call with
    ``out``; or, for such a call, a function ``args -> key`` of all that a capture bakes in of
    its arguments (None: not to be captured), where the call knows it to be less than
    :func:`address_key`'s every tensor's address, shape, strides and dtype (a collective's:
    its tensors' addresses); the TF32 switch of cuBLAS is part of every replay's key.

    ``fresh``: ``(i, make)`` where such a call's result slot is ``args[i]`` (its ``out``): where it
    is None — a call that returns a new tensor — and the call may be replayed, ``make(entry, args)``
    makes that tensor first and the call writes it: the call is then replayed whenever torch's
    allocator hands back an address it had (a loop whose last result is dropped: two addresses in
    turn). ``make`` returns None where the call's result is new whatever it is given: the call then
    runs eagerly, as it is.

    The hit path is this function: one look-up of the key, the entry called (or replayed)."""
    if ctx._closed:
        ctx._check_open()  # raises: a cached call must not launch over a closed context's heaps
    entries = cache._entries
    try:
        entry = entries.get(key)
    except TypeError:  # an unhashable argument (the full checks report it): not kept
        entry, key = None, None
    if entry is None:
        entry = cache.put(key, prepare(on))
    elif cache.lru and entry is not cache._recent:  # (a loop of one call: already the last)
        entries.move_to_end(key)
        cache._recent = entry
    try:
        if replay and key is not None:
            replays = cache._replays
            found = replays.get(id(entry))
            if found is None:
                found = replays[id(entry)] = Replay(entry, state(ctx), fresh, None if replay is True else replay)
            return found.run(ctx, args)
        return entry(*args)
    except BaseException as exc:
        paths = ctx.extensions.get(EXTENSION)
        if paths is None or not paths.capturing:  # (under a capture: the capturing call runs it again eagerly)
            fail(ctx, label, exc)
        raise
