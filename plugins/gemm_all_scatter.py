"""GEMM + all-scatter: every rank computes ``a[M, K] @ b_local[K, N/W]`` and scatters its
tiles so every rank ends with ``C[M, N]`` (rank ``r``'s product in columns
``r*N/W … (r+1)*N/W``). Compute-first: ``produce`` is a GEMM tile, ``consume`` stores it into
every rank's ``C``.
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


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    M = args[3]
    NL = args[4]
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    GROUP_M: tl.constexpr = CFG[3]
    pm, pn = tiles.grouped_tile(tile, tl.cdiv(M, BM), tl.cdiv(NL, BN), GROUP_M)
    return pm * BM, pn * BN


@triton.jit
def _c_block(args, tile, CFG: tl.constexpr):
    """Pointers into ``C`` for this rank's tile ``tile`` and their mask."""
    c, M, NL, stride_cm, rank = args[2], args[3], args[4], args[10], args[11]
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, BM)
    col = off_n + tl.arange(0, BN)
    ptrs = c + r[:, None] * stride_cm + (rank * NL + col)[None, :]
    return ptrs, (r[:, None] < M) & (col[None, :] < NL)


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    a, b, c, M, NL, K = args[0], args[1], args[2], args[3], args[4], args[5]
    off_m, off_n = _coords(args, tile, CFG)
    acc = tiles.matmul_tile(a, b, off_m, off_n, M, NL, K, args[6], args[7], args[8], args[9],
                            CFG[0], CFG[1], CFG[2], CFG[4], CFG[5], CFG[6])
    return acc.to(c.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    rank, world, heap_bases = args[11], args[12], args[13]
    ptrs, mask = _c_block(args, tile, CFG)
    if FROM_STASH:
        first: tl.constexpr = 1  # stash already wrote this rank's own C
    else:
        first: tl.constexpr = 0
    for i in range(first, world):
        dv.store(ptrs, value, rank, (rank + i) % world, heap_bases, mask=mask)


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    ptrs, mask = _c_block(args, tile, CFG)
    tl.store(ptrs, value, mask=mask)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    ptrs, mask = _c_block(args, tile, CFG)
    return tl.load(ptrs, mask=mask)


class GemmAllScatter:
    """``C[M, N] = a[M, K] @ concat_r(b_r[K, N/W])`` on every rank."""

    name = "gemm_all_scatter"
    description = "each rank a[M,K] @ b_local[K,N/W], tiles scattered: every rank gets C[M,N]"
    pieces = Pieces(produce, consume, stash, reload)
    comm_first = False

    def shape(self, ctx, a, b):
        """Validate; return ``(M, N_local, K, dtype)``."""
        a, b = check_operands(a, b, ctx.device, "a [M, K]", "b [K, N/W]")
        return a.shape[0], b.shape[1], a.shape[1], a.dtype

    @staticmethod
    def global_shape(shape, world_size):
        """``(M, N, K)`` of the whole product (the benchmark tables' shape)."""
        M, NL, K, _ = shape
        return M, NL * world_size, K

    def setup(self, ctx, shape, config, uses_stash):
        """Heap buffers that live as long as the op: the output ``C[M, N]``."""
        M, NL, K, dtype = shape
        cfg = config or default_config(M, NL, K, dtype, ctx.device)
        return {"config": cfg, "out": ctx.empty(M, NL * ctx.world_size, dtype=dtype)}

    def bind(self, ctx, ws, a, b) -> Plan:
        M, NL, K, dtype = self.shape(ctx, a, b)
        cfg, c = ws["config"], ws["out"]
        a_src, b_src, cfg_t = plan_operands(cfg, a, b)
        args = (a_src, b_src, c, M, NL, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                ctx.rank, ctx.world_size, ctx.heap_bases)
        tiles_ = triton.cdiv(M, cfg.block_m) * triton.cdiv(NL, cfg.block_n)
        elem = c.element_size()
        return Plan(self.name, self.pieces, args, cfg_t, tiles_, 0, cfg.num_warps, cfg.num_stages,
                    comm_bytes=M * NL * elem * (ctx.world_size - 1), flops=2 * M * NL * K, result=c)

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_r, b_r)`` for every rank: float64 ``C`` (column block ``r`` is
        ``a_r @ b_r``; usually every rank holds the same ``a``)."""
        return torch.cat([inputs[r][0].double() @ inputs[r][1].double() for r in range(world_size)], dim=1)


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(GemmAllScatter())
