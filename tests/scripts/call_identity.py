"""Misuse across ranks, one case after another in one job (tests/test_call_identity.py): each
rank runs the named cases and prints ``RESULT <case> <rank> <seconds> <error type> <message>``;
between cases the ranks meet in a barrier (which re-arms the job after an abort)."""

import sys
import time

import torch

import iris_fw
from iris_fw import ccl, ops


def skip_first(ctx):
    """Rank 1 skips the first collective (and calls barrier while rank 0 is in all_reduce)."""
    if ctx.rank != 1:
        ccl.all_reduce(torch.ones(100, device=ctx.device))
    ctx.barrier()


def other_collective(ctx):
    """Rank 0 calls all_reduce, rank 1 broadcast, on the (existing) world group."""
    t = ctx.ones(64)
    ccl.barrier()
    if ctx.rank == 0:
        ccl.all_reduce(t)
    else:
        ccl.broadcast(t, src=0)


def shape_later(ctx):
    """Both all_reduce 100 elements; then rank 1 (only) 200: the others repeat a validated call."""
    for _ in range(2):
        ccl.all_reduce(torch.ones(100, device=ctx.device))
    n = 200 if ctx.rank == 1 else 100
    ccl.all_reduce(torch.ones(n, device=ctx.device))
    ctx.synchronize()


def dtype_later(ctx):
    """As shape_later with the dtype changed on rank 1."""
    for _ in range(2):
        ccl.all_gather_into_tensor(torch.empty(64 * ctx.world_size, device=ctx.device),
                                   torch.ones(64, device=ctx.device))
    dtype = torch.float16 if ctx.rank == 1 else torch.float32
    ccl.all_gather_into_tensor(torch.empty(64 * ctx.world_size, device=ctx.device, dtype=dtype),
                               torch.ones(64, device=ctx.device, dtype=dtype))
    ctx.synchronize()


def op_shape_later(ctx):
    """An op called twice alike, then with a different M on rank 1."""
    w = ctx.world_size
    b = torch.randn(32, 8, device=ctx.device)
    for _ in range(2):
        ops.gemm_all_scatter(torch.randn(16, 32, device=ctx.device), b, scheduler="bulk_sync")
    m = 24 if ctx.rank == 1 else 16
    ops.gemm_all_scatter(torch.randn(m, 32, device=ctx.device), b, scheduler="bulk_sync")
    ctx.synchronize()
    del w


def op_fields(ctx):
    """A GEMM whose M differs on rank 1 in its first call: the message names M."""
    m = 24 if ctx.rank == 1 else 16
    ops.gemm_all_reduce(torch.randn(m, 32, device=ctx.device), torch.randn(32, 8, device=ctx.device),
                        scheduler="bulk_sync")


def host_stuck(ctx):
    """Rank 1 stays in host code instead of the barrier for longer than the host bound (3 + 3 s in
    the test), then comes (last case: the bootstrap is left mid-call)."""
    if ctx.rank == 1:
        time.sleep(9)
    ctx.barrier()


CASES = {f.__name__: f for f in (skip_first, other_collective, shape_later, dtype_later, op_shape_later, op_fields,
                                 host_stuck)}


def main(names):
    ctx = iris_fw.init(heap_size=1 << 26)
    for name in names:
        ctx.barrier()
        start = time.monotonic()
        try:
            CASES[name](ctx)
            kind, text = "-", ""
        except iris_fw.IrisError as exc:
            kind, text = type(exc).__name__, str(exc).replace("\n", " ")
        print(f"RESULT {name} {ctx.rank} {time.monotonic() - start:.2f} {kind} {text}", flush=True)
        if name == "host_stuck":
            if ctx.rank == 0:  # stays (its board says why it gave up) until rank 1 came, at 9 s, and read it
                time.sleep(max(0.0, 10.5 - (time.monotonic() - start)))
            break
        for _ in range(3):  # the barrier re-arms; a peer's late report may come once more
            try:
                ctx.barrier()
                break
            except iris_fw.IrisError:
                pass
    else:
        ctx.close()
        return
    ctx.abort("done")  # (the bootstrap was left mid-call: no collective close)


if __name__ == "__main__":
    main(sys.argv[1:])
