"""Device-side tracing: ``@triton.jit`` functions a kernel calls to record per-program events —
start and end timestamps, SM, rank, role (compute / communicate / wait), tile or chunk, peer,
bytes — into a trace buffer. A leaf module like :mod:`iris_fw.device` (it imports Triton only).

**Compiled out when off.** Every function takes the kernel's ``TRACE`` constexpr: ``0`` (the
default of every iris-fw kernel) makes each call an empty function, so an untraced kernel
compiles to the code it had without tracing; a traced kernel is a separate compiled variant.
When on, ``TRACE`` is the code of a clock (:data:`CLOCKS`: 1, 2, 3), as
:func:`iris_fw.trace_session.clock_mode` chooses it from the device:

* ``"globaltimer"`` — NVIDIA: the ``%globaltimer`` register (ns; its update granularity depends
  on the GPU, 32 ns to 1 us), SM id from ``%smid``;
* ``"memrealtime"`` — AMD CDNA (gfx9): ``s_memrealtime`` (a 100 MHz constant clock, recorded in
  ns), compute-unit id from ``HW_REG_HW_ID``;
* ``"host"`` — Triton's CPU interpreter: the host's ``CLOCK_MONOTONIC`` in ns (one clock for all
  ranks of a host), SM id -1. The interpreter cannot run inline assembly, so this branch calls a
  Python function; the compilers never see it (the branch is pruned for the other values).

**The trace buffer** (``trace``: an int64 address, as :meth:`iris_fw.trace_session.Tracer.handle`
returns it; ``None`` when off) is one *region* per kernel: a header of :data:`HEADER_WORDS` int64
slots (capacity, rings, rank, events of programs beyond the rings) and one ring per program —
a counter of the events the program ever recorded, then ``capacity`` records of
:data:`EVENT_WORDS` int64 each::

    [0] t_start (ns)   [1] t_end (ns)
    [2] kind | role << 16 | rank << 32          [3] program | (sm + 1) << 32
    [4] item (tile / chunk / -1)   [5] peer (-1: several or none)   [6] bytes (-1: unknown)
    [7] aux (a flag's heap byte offset for waits, else -1)

A program owns its ring, so recording needs no atomic: one load of the counter, a vector store
of the record, a store of the counter. When a ring is full the oldest records are overwritten
and the host reports how many were lost (``count - capacity``), never silently.

**Using it in a kernel** (the buffer handle and the constexpr come from the host:
``trace, TRACE = iris_fw.trace_session.kernel_args(ctx, "my_kernel", programs)``)::

    @triton.jit
    def my_kernel(x, n, trace, TRACE: tl.constexpr):
        t = tr.record_start(trace, TRACE)
        ...                                              # the work
        tr.record_end(trace, TRACE, t, tr.USER, tr.COMPUTE, item=tl.program_id(0), nbytes=n * 4)

``record_end`` first meets every warp of the program (``tl.debug_barrier``), so the end stamp
is taken once all of the program's threads finished the event's work.
"""

import ctypes
import time

import numpy as np
import triton
import triton.language as tl

from .device import bases


class _Const(tl.constexpr):
    """A constexpr global that Triton's launch check compares by identity: the compiler records
    every global a kernel reads (deep-copied) and re-checks it before each launch; a plain
    constexpr's copy is a new object compared by value (microseconds per launch), this one
    copies as itself."""

    def __deepcopy__(self, memo):
        return self


# ---- layout (int64 words) --------------------------------------------------------------------------
HEADER_WORDS = _Const(8)
H_MAGIC = _Const(0)  # MAGIC: the host's check that a handle points at a region
H_CAPACITY = _Const(1)  # records per ring
H_RINGS = _Const(2)  # rings (programs) in the region
H_RANK = _Const(3)  # the rank that owns the region
H_LOST = _Const(4)  # events of programs >= rings (not recorded)
RING_HEADER = _Const(8)  # words before a ring's records (its counter is word 0)
EVENT_WORDS = _Const(8)
MAGIC = 0x1215_7ACE

# ---- roles (how the timeline colours an event) -----------------------------------------------------
COMPUTE = _Const(0)
COMMUNICATE = _Const(1)
WAIT = _Const(2)
SPAN = _Const(3)  # a program's whole life in one call (the row's extent; not busy time)
ROLE_NAMES = ("compute", "communicate", "wait", "program")

