"""Host side of tracing: trace sessions (``with ctx.trace("run.json"):``), the trace buffers
kernels record into (:mod:`iris_fw.trace` is the device side), the alignment of the ranks'
clocks, and the export to Chrome-trace / Perfetto JSON.

A session is collective. Entering it aligns the clocks (below) and turns tracing on: every op
and collective launched inside it runs its *traced* kernel variants (their ``TRACE`` constexpr
is the device's clock, so they compile once more), each kernel role writing into a trace buffer
of its own — one ring of ``events_per_program`` records per program. Leaving it waits for the
device, aligns the clocks again, reads every buffer and writes one JSON per rank
(``run.rank0.json`` …) and, on rank 0, the merged ``run.json``: all ranks on one time axis.
Events lost to full rings are counted and reported (a warning, and in the files), never
dropped silently.

**Clock alignment.** Each GPU has its own clock. A one-program kernel plays ping-pong between
rank 0 and every other rank through their heaps (:func:`iris_fw._kernels._clock_sync_kernel`):
rank 0 stamps ``a`` and raises a flag in rank p's heap; rank p stamps ``b`` when it sees it and
answers; rank 0 stamps ``c`` when it sees the answer. Rank p's stamp ``b`` was taken at some
moment in ``[a, c]`` of rank 0's clock, so its offset lies in ``[b - c, b - a]``: the estimate
is ``b - (a + c) / 2`` with error at most ``(c - a) / 2`` — whatever the two directions'
latencies — from the round with the shortest round trip (plus the clock's granularity). This
runs when the session starts and when it ends; event times are corrected by the offset
interpolated linearly between the two (clock drift), and the files carry each rank's offsets
and error bound. On CPU ranks (Triton's interpreter) every rank reads the host's
``CLOCK_MONOTONIC``, so the offsets come out near zero within a bound of the interpreter's
polling time.

**On the context.** ``ctx.trace(...)`` and ``ctx.tracer`` come from :class:`TraceSessions`, a
base class of :class:`iris_fw.Context`; this module sits below the context in the layers (it
uses the context only through the methods a session calls), so the context imports it downward.

**User kernels** record through the same buffers: ``trace, TRACE = kernel_args(ctx, "name",
programs)`` gives a kernel its buffer handle and constexpr (``None, 0`` outside a session).
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import devinfo, env
from . import trace as tr
from .errors import ArgumentError, ArgumentTypeError, IrisError

#: Records per program ring unless a session says otherwise (GPU; CPU ranks keep fewer).
DEFAULT_EVENTS_PER_PROGRAM = 1024
CPU_EVENTS_PER_PROGRAM = 256
#: Ping-pong rounds per peer of each clock alignment (GPU; the interpreter polls slowly).
SYNC_ROUNDS = 32
CPU_SYNC_ROUNDS = 4
#: The ``otherData.format`` of iris-fw trace files.
FORMAT = "iris_fw.trace/1"
#: Columns of the decoded events (int64 rows).
COLUMNS = ("t0", "t1", "kind", "role", "rank", "region", "program", "sm", "item", "peer", "bytes", "aux", "flag")


def env_trace_path(environ=None) -> str | None:
    """``IRIS_FW_TRACE`` (:mod:`iris_fw.env`): trace the whole life of every context (from
    ``init`` to ``close``) into this path; None when unset."""
    return env.get("IRIS_FW_TRACE", environ)


def clock_mode(ctx) -> int:
    """The ``TRACE`` constexpr of traced kernels on ``ctx``'s device: the code of its clock
    (:data:`iris_fw.trace.CLOCKS`, :func:`iris_fw.devinfo.trace_clock`)."""
    return tr.CLOCKS.index(devinfo.trace_clock(ctx.device)) + 1


def kernel_args(ctx, name: str, programs: int) -> tuple[int | None, Any]:
    """``(trace, TRACE)`` for a user kernel named ``name`` launched with ``programs`` programs:
    its trace buffer handle and constexpr under a trace session (the same buffer for every launch
    of that name in the session), ``(None, 0)`` otherwise — pass both to the kernel (see
    :mod:`iris_fw.trace`)."""
    tracer = ctx.tracer
    if tracer is None:
        return None, 0
    return tracer.handle(("user", name), programs, name), tracer.mode


@dataclass
class Region:
    """One kernel role's trace buffer: ``tensor`` (int64 on the device; :mod:`iris_fw.trace` has
    its layout), ``label`` (names the kernel in traces), ``programs`` (rings), ``names``: heap byte
    ranges ``(offset, nbytes, name, itemsize)`` its waits may refer to."""

    label: str
    programs: int
    capacity: int
    tensor: torch.Tensor
    names: list = field(default_factory=list)
    pin: Any = None  # what the key's id() refers to, kept alive with the region

    @property
    def handle(self) -> int:
        return self.tensor.data_ptr()


class Tracer:
    """The state of an open trace session on one rank (``ctx.tracer``): the clock constexpr
    (:attr:`mode`), the records per ring and the regions, made on first use."""

    def __init__(self, ctx, session: int, capacity: int, kinds: dict):
        self.ctx = ctx
        self.session = session
        self.mode = clock_mode(ctx)
        self.capacity = capacity
        self.kinds = dict(kinds)
        self.regions: list[Region] = []
        self._by_key: dict = {}
        self._extra_names: list = []
        #: a traced launch was captured into a CUDA graph: keep the buffers (see TraceSession)
        self.captured = False

    def handle(self, key, programs: int, label: str, buffers: dict | None = None, pin=None,
               capacity: int | None = None) -> int:
        """The trace buffer handle of the kernel role ``key`` (any hashable; made on first use with
        ``programs`` rings and labelled ``label``). ``buffers``: name -> heap tensor its waits may
        wait on (named in the traces; the first range containing a flag names it); ``pin``: an
        object ``key`` refers to by ``id()``; ``capacity``: records per ring of this region (default
        the session's ``events_per_program``)."""
        capacity = self.capacity if capacity is None else capacity
        region = self._by_key.get(key)
        if region is not None and region.programs >= programs:
            self.launched()
            return region.handle
        if self.ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise IrisError(
                f"trace session: {label!r} has no trace buffer yet and one cannot be made during CUDA-graph capture; "
                f"run it once inside the session before capturing it")
        words = tr.HEADER_WORDS.value + programs * (tr.RING_HEADER.value + capacity * tr.EVENT_WORDS.value)
        tensor = torch.zeros(words, dtype=torch.int64, device=self.ctx.device)
        header = [0] * tr.HEADER_WORDS.value
        header[tr.H_MAGIC.value], header[tr.H_CAPACITY.value] = tr.MAGIC, capacity
        header[tr.H_RINGS.value], header[tr.H_RANK.value] = programs, self.ctx.rank
        tensor[:tr.HEADER_WORDS.value] = torch.tensor(header, dtype=torch.int64)
        region = Region(label, programs, capacity, tensor, pin=pin)
        for name, t in (buffers or {}).items():
            self.name(t, name, region)
        self._by_key[key] = region
        self.regions.append(region)
        return region.handle

    def launched(self) -> None:
        """Called for every traced launch that reuses a buffer: notes a CUDA-graph capture (the
        session then keeps its buffers, which the graph's replays write into)."""
        if not self.captured and self.ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            self.captured = True

    def name(self, t: torch.Tensor, name: str, region: Region | None = None) -> None:
        """Name the heap tensor ``t`` in the traces (waits on a flag inside it show ``name``)."""
        offset = self.ctx.heap.offset_of(t) if t is not None and t.device == self.ctx.device else None
        if offset is None:
            return
        target = region.names if region is not None else self._extra_names
        target.append((offset, max(t.numel() * t.element_size(), 1), name, t.element_size()))

    def flag_name(self, offset: int) -> str:
        """A name for the heap byte ``offset`` a wait recorded: ``name[i]`` for element ``i`` of a
        named tensor (``name`` for its first), else the heap block and where it was allocated."""
        for names in [region.names for region in self.regions] + [self._extra_names]:
            for start, nbytes, name, itemsize in names:
                if start <= offset < start + nbytes:
                    return name if offset == start else f"{name}[{(offset - start) // itemsize}]"
        block = self.ctx.heap.block_at(offset)
        if block is not None:
            return f"{block.what} from {block.site} +{offset - block.offset}"
        return f"heap offset {offset:#x}"

    def collect(self) -> dict:
        """This rank's events, decoded (``events``: int64 ``[n, len(COLUMNS)]``, oldest first per
        ring), with the regions, the flag names and what was lost."""
        rows, flags, regions = [], {}, []
        lost_total = 0
        for index, region in enumerate(self.regions):
            data = region.tensor.cpu().numpy()
            capacity, rings = int(data[tr.H_CAPACITY.value]), int(data[tr.H_RINGS.value])
            beyond = int(data[tr.H_LOST.value])
            stride = tr.RING_HEADER.value + capacity * tr.EVENT_WORDS.value
            overflow = {}
            for p in range(rings):
                ring = data[tr.HEADER_WORDS.value + p * stride:tr.HEADER_WORDS.value + (p + 1) * stride]
                count = int(ring[0])
                if not count:
                    continue
                records = ring[tr.RING_HEADER.value:].reshape(capacity, tr.EVENT_WORDS.value)
                if count > capacity:
                    start = count % capacity
                    records = np.concatenate([records[start:], records[:start]])
                    overflow[str(p)] = count - capacity
                else:
                    records = records[:count]
                rows.append(_decode(records, index))
            lost = sum(overflow.values()) + beyond
            lost_total += lost
            regions.append({"label": region.label, "programs": region.programs, "capacity": capacity,
                            "lost": lost, "overflow_by_program": overflow, "beyond_rings": beyond})
        events = np.concatenate(rows) if rows else np.zeros((0, len(COLUMNS)), dtype=np.int64)
        for i, (role, aux) in enumerate(zip(events[:, 3], events[:, 11])):
            if role == tr.WAIT.value and aux >= 0:
                name = self.flag_name(int(aux))
                events[i, 12] = flags.setdefault(name, len(flags))
        return {"rank": self.ctx.rank, "events": events, "flags": list(flags), "regions": regions,
                "lost": lost_total}


def _decode(records: np.ndarray, region: int) -> np.ndarray:
    """Raw ring records (``[n, EVENT_WORDS]``) as rows of :data:`COLUMNS`."""
    out = np.empty((len(records), len(COLUMNS)), dtype=np.int64)
    meta, where = records[:, 2], records[:, 3]
    out[:, 0], out[:, 1] = records[:, 0], records[:, 1]
    out[:, 2] = meta & 0xFFFF
    out[:, 3] = (meta >> 16) & 0xFF
    out[:, 4] = meta >> 32
    out[:, 5] = region
    out[:, 6] = where & 0xFFFFFFFF
    out[:, 7] = (where >> 32) - 1
    out[:, 8:12] = records[:, 4:8]
    out[:, 12] = -1
    return out


# ---- clock alignment ----------------------------------------------------------------------------------


def estimate_offset(sent: np.ndarray, seen: np.ndarray, answered: np.ndarray) -> tuple[float, float, float, float]:
    """The offset of a peer's clock from the reference clock, from ping-pong rounds: the
    reference stamped ``sent`` before its ping and ``answered`` when it saw the answer, the peer
    ``seen`` when it saw the ping. Returns ``(offset, bound, ref_time, peer_time)`` of the round
    with the shortest round trip: ``offset = seen - (sent + answered) / 2``, true offset within
    ``± bound = (answered - sent) / 2``, at reference time ``ref_time`` (peer time ``peer_time``)."""
    rtt = answered - sent
    best = int(np.argmin(rtt))
    mid = (sent[best] + answered[best]) / 2.0
    return float(seen[best] - mid), float(rtt[best]) / 2.0, float(mid), float(seen[best])


@dataclass
class Alignment:
    """Maps one rank's clock onto rank 0's: ``offset(t)`` interpolated between the offsets
    measured at the start and the end of the session (``starts``: the rank's own times of the two
    measurements), with error at most ``bound`` ns."""

    offsets: tuple[float, float]
    times: tuple[float, float]
    bound: float

    def to_reference(self, t: np.ndarray) -> np.ndarray:
        (o0, o1), (t0, t1) = self.offsets, self.times
        if t1 == t0:
            return t - o0
        return t - (o0 + (o1 - o0) * (t - t0) / (t1 - t0))


def alignments(world_size: int, samples: list) -> list[Alignment]:
    """Per rank, its :class:`Alignment` from every rank's ping-pong stamps: ``samples[r]`` is rank
    ``r``'s ``(start, end)`` ``out`` arrays of :func:`_clock_sync_kernel` (``[W, rounds, 3]``)."""
    result = [Alignment((0.0, 0.0), (0.0, 0.0), 0.0)]
    for p in range(1, world_size):
        offs, times, bounds = [], [], []
        for which in (0, 1):
            ref, peer = samples[0][which][p], samples[p][which][p]
            offset, bound, _, peer_time = estimate_offset(ref[:, 0], peer[:, 1], ref[:, 2])
            offs.append(offset)
            times.append(peer_time)
            bounds.append(bound)
        result.append(Alignment(tuple(offs), tuple(times), max(bounds)))
    return result


# ---- sessions -----------------------------------------------------------------------------------------


class TraceSessions:
    """Trace sessions of a context (a base class of :class:`iris_fw.Context`: ``ctx.trace``,
    ``ctx.tracer``). It needs of its subclass what a :class:`TraceSession` uses: ``agree``,
    ``barrier``, ``zeros``, ``rank``, ``world_size``, ``device``, ``heap_bases``, ``_check_open``."""

    #: the open trace session's :class:`Tracer` (None when not tracing; see :meth:`trace`)
    tracer: "Tracer | None" = None
    #: the ``IRIS_FW_TRACE`` session over the context's life (:func:`start_env_trace`), if any
    _env_trace: "TraceSession | None" = None
    #: trace sessions opened on this context so far (each session's number)
    _trace_sessions: int = 0

    def _check_open(self) -> None:
        """Raise if the context is closed (the subclass's check)."""
        raise NotImplementedError

    def trace(self, path=None, *, events_per_program: int | None = None, label: str | None = None,
              kinds: dict | None = None) -> "TraceSession":
        """Trace what runs inside ``with ctx.trace("run.json"):`` — every op and collective (their
        traced kernel variants) and user kernels given :func:`iris_fw.trace_session.kernel_args` — into
        one Chrome-trace / Perfetto JSON per rank (``run.rank<r>.json``) and, on rank 0, a merged
        ``run.json`` with the ranks' clocks aligned. Collective. ``events_per_program``: records
        per program ring (older ones are overwritten, and counted, beyond it); ``label``: names the
        trace (plots, summaries); ``kinds``: names of user event kinds (``{iris_fw.trace.USER + i:
        "name"}``); ``path=None`` writes no file (the session's ``trace`` / ``merged`` hold the
        events). See :mod:`iris_fw.trace_session` and docs/tracing.md."""
        self._check_open()
        return TraceSession(self, path, events_per_program=events_per_program, label=label, kinds=kinds)


class TraceSession:
    """What :meth:`iris_fw.Context.trace` returns: a context manager tracing everything launched
    inside it (see the module docstring). Collective: every rank enters and leaves it together.

    After it exits: ``files`` (paths written by this rank), ``trace`` (this rank's trace as a
    dict, the JSON written to ``<stem>.rank<r>.json``), ``merged`` (all ranks', as in the merged
    file), ``lost`` (events lost to full rings on this rank)."""

    def __init__(self, ctx, path=None, *, events_per_program: int | None = None, label: str | None = None,
                 kinds: dict | None = None):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a file path (str or os.PathLike) or None, got {type(path).__name__}")
        if events_per_program is None:
            events_per_program = CPU_EVENTS_PER_PROGRAM if ctx.device.type == "cpu" else DEFAULT_EVENTS_PER_PROGRAM
        if not isinstance(events_per_program, int) or isinstance(events_per_program, bool) or events_per_program < 1:
            raise ArgumentError(f"events_per_program must be a positive int, got {events_per_program!r}")
        kinds = dict(kinds or {})
        for code, name in kinds.items():
            if not isinstance(code, int) or code < tr.USER.value or not isinstance(name, str):
                raise ArgumentError(f"kinds maps user event kinds (ints >= iris_fw.trace.USER = {tr.USER.value}) to "
                                    f"names, got {code!r}: {name!r}")
        self.ctx = ctx
        self.path = None if path is None else os.fspath(path)
        self.events_per_program = events_per_program
        self.label = label
        self.kinds = kinds
        self.files: list[str] = []
        self.trace: dict | None = None
        self.merged: dict | None = None
        self.lost = 0
        self._tracer: Tracer | None = None
        self._slots = None
        self._start = None

    # ---- entering and leaving ---------------------------------------------------------------------
    def __enter__(self) -> "TraceSession":
        ctx = self.ctx
        error = None
        if ctx.tracer is not None:
            error = IrisError("a trace session is already open on this context (sessions do not nest)")
        ctx.agree("ctx.trace", {"path": self.path, "events_per_program": self.events_per_program,
                                "label": self.label, "kinds": sorted(self.kinds.items())}, error)
        self._rounds = CPU_SYNC_ROUNDS if ctx.device.type == "cpu" else SYNC_ROUNDS
        self._slots = ctx.zeros(2 * ctx.world_size, dtype=torch.int64)
        ctx.barrier()  # every rank's slots are zero before any ping
        self._start = self._sync(0)
        session = ctx._trace_sessions + 1
        ctx._trace_sessions = session
        self._tracer = Tracer(ctx, session, self.events_per_program, self.kinds)
        ctx.tracer = self._tracer
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        ctx, tracer = self.ctx, self._tracer
        ctx.tracer = None
        if exc_type is not None:
            # The other ranks may not get here: no collective. Keep what this rank recorded.
            try:
                ctx.transport.synchronize()
                self._export(tracer, [None] * ctx.world_size, local_only=True)
            except Exception:  # noqa: BLE001 - the original exception matters more
                pass
            self._release(tracer)
            return
        try:
            ctx.barrier()  # every rank's traced work is done (and no wait gave up)
            end = self._sync(self._rounds)
            gathered = ctx.bootstrap.all_gather(((self._start, end), tracer.collect()))
            self._export(tracer, gathered)
            ctx.bootstrap.barrier()  # every file is written when the session returns
        finally:
            self._release(tracer)

    def _release(self, tracer: Tracer | None) -> None:
        self._slots = None
        if tracer is not None and tracer.captured:
            # A captured graph keeps writing into these buffers when replayed: keep them as long
            # as the context (the events recorded by replays after this point are not exported).
            keep = getattr(self.ctx, "_trace_keepalive", [])
            keep.append(tracer.regions)
            self.ctx._trace_keepalive = keep

    @contextmanager
    def paused(self):
        """Launches inside run their untraced variants (collective like the session: every rank
        pauses around the same calls)."""
        ctx = self.ctx
        if ctx.tracer is not self._tracer or self._tracer is None:
            raise IrisError("paused(): this trace session is not the open one")
        ctx.tracer = None
        try:
            yield self
        finally:
            ctx.tracer = self._tracer

    # ---- clock alignment ---------------------------------------------------------------------------
    def _sync(self, base: int) -> np.ndarray:
        """One ping-pong alignment (see the module docstring): this rank's ``[W, rounds, 3]``
        stamps."""
        from ._kernels import _clock_sync_kernel

        ctx = self.ctx
        out = torch.zeros(ctx.world_size, self._rounds, 3, dtype=torch.int64, device=ctx.device)
        ctx.bootstrap.barrier()
        _clock_sync_kernel[(1,)](self._slots, out, base, self._rounds, ctx.rank, ctx.world_size, ctx.heap_bases,
                                 TRACE=clock_mode(ctx))
        ctx.synchronize()
        return out.cpu().numpy()

    # ---- export ------------------------------------------------------------------------------------
    def _export(self, tracer: Tracer, gathered: list, local_only: bool = False) -> None:
        ctx = self.ctx
        world = ctx.world_size
        if local_only:
            mine = tracer.collect() if tracer is not None else None
            per_rank = [mine if r == ctx.rank else None for r in range(world)]
            aligns = [None] * world
        else:
            per_rank = [local for _, local in gathered]
            aligns = alignments(world, [samples for samples, _ in gathered])
        present = [d for d in per_rank if d is not None and len(d["events"])]
        t_zero = min((float(a.to_reference(d["events"][:, 0].astype(np.float64)).min()) if a is not None
                      else float(d["events"][:, 0].min()))
                     for d, a in ((d, aligns[d["rank"]]) for d in present)) if present else 0.0
        info = devinfo.info(ctx.device)
        common = {"format": FORMAT, "world_size": world, "label": self.label, "device": info.name,
                  "clock": devinfo.trace_clock(ctx.device),
                  "kinds": {**{str(k): v for k, v in tr.KIND_NAMES.items()},
                            **{str(k): v for k, v in self.kinds.items()}},
                  "clock_alignment": _alignment_doc(aligns, local_only)}
        mine = per_rank[ctx.rank]
        self.lost = mine["lost"] if mine is not None else 0
        if self.lost:
            warnings.warn(f"trace: rank {ctx.rank} lost {self.lost} events to full rings (events_per_program="
                          f"{self.events_per_program}); the oldest records of those programs were overwritten",
                          RuntimeWarning, stacklevel=3)
        self.trace = chrome_trace([mine] if mine is not None else [], aligns, t_zero, self.kinds,
                                  {**common, "rank": ctx.rank})
        if not local_only:
            self.merged = chrome_trace(per_rank, aligns, t_zero, self.kinds, {**common, "rank": None})
        if self.path is None:
            return
        stem, ext = os.path.splitext(self.path)
        rank_path = f"{stem}.rank{ctx.rank}{ext or '.json'}"
        _write_json(rank_path, self.trace)
        self.files.append(rank_path)
        if ctx.rank == 0 and self.merged is not None:
            _write_json(self.path, self.merged)
            self.files.append(self.path)


def _alignment_doc(aligns: list, local_only: bool) -> dict:
    doc = {"method": "device ping-pong with rank 0 through the heaps at the session's start and end; offsets "
                     "interpolated linearly; error at most half the shortest round trip (plus the clock's "
                     "granularity)",
           "reference_rank": 0}
    if local_only or not aligns or aligns[0] is None:
        doc["aligned"] = False
        return doc
    doc["aligned"] = True
    doc["offsets_ns"] = [list(a.offsets) for a in aligns]
    doc["bounds_ns"] = [a.bound for a in aligns]
    return doc


def _write_json(path: str, data: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


def chrome_trace(per_rank: list, aligns: list, t_zero: float, kinds: dict, other: dict) -> dict:
    """A Chrome-trace / Perfetto JSON dict of the ranks' decoded events (:meth:`Tracer.collect`):
    one process per rank, one thread per (kernel, program), complete (``"X"``) events in
    microseconds from ``t_zero`` (rank 0's clock, ns), arguments ``kernel, program, sm, item, peer,
    bytes`` and, for waits, ``flag``."""
    names = {**tr.KIND_NAMES, **kinds}
    events: list = []
    regions_doc, lost = {}, {}
    for data in per_rank:
        if data is None:
            continue
        rank = data["rank"]
        align = aligns[rank] if aligns and rank < len(aligns) else None
        ev = data["events"]
        regions = data["regions"]
        regions_doc[str(rank)] = regions
        lost[str(rank)] = data["lost"]
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        if not len(ev):
            continue
        t0 = ev[:, 0].astype(np.float64)
        t1 = ev[:, 1].astype(np.float64)
        if align is not None:
            t0, t1 = align.to_reference(t0), align.to_reference(t1)
        rows = sorted({(int(r), int(p)) for r, p in zip(ev[:, 5], ev[:, 6])})
        tids = {row: i + 1 for i, row in enumerate(rows)}
        sms: dict = {}
        for r, p, s in zip(ev[:, 5], ev[:, 6], ev[:, 7]):
            sms.setdefault((int(r), int(p)), set()).add(int(s))
        for (region, program), tid in tids.items():
            label = regions[region]["label"]
            on = sorted(s for s in sms[(region, program)] if s >= 0)
            where = f" (SM {on[0]})" if len(on) == 1 else ""
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": f"{label} p{program}{where}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
        flags = data["flags"]
        for i in range(len(ev)):
            kind, role = int(ev[i, 2]), int(ev[i, 3])
            region, program, sm = int(ev[i, 5]), int(ev[i, 6]), int(ev[i, 7])
            args = {"kernel": regions[region]["label"], "program": program, "sm": sm, "item": int(ev[i, 8]),
                    "peer": int(ev[i, 9]), "bytes": int(ev[i, 10])}
            if role == tr.WAIT.value:
                args["flag"] = flags[int(ev[i, 12])] if ev[i, 12] >= 0 else None
            elif ev[i, 11] != -1:
                args["aux"] = int(ev[i, 11])
            events.append({"name": names.get(kind, f"user{kind - tr.USER.value}" if kind >= tr.USER.value
                                             else f"kind{kind}"),
                           "cat": tr.ROLE_NAMES[role] if role < len(tr.ROLE_NAMES) else f"role{role}",
                           "ph": "X", "ts": round((t0[i] - t_zero) / 1e3, 3),
                           "dur": round(max(t1[i] - t0[i], 0.0) / 1e3, 3),
                           "pid": rank, "tid": tids[(region, program)], "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {**other, "regions": regions_doc, "lost_events": lost}}


def start_env_trace(ctx) -> None:
    """Open a session over the context's life when ``IRIS_FW_TRACE`` names a path (called by
    :func:`iris_fw.init`; :meth:`~iris_fw.Context.close` ends it)."""
    path = env_trace_path()
    if path:
        session = TraceSession(ctx, path)
        session.__enter__()
        ctx._env_trace = session


def end_env_trace(ctx) -> None:
    """Close the ``IRIS_FW_TRACE`` session of ``ctx`` (writing its files), if any."""
    session = ctx._env_trace
    if session is not None:
        ctx._env_trace = None
        session.__exit__(None, None, None)
