"""All-gather (``push``, ``pull``), reduce-scatter (``push``) and all-to-all (``push``).

Sources may be any local tensor; data lands in the group's receive buffers (symmetric, one
slot per sending rank, double-buffered by the call's epoch parity) and each rank copies or
reduces it into its destination after one round trip (per-program arrivals: program ``p``
waits for program ``p`` of every rank, which sent it exactly the tiles it reads).

* ``all_gather.push``: every rank pushes its tiles into every rank's slot for it.
* ``all_gather.pull``: every rank publishes its input (in place when it lies on the heap at
  the same offset on every rank — zero copy — else copied into a staging slot) and reads each
  peer's; zero copy adds a second arrival so no rank reuses its input before the peers read it.
* ``reduce_scatter.push``: rank ``r`` pushes chunk ``p`` of its input to rank ``p``; each rank
  reduces its slots in rank order (8/16-bit floats in fp32).
* ``all_to_all.push``: rank ``r`` pushes its chunk for ``p`` (ragged split sizes) to ``p``;
  messages longer than a slot go in rounds.

Traced (``TRACE``, :mod:`iris_fw.trace`), each program records ``push`` / ``pull`` (sends,
reads), ``arrivals`` (waits) and ``reduce`` (the local reduction or copy-out).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_fw import tilecomm as tc
from iris_fw import trace as tr
from iris_fw.ccl import algorithm as al
from iris_fw.hookspecs import hookimpl


@triton.jit
def _all_gather_push_kernel(src, dst, recv, slots, counters, n, stride, rank, world_size, heap_bases, trace,
                            BLOCK: tl.constexpr, CAP: tl.constexpr, TRACE: tl.constexpr = 0):
    """``dst[p * stride + i]`` = rank ``p``'s ``src[i]``, ``i < n <= CAP``. ``recv``: symmetric
    ``[2, world_size, CAP]``; ``slots``: symmetric int64 ``[programs, world_size]``."""
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
            for p in range(0, world_size):
                tl.store(dst + p * stride + offs, tl.load(buf + p * CAP + offs, mask=mask), mask=mask)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _all_gather_pull_kernel(src, dst, stage, slots, counters, n, stride, rank, world_size, heap_bases, trace,
                            BLOCK: tl.constexpr, CAP: tl.constexpr, STAGED: tl.constexpr, TRACE: tl.constexpr = 0):
    """``dst[p * stride + i]`` = rank ``p``'s ``src[i]``, read from ``p``'s heap. ``STAGED``:
    ``src`` is copied into ``stage`` (symmetric ``[2, CAP]``) first; else ``src`` is symmetric
    (same offset on every rank) and a second arrival keeps it unchanged until every peer read
    it. ``slots``: symmetric int64 ``[programs, 2, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    entry = slots + pid * 2 * world_size
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    if STAGED:
        base = stage + (epoch % 2) * CAP
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(base + offs, tl.load(src + offs, mask=mask), mask=mask)
    else:
        base = src
    tc.arrive(entry, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.PUSH, -1, 0)
        t0 = tr.record_start(trace, TRACE)
    ok = tc.wait_arrivals(entry, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, entry, rank, heap_bases)
        t0 = tr.record_start(trace, TRACE)
    if ok:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tc.tile_gather(base + offs, dst + offs, stride, rank, world_size, heap_bases, mask=mask)
    if TRACE:
        ELEM: tl.constexpr = dst.dtype.element_ty.primitive_bitwidth // 8
        tr.record_move(trace, TRACE, t0, tr.PULL, tr.only_peer(rank, world_size),
                       tr.strided_share(n, BLOCK, pid, nprog) * (world_size - 1) * ELEM)
    if not STAGED:
        if TRACE:
            t0 = tr.record_start(trace, TRACE)
        tc.arrive(entry + world_size, epoch, rank, world_size, heap_bases)
        tc.wait_arrivals(entry + world_size, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, entry + world_size, rank, heap_bases)
    if TRACE:
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _reduce_scatter_push_kernel(src, dst, recv, slots, counters, n, stride, rank, world_size, heap_bases, trace,
                                OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                                TRACE: tl.constexpr = 0):
    """``dst[i]`` = ``src[rank * stride + i]`` reduced over the group, ``i < n <= CAP``.
    ``recv``: symmetric ``[2, world_size, CAP]``; ``slots``: symmetric int64
    ``[programs, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf, ok = tc.push_exchange(src, recv, slots, epoch, n, rank, world_size, heap_bases, BLOCK, CAP, trace, TRACE,
                               src_stride=stride)
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
def _all_to_all_push_kernel(src, dst, recv, slots, counters, meta, base, n, rank, world_size, heap_bases, trace,
                            BLOCK: tl.constexpr, CAP: tl.constexpr, TRACE: tl.constexpr = 0):
    """One round of an all-to-all: elements ``[base, base + n)`` of every chunk (``n <= CAP``).
    ``meta``: int64 ``[4, world_size]`` — offset and length (elements) of this rank's chunk for
    each rank in ``src``, and of each rank's chunk for this rank in ``dst``. ``recv``: symmetric
    ``[2, world_size, CAP]``; ``slots``: symmetric int64 ``[programs, world_size]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * world_size * CAP
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    if TRACE:
        sent = tr.as_i64(0)
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        loc = t * BLOCK + tl.arange(0, BLOCK)
        tc.tile_put_chunks(src + base + loc, meta, meta + world_size, base + loc, buf + loc, CAP, rank, world_size,
                           heap_bases)
        if TRACE:
            for p in range(0, world_size):
                sent += tl.where(p != rank, tl.sum((base + loc < tl.load(meta + world_size + p)).to(tl.int64)), 0)
    tc.arrive(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
        tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size), sent * ELEM)
        t0 = tr.record_start(trace, TRACE)
    ok = tc.wait_arrivals(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, slots + pid * world_size, rank, heap_bases)
        t0 = tr.record_start(trace, TRACE)
    if ok:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            loc = t * BLOCK + tl.arange(0, BLOCK)
            for p in range(0, world_size):
                off = tl.load(meta + 2 * world_size + p)
                mask = base + loc < tl.load(meta + 3 * world_size + p)
                tl.store(dst + off + base + loc, tl.load(buf + p * CAP + loc, mask=mask), mask=mask)
    if TRACE:
        tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


