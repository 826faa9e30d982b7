"""Every atomic × sem × scope under contention from all ranks, with exact expected results.

Every rank applies the atomic ``iters`` times to every rank's accumulator (its own too), with
per-rank random operands; afterwards each rank checks its accumulator against the value
computed on the host in int64 / float64.
"""

import functools

import pytest
import torch
import triton
import triton.language as tl

import iris_fw

from helpers import fresh_seed, on_worlds
from iris_fw import device as dv

SEMS = ["relaxed", "acquire", "release", "acq_rel"]
SCOPES = ["cta", "gpu", "sys"]
DTYPES = {
    "add": [torch.int32, torch.int64, torch.float32],
    "sub": [torch.int32, torch.int64, torch.float32],
    "xchg": [torch.int32, torch.int64, torch.float32],
    "cas": [torch.int32, torch.int64],
    "and": [torch.int32, torch.int64],
    "or": [torch.int32, torch.int64],
    "xor": [torch.int32, torch.int64],
    "min": [torch.int32, torch.int64, torch.float32],
    "max": [torch.int32, torch.int64, torch.float32],
}


@triton.jit
def _atomic_kernel(acc, vals, olds, n, iters, rank, world_size, heap_bases,
                   OP: tl.constexpr, SEM: tl.constexpr, SCOPE: tl.constexpr, MASKED: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASKED:
        mask = offs < n
    else:
        mask = None
    v = tl.load(vals + offs)
    for peer in range(0, world_size):
        for it in range(0, iters):
            p = acc + offs
            if OP == "add":
                old = dv.atomic_add(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "sub":
                old = dv.atomic_sub(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "xchg":
                old = dv.atomic_xchg(p, v + it, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "and":
                old = dv.atomic_and(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "or":
                old = dv.atomic_or(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "xor":
                old = dv.atomic_xor(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "min":
                old = dv.atomic_min(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            elif OP == "max":
                old = dv.atomic_max(p, v, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
            else:
                # CAS-loop increment of every lane. Values only grow, so a lane that
                # succeeded keeps failing harmlessly with its stale `cur`.
                cur = tl.zeros([BLOCK], dtype=v.dtype)
                done = tl.zeros([BLOCK], dtype=tl.int32)
                old = cur
                while tl.sum(1 - done) > 0:
                    prev = dv.atomic_cas(p, cur, cur + 1, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
                    won = (prev == cur) & (done == 0)
                    old = tl.where(won, prev, old)
                    done = done | won.to(tl.int32)
                    cur = tl.where(done == 1, cur, prev)
            tl.store(olds + (peer * iters + it) * BLOCK + offs, old)


def _operands(op, dtype, n, gen):
    """(initial accumulator, operand) tensors for one rank, drawn from ``gen``."""
    if op in ("add", "sub", "xchg"):
        init = torch.randint(-1000, 1000, (n,), generator=gen)
        val = torch.randint(-100, 100, (n,), generator=gen)
    elif op == "cas":
        init = torch.randint(-1000, 1000, (n,), generator=gen)
        val = torch.zeros(n, dtype=torch.int64)
    else:
        bits = 31 if dtype == torch.int32 else 62
        init = torch.randint(-(1 << bits), 1 << bits, (n,), generator=gen)
        val = torch.randint(-(1 << bits), 1 << bits, (n,), generator=gen)
    return init.to(dtype), val.to(dtype)


def _expected(op, init, vals, world, iters):
    wide = torch.float64 if init.dtype.is_floating_point else torch.int64
    acc = init.to(wide)
    vs = [v.to(wide) for v in vals]
    if op == "add":
        return acc + iters * sum(vs)
    if op == "sub":
        return acc - iters * sum(vs)
    if op == "cas":
        return acc + world * iters
    if op in ("min", "max"):
        f = torch.minimum if op == "min" else torch.maximum
        return functools.reduce(f, vs, acc)
    f = {"and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor}[op]
    if op == "xor" and iters % 2 == 0:
        return acc
    return functools.reduce(f, vs, acc)


def _run_atomic(ctx, op, sem, scope):
    block, iters = (16, 3) if ctx.device.type == "cpu" else (256, 33)
    world, me = ctx.world_size, ctx.rank
    for dtype in DTYPES[op]:
        masked = op != "cas"  # tl.atomic_cas has no mask
        n = block - 3 if masked else block
        seed = fresh_seed(ctx)
        operands = [_operands(op, dtype, block, torch.Generator().manual_seed(seed + r)) for r in range(world)]
        inits, vals = [o[0] for o in operands], [o[1] for o in operands]
        acc = ctx.as_symmetric(inits[me])
        olds = torch.empty(world, iters, block, dtype=dtype, device=ctx.device)
        ctx.barrier()
        _atomic_kernel[(1,)](acc, vals[me].to(ctx.device), olds, n, iters, me, world, ctx.heap_bases,
                             OP=op, SEM=sem, SCOPE=scope, MASKED=masked, BLOCK=block)
        ctx.barrier()
        got = acc.cpu()
        what = f"atomic_{op} {dtype} sem={sem} scope={scope} on rank {me}"
        if op == "xchg":
            # conservation: final + every value taken out == initial + every value put in
            taken = [olds[t, :, :n].cpu().double().sum(0) for t in range(world)]
            taken_here = sum(ctx.bootstrap.all_gather(taken[me].tolist()) and
                             [torch.tensor(x[me]) for x in ctx.bootstrap.all_gather([t.tolist() for t in taken])])
            put_in = sum(vals[r][:n].double() * iters + sum(range(iters)) for r in range(world))
            assert torch.equal(got[:n].double() + taken_here, inits[me][:n].double() + put_in), what
        else:
            want = _expected(op, inits[me][:n], [v[:n] for v in vals], world, iters)
            assert torch.equal(got[:n].to(want.dtype), want), f"{what}: {got[:n].tolist()} != {want.tolist()}"
        if masked:
            assert torch.equal(got[n:], inits[me][n:]), f"{what}: masked-off lanes changed"
        del acc


def _orders():
    """(sem, scope) pairs: every pair on GPUs; Triton's interpreter ignores both, so CPU ranks run
    one pair by default and the rest under ``-m extended`` (the compile matrix compiles each)."""
    for sem in SEMS:
        for scope in SCOPES:
            if iris_fw.interpreting() and (sem, scope) != ("acq_rel", "sys"):
                yield pytest.param(sem, scope, marks=pytest.mark.extended)
            else:
                yield sem, scope


@pytest.mark.parametrize("sem,scope", list(_orders()))
@pytest.mark.parametrize("op", list(DTYPES))
@on_worlds(1, 3)  # (CPU ranks: 3 contends from every rank as 2 does, from one more; 2 under -m extended)
def test_atomic_contention(world, op, sem, scope):
    world.run(_run_atomic, op, sem, scope)
