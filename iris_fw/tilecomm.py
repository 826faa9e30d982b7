"""Tile-level communication: the ``@triton.jit`` exchanges every higher layer is built from.

Fused GEMM + collective patterns, the host collectives and attention combines all move tiles
between ranks with the functions below, so each exchange has one implementation. A leaf
module like :mod:`iris_fw.device` (it imports Triton and ``iris_fw.device`` only).

**Argument order** (the one of :mod:`iris_fw.device`): pointers and values first (sources
before destinations; a stride between per-rank slots goes with them), then ``rank`` (the
caller), then the peer rank (``peer``/``root``) or ``world_size``, then ``heap_bases``, then
keyword options (``mask=None``, ``OP``)::

    tile_reduce(ptrs, rank, world_size, heap_bases, mask=None, OP="sum") -> tile
    tile_all_reduce(src, dst, rank, world_size, heap_bases, mask=None, OP="sum")
    tile_reduce_broadcast(src, dst, rank, world_size, heap_bases, mask=None, OP="sum")
    tile_store_all(ptrs, value, rank, world_size, heap_bases, mask=None)
    tile_put_all(src, dst, rank, world_size, heap_bases, mask=None)
    tile_gather(src, dst, stride, rank, world_size, heap_bases, mask=None)
    tile_all_to_all(src, dst, stride, rank, world_size, heap_bases, mask=None, dst_stride=None)
    tile_put_chunks(src, offsets, counts, pos, dst, dst_stride, rank, world_size, heap_bases)
    tile_broadcast(src, dst, rank, root, heap_bases, mask=None)
    signal_peers(flag, value, rank, world_size, heap_bases)
    arrive(slots, epoch, rank, world_size, heap_bases)
    wait_flag(flag, epoch, rank, heap_bases) -> 1/0
    wait_arrivals(slots, epoch, rank, world_size, heap_bases) -> 1/0
    last_program(counter, nprog, epoch) -> bool
    program_epoch(counters) -> epoch
    tile_reduce_rows(ptrs, stride, world_size, mask=None, OP="sum") -> tile
    widen(x) -> tile;  combine(acc, x, OP) -> tile
    push_exchange(src, recv, slots, epoch, n, rank, world_size, heap_bases, BLOCK, CAP, src_stride=None) -> (buf, 1/0)
    lamport_put_all(src, dst, rank, world_size, heap_bases, mask=None)
    lamport_wait(ptrs, where, rank, heap_bases, mask=None, live=1) -> (tile, 1/0)
    lamport_clear(ptrs, mask=None)
    lamport_reduce(ptrs, stride, where, rank, world_size, heap_bases, mask=None, OP="sum", live=1) -> (tile, 1/0)

A tile is a block of pointers, 1-D ``[BLOCK]`` or 2-D ``[BM, BN]`` (any pointer arithmetic),
with an optional ``mask`` of the same shape as in ``tl.load``. Pointers that a peer's copy is
read or written through point into the *caller's* heap (symmetric tensors) and are
translated per peer; a purely local side (the ``dst`` of a reduction or a pull, the ``src``
of a push) may be any pointer. Loops over ranks start at the caller's own rank and rotate
(``rank, rank+1, …``), so the ranks use different links at the same time.

Reductions: ``OP`` is ``"sum"``, ``"max"``, ``"min"`` or ``"prod"``. Floating inputs narrower
than 32 bits (fp16, bf16, fp8) accumulate in fp32, wider ones in their own type; integers
accumulate in their own type (wrapping). Results are cast to the destination's dtype when
stored (round to nearest even on GPUs; Triton's CPU interpreter truncates fp32 -> bf16 and
mis-rounds fp32 -> fp8 where rounding carries into the exponent, e.g. 1.96 -> 1.0).

**Synchronization model.** These functions only move data; ordering is the caller's, with
int64 flag slots on the heap whose values are *epochs*: a per-call counter that only grows
(call ``e`` uses epoch ``e``, or ``2e-1``/``2e`` for an entry and an exit barrier on one slot
array), kept on the device by the caller and passed as a runtime scalar — never a Python int
baked into each launch — so kernels stay CUDA-graph safe and slots are never reset.
Cross-rank flags are written with release and read with acquire order at scope ``"sys"``;
every wait is :func:`iris_fw.device.wait_until` (bounded: a missing peer becomes a
:class:`iris_fw.WaitTimeout` naming the flag, never a hang). A typical kernel::

    # state: int64 [2] (epoch of the last call, program counter); slots: int64 [world_size]
    epoch = tl.load(state) + 1                                         # every program
    arrive(slots, 2 * epoch - 1, rank, world_size, heap_bases)        # entry: my inputs are
    wait_arrivals(slots, 2 * epoch - 1, rank, world_size, heap_bases) # written, my outputs
    ... exchanges ...                                                  # free; so are peers'
    if last_program(state + 1, tl.num_programs(0), epoch):            # exit, once per rank
        tl.store(state, epoch)                   # every other program has read it already
        arrive(slots, 2 * epoch, rank, world_size, heap_bases)        # peers are done with
        wait_arrivals(slots, 2 * epoch, rank, world_size, heap_bases) # my buffers, I with theirs

No program may wait for something another program of the *same launch* does: programs are
not guaranteed to run at the same time (Triton's CPU interpreter runs them one after
another). So every program does its own entry arrival, and the cross-rank exit barrier is
done by the last program of the rank to finish, found with :func:`last_program`.
"""