def _geometry(group, algo, call, nbytes=None):
    """``(cap, block, nprog)`` of a call: capacity class in elements, tile, programs."""
    cap = al.capacity(group, algo, call.nbytes if nbytes is None else nbytes) // call.element_size
    block = al.block_elems(call.dtype)
    return cap, block, al.programs(group, cap, block)


class AllGatherPush(al.Algorithm):
    collective, name = "all_gather", "push"

    def plan(self, group, call):
        cap, block, nprog = _geometry(group, self, call)
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), _all_gather_push_kernel, nprog=nprog,
            constexprs=dict(BLOCK=block, CAP=cap),
            buffers=[(2 * group.size * cap, call.dtype, "receive buffer")], slots=group.size)
        return al.chunked_run(launch, bufs, call.numel, cap, (call.numel, group.rank, group.size, group.heap_bases))


class AllGatherPull(al.Algorithm):
    collective, name = "all_gather", "pull"
    buffers_per_capacity = staticmethod(lambda world: 2)

    def plan(self, group, call):
        cap, block, nprog = _geometry(group, self, call)
        zero_copy = call.src_offset is not None
        if zero_copy:  # one launch over the whole input, which every peer reads in place
            cap, nprog = max(call.numel, 1), al.programs(group, call.numel, block)
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, 0 if zero_copy else cap), _all_gather_pull_kernel, nprog=nprog,
            constexprs=dict(BLOCK=block, CAP=1 if zero_copy else cap, STAGED=not zero_copy),
            buffers=[] if zero_copy else [(2 * cap, call.dtype, "staging buffer")], slots=2 * group.size)
        if zero_copy:
            bufs = (None, *bufs)
        return al.chunked_run(launch, bufs, call.numel, cap, (call.numel, group.rank, group.size, group.heap_bases))


class ReduceScatterPush(al.Algorithm):
    collective, name = "reduce_scatter", "push"
    reduces = True

    def plan(self, group, call):
        cap, block, nprog = _geometry(group, self, call)
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), _reduce_scatter_push_kernel, nprog=nprog,
            constexprs=dict(**al.reduce_constexprs(call.op), BLOCK=block, CAP=cap),
            buffers=[(2 * group.size * cap, call.dtype, "receive buffer")], slots=group.size)
        return al.chunked_run(launch, bufs, call.numel, cap, (call.numel, group.rank, group.size, group.heap_bases))


class AllToAllPush(al.Algorithm):
    collective, name = "all_to_all", "push"

    def plan(self, group, call):
        splits, r, w = call.splits, group.rank, group.size
        longest = max((c for row in splits for c in row), default=0)
        cap, block, nprog = _geometry(group, self, call, nbytes=longest * call.element_size)
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), _all_to_all_push_kernel, nprog=nprog,
            constexprs=dict(BLOCK=block, CAP=cap),
            buffers=[(2 * w * cap, call.dtype, "receive buffer")], slots=w)
        send = [splits[r][p] for p in range(w)]
        recv = [splits[p][r] for p in range(w)]
        offsets = lambda counts: [sum(counts[:p]) for p in range(w)]  # noqa: E731
        meta = torch.tensor([offsets(send), send, offsets(recv), recv], dtype=torch.int64, device=group.ctx.device)
        rounds = [(base, min(cap, longest - base)) for base in range(0, longest, cap)]
        recv_buf, slots, counters = bufs
        bases = group.heap_bases

        def run(src, dst):
            for base, length in rounds:
                launch(src, dst, recv_buf, slots, counters, meta, base, length, r, w, bases)

        return run


@hookimpl
def iris_fw_register_algorithms(registry):
    for algo in (AllGatherPush(), AllGatherPull(), ReduceScatterPush(), AllToAllPush()):
        registry.register(algo, algo.key)
