"""Kernel skeletons: the ``@triton.jit`` roles and persistent kernels the built-in schedulers
are assembled from, and the device-side per-call state that makes them graph-safe.

**Per-call state lives on the device.** Every skeleton kernel gets a *state region* of int64
slots on the heap (:func:`state_slots` long, zeroed once when the op is created)::

    [ST_QUEUE]   dynamic tile queue: a ticket counter that only grows
    [ST_DONE]    programs finished, over all calls (finds the last program of a call)
    [ST_OPENED]  the last call whose entry barrier a program of this kernel opened (the first
                 program of a call to get there announces the rank)
    [ST_ARRIVE + p]            cross-rank barrier: rank p's arrival (in every rank's heap)
    [ST_ARRIVE + W + pid]      program ``pid``'s call counter (its epoch)
    [ST_ARRIVE + W + NPROG + pid * W + p]  multi-step patterns: program ``pid`` of rank ``p``
                               finished step ``s`` of call ``e`` (value ``(e-1)(S-1) + s``)

Each program advances its own counter once per call, so every program of every kernel of an
op agrees on the call's *epoch* ``e`` (1, 2, …) without any host integer: a captured CUDA graph
replays correctly. Items are released as ``flag = e`` and acquired as ``flag >= e``; the
queue's base is ``(e-1) * (tiles + programs)`` (every call draws exactly that many tickets);
the cross-rank barrier writes ``2e-1`` on entry and ``2e`` on exit.

**Barriers folded into kernels.** ``ENTRY``: the first program of the call to start announces
this rank's arrival on every peer and every program waits (bounded) until every rank arrived —
inputs are ready and outputs free to overwrite. ``EXIT``: each program fences its stores; the
last program of the rank to finish announces and waits for every rank — deliveries are complete
when the kernel ends. The scheduler chooses which of its kernels carries them (the ones that
communicate). A failed wait (a timeout, or the abort word: reported by the host at the next
synchronization) makes programs skip their work rather than send stale data, and a consumer
stops at its first failed acquire.

**Forward progress.** Nothing makes the programs of a launch, or of two launches on two
streams, resident at the same time: the hardware dispatches them in no promised order, and
under CUDA MPS other clients' programs share the SMs (the share caps a client; it reserves
nothing). So on its own rank a program only ever waits for a program that is already running:
the entry barrier's announcer is whichever program started first; a consumer that needs an item
(a chunk or a tile released by a producer) whose producer program has not started this call
produces it itself (:func:`obtain`), and otherwise waits for the item's producer program or
claimant — running, and needing nothing more on this rank. Every item is *claimed* before it is
produced (:func:`claim`, one slot per item after the release flags), so exactly one program
produces it. Waits for other ranks (entry, exit and step barriers) assume what every cross-rank
wait assumes: each rank's kernels get SMs (under MPS, a share per rank).

Under Triton's interpreter the programs of one launch run one after another, so nothing here
makes a program wait for a later program of the same launch: entry waits are for other ranks,
and the exit wait is done by the last program.

**args.** A pattern's named ``args`` reach a kernel as ``top0, top1, rest``
(:func:`iris_fw.engine.contract.split_args`) and are rebuilt, ``ARGS(top0, *rest)`` and the
like, *where they are passed on* to a role or piece — never assigned to a variable nor returned
from a jit function: Triton (3.6 and 3.9 on assignment, 3.6 on return too) turns the constexprs
of such a tuple into run-time values, and ``args.heap_bases`` carries two
(:class:`iris_fw.device.DeviceHeaps`); :mod:`iris_fw.device` then refuses to compile, naming
this. A parameter keeps them.

**Tracing.** Every skeleton kernel takes a ``trace`` buffer handle and a ``TRACE`` constexpr
(:mod:`iris_fw.trace`; ``None`` and 0 unless a trace session is on, and then the kernel is a
separate compiled variant). Each program records its span in the call (``program``), the entry,
exit and step barriers and every acquire (role *wait*, with the flag waited for), every produce
(*compute*), fetch, consume and step (*communicate* when the pattern's ``traffic`` piece says
the item moves bytes to or from peers, else *compute*), with the tile or chunk, peer and bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import device as dv
from .. import tilecomm as tc
from .. import trace as tr

# ---- state region layout (int64 slots) -----------------------------------------------------------
ST_QUEUE = tl.constexpr(0)
ST_DONE = tl.constexpr(1)
ST_OPENED = tl.constexpr(2)
ST_ARRIVE = tl.constexpr(8)

_GPU = tl.constexpr("gpu")
_NO_TRACE = tl.constexpr(0)


def state_slots(world_size: int, nprog: int) -> int:
    """int64 slots of one kernel's state region."""
    return ST_ARRIVE.value + world_size + nprog + nprog * world_size


