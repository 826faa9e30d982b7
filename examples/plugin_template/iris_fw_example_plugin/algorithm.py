"""A collective algorithm: ``broadcast.pull``, every rank reads the root's data.

An algorithm runs one collective of :mod:`iris_fw.ccl` (contract:
:class:`iris_fw.ccl.algorithm.Algorithm`): ``plan(group, call)`` carves its buffers from the
group's workspace once per kernel configuration and returns ``run(src, dst)``, which launches.
Use it with ``ccl.broadcast(t, src=0, algorithm="pull")``.

Per program: the root copies its tiles into a staging buffer on its own heap and raises a
"ready" flag on every rank; each other rank waits for its flag, ``load``s the tiles from the
root's heap and answers; the root ends its call only when every answer arrived, so the next call
never overwrites data a rank still reads. Flags carry the call's epoch (counted on the device),
so calls replay from CUDA graphs; every wait is bounded.
"""

import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import tilecomm as tc
from iris_fw.ccl import algorithm as al


@triton.jit
def _pull_broadcast_kernel(src, dst, stage, slots, counters, n, root, rank, world_size, heap_bases,
                           BLOCK: tl.constexpr, CAP: tl.constexpr):
    """``dst[:n]`` = the root's ``src[:n]`` on every rank. ``stage``: symmetric ``[CAP]``;
    ``slots``: symmetric int64 ``[programs, world_size + 1]`` (answers at the root, then the
    ready flag); ``counters``: local int64 ``[programs]`` (the epochs)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    answers = slots + pid * (world_size + 1)
    ready = answers + world_size
    if rank == root:
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            value = tl.load(src + offs, mask=mask)
            tl.store(stage + offs, value, mask=mask)
            tl.store(dst + offs, value, mask=mask)
        tc.signal_peers(ready, epoch, rank, world_size, heap_bases)
        dv.signal(answers + rank, epoch, rank, rank, heap_bases)
        tc.wait_arrivals(answers, epoch, rank, world_size, heap_bases)
    else:
        if tc.wait_flag(ready, epoch, rank, heap_bases):
            for t in range(pid, tl.cdiv(n, BLOCK), nprog):
                offs = t * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, dv.load(stage + offs, rank, root, heap_bases, mask=mask), mask=mask)
        dv.signal(answers + rank, epoch, rank, root, heap_bases)


class PullBroadcast(al.Algorithm):
    collective = "broadcast"
    name = "pull"
    buffers_per_capacity = staticmethod(lambda world: 1)  # one staging buffer per configuration

    def plan(self, group, call):
        cap = al.capacity(group, self, call.nbytes) // call.element_size  # elements per chunk
        block = al.block_elems(call.dtype)
        launch, bufs = al.kernel_config(
            group, (self.key, call.dtype, cap), _pull_broadcast_kernel, nprog=al.programs(group, cap, block),
            constexprs=dict(BLOCK=block, CAP=cap), buffers=[(cap, call.dtype, "staging buffer")],
            slots=group.size + 1)
        return al.chunked_run(launch, bufs, call.numel, cap, (call.root, group.rank, group.size, group.heap_bases))