# ---- kinds (event names; user kinds start at USER) ---------------------------------------------------
PROGRAM = _Const(1)  # a program of a kernel, start to end (role SPAN)
PRODUCE = _Const(2)  # a pattern's produce (a GEMM tile), stash included
CONSUME = _Const(3)  # a pattern's consume (compute-first: the tile's delivery), reload included
FETCH = _Const(4)  # communicate-first: an operand chunk brought from its owner
STEP = _Const(5)  # a later step of a multi-step pattern on one tile
ACQUIRE = _Const(6)  # waiting for an item flag (a tile / chunk released by a producer)
ENTRY_BARRIER = _Const(7)  # a kernel's cross-rank entry barrier
EXIT_BARRIER = _Const(8)  # a kernel's cross-rank exit barrier (the call's last program)
STEP_BARRIER = _Const(9)  # the per-program cross-rank barrier before a step
PUSH = _Const(10)  # a collective program's sends
ARRIVALS = _Const(11)  # a collective program waiting for its peers' arrivals
REDUCE = _Const(12)  # a collective program's local reduction / copy-out
RECEIVE = _Const(13)  # data-as-flag receive (polls the data, then reduces)
PULL = _Const(14)  # a collective program's reads from peers
RING_STEP = _Const(15)  # one tile row's pass around the ring (sends, waits, adds)
ATTENTION = _Const(16)  # flash decode: one split of a unit's attention (its K/V tiles)
USER = _Const(256)  # first kind free for user events

KIND_NAMES = {
    1: "program", 2: "produce", 3: "consume", 4: "fetch", 5: "step", 6: "acquire", 7: "entry_barrier",
    8: "exit_barrier", 9: "step_barrier", 10: "push", 11: "arrivals", 12: "reduce", 13: "receive", 14: "pull",
    15: "ring_step", 16: "attention",
}

# ---- clocks -------------------------------------------------------------------------------------------
#: The clocks a kernel's TRACE constexpr selects: TRACE = 1 + the index here (0: off).
CLOCKS = ("globaltimer", "memrealtime", "host")
GLOBALTIMER = _Const(1)
MEMREALTIME = _Const(2)
HOST = _Const(3)
#: s_memrealtime ticks at 100 MHz on CDNA (MI200, MI300): ns per tick.
MEMREALTIME_NS = _Const(10)


def _host_clock_ns(_semantic=None):
    """The interpreter's clock: ``CLOCK_MONOTONIC`` in ns, shared by every process of a host.

    Marked as a Triton builtin only so that the compilers' dependency scan accepts the name in
    :func:`now` (it sits in a branch they prune); a compiled kernel calling it is an error."""
    if _semantic is not None:
        raise ValueError("TRACE=3 (the host clock) is for Triton's interpreter; compiled kernels use 1 "
                         "(globaltimer, NVIDIA) or 2 (memrealtime, AMD): see iris_fw.trace_session.clock_mode")
    return time.monotonic_ns()


_host_clock_ns.__triton_builtin__ = True


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _memrealtime():
    return tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def now(TRACE: tl.constexpr):
    """The clock ``TRACE`` selects, in ns (int64); 0 when ``TRACE`` is 0."""
    if TRACE == GLOBALTIMER:
        t = _globaltimer()
    elif TRACE == MEMREALTIME:
        t = _memrealtime() * MEMREALTIME_NS
    elif TRACE == HOST:
        t = tl.full((), 0, tl.int64) + _host_clock_ns()
    else:
        tl.static_assert(TRACE == 0, "TRACE must be 0 (off) or a clock code: 1, 2, 3 (iris_fw.trace.CLOCKS)")
        t = tl.full((), 0, tl.int64)
    return t


@triton.jit
def sm_id(TRACE: tl.constexpr):
    """The SM (NVIDIA) or compute unit (AMD: CU, shader array and engine bits of HW_ID) the
    program runs on, as an int64; -1 under the interpreter."""
    if TRACE == GLOBALTIMER:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True,
                                       pack=1).to(tl.int64)
    elif TRACE == MEMREALTIME:
        sm = tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_HW_ID, 8, 8)", "=s", [], dtype=tl.int32,
                                       is_pure=True, pack=1).to(tl.int64)
    else:
        sm = tl.full((), -1, tl.int64)
    return sm


@triton.jit
def program_index():
    """This program's index in the launch grid (row-major over the three grid axes)."""
    return (tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2)))


@triton.jit
def as_i64(x):
    """``x`` (a Python int, a constexpr or a scalar tensor) as an int64 scalar tensor."""
    return tl.full((), 0, tl.int64) + x


@triton.jit
def only_peer(rank, world_size):
    """The one peer of a rank in a group of two, else -1 (several, or none): the ``peer`` of an
    event that talks to every other rank."""
    return tl.where(as_i64(world_size) == 2, (as_i64(rank) + 1) % 2, -1)


