"""Error decoding: the messages of a rank's device-side failure records (a timed-out wait, a
failed pointer check), read from its heap header by the watchdog, and the heap offsets they
name (the allocation, element or header slot there). Hangs off a context (every function takes
it) without the context importing this module."""

from __future__ import annotations

import torch

from . import device as dev
from .heap import Block


def _element(block: Block, offset: int) -> str:
    """``", element [i]"`` of a block allocated as ``dtype[shape]`` (``Block.what``), or ``""``."""
    name = block.what.split("[", 1)[0]
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        return ""
    size = torch.empty((), dtype=dtype).element_size()
    delta = offset - block.offset
    return f", element [{delta // size}]" if delta % size == 0 else ""


def describe_timeout(ctx, record: list) -> str:
    """The message for ``ctx``'s rank's timeout record (the header's first ``HDR_WAIT_BOUND``
    slots, as read by the watchdog)."""
    rank, peer, offset = (record[s.value] for s in (dev.HDR_ERR_RANK, dev.HDR_ERR_PEER, dev.HDR_ERR_OFFSET))
    expected, seen, cmp, spins = (
        record[s.value] for s in (dev.HDR_ERR_EXPECTED, dev.HDR_ERR_SEEN, dev.HDR_ERR_CMP, dev.HDR_ERR_SPINS)
    )
    cmp_op = dev.CMP_OPS[cmp] if 0 <= cmp < len(dev.CMP_OPS) else f"<cmp {cmp}>"
    slot, first = offset // dev.HDR_SLOT_BYTES.value, dev.HDR_BARRIER_SLOTS.value
    if offset % dev.HDR_SLOT_BYTES.value == 0 and first <= slot < first + ctx.world_size:
        late = slot - first
        return (
            f"device barrier: rank {late} never arrived — rank {rank} waited for it {spins} polls (wait_timeout "
            f"{ctx._wait_timeout:g}s): its arrival slot in rank {peer}'s heap header stayed at epoch {seen}, "
            f"barrier epoch {expected} (rank {late} did not call device_barrier() as often as rank {rank}, or "
            f"it is stuck or gone); {record[dev.HDR_ERR_COUNT.value]} wait(s) timed out on rank {ctx.rank}"
        )
    where = describe_offset(ctx, offset)
    return (
        f"rank {rank} gave up waiting for the flag at {where} in rank {peer}'s heap to become "
        f"{cmp_op} {expected}: last saw {seen} after {spins} polls (wait_timeout "
        f"{ctx._wait_timeout:g}s); {record[dev.HDR_ERR_COUNT.value]} wait(s) timed out on rank {ctx.rank}"
    )


def describe_offset(ctx, offset: int) -> str:
    """``offset`` of ``ctx``'s rank's heap, with the allocation (and element) or header slot there."""
    block = ctx.heap.block_at(offset)
    where = f"offset {offset:#x}"
    slot = offset // dev.HDR_SLOT_BYTES.value
    if block is not None:
        where += f" ({block.what} allocated at {block.site}, +{offset - block.offset} bytes{_element(block, offset)})"
    elif slot == dev.HDR_PROBE.value and offset % dev.HDR_SLOT_BYTES.value == 0:
        where += " (heap header: the wait-bound calibration flag)"
    elif 0 <= offset < ctx._hdr.numel() * 8:
        where += f" (heap header slot {slot})"
    return where


def describe_bad_pointer(ctx, state: list) -> str:
    """The message for ``ctx``'s rank's pointer-check record (the header's fixed slots)."""
    rank, peer, offset, program, count = (state[s.value] for s in (
        dev.HDR_PTR_RANK, dev.HDR_PTR_PEER, dev.HDR_PTR_OFFSET, dev.HDR_PTR_PROGRAM, dev.HDR_PTR_COUNT))
    what = []
    if not 0 <= peer < ctx.world_size:
        what.append(f"peer rank {peer} is outside the world [0, {ctx.world_size})")
    if not 0 <= offset < ctx.heap_size:
        what.append(f"the pointer is at offset {offset:#x} ({offset}) from rank {ctx.rank}'s heap base, "
                    f"outside the heap of {ctx.heap_size} bytes (not a symmetric tensor of this rank?)")
    if not what:
        what.append(f"the pointer at {describe_offset(ctx, offset)} or peer {peer} is not in a group's heaps")
    return (f"rank {ctx.rank}: a device primitive of program {program} (rank argument {rank}, peer {peer}) "
            f"was given an invalid address: " + "; ".join(what) + f"; {count} lane(s) failed the check and "
            "were not accessed (the job's waits were aborted)")