# ---- per-call state ------------------------------------------------------------------------------


@triton.jit
def begin_call(st, world_size):
    """This program's epoch for the current call (1 for the first call); advances its counter.
    Every warp loads the counter before one thread stores the next value (the barrier between
    them: see :func:`iris_fw.tilecomm.program_epoch`)."""
    return tc.program_epoch(st + ST_ARRIVE + world_size)


@triton.jit
def entry_barrier(st, epoch, rank, world_size, heap_bases):
    """The first program of the call to get here announces this rank; every program waits for
    every rank. Returns 1, or 0 if a wait gave up.

    The first to arrive, not program 0: a program waits for its own rank's announcement too, and
    nothing makes program 0 resident before the others (programs of a grid larger than the SMs
    free to it — under CUDA MPS other clients' programs share the SMs — would spin while program 0
    waited for an SM). The announcer is running, so the announcement comes."""
    if tl.atomic_max(st + ST_OPENED, epoch, sem="relaxed", scope=_GPU) < epoch:
        tc.arrive(st + ST_ARRIVE, 2 * epoch - 1, rank, world_size, heap_bases)
    return tc.wait_arrivals(st + ST_ARRIVE, 2 * epoch - 1, rank, world_size, heap_bases)


@triton.jit
def finish_program(st, epoch, NPROG: tl.constexpr):
    """Every program calls this once at its end: orders its stores (system-scope release) and
    returns whether it is the last program of this call on this rank (which then sees every
    other program's stores)."""
    return tc.last_program(st + ST_DONE, NPROG, epoch)


@triton.jit
def exit_barrier(st, epoch, rank, world_size, heap_bases):
    """Called by the last program of a call: announce and wait for every rank."""
    tc.arrive(st + ST_ARRIVE, 2 * epoch, rank, world_size, heap_bases)
    tc.wait_arrivals(st + ST_ARRIVE, 2 * epoch, rank, world_size, heap_bases)


@triton.jit
def release(flags, item, epoch, rank, heap_bases):
    """Publish item ``item`` of this call: every store this program made before is visible to a
    program of this rank that acquires it."""
    dv.signal(flags + item, epoch, rank, rank, heap_bases, op="set", sem="release", scope=_GPU)


@triton.jit
def acquire(flags, item, target, rank, heap_bases):
    """Wait (bounded) until item ``item`` reaches ``target``; returns 1, or 0 on timeout."""
    return dv.wait_until(flags + item, ">=", target, rank, rank, heap_bases, sem="acquire", scope=_GPU)


@triton.jit
def next_tile(st, epoch, num_tiles, NPROG: tl.constexpr):
    """The next tile of the dynamic queue (in order), as an int32. Every call draws exactly
    ``num_tiles + NPROG`` tickets (each program one past the end), so the call's first ticket is
    ``(epoch - 1) * (num_tiles + NPROG)``."""
    base = (epoch - 1) * (num_tiles + NPROG)
    return (tl.atomic_add(st + ST_QUEUE, 1, sem="relaxed", scope=_GPU) - base).to(tl.int32)


@triton.jit
def start_call(st, rank, world_size, heap_bases, ENTRY: tl.constexpr, trace=None, TRACE: tl.constexpr = _NO_TRACE):
    """The prologue of every skeleton kernel: this program's epoch for the call
    (:func:`begin_call`) and, with ``ENTRY``, the cross-rank entry barrier. Returns
    ``(epoch, ok)``; ``ok`` is 0 when the entry wait gave up (the program then skips its work and
    only ends the call). The pattern's ``args`` are built where they are passed on (see the
    module docstring, "args")."""
    epoch = begin_call(st, world_size)
    ok = 1
    if ENTRY:
        if TRACE:
            t = tr.record_start(trace, TRACE)
        ok = entry_barrier(st, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t, tr.ENTRY_BARRIER, st + ST_ARRIVE, rank, heap_bases, epoch)
    return epoch, ok