import triton
import triton.language as tl

from . import device as dv
from . import trace as tr

# String defaults of constexpr parameters are tl.constexpr objects (see iris_fw.device).
_SUM = tl.constexpr("sum")
_SET = tl.constexpr("set")
_NO_TRACE = tl.constexpr(0)


# ---- synchronization ----------------------------------------------------------------------


@triton.jit
def signal_peers(flag, value, rank, world_size, heap_bases):
    """Release-store ``value`` into the scalar ``flag`` (an int64 slot of a symmetric tensor)
    on every rank's heap, the caller's own first (scope ``"sys"``): every store the calling
    program made before is visible to whoever acquires the flag. E.g. a chunk's owner
    announcing "chunk ready for epoch e" to every rank."""
    for i in range(0, world_size):
        dv.signal(flag, value, rank, (rank + i) % world_size, heap_bases, op=_SET)


@triton.jit
def arrive(slots, epoch, rank, world_size, heap_bases):
    """Arrive at a barrier: release-store ``epoch`` into ``slots[rank]`` on every rank's heap
    (scope ``"sys"``). ``slots``: an int64 ``[world_size]`` symmetric tensor, zero before its
    first use. Pair with :func:`wait_arrivals`. Any program may arrive, any number of times
    with the same epoch; an arrival must never be waited for by another program of the same
    launch on the same rank."""
    signal_peers(slots + rank, epoch, rank, world_size, heap_bases)


@triton.jit
def wait_flag(flag, epoch, rank, heap_bases):
    """Bounded acquire-wait (scope ``"sys"``) until the scalar int64 ``flag`` on the caller's
    own heap is ``>= epoch``. Returns 1, or 0 if the wait timed out (recorded in the heap
    header; the host raises ``WaitTimeout`` naming the flag)."""
    return dv.wait_until(flag, ">=", epoch, rank, rank, heap_bases)


@triton.jit
def wait_arrivals(slots, epoch, rank, world_size, heap_bases):
    """Bounded acquire-wait until every ``slots[p] >= epoch`` (``p < world_size``, int64
    ``[world_size]``) in the caller's own heap, i.e. every rank did
    ``arrive(slots, epoch', …)`` with ``epoch' >= epoch``.

    Returns 1, or 0 if a wait timed out; after the first timeout the remaining slots are not
    waited for (one timeout is recorded and the caller is not held up ``world_size`` times).
    """
    ok = dv.wait_until(slots + rank, ">=", epoch, rank, rank, heap_bases)
    for i in range(1, world_size):
        if ok != 0:
            ok = dv.wait_until(slots + (rank + i) % world_size, ">=", epoch, rank, rank, heap_bases)
    return ok


@triton.jit
def last_program(counter, nprog, epoch):
    """Count this program as finished with call ``epoch``; true for exactly the last of the
    launch's ``nprog`` programs to do so.

    Every program of the launch calls it once, at its end. ``counter``: a scalar integer
    (int64) in local memory that only grows, 0 before the first call, advanced by ``nprog``
    per call (so every call on one counter must use the same ``nprog``); ``epoch`` is 1 for
    the first call. The add is acq_rel (scope ``"sys"``, so that peer-memory stores of the
    other programs are ordered before the last program's cross-rank release): the last
    program sees every store the others made before their call.
    """
    # Every thread of the program finished its stores before one of them releases.
    tl.debug_barrier()
    old = tl.atomic_add(counter, 1, sem="acq_rel", scope="sys")
    tl.debug_barrier()
    return old == epoch * nprog - 1


