"""GEMM + reduce-scatter: rank ``r`` holds ``a[M, K/W]`` and ``b[K/W, N]``; the partial
products are summed over ranks and rank ``r`` keeps rows ``r*M/W … (r+1)*M/W`` of the sum.

Compute-first: ``produce`` is a partial GEMM tile; ``consume`` stores it, in the output dtype,
into slot ``rank`` of the row owner's ``partials[W, M/W, N]`` buffer. After the closing
barrier each rank sums its ``W`` slots in fp32 (``finish``). Row blocks start with the next
rank's rows, so at any moment the ranks send to different peers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import tiles
from iris_fw.gemm import check_operands, default_config, plan_operands
from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Pieces, Plan

#: Elements per program of the final reduction (GPU; the CPU uses a small block).
REDUCE_BLOCK = 2048
CPU_REDUCE_BLOCK = 256

# args: 0 a operand, 1 b operand, 2 partials (heap [W, M/W, N]), 3 stash [M, N], 4 M, 5 N,
# 6 K/W, 7 M/W, 8 a stride 0, 9 a stride 1, 10 b stride 0, 11 b stride 1, 12 rank,
# 13 world size, 14 heap_bases, 15 row-block rotation
# CFG: BM, BN, BK, GROUP_M, A_DESC, B_DESC, EXACT


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    M, N, shift = args[4], args[5], args[15]
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    seq, pm, pn = tiles.rotated_tile(tile, tl.cdiv(M, BM), tl.cdiv(N, BN), shift, CFG[3])
    return pm * BM, pn * BN


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    off_m, off_n = _coords(args, tile, CFG)
    acc = tiles.matmul_tile(args[0], args[1], off_m, off_n, args[4], args[5], args[6], args[8], args[9],
                            args[10], args[11], CFG[0], CFG[1], CFG[2], CFG[4], CFG[5], CFG[6])
    return acc.to(args[2].dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    partials, M, N, Mo, rank, world, heap_bases = args[2], args[4], args[5], args[7], args[12], args[13], args[14]
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, BM)
    col = off_n + tl.arange(0, BN)
    owner = tl.minimum(r // Mo, world - 1)
    dst = partials + ((rank * Mo + r - owner * Mo) * N)[:, None] + col[None, :]
    dv.store(dst, value, rank, owner[:, None], heap_bases, mask=(r[:, None] < M) & (col[None, :] < N))


@triton.jit
def _stash_block(args, tile, CFG: tl.constexpr):
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, BM)
    col = off_n + tl.arange(0, BN)
    return args[3] + r[:, None] * args[5] + col[None, :], (r[:, None] < args[4]) & (col[None, :] < args[5])


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    tl.store(ptrs, value, mask=mask)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    return tl.load(ptrs, mask=mask)


@triton.jit
def _reduce_kernel(partials, out, n, world, BLOCK: tl.constexpr):
    """``out[:n] = sum over s of partials[s, :n]`` (fp32 sums)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, world):
        acc += tl.load(partials + s * n + offs, mask=mask).to(tl.float32)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


class GemmReduceScatter:
    """``out[M/W, N]`` = rows ``rank*M/W …`` of ``sum_r a_r[M, K/W] @ b_r[K/W, N]``."""

    name = "gemm_reduce_scatter"
    description = "partials a[M,K/W] @ b[K/W,N] summed over ranks; rank r keeps rows r*M/W.."
    pieces = Pieces(produce, consume, stash, reload)
    comm_first = False

    def shape(self, ctx, a, b):
        """Validate; return ``(M, N, K_local, dtype)``."""
        a, b = check_operands(a, b, ctx.device, "a [M, K/W]", "b [K/W, N]", "K/W")
        if a.shape[0] % ctx.world_size:
            raise ValueError(f"a's rows M={a.shape[0]} must divide evenly over the {ctx.world_size} ranks "
                             f"(rank r keeps rows r*M/W .. (r+1)*M/W)")
        return a.shape[0], b.shape[1], a.shape[1], a.dtype

    @staticmethod
    def global_shape(shape, world_size):
        """``(M, N, K)`` of the whole product (the benchmark tables' shape)."""
        M, N, K, _ = shape
        return M, N, K * world_size

    def setup(self, ctx, shape, config, uses_stash):
        """``partials[W, M/W, N]`` on the heap, the output and, for unfused schedules, a stash."""
        M, N, K, dtype = shape
        Mo = M // ctx.world_size
        cfg = config or default_config(M, N, K, dtype, ctx.device)
        return {"config": cfg, "partials": ctx.empty(ctx.world_size, Mo, N, dtype=dtype),
                "stash": torch.empty(M if uses_stash else 1, N, dtype=dtype, device=ctx.device),
                "out": torch.empty(Mo, N, dtype=dtype, device=ctx.device)}

    def bind(self, ctx, ws, a, b) -> Plan:
        M, N, K, dtype = self.shape(ctx, a, b)
        cfg, partials, out = ws["config"], ws["partials"], ws["out"]
        Mo = M // ctx.world_size
        a_src, b_src, cfg_t = plan_operands(cfg, a, b)
        shift = (((ctx.rank + 1) % ctx.world_size) * Mo) // cfg.block_m
        args = (a_src, b_src, partials, ws["stash"], M, N, K, Mo, a.stride(0), a.stride(1), b.stride(0),
                b.stride(1), ctx.rank, ctx.world_size, ctx.heap_bases, shift)
        block = CPU_REDUCE_BLOCK if ctx.device.type == "cpu" else REDUCE_BLOCK
        n, world = Mo * N, ctx.world_size

        def finish():
            if n:
                _reduce_kernel[(triton.cdiv(n, block),)](partials, out, n, world, BLOCK=block)

        tiles_ = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        return Plan(self.name, self.pieces, args, cfg_t, tiles_, 0, cfg.num_warps, cfg.num_stages,
                    comm_bytes=(M - Mo) * N * a.element_size(), flops=2 * M * N * K, result=out, finish=finish)

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_r, b_r)``: float64 rows ``rank*M/W …`` of ``sum_r a_r @ b_r``."""
        total = sum(inputs[r][0].double() @ inputs[r][1].double() for r in range(world_size))
        Mo = total.shape[0] // world_size
        return total[rank * Mo:(rank + 1) * Mo]


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(GemmReduceScatter())