@triton.jit
def step_barrier(st, epoch, step, STEPS: tl.constexpr, rank, world_size, heap_bases, NPROG: tl.constexpr):
    """Between step ``step - 1`` and step ``step`` of a multi-step pattern: this program tells
    every rank it finished the previous step (release) and waits (bounded) until the *same*
    program of every rank did — the tiles a program handles are the same on every rank, so its
    next step may read whatever those programs delivered. Returns 1, or 0 if a wait gave up."""
    slots = st + ST_ARRIVE + world_size + NPROG + tl.program_id(0) * world_size
    value = (epoch - 1) * (STEPS - 1) + step
    tc.arrive(slots, value, rank, world_size, heap_bases)
    return tc.wait_arrivals(slots, value, rank, world_size, heap_bases)


@triton.jit
def traced_step_barrier(st, epoch, step, STEPS: tl.constexpr, rank, world_size, heap_bases, NPROG: tl.constexpr,
                        trace, TRACE: tl.constexpr):
    """:func:`step_barrier`, recorded as a wait (``step_barrier``, item = the step); traced kernels
    only (``TRACE`` set)."""
    t = tr.record_start(trace, TRACE)
    ok = step_barrier(st, epoch, step, STEPS, rank, world_size, heap_bases, NPROG)
    slots = st + ST_ARRIVE + world_size + NPROG + tl.program_id(0) * world_size
    tr.record_wait(trace, TRACE, t, tr.STEP_BARRIER, slots, rank, heap_bases, step)
    return ok


@triton.jit
def run_steps(args, st, epoch, ok, FIRST_BARRIER: tl.constexpr, num_tiles, rank, world_size, heap_bases,
              CFG: tl.constexpr, STEP: tl.constexpr, STEPS: tl.constexpr, NPROG: tl.constexpr, trace,
              TRACE: tl.constexpr, TRAFFIC: tl.constexpr):
    """A multi-step pattern's steps ``1 … STEPS-1`` of this program's tiles, each from step
    ``FIRST_BARRIER`` on after :func:`step_barrier`; ``ok`` 0 (a wait gave up) skips them."""
    for s in tl.static_range(1, STEPS):
        if s >= FIRST_BARRIER:
            if ok:
                if TRACE:
                    ok = traced_step_barrier(st, epoch, s, STEPS, rank, world_size, heap_bases, NPROG, trace, TRACE)
                else:
                    ok = step_barrier(st, epoch, s, STEPS, rank, world_size, heap_bases, NPROG)
        if ok:
            for tile in range(tl.program_id(0), num_tiles, NPROG):
                if TRACE:
                    t = tr.record_start(trace, TRACE)
                STEP(args, tile, s, CFG)
                if TRACE:
                    deliver_end(trace, TRACE, t, tr.STEP, args, tile, s, CFG, TRAFFIC)


# ---- tracing -------------------------------------------------------------------------------------


@triton.jit
def deliver_end(trace, TRACE: tl.constexpr, start, kind, args, item, STEP: tl.constexpr, CFG: tl.constexpr,
                TRAFFIC: tl.constexpr):
    """Record a fetch, consume or step of ``item`` that started at ``start``: peer and bytes from
    the pattern's ``traffic`` piece; role *communicate* unless it says no byte moves."""
    if TRACE:
        peer, nbytes = TRAFFIC(args, item, STEP, CFG)
        tr.record_move(trace, TRACE, start, kind, peer, nbytes, item)


@triton.jit
def deliver_end_at(trace, TRACE: tl.constexpr, ring, count, start, kind, args, item, STEP: tl.constexpr,
                   CFG: tl.constexpr, TRAFFIC: tl.constexpr):
    """:func:`deliver_end` from a loop holding the trace ring open (:func:`iris_fw.trace.ring_open`);
    returns the advanced event count."""
    if TRACE:
        peer, nbytes = TRAFFIC(args, item, STEP, CFG)
        count = tr.record_move_at(trace, TRACE, ring, count, start, kind, peer, nbytes, item)
    return count


