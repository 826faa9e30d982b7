"""All-reduce algorithms (``ccl.all_reduce``): ``one_shot``, ``lamport``, ``two_shot``, ``ring``.

Every kernel reads its source from any local tensor (the caller's, heap or not) and writes any
local destination (in place allowed: a program reads each of its tiles before writing it).
Data travels into the group's receive buffers (symmetric, double-buffered by the call's epoch
parity, one slot per sending rank); every rank reduces the slots in rank order, so all ranks
hold bitwise the same result. Sums of 8/16-bit floats accumulate in fp32.

* ``one_shot``: each program pushes its tiles to every rank, arrives, waits for every rank's
  same program, reduces locally. One round trip; each rank sends ``(W-1)·n``. Small messages.
* ``lamport``: as one_shot, but the data is its own flag (:mod:`iris_fw.tilecomm`'s Lamport
  exchange): no arrival, the receiver polls the data. Floats only. The smallest messages.
* ``two_shot``: tile ``t`` is owned by rank ``t mod W``; ranks push tiles to their owners,
  owners reduce and push the result to every rank: ``2(W-1)/W·n`` sent per rank, two round
  trips. Large messages at W > 2.
* ``ring``: reduce-scatter then all-gather around the ring ``r -> r+1``, W-1 steps each,
  tile-pipelined; each rank only talks to its neighbours. Large messages on ring topologies.

Traced (``TRACE``, :mod:`iris_fw.trace`), each program records its phases: ``push`` (sends),
``arrivals`` / ``receive`` (waits), ``reduce`` (local reduction and stores; *communicate* when
it stores to peers), ``ring_step`` (one tile row's pass around the ring).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import tilecomm as tc
from iris_fw import trace as tr
from iris_fw.ccl import algorithm as al
from iris_fw.hookspecs import hookimpl


@triton.jit
def _one_shot_kernel(src, dst, recv, slots, counters, n, rank, world_size, heap_bases, trace,
                     OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                     TRACE: tl.constexpr = 0):
    """``dst[:n]`` = ``src[:n]`` reduced over the group (``n <= CAP``). ``recv``: symmetric
    ``[2, world_size, CAP]``; ``slots``: symmetric int64 ``[programs, world_size]``;
    ``counters``: int64 ``[programs]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf, ok = tc.push_exchange(src, recv, slots, epoch, n, rank, world_size, heap_bases, BLOCK, CAP, trace, TRACE)
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    if ok:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            acc = tc.tile_reduce_rows(buf + offs, CAP, world_size, mask=mask, OP=OP)
            if AVG:
                acc = acc / world_size
            tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _lamport_kernel(src, dst, recv, counters, n, rank, world_size, heap_bases, trace,
                    OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                    TRACE: tl.constexpr = 0):
    """As :func:`_one_shot_kernel` with the data as flag: ``recv`` (``[2, world_size, CAP]``)
    holds the empty pattern wherever no data is in flight."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * world_size * CAP
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tc.lamport_put_all(src + offs, buf + rank * CAP + offs, rank, world_size, heap_bases, mask=mask)
    tl.debug_barrier()  # in place (dst is src): every warp has read its share before any writes dst
    if TRACE:
        ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
        tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                       tr.strided_share(n, BLOCK, pid, nprog) * (world_size - 1) * ELEM)
        t0 = tr.record_start(trace, TRACE)
    ok = 1
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc, ok = tc.lamport_reduce(buf + offs, CAP, buf, rank, world_size, heap_bases, mask=mask, OP=OP, live=ok)
        if AVG:
            acc = acc / world_size
        if ok:
            tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.RECEIVE, buf, rank, heap_bases)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _two_shot_kernel(src, dst, recv, gath, slots, counters, n, rank, world_size, heap_bases, trace,
                     OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                     TRACE: tl.constexpr = 0):
    """``dst[:n]`` = ``src[:n]`` reduced over the group; tile ``t`` is reduced by rank
    ``t mod world_size``. ``recv``: symmetric ``[2, world_size, CAP]`` (slot ``r``: rank r's
    copy of the tiles this rank owns); ``gath``: symmetric ``[2, CAP]`` (reduced tiles);
    ``slots``: symmetric int64 ``[programs, 2, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    rs = recv + (epoch % 2) * world_size * CAP
    ag = gath + (epoch % 2) * CAP
    phase1 = slots + pid * 2 * world_size
    phase2 = phase1 + world_size
    ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dv.store(rs + rank * CAP + offs, tl.load(src + offs, mask=mask), rank, t % world_size, heap_bases, mask=mask)
    tc.arrive(phase1, epoch, rank, world_size, heap_bases)
    if TRACE:  # every tile but the ones this rank owns goes to its owner
        tr.record_move(trace, TRACE, t0, tr.PUSH, -1,
                       (tr.strided_share(n, BLOCK, pid, nprog) - _owned(n, rank, world_size, BLOCK)) * ELEM)
        t0 = tr.record_start(trace, TRACE)
    ok = tc.wait_arrivals(phase1, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, phase1, rank, heap_bases)
        t0 = tr.record_start(trace, TRACE)
    if ok:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            if t % world_size == rank:
                offs = t * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                acc = tc.tile_reduce_rows(rs + offs, CAP, world_size, mask=mask, OP=OP)
                if AVG:
                    acc = acc / world_size
                tc.tile_store_all(ag + offs, acc, rank, world_size, heap_bases, mask=mask)
        # "my reduced tiles are in your buffer": only when they are (a failed wait sends no
        # stale data; the peers' waits give up instead)
        tc.arrive(phase2, epoch, rank, world_size, heap_bases)
    if TRACE:  # the owned tiles' sums to every other rank
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, _owned(n, rank, world_size, BLOCK) * (world_size - 1) * ELEM)
        t0 = tr.record_start(trace, TRACE)
    if ok:
        ok = tc.wait_arrivals(phase2, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, phase2, rank, heap_bases)
        t0 = tr.record_start(trace, TRACE)
    if ok:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(dst + offs, tl.load(ag + offs, mask=mask), mask=mask)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _owned(n, rank, world_size, BLOCK: tl.constexpr):
    """Elements of this program's tiles of ``[0, n)`` that ``rank`` owns (tile ``t`` is owned by
    rank ``t mod world_size``): what it reduces in a two-shot all-reduce (for traces)."""
    owned = tr.as_i64(0)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        owned += tl.where(t % world_size == rank, tl.minimum(n - t * BLOCK, BLOCK), 0)
    return owned