@triton.jit
def rows_peer(owner, remote):
    """``(peer, remote rows)`` of a block of rows: ``owner`` holds each row's rank and ``remote``
    whether it belongs to another rank (blocks ``[R]`` or ``[R, 1]``). ``peer`` is the one rank
    owning every remote row, else -1 (several, or none)."""
    big = tl.full(owner.shape, 1 << 30, tl.int64)
    first = tl.min(tl.where(remote, as_i64(owner) + 0 * big, big))
    last = tl.max(tl.where(remote, as_i64(owner) + 0 * big, -1))
    peer = tl.where(first == last, first, -1)
    return peer, tl.sum(remote.to(tl.int64))


@triton.jit
def strided_share(n, BLOCK: tl.constexpr, first, step):
    """Elements of ``[0, n)`` in the ``BLOCK``-element tiles ``first, first + step, …`` (what a
    program of a grid-strided tile loop handles), as int64."""
    tiles = tl.cdiv(as_i64(n), BLOCK)
    mine = tl.maximum(tl.cdiv(tiles - first, step), 0)
    last = (tiles > first) & ((tiles - 1 - first) % step == 0)
    return mine * BLOCK - tl.where(last, tiles * BLOCK - n, 0)


@triton.jit
def heap_offset(ptr, rank, heap_bases):
    """The byte offset of ``ptr`` (a pointer into ``rank``'s heap) in that heap: what a wait event
    records as ``aux``, so the host can name the flag waited for."""
    return ptr.to(tl.int64) - tl.load(bases(heap_bases) + rank)


# ---- recording ------------------------------------------------------------------------------------------


@triton.jit
def record_start(trace, TRACE: tl.constexpr):
    """The start stamp of an event (pass it to :func:`record_end`); 0 when ``TRACE`` is 0."""
    if TRACE == HOST:  # the interpreter pays for each nested call: read the clock here
        t = tl.full((), 0, tl.int64) + _host_clock_ns()
    else:
        t = now(TRACE)
    return t


@triton.jit
def record_end(trace, TRACE: tl.constexpr, start, kind, role, item=-1, peer=-1, nbytes=0, aux=-1):
    """Record an event of this program that started at ``start`` (:func:`record_start`) and ends
    now. ``kind``: a :data:`KIND_NAMES` code or ``USER + n``; ``role``: :data:`COMPUTE`,
    :data:`COMMUNICATE`, :data:`WAIT` or :data:`SPAN`; ``item``: the tile or chunk; ``peer``: the
    rank talked to (-1: several or none); ``nbytes``: bytes moved to or from peers (-1: unknown);
    ``aux``: any int64 (waits: the flag's heap offset, :func:`heap_offset`). Does nothing when
    ``TRACE`` is 0."""
    if TRACE == HOST:
        _host_event(trace, start, None, kind, role, item, peer, nbytes, aux, tl.program_id(0), tl.program_id(1),
                    tl.program_id(2), tl.num_programs(0), tl.num_programs(1))
    elif TRACE:
        tl.debug_barrier()  # every warp has finished the event's work
        _device_event(trace, TRACE, start, now(TRACE), kind, role, item, peer, nbytes, aux)


@triton.jit
def record_wait(trace, TRACE: tl.constexpr, start, kind, flag, rank, heap_bases, item=-1):
    """Record a wait of this program since ``start`` for the flag (or the first of the slots) at
    ``flag`` in ``rank``'s (the caller's) heap: role :data:`WAIT`, ``peer`` = ``rank`` (whose heap
    holds the flag), ``aux`` = the flag's heap offset (the host names it)."""
    if TRACE:
        record_end(trace, TRACE, start, kind, WAIT, item, rank, 0,
                   flag.to(tl.int64) - tl.load(bases(heap_bases) + rank))


@triton.jit
def record_move(trace, TRACE: tl.constexpr, start, kind, peer, nbytes, item=-1):
    """Record data movement of this program since ``start``: ``nbytes`` to or from ``peer`` (-1:
    several); role :data:`COMMUNICATE`, or :data:`COMPUTE` when ``nbytes`` is 0 (only local work)."""
    if TRACE:
        moved = tl.full((), 0, tl.int64) + nbytes
        record_end(trace, TRACE, start, kind, tl.where(moved != 0, COMMUNICATE, COMPUTE), item, peer, moved)


@triton.jit
def event(trace, TRACE: tl.constexpr, start, end, kind, role, item=-1, peer=-1, nbytes=0, aux=-1):
    """Record an event with both stamps given (see :func:`record_end` for the fields)."""
    if TRACE == HOST:
        _host_event(trace, start, end, kind, role, item, peer, nbytes, aux, tl.program_id(0), tl.program_id(1),
                    tl.program_id(2), tl.num_programs(0), tl.num_programs(1))
    elif TRACE:
        _device_event(trace, TRACE, start, end, kind, role, item, peer, nbytes, aux)


