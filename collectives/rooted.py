"""Rooted collectives, ``push`` each: broadcast and scatter (from the root), reduce and gather
(to the root).

From the root: the root pushes every rank's tiles into that rank's receive buffer and raises
one flag per program on every rank; each rank copies its tiles out and answers the root, which
waits for every answer before its call ends (so it never overwrites a buffer a rank still
reads). To the root: every rank pushes its tiles into its slot of the root's receive buffer and
arrives there; the root combines (reduce: in rank order, 8/16-bit floats in fp32) or copies
(gather), then raises a "done" flag every rank waits for. Buffers are double-buffered by the
call's epoch parity.

Traced (``TRACE``, :mod:`iris_fw.trace`), each program records ``push`` (sends), ``arrivals`` /
``acquire`` (waits for the ranks' arrivals / the root's flag) and ``reduce`` (copy-out or
reduction).
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import tilecomm as tc
from iris_fw import trace as tr
from iris_fw.ccl import algorithm as al
from iris_fw.hookspecs import hookimpl


@triton.jit
def _from_root_kernel(src, dst, recv, slots, counters, n, stride, root, rank, world_size, heap_bases, trace,
                      SCATTER: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, TRACE: tl.constexpr = 0):
    """Broadcast: every rank's ``dst[:n]`` = the root's ``src[:n]``; scatter: rank ``p``'s
    ``dst[:n]`` = the root's ``src[p * stride:][:n]``. ``recv``: symmetric ``[2, CAP]``;
    ``slots``: symmetric int64 ``[programs, world_size + 1]`` (answers, then the data flag)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * CAP
    answers = slots + pid * (world_size + 1)
    ready = answers + world_size
    if rank == root:
        if TRACE:
            t0 = tr.record_start(trace, TRACE)
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            for i in range(0, world_size):
                p = (rank + i) % world_size
                if SCATTER:
                    value = tl.load(src + p * stride + offs, mask=mask)
                else:
                    value = tl.load(src + offs, mask=mask)
                if p == rank:
                    tl.store(dst + offs, value, mask=mask)
                else:
                    dv.store(buf + offs, value, rank, p, heap_bases, mask=mask)
        tc.signal_peers(ready, epoch, rank, world_size, heap_bases)
        dv.signal(answers + rank, epoch, rank, rank, heap_bases)
        if TRACE:
            ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
            tr.record_move(trace, TRACE, t0, tr.PUSH, tr.only_peer(rank, world_size),
                           tr.strided_share(n, BLOCK, pid, nprog) * (world_size - 1) * ELEM)
            t0 = tr.record_start(trace, TRACE)
        tc.wait_arrivals(answers, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, answers, rank, heap_bases)
    else:
        if TRACE:
            t0 = tr.record_start(trace, TRACE)
        ok = tc.wait_flag(ready, epoch, rank, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ACQUIRE, ready, rank, heap_bases)
            t0 = tr.record_start(trace, TRACE)
        if ok:
            for t in range(pid, tl.cdiv(n, BLOCK), nprog):
                offs = t * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, tl.load(buf + offs, mask=mask), mask=mask)
        dv.signal(answers + rank, epoch, rank, root, heap_bases)
        if TRACE:
            tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
    if TRACE:
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


@triton.jit
def _to_root_kernel(src, dst, recv, slots, counters, n, stride, root, rank, world_size, heap_bases, trace,
                    GATHER: tl.constexpr, OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr,
                    CAP: tl.constexpr, TRACE: tl.constexpr = 0):
    """Reduce: the root's ``dst[:n]`` = ``src[:n]`` reduced over the group; gather: the root's
    ``dst[p * stride:][:n]`` = rank ``p``'s ``src[:n]``. ``recv``: symmetric
    ``[2, world_size, CAP]``; ``slots``: symmetric int64 ``[programs, world_size + 1]``
    (arrivals at the root, then its "done" flag)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    buf = recv + (epoch % 2) * world_size * CAP
    arrivals = slots + pid * (world_size + 1)
    done = arrivals + world_size
    if TRACE:
        t0 = tr.record_start(trace, TRACE)
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dv.store(buf + rank * CAP + offs, tl.load(src + offs, mask=mask), rank, root, heap_bases, mask=mask)
    dv.signal(arrivals + rank, epoch, rank, root, heap_bases)
    if TRACE:
        ELEM: tl.constexpr = recv.dtype.element_ty.primitive_bitwidth // 8
        tr.record_move(trace, TRACE, t0, tr.PUSH, tl.where(rank == root, -1, root),
                       tl.where(rank == root, 0, tr.strided_share(n, BLOCK, pid, nprog) * ELEM))
        t0 = tr.record_start(trace, TRACE)
    if rank == root:
        ok = tc.wait_arrivals(arrivals, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ARRIVALS, arrivals, rank, heap_bases)
            t0 = tr.record_start(trace, TRACE)
        if ok:
            for t in range(pid, tl.cdiv(n, BLOCK), nprog):
                offs = t * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                if GATHER:
                    for p in range(0, world_size):
                        tl.store(dst + p * stride + offs, tl.load(buf + p * CAP + offs, mask=mask), mask=mask)
                else:
                    acc = tc.tile_reduce_rows(buf + offs, CAP, world_size, mask=mask, OP=OP)
                    if AVG:
                        acc = acc / world_size
                    tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)
        tc.signal_peers(done, epoch, rank, world_size, heap_bases)
        if TRACE:
            tr.record_move(trace, TRACE, t0, tr.REDUCE, -1, 0)
    else:
        tc.wait_flag(done, epoch, rank, heap_bases)
        if TRACE:
            tr.record_wait(trace, TRACE, t0, tr.ACQUIRE, done, rank, heap_bases)
    if TRACE:
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


class _Rooted(al.Algorithm):
    name = "push"
    kernel = None
    #: receive slots per rank: 1 (from the root) or the group size (to the root)
    to_root = False

    def constexprs(self, call) -> dict:
        return {}

    def plan(self, group, call):
        cap = al.capacity(group, self, call.nbytes) // call.element_size
        block = al.block_elems(call.dtype)
        nprog = al.programs(group, cap, block)
        recv = 2 * (group.size if self.to_root else 1) * cap
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), self.kernel, nprog=nprog,
            constexprs=dict(BLOCK=block, CAP=cap, **self.constexprs(call)),
            buffers=[(recv, call.dtype, "receive buffer")], slots=group.size + 1)
        return al.chunked_run(launch, bufs, call.numel, cap,
                              (call.numel, call.root, group.rank, group.size, group.heap_bases))


class Broadcast(_Rooted):
    collective = "broadcast"
    kernel = _from_root_kernel
    buffers_per_capacity = staticmethod(lambda world: 2)

    def constexprs(self, call):
        return {"SCATTER": False}


class Scatter(_Rooted):
    collective = "scatter"
    kernel = _from_root_kernel
    buffers_per_capacity = staticmethod(lambda world: 2)

    def constexprs(self, call):
        return {"SCATTER": True}


class Reduce(_Rooted):
    collective = "reduce"
    kernel = _to_root_kernel
    to_root = True
    reduces = True

    def constexprs(self, call):
        return {"GATHER": False, **al.reduce_constexprs(call.op)}


class Gather(_Rooted):
    collective = "gather"
    kernel = _to_root_kernel
    to_root = True

    def constexprs(self, call):
        return {"GATHER": True, "OP": "sum", "AVG": False}


@hookimpl
def iris_fw_register_algorithms(registry):
    for algo in (Broadcast(), Scatter(), Reduce(), Gather()):
        registry.register(algo, algo.key)