@triton.jit
def _ring_kernel(src, dst, recv, slots, counters, n, rank, world_size, heap_bases, trace,
                 OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                 TRACE: tl.constexpr = 0):
    """Ring all-reduce of ``src[:n]`` into ``dst``: the message is cut into ``world_size``
    segments of ``seg = cdiv(n, world_size)`` elements; program ``p`` carries tile ``j`` of
    every segment (``j = p, p + programs, …``). Reduce-scatter: at step ``s`` (0 … W-2) rank
    ``r`` adds its own copy of segment ``(r - s - 1) mod W`` to the partial received from
    ``r - 1`` (none at step 0) and sends it on to ``r + 1``; after W-1 steps rank ``r`` holds
    segment ``r`` reduced (in the ring's order, so ranks agree bitwise: every rank receives
    the same final values in the all-gather). All-gather: W-1 more steps forward the reduced
    segments. ``recv``: symmetric ``[2, 2 * world_size, cdiv(CAP, world_size)]`` rounded up to tiles
    (one slot per step, in the accumulator type); ``slots``: symmetric int64 ``[programs, 2 * world_size]`` (one per
    step, written by the left neighbour only). A program carries several tiles, so a step's flag
    counts (call, tile): the left neighbour sets it to ``epoch * 2**32 + j + 1`` after storing
    tile ``j`` (values only grow, call after call), and the wait is for that value — waiting for
    ``epoch`` alone would let every tile after a program's first read its slot before the left
    neighbour wrote it."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    seg = tl.cdiv(tl.cdiv(n, world_size), BLOCK) * BLOCK  # elements per segment, tile-aligned
    slot = tl.cdiv(tl.cdiv(CAP, world_size), BLOCK) * BLOCK  # elements per step slot
    buf = recv + (epoch % 2) * 2 * world_size * slot
    flags = slots + pid * 2 * world_size
    right = (rank + 1) % world_size
    ok = 1
    STEP_BYTES: tl.constexpr = BLOCK * (recv.dtype.element_ty.primitive_bitwidth // 8)
    for j in range(pid, tl.cdiv(seg, BLOCK), nprog):
        if TRACE:
            t0 = tr.record_start(trace, TRACE)
        loc = j * BLOCK + tl.arange(0, BLOCK)
        mark = epoch * 4294967296 + j + 1  # this (call, tile) on the step flags: only grows
        # reduce-scatter: send segment k, receive the partial of segment k - 1, add my copy
        k = (rank + world_size - 1) % world_size
        offs = k * seg + loc
        acc = tc.widen(tl.load(src + offs, mask=(loc < seg) & (offs < n)))
        for s in range(0, world_size - 1):
            step = buf + s * slot
            # after a failed wait, nothing more is sent (a partial built from a slot never
            # written is not passed on) and nothing more waited for
            if ok:
                dv.store(step + loc, acc.to(step.dtype.element_ty), rank, right, heap_bases, mask=loc < seg)
                dv.signal(flags + s, mark, rank, right, heap_bases)
                ok = tc.wait_flag(flags + s, mark, rank, heap_bases)
            k = (k + world_size - 1) % world_size
            offs = k * seg + loc
            mine = tc.widen(tl.load(src + offs, mask=(loc < seg) & (offs < n)))
            acc = tc.combine(tc.widen(tl.load(step + loc, mask=loc < seg)), mine, OP)
        # k == rank: this rank's segment, reduced
        if AVG:
            acc = acc / world_size
        out = acc.to(dst.dtype.element_ty)
        offs = k * seg + loc
        if ok:
            tl.store(dst + offs, out, mask=(loc < seg) & (offs < n))
        # all-gather: forward the reduced segments
        for s in range(world_size - 1, 2 * world_size - 2):
            step = buf + s * slot
            if ok:
                dv.store(step + loc, out.to(step.dtype.element_ty), rank, right, heap_bases, mask=loc < seg)
                dv.signal(flags + s, mark, rank, right, heap_bases)
                ok = tc.wait_flag(flags + s, mark, rank, heap_bases)
            k = (k + world_size - 1) % world_size
            offs = k * seg + loc
            out = tl.load(step + loc, mask=loc < seg).to(dst.dtype.element_ty)
            if ok:
                tl.store(dst + offs, out, mask=(loc < seg) & (offs < n))
        if TRACE:  # 2(W-1) steps of one tile to the right neighbour (waits for the left one included)
            tr.record_move(trace, TRACE, t0, tr.RING_STEP, right, tr.as_i64(STEP_BYTES) * 2 * (world_size - 1), j)
    if TRACE:
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


class _AllReduce(al.Algorithm):
    collective = "all_reduce"
    reduces = True
    kernel = None
    #: whether the kernel takes arrival slots (the Lamport one needs none)
    needs_slots = True

    def recv_numel(self, cap: int, world: int, block: int) -> int:
        return 2 * world * cap

    def extra_buffers(self, cap: int, dtype: torch.dtype) -> list:
        """More symmetric buffers after ``recv``: ``(numel, dtype, what)`` each."""
        return []

    def recv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def slots_per_program(self, world: int) -> int:
        return world

    def program_work(self, cap: int, world: int) -> int:
        """Elements whose tiles the programs share (sets the program count)."""
        return cap

    def fill(self, buffers: list) -> bool:
        """Prepare a new configuration's buffers (zeroed by the workspace); true if they were
        written, so members must sync before a peer may send into them."""
        return False

    def plan(self, group, call):
        if call.numel == 0:
            # nothing to reduce, on every member alike (numel is validated): no launch. A ring
            # launch without tiles would not wait for anyone, so a rank could run two calls
            # ahead and write a buffer half a peer is still reading.
            return lambda src, dst: None
        cap_bytes = al.capacity(group, self, call.nbytes)
        block = al.block_elems(call.dtype)
        cap = cap_bytes // call.element_size
        nprog = al.programs(group, self.program_work(cap, group.size), block)

        buffers = [(self.recv_numel(cap, group.size, block), self.recv_dtype(call.dtype), "receive buffer"),
                   *self.extra_buffers(cap, call.dtype)]
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), self.kernel, nprog=nprog,
            constexprs=dict(**al.reduce_constexprs(call.op), BLOCK=block, CAP=cap),
            buffers=buffers, slots=self.slots_per_program(group.size) if self.needs_slots else 0,
            fill=self.fill)
        return al.chunked_run(launch, bufs, call.numel, cap, (group.rank, group.size, group.heap_bases))


class OneShot(_AllReduce):
    name = "one_shot"
    kernel = _one_shot_kernel


class Lamport(_AllReduce):
    name = "lamport"
    kernel = _lamport_kernel
    needs_slots = False

    def supports(self, call):
        if call.dtype not in al.FLOAT_DTYPES:
            return False, f"the data-as-flag exchange needs a floating dtype, got {call.dtype}"
        return super().supports(call)

    def fill(self, buffers):
        recv = buffers[0]
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[recv.element_size()]
        recv.view(bits).fill_(tc.lamport_empty(8 * recv.element_size()))
        return True


class TwoShot(_AllReduce):
    name = "two_shot"
    kernel = _two_shot_kernel
    buffers_per_capacity = staticmethod(lambda world: 2 * world + 2)

    def extra_buffers(self, cap, dtype):
        return [(2 * cap, dtype, "gather buffer")]

    def slots_per_program(self, world):
        return 2 * world


class Ring(_AllReduce):
    name = "ring"
    kernel = _ring_kernel
    buffers_per_capacity = staticmethod(lambda world: 8)

    def program_work(self, cap, world):
        return triton.cdiv(cap, world)

    def recv_numel(self, cap, world, block):
        return 2 * 2 * world * triton.cdiv(triton.cdiv(cap, world), block) * block

    def recv_dtype(self, dtype):
        # partial reductions travel in the accumulator type
        return torch.float32 if dtype in al.FLOAT_DTYPES and dtype != torch.float32 else dtype

    def slots_per_program(self, world):
        return 2 * world


@hookimpl
def iris_fw_register_algorithms(registry):
    for algo in (OneShot(), Lamport(), TwoShot(), Ring()):
        registry.register(algo, algo.key)