# ---- recording from hot loops: the ring's state in registers --------------------------------------
#
# record_end reads the region's header and the ring's counter from memory for every event and
# stores the counter back: two dependent global round trips per event. After an acquire (which
# invalidates the SM's L1) both go to L2, ~0.3 us each on H100/H200 — more than a tile's share
# of time in a program that only waits for flags and forwards tiles (gemm_all_scatter's single
# communication program at W = 1 records ~2 events per tile: +88-94 % before this). Loops that
# record per tile open the ring once (ring_open: header and counter read), carry the count in a
# register (record_at returns it advanced; its store of the record needs no load), and store it
# back once (ring_close). No other recording of the program may happen between open and close.


@triton.jit
def ring_open(trace, TRACE: tl.constexpr, heap_bases, rank):
    """``(state, count)``: this program's ring (``state``: ring address, capacity, rank bits of
    the record's meta word, the record's program/SM word, this rank's heap base — for the wait
    events' flag offsets) and its event count, read once. Interpreter and ``TRACE`` 0: zeros
    (the host path counts in memory itself)."""
    zero = tl.full((), 0, tl.int64)
    if TRACE == GLOBALTIMER or TRACE == MEMREALTIME:
        # the counter's last store (one thread's, by an event or ring_close before) is seen by
        # every thread: all of them must carry the same count
        tl.debug_barrier()
        base = trace.to(tl.int64).to(tl.pointer_type(tl.int64))
        capacity = tl.load(base + H_CAPACITY)
        rings = tl.load(base + H_RINGS)
        rank_bits = tl.load(base + H_RANK) << 32
        prog = program_index().to(tl.int64)
        inside = prog < rings
        ring = tl.where(inside, trace.to(tl.int64) + 8 * (HEADER_WORDS + prog * (RING_HEADER + capacity * EVENT_WORDS)),
                        zero)
        count = tl.load(ring.to(tl.pointer_type(tl.int64)), mask=inside, other=0)
        where = prog | ((sm_id(TRACE) + 1) << 32)
        state = (ring, capacity, rank_bits, where, tl.load(bases(heap_bases) + rank).to(tl.int64))
    elif TRACE == HOST:
        count = zero
        state = (zero, zero, zero, zero, tl.load(bases(heap_bases) + rank).to(tl.int64))
    else:
        count = zero
        state = (zero, zero, zero, zero, zero)
    return state, count


@triton.jit
def record_at(trace, TRACE: tl.constexpr, state, count, start, kind, role, item=-1, peer=-1, nbytes=0, aux=-1):
    """:func:`record_end` from a loop holding the ring open (:func:`ring_open`): returns the
    advanced count (carry it to the next event and to :func:`ring_close`)."""
    new = count
    if TRACE == HOST:
        _host_event(trace, start, None, kind, role, item, peer, nbytes, aux, tl.program_id(0), tl.program_id(1),
                    tl.program_id(2), tl.num_programs(0), tl.num_programs(1))
    elif TRACE:
        tl.debug_barrier()  # every warp has finished the event's work
        end = now(TRACE)
        ring = state[0]
        if ring != 0:
            w = tl.arange(0, EVENT_WORDS)
            meta = as_i64(kind) | (as_i64(role) << 16) | state[2]
            record = tl.where(w == 0, as_i64(start), tl.where(w == 1, end, tl.where(
                w == 2, meta, tl.where(w == 3, state[3], tl.where(w == 4, as_i64(item), tl.where(
                    w == 5, as_i64(peer), tl.where(w == 6, as_i64(nbytes), as_i64(aux))))))))
            slot = RING_HEADER + (count % state[1]) * EVENT_WORDS
            tl.store(ring.to(tl.pointer_type(tl.int64)) + slot + w, record)
        else:
            tl.atomic_add(trace.to(tl.int64).to(tl.pointer_type(tl.int64)) + H_LOST, 1, sem="relaxed")
        new = count + 1
    return new


@triton.jit
def record_wait_at(trace, TRACE: tl.constexpr, state, count, start, kind, flag, rank, item=-1):
    """:func:`record_wait` from a loop holding the ring open: the flag's heap offset from the
    heap base read at :func:`ring_open`."""
    new = count
    if TRACE:
        new = record_at(trace, TRACE, state, count, start, kind, WAIT, item, rank, 0, flag.to(tl.int64) - state[4])
    return new


