"""load / store / get / put / copy × dtypes × masked and unmasked × every peer, world sizes 1-4."""

import pytest
import torch
import triton
import triton.language as tl

import iris_fw

from helpers import DTYPES, fresh_seed, poison_value, random_data, same, sizes
from iris_fw import device as dv

# Masked-off lanes of a load read `other`. A float for float dtypes: Triton 3.9's interpreter
# stores an int `other` into bf16 as raw bits (3 -> 2.8e-40).
OTHER_INT = tl.constexpr(3)
OTHER_FLOAT = tl.constexpr(3.0)


@triton.jit
def _primitive_kernel(src, dst, n, dst_row, rank, peer, src_rank, heap_bases,
                      OP: tl.constexpr, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    out = dst + dst_row * (tl.num_programs(0) * BLOCK) + offs
    if MASKED:
        mask = offs < n
        if src.dtype.element_ty.is_floating():
            other = OTHER_FLOAT
        else:
            other = OTHER_INT
    else:
        mask = None
        other = None
    if OP == "load":
        tl.store(out, dv.load(src + offs, rank, peer, heap_bases, mask=mask, other=other))
    elif OP == "get":
        dv.get(src + offs, out, rank, peer, heap_bases, mask=mask, other=other)
    elif OP == "store":
        dv.store(out, tl.load(src + offs, mask=mask), rank, peer, heap_bases, mask=mask)
    elif OP == "put":
        dv.put(src + offs, out, rank, peer, heap_bases, mask=mask)
    else:
        dv.copy(src + offs, out, rank, src_rank, peer, heap_bases, mask=mask, other=other)


def _check_row(got, want, n, masked, tail, what):
    assert same(got[:n], want[:n]), f"{what}: wrong values"
    if masked:
        assert same(got[n:], torch.full_like(got[n:], tail)), f"{what}: masked-off lanes were written"


def _run_primitive(ctx, op, dtype, masked):
    block, n_full, n_ragged = sizes(ctx)
    n = n_ragged if masked else n_full
    grid = (triton.cdiv(n, block),)
    n_alloc = grid[0] * block
    world, me, hb = ctx.world_size, ctx.rank, ctx.heap_bases
    seed = fresh_seed(ctx)
    data = [random_data(n_alloc, dtype, ctx.device, seed + r) for r in range(world)]  # every rank's input
    src = ctx.as_symmetric(data[me])
    poison = poison_value(dtype)

    def launch(src_t, dst_t, row, peer, src_rank=0):
        _primitive_kernel[grid](src_t, dst_t, n, row, me, peer, src_rank, hb, OP=op, MASKED=masked, BLOCK=block)

    if op in ("load", "get"):
        ctx.barrier()
        for peer in range(world):
            dst = torch.full((n_alloc,), poison, dtype=dtype, device=ctx.device)  # local, off-heap
            launch(src, dst, 0, peer)
            ctx.synchronize()
            _check_row(dst, data[peer], n, masked, 3 if op == "load" else poison, f"{op} from rank {peer}")
    elif op in ("store", "put"):
        buf = ctx.full((world, n_alloc), poison, dtype=dtype)
        local = data[me].clone()  # off-heap source
        ctx.barrier()
        for peer in range(world):
            launch(local, buf, me, peer)  # into row `me` of every peer's buf
        ctx.barrier()
        for r in range(world):
            _check_row(buf[r], data[r], n, masked, poison, f"{op} by rank {r} into rank {me}")
    else:  # copy: this rank moves every src rank's data into every dst rank's buf[me, src]
        buf = ctx.full((world, world, n_alloc), poison, dtype=dtype)
        ctx.barrier()
        for s in range(world):
            for d in range(world):
                launch(src, buf, me * world + s, d, s)
        ctx.barrier()
        for r in range(world):
            for s in range(world):
                _check_row(buf[r, s], data[s], n, masked, poison, f"copy by rank {r} from rank {s} into rank {me}")


#: On CPU ranks world sizes 1 and 3 move one dtype of each width in 1, 2 and 8 bytes through
#: masked calls by default; world size 2 moves the 4-byte ones (int32 and float32: an integer and
#: a float ``other``) through masked calls and an unmasked call of every width (int8, bfloat16,
#: int32, int64). The device code branches on the element's width, and on float-ness only for a
#: masked load's ``other``: int16 and float16 take bfloat16's 2-byte path and int8's / int32's
#: integer ``other``, an unmasked float32 call int32's path. They and the rest run under
#: ``-m extended``; on GPUs every case runs.
_CPU_SPARSE = {torch.int8, torch.bfloat16, torch.int64}
_CPU_W2_MASKED = {torch.int32, torch.float32}
_CPU_W2_UNMASKED = {torch.int8, torch.bfloat16, torch.int32, torch.int64}


def _primitive_cases():
    for op in ("load", "store", "get", "put", "copy"):
        for dtype in DTYPES:
            for masked in (False, True):
                for w in (1, 2, 3, 4):
                    name = f"w{w}-{op}-{str(dtype).replace('torch.', '')}-{'masked' if masked else 'unmasked'}"
                    default = ((w in (1, 3) and masked and dtype in _CPU_SPARSE)
                               or (w == 2 and dtype in (_CPU_W2_MASKED if masked else _CPU_W2_UNMASKED)))
                    marks = [] if default or not iris_fw.interpreting() else [pytest.mark.extended]
                    yield pytest.param(w, op, dtype, masked, id=name, marks=marks)


@pytest.mark.parametrize("world,op,dtype,masked", list(_primitive_cases()), indirect=["world"])
def test_primitive(world, op, dtype, masked):
    world.run(_run_primitive, op, dtype, masked)