@triton.jit
def traced_acquire_at(flags, item, target, rank, heap_bases, trace, TRACE: tl.constexpr, ring, count):
    """:func:`traced_acquire` from a loop holding the trace ring open: ``(ok, count)``."""
    t = tr.record_start(trace, TRACE)
    ok = acquire(flags, item, target, rank, heap_bases)
    count = tr.record_wait_at(trace, TRACE, ring, count, t, tr.ACQUIRE, flags + item, rank, item)
    return ok, count


@triton.jit
def traced_acquire(flags, item, target, rank, heap_bases, trace, TRACE: tl.constexpr):
    """:func:`acquire`, recorded as a wait (``acquire``, item = the item waited for); traced kernels
    only (``TRACE`` set)."""
    t = tr.record_start(trace, TRACE)
    ok = acquire(flags, item, target, rank, heap_bases)
    tr.record_wait(trace, TRACE, t, tr.ACQUIRE, flags + item, rank, heap_bases, item)
    return ok


@triton.jit
def no_traffic(args, item, STEP: tl.constexpr, CFG: tl.constexpr):
    """``traffic`` of a pattern that does not describe its communication: peer -1, bytes -1
    (unknown)."""
    return -1, -1


# ---- roles ---------------------------------------------------------------------------------------


@triton.jit
def claim(flags, num_items, item, epoch):
    """Claim item ``item`` of call ``epoch``: true for exactly one program of all the op's
    kernels (its slot ``flags[num_items + item]`` holds the last call the item was claimed in).
    The claimant produces the item and releases it; nobody else does its work."""
    return tl.atomic_max(flags + num_items + item, epoch, sem="relaxed", scope=_GPU) < epoch


@triton.jit
def produce_item(args, item, flags, epoch, rank, heap_bases,
                 PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr,
                 COMM_FIRST: tl.constexpr, SYNC: tl.constexpr, trace, TRACE: tl.constexpr, TRAFFIC: tl.constexpr,
                 ring, events):
    """The producer's work on item ``item``: fetch a chunk (communicate-first) or produce and
    stash a tile (compute-first); with ``SYNC``, release it. Returns the trace ring's event count."""
    if TRACE:
        t = tr.record_start(trace, TRACE)
    if COMM_FIRST:
        FETCH(args, item, CFG)
        if TRACE:
            events = deliver_end_at(trace, TRACE, ring, events, t, tr.FETCH, args, item, 0, CFG, TRAFFIC)
    else:
        STASH(args, item, PRODUCE(args, item, CFG, False), CFG)
        if TRACE:
            events = tr.record_at(trace, TRACE, ring, events, t, tr.PRODUCE, tr.COMPUTE, item)
    if SYNC:
        release(flags, item, epoch, rank, heap_bases)
    return events


@triton.jit
def produce_role(args, first, count, step, flags, epoch, rank, heap_bases,
                 PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr,
                 COMM_FIRST: tl.constexpr, SYNC: tl.constexpr, trace, TRACE: tl.constexpr, TRAFFIC: tl.constexpr):
    """Items ``first, first+step, …`` below ``count``: fetch chunks (communicate-first) or
    produce and stash tiles (compute-first); with ``SYNC``, each one only if this program wins
    its :func:`claim` (a consumer that found it unreleased may have claimed and produced it
    already), and released. Traced, the ring stays open over the loop (one event per item, no
    counter round trip)."""
    ring, events = tr.ring_open(trace, TRACE, heap_bases, rank)
    for item in range(first, count, step):
        mine = 1
        if SYNC:
            mine = claim(flags, count, item, epoch)
        if mine:
            events = produce_item(args, item, flags, epoch, rank, heap_bases, PRODUCE, STASH, FETCH, CFG, COMM_FIRST,
                                  SYNC, trace, TRACE, TRAFFIC, ring, events)
    tr.ring_close(TRACE, ring, events)