@triton.jit
def record_move_at(trace, TRACE: tl.constexpr, state, count, start, kind, peer, nbytes, item=-1):
    """:func:`record_move` from a loop holding the ring open."""
    new = count
    if TRACE:
        moved = tl.full((), 0, tl.int64) + nbytes
        new = record_at(trace, TRACE, state, count, start, kind, tl.where(moved != 0, COMMUNICATE, COMPUTE), item,
                        peer, moved)
    return new


@triton.jit
def ring_close(TRACE: tl.constexpr, state, count):
    """Store the count carried since :func:`ring_open` back (compiled kernels)."""
    if TRACE == GLOBALTIMER or TRACE == MEMREALTIME:
        ring = state[0]
        if ring != 0:
            tl.debug_barrier()  # the count's last load and every record store came first
            tl.store(ring.to(tl.pointer_type(tl.int64)), count)


@triton.jit
def _device_event(trace, TRACE: tl.constexpr, start, end, kind, role, item, peer, nbytes, aux):
    """The record written by the program (compiled kernels): a vector store of its words, then
    the ring's counter."""
    base = trace.to(tl.int64).to(tl.pointer_type(tl.int64))
    capacity = tl.load(base + H_CAPACITY)
    rings = tl.load(base + H_RINGS)
    rank = tl.load(base + H_RANK)
    prog = program_index().to(tl.int64)
    if prog < rings:
        ring = base + HEADER_WORDS + prog * (RING_HEADER + capacity * EVENT_WORDS)
        count = tl.load(ring)
        w = tl.arange(0, EVENT_WORDS)
        meta = as_i64(kind) | (as_i64(role) << 16) | (rank << 32)
        where = prog | ((sm_id(TRACE) + 1) << 32)
        record = tl.where(w == 0, as_i64(start), tl.where(w == 1, as_i64(end), tl.where(
            w == 2, meta, tl.where(w == 3, where, tl.where(w == 4, as_i64(item), tl.where(
                w == 5, as_i64(peer), tl.where(w == 6, as_i64(nbytes), as_i64(aux))))))))
        tl.store(ring + RING_HEADER + (count % capacity) * EVENT_WORDS + w, record)
        tl.store(ring, count + 1)
    else:
        tl.atomic_add(base + H_LOST, 1, sem="relaxed")


def _host_int(x) -> int:
    """A Python int from an interpreter scalar (a tensor of one element), a constexpr or an int."""
    if isinstance(x, tl.constexpr):
        x = x.value
    handle = getattr(x, "handle", None)
    if handle is not None:  # the interpreter's tensors keep their values in numpy arrays
        data = np.asarray(handle.data).reshape(-1)
        if data.size != 1:
            raise ValueError(f"iris_fw.trace: an event field must be a scalar, got a block of {data.size}")
        return int(data[0])
    return int(x)


def _host_event(trace, start, end, kind, role, item, peer, nbytes, aux, p0, p1, p2, n0, n1, _semantic=None):
    """The interpreter's record: the same words as :func:`_device_event`, written with numpy by
    one Python call — the interpreter pays milliseconds for each nested jit call and Triton
    operation, and nothing here needs to run as one. ``end`` None: now. A builtin mark, as
    :func:`_host_clock_ns`, for the compilers' dependency scan only."""
    if _semantic is not None:
        raise ValueError("TRACE=3 (the host clock) is for Triton's interpreter")
    stamp = time.monotonic_ns() if end is None else _host_int(end)
    base = _host_int(trace)
    header = np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_int64)), shape=(HEADER_WORDS.value,))
    capacity, rings, rank = int(header[H_CAPACITY.value]), int(header[H_RINGS.value]), int(header[H_RANK.value])
    prog = _host_int(p0) + _host_int(n0) * (_host_int(p1) + _host_int(n1) * _host_int(p2))
    if prog >= rings:
        header[H_LOST.value] += 1
        return
    stride = RING_HEADER.value + capacity * EVENT_WORDS.value
    ring = np.ctypeslib.as_array(ctypes.cast(base + 8 * (HEADER_WORDS.value + prog * stride),
                                             ctypes.POINTER(ctypes.c_int64)), shape=(stride,))
    count = int(ring[0])
    slot = RING_HEADER.value + (count % capacity) * EVENT_WORDS.value
    meta = _host_int(kind) | (_host_int(role) << 16) | (rank << 32)
    ring[slot:slot + EVENT_WORDS.value] = [_host_int(start), stamp, meta, prog, _host_int(item), _host_int(peer),
                                           _host_int(nbytes), _host_int(aux)]
    ring[0] = count + 1


_host_event.__triton_builtin__ = True
