"""All-gather + GEMM: rank ``r`` holds ``a_shard[M/W, K]`` (rows ``r*M/W …``); every rank
computes ``all_gather(a_shard)[M, K] @ b_local[K, N/W]``.

Communicate-first: chunk ``i`` is one ``BLOCK_M``-row block of the gathered ``A``; ``fetch``
pulls it from its owner(s) into local staging and ``produce(STAGED=True)`` multiplies staged
rows; ``produce(STAGED=False)`` (the fused schedule) reads every row straight from its owner's
heap inside the K loop. Row blocks are visited starting with this rank's own rows, so compute
starts on local data while the rest arrives.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import tiles
from iris_fw.gemm import check_operands, default_config, plan_operands
from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Copy, Pieces, Plan

#: Columns of ``A`` one fetch step copies (GPU); the CPU uses the GEMM's ``block_k``.
FETCH_BLOCK_K = 256
#: Copy-engine schedules copy each rank's shard in this many pieces (whole row blocks).
COPY_PIECES = 4

# args: 0 a_full as operand, 1 b operand, 2 a_shard (heap), 3 a_full (staging), 4 c, 5 M, 6 M/W,
# 7 N/W, 8 K, 9 a_shard stride 0, 10 a_shard stride 1, 11 a_full stride 0, 12 b stride 0,
# 13 b stride 1, 14 c stride 0, 15 rank, 16 world size, 17 heap_bases, 18 row-block rotation
# CFG: BM, BN, BK, GROUP_M, A_DESC, B_DESC, EXACT, FETCH_BK


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    """``(row-block sequence number, off_m, off_n)`` of ``tile``."""
    M, NL, shift = args[5], args[7], args[18]
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    seq, pm, pn = tiles.rotated_tile(tile, tl.cdiv(M, BM), tl.cdiv(NL, BN), shift, CFG[3])
    return seq, pm * BM, pn * BN


@triton.jit
def _owner_rows(args, off_m, BM: tl.constexpr):
    """For rows ``off_m …``: ``(rows, owner rank, pointer to the row in the owner's shard)``,
    as ``[BM, 1]`` blocks (rows past ``M`` clamp to the last rank; callers mask them)."""
    a_shard, Ms, stride_am, world = args[2], args[6], args[9], args[16]
    r = off_m + tl.arange(0, BM)
    owner = tl.minimum(r // Ms, world - 1)
    return r[:, None], owner[:, None], a_shard + ((r - owner * Ms) * stride_am)[:, None]


@triton.jit
def fetch(args, chunk, CFG: tl.constexpr):
    a_full, M, K, stride_ak, stride_fm = args[3], args[5], args[8], args[10], args[11]
    rank, heap_bases, shift = args[15], args[17], args[18]
    BM: tl.constexpr = CFG[0]
    FBK: tl.constexpr = CFG[7]
    off_m = ((chunk + shift) % tl.cdiv(M, BM)) * BM
    r, owner, src = _owner_rows(args, off_m, BM)
    for k0 in range(0, K, FBK):
        col = k0 + tl.arange(0, FBK)[None, :]
        mask = (r < M) & (col < K)
        tl.store(a_full + r * stride_fm + col, dv.load(src + col * stride_ak, rank, owner, heap_bases, mask=mask), mask=mask)


@triton.jit
def depends(args, tile, CFG: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    return seq


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    b, c, M, NL, K = args[1], args[4], args[5], args[7], args[8]
    BM: tl.constexpr = CFG[0]
    seq, off_m, off_n = _coords(args, tile, CFG)
    if STAGED:
        acc = tiles.matmul_tile(args[0], b, off_m, off_n, M, NL, K, args[11], 1, args[12], args[13],
                                BM, CFG[1], CFG[2], CFG[4], CFG[5], CFG[6])
    else:
        r, owner, src = _owner_rows(args, off_m, BM)
        rows = dv.translate(src, args[15], owner, args[17])
        acc = tiles.matmul_tile_rows(rows, b, off_n, NL, K, args[10], args[12], args[13], r < M,
                                     BM, CFG[1], CFG[2], CFG[5], CFG[6])
    return acc.to(c.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    tiles.store_block(args[4], value, off_m, off_n, args[5], args[7], args[14], 1, CFG[0], CFG[1])


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    consume(args, tile, value, CFG, False)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    BM: tl.constexpr = CFG[0]
    BN: tl.constexpr = CFG[1]
    seq, off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, BM)
    col = off_n + tl.arange(0, BN)
    return tl.load(args[4] + r[:, None] * args[14] + col[None, :], mask=(r[:, None] < args[5]) & (col[None, :] < args[7]))


class AllGatherGemm:
    """``C[M, N/W] = all_gather(a_shard[M/W, K]) @ b_local[K, N/W]``."""

    name = "all_gather_gemm"
    description = "A_shard[M/W,K] gathered from every rank, times b_local[K,N/W] -> C[M,N/W]"
    pieces = Pieces(produce, consume, stash, reload, fetch, depends)
    comm_first = True

    def shape(self, ctx, a_shard, b):
        """Validate; return ``(M/W, N_local, K, dtype)``."""
        a_shard, b = check_operands(a_shard, b, ctx.device, "a_shard [M/W, K]", "b [K, N/W]")
        return a_shard.shape[0], b.shape[1], a_shard.shape[1], a_shard.dtype

    @staticmethod
    def global_shape(shape, world_size):
        """``(M, N, K)`` of the whole product (the benchmark tables' shape)."""
        Ms, NL, K, _ = shape
        return Ms * world_size, NL * world_size, K

    def setup(self, ctx, shape, config, uses_stash):
        """The output, the staging buffer for the gathered ``A`` (unfused schedules) and a heap
        copy of ``a_shard`` for inputs that are not on the heap."""
        Ms, NL, K, dtype = shape
        M = Ms * ctx.world_size
        cfg = config or default_config(M, NL, K, dtype, ctx.device)
        staging = torch.empty(M if uses_stash else 1, K, dtype=dtype, device=ctx.device)
        return {"config": cfg, "out": torch.empty(M, NL, dtype=dtype, device=ctx.device),
                "staging": staging, "staged": uses_stash, "a_heap": ctx.empty(Ms, K, dtype=dtype)}

    def bind(self, ctx, ws, a_shard, b) -> Plan:
        Ms, NL, K, dtype = self.shape(ctx, a_shard, b)
        cfg, c, a_full = ws["config"], ws["out"], ws["staging"]
        if not (ctx.is_symmetric(a_shard) and a_shard.is_contiguous()):  # peers read it: on the heap, dense
            a_shard = ws["a_heap"].copy_(a_shard)
        M = Ms * ctx.world_size
        # Staged: the GEMM reads the local staging buffer (TMA where aligned); fused: the shard
        # pointer stands in (produce(STAGED=False) reads every row from its owner instead).
        a_src, b_src, cfg_head = plan_operands(cfg, a_full if ws["staged"] else a_shard, b, a_tma=ws["staged"])
        shift = (ctx.rank * Ms) // cfg.block_m
        args = (a_src, b_src, a_shard, a_full, c, M, Ms, NL, K, a_shard.stride(0), a_shard.stride(1),
                a_full.stride(0), b.stride(0), b.stride(1), c.stride(0), ctx.rank, ctx.world_size,
                ctx.heap_bases, shift)
        fetch_bk = cfg.block_k if ctx.device.type == "cpu" else FETCH_BLOCK_K
        cfg_t = cfg_head + (fetch_bk,)
        tiles_m = triton.cdiv(M, cfg.block_m)
        copies = self._copies(ctx, ws, a_shard, a_full, Ms, cfg.block_m, shift) if ws["staged"] else None
        return Plan(self.name, self.pieces, args, cfg_t, tiles_m * triton.cdiv(NL, cfg.block_n), tiles_m,
                    cfg.num_warps, cfg.num_stages, comm_bytes=(M - Ms) * K * a_shard.element_size(),
                    flops=2 * M * NL * K, result=c, copies=copies)

    @staticmethod
    def _copies(ctx, ws, a_shard, a_full, Ms, BM, shift):
        """Shards into staging, this rank's first, then the next ranks' (the order tiles are
        computed in), each in :data:`COPY_PIECES` pieces so the first tiles start early; each
        step completes the chunks (``BM``-row blocks, numbered from this rank's first block, as
        ``depends`` numbers them) its rows finish."""
        W, M = ctx.world_size, Ms * ctx.world_size
        key = (a_shard.data_ptr(), tuple(a_shard.shape))
        if ws.get("peer_shards", (None,))[0] != key:  # peer views cost a mapping each: keep them
            ws["peer_shards"] = (key, [ctx.peer_view(a_shard, r) for r in range(W)])
        views = ws["peer_shards"][1]
        start, tiles_m, ready, covered, out = ctx.rank * Ms, triton.cdiv(M, BM), 0, 0, []
        piece = triton.cdiv(triton.cdiv(Ms, COPY_PIECES), BM) * BM
        for i in range(W):
            owner = (ctx.rank + i) % W
            for lo in range(0, Ms, piece):
                hi = min(lo + piece, Ms)
                covered += hi - lo  # rows start … start + covered (cyclically) are in staging
                while ready < tiles_m:
                    r0 = ((ready + shift) % tiles_m) * BM
                    if covered < M and (r0 - start) % M + min(BM, M - r0) > covered:
                        break
                    ready += 1
                out.append(Copy(a_full[owner * Ms + lo:owner * Ms + hi], views[owner][lo:hi], ready))
        return out

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_shard_r, b_r)``: float64 ``cat(a_shard) @ b_rank``."""
        a = torch.cat([inputs[r][0].double() for r in range(world_size)], dim=0)
        return a @ inputs[rank][1].double()


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(AllGatherGemm())