@triton.jit
def obtain(args, item, flags, num_items, epoch, target, rank, heap_bases, owners,
           PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr,
           COMM_FIRST: tl.constexpr, HELP: tl.constexpr, OWNERS: tl.constexpr, trace, TRACE: tl.constexpr,
           TRAFFIC: tl.constexpr, ring, events):
    """Wait (bounded) until item ``item`` reaches ``target``.

    With ``HELP`` the items are produced by ``OWNERS`` producer programs, item ``i`` by program
    ``i % OWNERS`` (:func:`produce_role`), whose call counters are ``owners[0:OWNERS]``. An item
    not yet released whose producer program has not started this call is claimed and produced by
    this program itself (unless someone claimed it first). So the wait that follows is only ever
    for a running program: the item's claimant, or its producer program, which started and will
    claim it or find it claimed — never for a producer program that may not be resident (see
    :func:`consume_tile`). While the producer runs, consumers wait as without ``HELP``: the
    schedule's split of the SMs holds. Returns ``(ok, events)``."""
    if HELP:
        if tl.load(flags + item, volatile=True) < target:
            if tl.load(owners + item % OWNERS, volatile=True) < epoch:
                if claim(flags, num_items, item, epoch):
                    events = produce_item(args, item, flags, epoch, rank, heap_bases, PRODUCE, STASH, FETCH, CFG,
                                          COMM_FIRST, True, trace, TRACE, TRAFFIC, ring, events)
    if TRACE:
        ok, events = traced_acquire_at(flags, item, target, rank, heap_bases, trace, TRACE, ring, events)
    else:
        ok = acquire(flags, item, target, rank, heap_bases)
    return ok, events


@triton.jit
def consume_tile(args, tile, flags, num_items, epoch, target, rank, heap_bases, owners,
                 PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                 STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr, COMM_FIRST: tl.constexpr,
                 SYNC: tl.constexpr, HELP: tl.constexpr, OWNERS: tl.constexpr, trace, TRACE: tl.constexpr,
                 TRAFFIC: tl.constexpr, ring, events):
    """The consumer's work on one tile: compute from staged operands and deliver it
    (communicate-first), or reload a stashed tile and send it (compute-first). With ``SYNC`` it
    first obtains the item it depends on (:func:`obtain`: with ``HELP`` it produces the item
    itself when the item's producer program has not started), and skips the tile if that wait
    gave up. Returns
    ``(ok, events)``: 1, or 0 if the acquire gave up; traced, the event count of the ring the
    caller holds open (``ring``, ``events``: :func:`iris_fw.trace.ring_open`; untraced 0).

    Why ``HELP`` exists: a consumer kernel on another stream (``producer_consumer``), or the
    consumer programs of one kernel (``wg_specialized``), may be resident on every SM this
    process can use before the producer's programs get one — nothing orders two streams'
    dispatch, and under CUDA MPS another client's programs share the SMs. A consumer that only
    spun on the flag would then wait for a producer that never runs (seen on one H100 under MPS:
    ``all_gather_gemm`` hung in its 93rd back-to-back call)."""
    ok = 1
    if COMM_FIRST:
        if SYNC:
            ok, events = obtain(args, DEPENDS(args, tile, CFG), flags, num_items, epoch, target, rank, heap_bases,
                                owners, PRODUCE, STASH, FETCH, CFG, COMM_FIRST, HELP, OWNERS, trace, TRACE, TRAFFIC,
                                ring, events)
        if ok:
            if TRACE:
                t = tr.record_start(trace, TRACE)
            value = PRODUCE(args, tile, CFG, True)
            if TRACE:
                events = tr.record_at(trace, TRACE, ring, events, t, tr.PRODUCE, tr.COMPUTE, tile)
                t = tr.record_start(trace, TRACE)
            CONSUME(args, tile, value, CFG, False)
            if TRACE:
                events = tr.record_at(trace, TRACE, ring, events, t, tr.CONSUME, tr.COMPUTE, tile, -1, 0)
    else:
        if SYNC:
            ok, events = obtain(args, tile, flags, num_items, epoch, target, rank, heap_bases, owners, PRODUCE, STASH,
                                FETCH, CFG, COMM_FIRST, HELP, OWNERS, trace, TRACE, TRAFFIC, ring, events)
        if ok:
            if TRACE:
                t = tr.record_start(trace, TRACE)
            CONSUME(args, tile, RELOAD(args, tile, CFG), CFG, True)
            if TRACE:
                events = deliver_end_at(trace, TRACE, ring, events, t, tr.CONSUME, args, tile, 0, CFG, TRAFFIC)
    return ok, events


