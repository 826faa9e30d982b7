"""Kernels the host side of iris-fw launches itself."""

import triton
import triton.language as tl

from . import device, trace


@triton.jit
def _device_barrier_kernel(rank, world_size, heap_bases):
    device.barrier(rank, world_size, heap_bases)


@triton.jit
def _wait_probe_kernel(rank, heap_bases):
    # Waits for a flag nobody sets: runs exactly the header's wait bound of polls.
    hdr = device.heap_header(rank, heap_bases)
    device.wait_until(hdr + device.HDR_PROBE, "==", 1, rank, rank, heap_bases)


@triton.jit
def _clock_sync_kernel(slots, out, base, rounds, rank, world_size, heap_bases, TRACE: tl.constexpr):
    """Ping-pong between rank 0 and every other rank, ``rounds`` times each, stamping with the
    trace clock (:func:`iris_fw.trace.now`). ``slots``: symmetric int64 ``[2, world_size]``
    (``[0, p]``: rank 0's pings in rank p's heap; ``[1, p]``: rank p's answers in rank 0's heap),
    values ``base + 1 …`` (they only grow). ``out``: int64 ``[world_size, rounds, 3]``: rank 0
    writes ``(send, -, answer seen)`` of each round with rank p in row p, rank p its
    ``(-, ping seen, -)`` in row p. A wait that gives up is recorded like any other."""
    if rank == 0:
        for p in range(1, world_size):
            for i in range(0, rounds):
                seq = base + i + 1
                sent = trace.now(TRACE)
                device.signal(slots + p, seq, rank, p, heap_bases)
                device.wait_until(slots + world_size + p, ">=", seq, rank, rank, heap_bases)
                seen = trace.now(TRACE)
                tl.store(out + (p * rounds + i) * 3, sent)
                tl.store(out + (p * rounds + i) * 3 + 2, seen)
    else:
        for i in range(0, rounds):
            seq = base + i + 1
            device.wait_until(slots + rank, ">=", seq, rank, rank, heap_bases)
            seen = trace.now(TRACE)
            device.signal(slots + world_size + rank, seq, rank, 0, heap_bases)
            tl.store(out + (rank * rounds + i) * 3 + 1, seen)