@triton.jit
def program_epoch(counters):
    """This program's call number (1 for the first call), advanced: ``counters`` is an int64
    ``[num_programs]`` array in local memory, zero before the first call, where each program
    keeps its own count. Every launch of one kernel configuration uses the same grid, so the
    ``p``-th program of every rank agrees on the epoch without a host integer or an atomic.

    Every thread loads the counter, then all meet, then one thread stores the new value: without
    the barrier a warp that starts late can load the value another warp of the same program has
    already advanced, and that warp's share of every tile then uses the next call's epoch —
    the other half of a double buffer, the next call's flag value."""
    slot = counters + tl.program_id(0)
    epoch = tl.load(slot) + 1
    tl.debug_barrier()
    tl.store(slot, epoch)
    return epoch


# ---- reductions ---------------------------------------------------------------------------


@triton.jit
def widen(x):
    """``x`` in its accumulator type: fp32 for floats narrower than 32 bits, else unchanged."""
    if x.dtype.is_floating():
        if x.dtype.primitive_bitwidth < 32:
            x = x.to(tl.float32)
    return x


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """``acc`` combined with ``x`` (both in the accumulator type) by ``OP``."""
    if OP == "sum":
        out = acc + x
    elif OP == "max":
        out = tl.maximum(acc, x)
    elif OP == "min":
        out = tl.minimum(acc, x)
    else:
        out = acc * x
    return out


@triton.jit
def tile_reduce(ptrs, rank, world_size, heap_bases, mask=None, OP: tl.constexpr = _SUM):
    """The tile at ``ptrs`` (symmetric; ``[BLOCK]`` or ``[BM, BN]``) reduced with ``OP`` over
    every rank's copy, read from ``rank``, ``rank+1``, …; returned as a register tile of the
    same shape in the accumulator type (fp32 for 16/8-bit floats). Lanes outside ``mask``
    hold unspecified values."""
    tl.static_assert(OP == "sum" or OP == "max" or OP == "min" or OP == "prod",
                     "tile_reduce: OP must be 'sum', 'max', 'min' or 'prod'")
    acc = widen(tl.load(ptrs, mask=mask))
    for i in range(1, world_size):
        x = dv.load(ptrs, rank, (rank + i) % world_size, heap_bases, mask=mask)
        acc = combine(acc, widen(x), OP)
    return acc