@triton.jit
def consume_role(args, first, num_tiles, step, st, flags, num_items, epoch, target, rank, heap_bases, owners,
                 PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                 STASH: tl.constexpr, FETCH: tl.constexpr, CFG: tl.constexpr, COMM_FIRST: tl.constexpr,
                 SYNC: tl.constexpr, HELP: tl.constexpr, OWNERS: tl.constexpr, QUEUE: tl.constexpr,
                 NPROG: tl.constexpr, trace, TRACE: tl.constexpr, TRAFFIC: tl.constexpr):
    """Tiles ``first, first+step, …`` (or, with ``QUEUE``, whatever the dynamic queue hands out
    to the kernel's ``NPROG`` programs) through :func:`consume_tile`. After an acquire gave up
    the program stops: no later tile is waited for or sent (the queue's tickets are still drawn,
    so the next call's tiles are numbered right)."""
    ok = 1
    # traced: the ring stays open over the loop (events counted in a register)
    ring, events = tr.ring_open(trace, TRACE, heap_bases, rank)
    if QUEUE:
        tile = next_tile(st, epoch, num_tiles, NPROG)
        while tile < num_tiles:
            if ok:
                ok, events = consume_tile(args, tile, flags, num_items, epoch, target, rank, heap_bases, owners,
                                          PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG, COMM_FIRST, SYNC, HELP,
                                          OWNERS, trace, TRACE, TRAFFIC, ring, events)
            tile = next_tile(st, epoch, num_tiles, NPROG)
    else:
        for tile in range(first, num_tiles, step):
            if ok:
                ok, events = consume_tile(args, tile, flags, num_items, epoch, target, rank, heap_bases, owners,
                                          PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG, COMM_FIRST, SYNC, HELP,
                                          OWNERS, trace, TRACE, TRAFFIC, ring, events)
    tr.ring_close(TRACE, ring, events)


@triton.jit
def end_call(st, flags, epoch, num_flags, rank, world_size, heap_bases,
             NPROG: tl.constexpr, EXIT: tl.constexpr, RESET_FLAGS: tl.constexpr, trace=None,
             TRACE: tl.constexpr = _NO_TRACE, started=0):
    """End of every program: the last one of the call does the exit barrier and, for flags
    published with a fixed value (copy engine), resets them for the next call. Traced, it
    records the program's span since ``started`` (item = the call's epoch)."""
    last = finish_program(st, epoch, NPROG)
    if last:
        if RESET_FLAGS:
            for item in range(0, num_flags):
                tl.store(flags + item, 0)
        if EXIT:
            if TRACE:
                t = tr.record_start(trace, TRACE)
            exit_barrier(st, epoch, rank, world_size, heap_bases)
            if TRACE:
                tr.record_wait(trace, TRACE, t, tr.EXIT_BARRIER, st + ST_ARRIVE, rank, heap_bases, epoch)
    if TRACE:
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch, -1, 0)


@triton.jit
def fused_tiles(args, num_tiles, CFG: tl.constexpr, PRODUCE: tl.constexpr, CONSUME: tl.constexpr, NPROG: tl.constexpr,
                DEPENDS: tl.constexpr, TRAFFIC: tl.constexpr, COMM_FIRST: tl.constexpr, trace, TRACE: tl.constexpr):
    """The fused skeleton's tile loop: each program computes a tile and delivers it at once."""
    for tile in range(tl.program_id(0), num_tiles, NPROG):
        if TRACE:
            t = tr.record_start(trace, TRACE)
        value = PRODUCE(args, tile, CFG, False)
        if COMM_FIRST:
            if TRACE:
                peer, nbytes = TRAFFIC(args, DEPENDS(args, tile, CFG), 0, CFG)
                tr.record_end(trace, TRACE, t, tr.PRODUCE, tr.COMPUTE, tile, peer, nbytes)
                t = tr.record_start(trace, TRACE)
            CONSUME(args, tile, value, CFG, False)
            if TRACE:
                tr.record_end(trace, TRACE, t, tr.CONSUME, tr.COMPUTE, tile, -1, 0)
        else:
            if TRACE:
                tr.record_end(trace, TRACE, t, tr.PRODUCE, tr.COMPUTE, tile)
                t = tr.record_start(trace, TRACE)
            CONSUME(args, tile, value, CFG, False)
            if TRACE:
                deliver_end(trace, TRACE, t, tr.CONSUME, args, tile, 0, CFG, TRAFFIC)


# ---- kernel skeletons ----------------------------------------------------------------------------


@triton.jit
def _fused_kernel(top0, top1, rest, st, flags, num_tiles, rank, world_size, heap_bases, trace,
                  ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                  PRODUCE: tl.constexpr, CONSUME: tl.constexpr, STEP: tl.constexpr, STEPS: tl.constexpr,
                  NPROG: tl.constexpr, ENTRY: tl.constexpr, EXIT: tl.constexpr,
                  DEPENDS: tl.constexpr = None, TRAFFIC: tl.constexpr = None, COMM_FIRST: tl.constexpr = False,
                  TRACE: tl.constexpr = _NO_TRACE):
    """Persistent: each program computes a tile and delivers it at once (it stays in registers).
    A multi-step pattern (``STEPS > 1``) then runs ``STEP(args, tile, s, CFG)`` for the same
    tiles, step by step, each after :func:`step_barrier`. Communicate-first patterns read their
    operands from the peers inside ``PRODUCE`` (traced: the produce event carries the chunk's
    peer and bytes)."""
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = start_call(st, rank, world_size, heap_bases, ENTRY, trace, TRACE)
    if ok:
        fused_tiles((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                    num_tiles, CFG, PRODUCE, CONSUME, NPROG, DEPENDS, TRAFFIC, COMM_FIRST, trace, TRACE)
    if STEPS > 1:
        run_steps((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                  st, epoch, ok, 1, num_tiles, rank, world_size, heap_bases, CFG, STEP, STEPS, NPROG, trace, TRACE,
                  TRAFFIC)
    end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False, trace, TRACE, started)


@triton.jit
def _producer_kernel(top0, top1, rest, st, flags, count, rank, world_size, heap_bases, trace,
                     ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                     PRODUCE: tl.constexpr, STASH: tl.constexpr, FETCH: tl.constexpr,
                     NPROG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr,
                     ENTRY: tl.constexpr, EXIT: tl.constexpr, TRAFFIC: tl.constexpr = None,
                     TRACE: tl.constexpr = _NO_TRACE):
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = start_call(st, rank, world_size, heap_bases, ENTRY, trace, TRACE)
    if ok:
        produce_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                     tl.program_id(0), count, NPROG, flags, epoch, rank, heap_bases, PRODUCE, STASH, FETCH, CFG,
                     COMM_FIRST, SYNC, trace, TRACE, TRAFFIC)
    end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False, trace, TRACE, started)


@triton.jit
def _consumer_kernel(top0, top1, rest, st, flags, num_tiles, num_flags, fixed_flag, rank, world_size, heap_bases,
                     owners, trace, ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                     PRODUCE: tl.constexpr, CONSUME: tl.constexpr, RELOAD: tl.constexpr, DEPENDS: tl.constexpr,
                     NPROG: tl.constexpr, COMM_FIRST: tl.constexpr, SYNC: tl.constexpr, QUEUE: tl.constexpr,
                     FIXED: tl.constexpr, ENTRY: tl.constexpr, EXIT: tl.constexpr, TRAFFIC: tl.constexpr = None,
                     STASH: tl.constexpr = None, FETCH: tl.constexpr = None, HELP: tl.constexpr = False,
                     OWNERS: tl.constexpr = 1, TRACE: tl.constexpr = _NO_TRACE):
    """Acquires items released with the epoch, or (``FIXED``) with the constant ``fixed_flag`` —
    then the last program resets the ``num_flags`` flags for the next call. With ``HELP`` (items
    released by the ``OWNERS`` programs of a producer *kernel* whose call counters are ``owners``:
    not ``FIXED``), an item whose producer program has not started is produced by the consumer
    program that needs it (:func:`obtain`); a communicate-first consumer that helps fetches from
    peers, so it then carries ``ENTRY`` and ``EXIT`` like the producer."""
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = start_call(st, rank, world_size, heap_bases, ENTRY, trace, TRACE)
    target = epoch
    if FIXED:
        target = fixed_flag
    if ok:
        consume_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                     tl.program_id(0), num_tiles, NPROG, st, flags, num_flags, epoch, target, rank, heap_bases, owners,
                     PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG, COMM_FIRST, SYNC, HELP, OWNERS, QUEUE, NPROG,
                     trace, TRACE, TRAFFIC)
    end_call(st, flags, epoch, num_flags, rank, world_size, heap_bases, NPROG, EXIT, FIXED, trace, TRACE, started)