@triton.jit
def tile_all_reduce(src, dst, rank, world_size, heap_bases, mask=None, OP: tl.constexpr = _SUM):
    """``dst`` = ``src`` reduced with ``OP`` over every rank. ``src``: symmetric, ``dst``: any
    local pointers (its dtype may differ from ``src``'s), both ``[BLOCK]`` or ``[BM, BN]``.

    One-shot all-reduce of a tile when every rank calls it for every tile; the reduce-scatter
    piece when only a chunk's owner calls it for the tiles of its chunk.
    """
    acc = tile_reduce(src, rank, world_size, heap_bases, mask=mask, OP=OP)
    tl.store(dst, acc.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def tile_reduce_broadcast(src, dst, rank, world_size, heap_bases, mask=None, OP: tl.constexpr = _SUM):
    """``src`` reduced with ``OP`` over every rank, stored into ``dst`` on every rank. ``src``,
    ``dst``: symmetric, ``[BLOCK]`` or ``[BM, BN]``.

    The owner's step of a two-shot all-reduce: each tile has one owner rank, which calls this
    for it; ``dst`` may be ``src`` only if no rank reads this tile of ``src`` afterwards.
    """
    acc = tile_reduce(src, rank, world_size, heap_bases, mask=mask, OP=OP)
    tile_store_all(dst, acc, rank, world_size, heap_bases, mask=mask)


@triton.jit
def tile_reduce_rows(ptrs, stride, world_size, mask=None, OP: tl.constexpr = _SUM):
    """The local tiles ``ptrs + p * stride`` (``p = 0 … world_size-1``, e.g. the per-rank
    slots of a receive buffer) reduced with ``OP``, combined in rank order so that every rank
    computes bitwise the same result; returned in the accumulator type."""
    acc = widen(tl.load(ptrs, mask=mask))
    for p in range(1, world_size):
        acc = combine(acc, widen(tl.load(ptrs + p * stride, mask=mask)), OP)
    return acc


# ---- data movement ------------------------------------------------------------------------


@triton.jit
def tile_store_all(ptrs, value, rank, world_size, heap_bases, mask=None):
    """Store the register tile ``value`` (cast to ``ptrs``' dtype) at ``ptrs`` (symmetric) on
    every rank, ``[BLOCK]`` or ``[BM, BN]`` alike: what a fused producer does with a tile
    every rank needs."""
    out = value.to(ptrs.dtype.element_ty)
    for i in range(0, world_size):
        dv.store(ptrs, out, rank, (rank + i) % world_size, heap_bases, mask=mask)


@triton.jit
def tile_put_all(src, dst, rank, world_size, heap_bases, mask=None):
    """Push: copy the caller's tile at ``src`` (any local pointers) to ``dst`` (symmetric) on
    every rank; both ``[BLOCK]`` or ``[BM, BN]``. All-gather by push (``dst`` = the caller's
    slot of the output), and the root's side of a push broadcast."""
    tile_store_all(dst, tl.load(src, mask=mask), rank, world_size, heap_bases, mask=mask)


@triton.jit
def tile_gather(src, dst, stride, rank, world_size, heap_bases, mask=None):
    """Pull: for every rank ``p``, copy ``p``'s tile at ``src`` (symmetric) into the local
    ``dst + p * stride``; both ``[BLOCK]`` or ``[BM, BN]``, ``stride`` in elements between
    the per-rank slots of the output. All-gather by pull."""
    for i in range(0, world_size):
        p = (rank + i) % world_size
        tl.store(dst + p * stride, dv.load(src, rank, p, heap_bases, mask=mask), mask=mask)


@triton.jit
def tile_all_to_all(src, dst, stride, rank, world_size, heap_bases, mask=None, dst_stride=None):
    """All-to-all by push: for every rank ``p``, the caller's tile for ``p`` at
    ``src + p * stride`` (any local pointers) goes to ``p``'s slot for the caller,
    ``dst + rank * dst_stride`` in ``p``'s heap (``dst`` symmetric). ``src``, ``dst``: the
    ``[BLOCK]`` or ``[BM, BN]`` tile of slot 0; ``stride``: elements between per-rank slots of
    ``src``; ``dst_stride``: of ``dst`` (None: ``stride``)."""
    for i in range(0, world_size):
        p = (rank + i) % world_size
        if dst_stride is None:
            dv.store(dst + rank * stride, tl.load(src + p * stride, mask=mask), rank, p, heap_bases, mask=mask)
        else:
            dv.store(dst + rank * dst_stride, tl.load(src + p * stride, mask=mask), rank, p, heap_bases, mask=mask)


@triton.jit
def tile_put_chunks(src, offsets, counts, pos, dst, dst_stride, rank, world_size, heap_bases):
    """All-to-all of ragged chunks by push: for every rank ``p``, the caller's chunk for ``p``
    starts ``offsets[p]`` elements into the send buffer and is ``counts[p]`` elements long
    (``offsets``, ``counts``: int64 ``[world_size]``); its elements at positions ``pos`` go to
    ``p``'s slot for the caller, ``dst + rank * dst_stride`` in ``p``'s heap. ``src``: the
    pointers of positions ``pos`` of a chunk starting at the buffer's element 0 (any local
    pointers; chunk ``p``'s are ``src + offsets[p]``); ``dst``: where those positions land in
    slot 0 (symmetric); ``pos``: 1-D int positions within a chunk — those at or past
    ``counts[p]`` are neither read nor written for ``p``. :func:`tile_all_to_all` when every
    chunk has the same length at a fixed stride."""
    for i in range(0, world_size):
        p = (rank + i) % world_size
        mask = pos < tl.load(counts + p)
        dv.store(dst + rank * dst_stride, tl.load(src + tl.load(offsets + p), mask=mask), rank, p, heap_bases,
                 mask=mask)


@triton.jit
def tile_broadcast(src, dst, rank, root, heap_bases, mask=None):
    """Broadcast by pull: ``dst`` (any local pointers) = ``root``'s tile at ``src``
    (symmetric); both ``[BLOCK]`` or ``[BM, BN]``. The root copies its own tile (a no-op
    copy when ``dst`` is ``src``)."""
    tl.store(dst, dv.load(src, rank, root, heap_bases, mask=mask), mask=mask)


@triton.jit
def push_exchange(src, recv, slots, epoch, n, rank, world_size, heap_bases, BLOCK: tl.constexpr,
                  CAP: tl.constexpr, trace=None, TRACE: tl.constexpr = _NO_TRACE, src_stride=None):
    """One round of a push exchange, the first half of a one-shot all-reduce, a push all-gather or
    a push reduce-scatter: this program pushes its tiles ``t = pid, pid + programs, …`` of
    ``src[:n]`` (any local pointer) into slot ``rank`` of every rank's receive buffer, arrives, and
    waits for the same program of every rank (which pushed it exactly the tiles it will read).
    ``src_stride`` (reduce-scatter): rank ``p`` gets ``src[p * src_stride:][:n]`` instead, the
    piece meant for it (:func:`tile_all_to_all`); None: every rank gets ``src[:n]``. ``recv``:
    symmetric ``[2, world_size, CAP]``, its half chosen by the parity of ``epoch`` (the call's,
    from :func:`program_epoch`); ``slots``: symmetric int64 ``[programs, world_size]``. Returns
    ``(buf, ok)``: this call's ``[world_size, CAP]`` half, and 1, or 0 if a wait gave up. Traced
    (:mod:`iris_fw.trace`): a ``push`` and an ``arrivals`` event."""
    pid = tl.program_id(0)
    buf = recv + (epoch % 2) * world_size * CAP
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for t in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if src_stride is None:
            tile_put_all(src + offs, buf + rank * CAP + offs, rank, world_size, heap_bases, mask=offs < n)
        else:
            tile_all_to_all(src + offs, buf + offs, src_stride, rank, world_size, heap_bases, mask=offs < n,
                            dst_stride=CAP)
    arrive(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
        tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                       tr.strided_share(n, BLOCK, pid, tl.num_programs(0)) * (world_size - 1) * ELEM)
        t0 = tr.record_start(trace, TRACE)
    ok = wait_arrivals(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, slots + pid * world_size, rank, heap_bases)
    return buf, ok


# ---- data as flag ("Lamport" exchange) ----------------------------------------------------
#
# A receive buffer is filled with an *empty* bit pattern (a float's negative zero: only the
# sign bit set, see :func:`lamport_empty`); a sender stores its tile there with every negative
# zero turned into a positive one, so the receiver knows a lane has arrived when it no longer
# holds the pattern — no separate flag, no extra round trip. The receiver clears what it read
# (:func:`lamport_clear`) for the buffer's next use, and alternates between two buffers (by
# call parity): a peer can run at most one call ahead, because it cannot finish a call before
# receiving this rank's data for it. Floating dtypes only (an integer has no spare pattern).
# A polled tile must give each lane to one thread (at least as many elements as the program has
# threads, as the collectives' 4 KiB tiles do): where Triton's layout repeats a small tile over
# several threads, each copy of a lane is loaded on its own, and the poll's count can come from a
# copy that saw the data while another copy still holds the empty pattern. (Our reading of run 84,
# one H200: flash-decode's splits combined this way — a [16, 4] tile of log-sum-exps on 8 warps —
# gave wrong values, where on 4 warps it passed its checks; that combine was slower as well, and
# was taken back.)


def lamport_empty(bits: int) -> int:
    """The empty pattern of a ``bits``-wide float, as the signed integer of the same width."""
    return -(1 << (bits - 1))


@triton.jit
def _as_bits(ptrs):
    BITS: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    tl.static_assert(BITS == 8 or BITS == 16 or BITS == 32 or BITS == 64, "lamport: 8/16/32/64-bit dtypes only")
    if BITS == 8:
        out = ptrs.to(tl.pointer_type(tl.int8), bitcast=True)
    elif BITS == 16:
        out = ptrs.to(tl.pointer_type(tl.int16), bitcast=True)
    elif BITS == 32:
        out = ptrs.to(tl.pointer_type(tl.int32), bitcast=True)
    else:
        out = ptrs.to(tl.pointer_type(tl.int64), bitcast=True)
    return out


@triton.jit
def _empty_bits(ptrs):
    BITS: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    EMPTY: tl.constexpr = -(1 << (BITS - 1))
    return EMPTY


@triton.jit
def lamport_put_all(src, dst, rank, world_size, heap_bases, mask=None):
    """Push the caller's floating tile at ``src`` (any local pointers) to ``dst`` (symmetric,
    a buffer filled with the empty pattern) on every rank, the caller's own first; negative
    zeros travel as positive zeros so no lane looks empty."""
    bits = tl.load(_as_bits(src), mask=mask)
    bits = tl.where(bits == _empty_bits(src), tl.zeros_like(bits), bits)
    out = _as_bits(dst)
    for i in range(0, world_size):
        dv.store(out, bits, rank, (rank + i) % world_size, heap_bases, mask=mask)


@triton.jit
def lamport_wait(ptrs, where, rank, heap_bases, mask=None, live=1):
    """Poll the caller's local tile at ``ptrs`` (volatile loads) until no lane inside ``mask``
    holds the empty pattern; returns ``(tile, 1)``, or ``(tile, 0)`` after the header's wait
    bound, when the timeout is recorded against the scalar pointer ``where`` (the buffer, for
    the host's ``WaitTimeout`` message). ``live=0`` (an earlier wait of the caller failed)
    looks once and does not wait, so one missing peer costs one timeout, not one per tile; it
    gives up at once, too, when the abort word is set (polled as :func:`iris_fw.device.wait_until`
    does)."""
    bits_ptrs = _as_bits(ptrs)
    EMPTY = _empty_bits(ptrs)
    hdr = dv.heap_header(rank, heap_bases)
    bound = tl.load(hdr + dv.HDR_WAIT_BOUND) * live
    bits = tl.load(bits_ptrs, mask=mask, other=0, volatile=True)
    missing = tl.sum((bits == EMPTY).to(tl.int32))
    spins = bound * 0
    stop = missing * 0
    while (missing > 0) & (spins < bound) & (stop == 0):
        if spins % dv.ABORT_POLL_EVERY == 0:  # the abort word: give up with the others
            stop = (tl.load(hdr + dv.HDR_ABORT, volatile=True) != 0).to(tl.int32)
        bits = tl.load(bits_ptrs, mask=mask, other=0, volatile=True)
        missing = tl.sum((bits == EMPTY).to(tl.int32))
        spins += 1
    ok = (missing == 0).to(tl.int32)
    if (missing > 0) & (live != 0):
        if stop == 0:
            dv.record_timeout(where, "!=", EMPTY, EMPTY, spins, rank, rank, heap_bases)
        else:
            dv.gave_up(rank, heap_bases)
    return bits.to(ptrs.dtype.element_ty, bitcast=True), ok


@triton.jit
def lamport_clear(ptrs, mask=None):
    """Refill the caller's local tile at ``ptrs`` with the empty pattern (after reading it)."""
    bits_ptrs = _as_bits(ptrs)
    tl.store(bits_ptrs, tl.cast(_empty_bits(ptrs), bits_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def lamport_reduce(ptrs, stride, where, rank, world_size, heap_bases, mask=None, OP: tl.constexpr = _SUM, live=1):
    """The receiving side of a Lamport all-reduce: wait for the local tiles
    ``ptrs + p * stride`` (``p = 0 … world_size-1``, one slot per sending rank), combine them in
    rank order with ``OP`` and clear each after reading it. Returns ``(tile in the accumulator
    type, 1)``, or ``(…, 0)`` if a wait timed out (recorded against ``where``); ``live`` as in
    :func:`lamport_wait`."""
    x, ok = lamport_wait(ptrs, where, rank, heap_bases, mask=mask, live=live)
    acc = widen(x)
    lamport_clear(ptrs, mask=mask)
    for p in range(1, world_size):
        x, got = lamport_wait(ptrs + p * stride, where, rank, heap_bases, mask=mask, live=ok)
        ok = ok & got
        acc = combine(acc, widen(x), OP)
        lamport_clear(ptrs + p * stride, mask=mask)
    return acc, ok