@triton.jit
def _specialized_kernel(top0, top1, rest, st, flags, num_tiles, num_items, rank, world_size, heap_bases, trace,
                        ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                        PRODUCE: tl.constexpr, CONSUME: tl.constexpr, STASH: tl.constexpr, RELOAD: tl.constexpr,
                        FETCH: tl.constexpr, DEPENDS: tl.constexpr,
                        NPROG: tl.constexpr, PRODUCERS: tl.constexpr, COMM_FIRST: tl.constexpr,
                        ENTRY: tl.constexpr, EXIT: tl.constexpr, TRAFFIC: tl.constexpr = None,
                        TRACE: tl.constexpr = _NO_TRACE):
    """One kernel, two roles: programs below ``PRODUCERS`` produce and release, the others
    acquire and consume — and produce an item themselves when its producer program has not
    started (:func:`obtain`), so a consumer program never waits for a producer program that is
    not resident. Communicate-first: the fetching programs join the (dynamic) compute queue once
    their chunks are fetched."""
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = start_call(st, rank, world_size, heap_bases, ENTRY, trace, TRACE)
    pid = tl.program_id(0)
    counters = st + ST_ARRIVE + world_size  # every program's call counter: the producers' come first
    if ok:
        if pid < PRODUCERS:
            produce_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                         pid, num_items, PRODUCERS, flags, epoch, rank, heap_bases, PRODUCE, STASH, FETCH, CFG,
                         COMM_FIRST, True, trace, TRACE, TRAFFIC)
            if COMM_FIRST:
                consume_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                             0, num_tiles, 1, st, flags, num_items, epoch, epoch, rank, heap_bases, counters,
                             PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG, COMM_FIRST, True, True, PRODUCERS,
                             True, NPROG, trace, TRACE, TRAFFIC)
        else:
            consume_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                         pid - PRODUCERS, num_tiles, NPROG - PRODUCERS, st, flags, num_items, epoch, epoch, rank,
                         heap_bases, counters, PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG, COMM_FIRST, True,
                         True, PRODUCERS, COMM_FIRST, NPROG, trace, TRACE, TRAFFIC)
    end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False, trace, TRACE, started)


@triton.jit
def _steps_kernel(top0, top1, rest, st, flags, num_tiles, rank, world_size, heap_bases, trace,
                  ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                  STEP: tl.constexpr, STEPS: tl.constexpr, NPROG: tl.constexpr, EXIT: tl.constexpr,
                  TRAFFIC: tl.constexpr = None, TRACE: tl.constexpr = _NO_TRACE):
    """A multi-step pattern's steps ``1 … STEPS-1`` on a schedule that ran step 0 in kernels of
    its own: launched after them on the same stream, whose exit barrier made every delivery of
    step 0 complete on every rank — so step 1 needs no barrier of its own; each later step
    follows :func:`step_barrier`. ``EXIT``: the last program waits until every rank's steps
    delivered (the steps communicate)."""
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = start_call(st, rank, world_size, heap_bases, False, trace, TRACE)
    if STEPS > 1:
        run_steps((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                  st, epoch, ok, 2, num_tiles, rank, world_size, heap_bases, CFG, STEP, STEPS, NPROG, trace, TRACE,
                  TRAFFIC)
    end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False, trace, TRACE, started)


@triton.jit
def no_fetch(args, chunk, CFG: tl.constexpr):
    """``fetch`` of a pattern with no operand chunks: does nothing."""
    pass


@triton.jit
def no_step(args, tile, STEP: tl.constexpr, CFG: tl.constexpr):
    """``step`` of a one-step pattern: does nothing (never called)."""
    pass


@triton.jit
def no_depends(args, tile, CFG: tl.constexpr):
    """``depends`` of a pattern with no operand chunks: chunk 0 (never waited for)."""
    return 0
