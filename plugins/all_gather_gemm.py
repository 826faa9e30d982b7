"""All-gather + GEMM: rank ``r`` holds ``a_shard[M/W, K]`` (rows ``r*M/W …``); every rank
computes ``all_gather(a_shard)[M, K] @ b_local[K, N/W]``.

Communicate-first: chunk ``i`` is one ``BLOCK_M``-row block of the gathered ``A``; ``fetch``
pulls it from its owner(s) into local staging and ``produce(STAGED=True)`` multiplies staged
rows; ``produce(STAGED=False)`` (the fused schedule) reads every row straight from its owner's
heap inside the K loop. Row blocks are visited starting with this rank's own rows, so compute
starts on local data while the rest arrives.

Under the kernel schedules peers read ``a_shard`` from the op's own heap buffer
(``op.buffers["a_heap"]``): a call copies its input there (the plan's ``stage_in``) unless the
input *is* that buffer (write your shard into it to skip the copy). A tensor the caller placed on
the heap is not read in place, because nothing checks per call that every rank placed its shard
at the same offset. The ``library`` form (``auto``'s pick on one rank) is the local product
(:class:`~iris_fw.gemm.LocalProduct`) of the shard where it is on one rank, and of the gathered
``A`` on more (the shard into the heap buffer unless it is that buffer, then the all-gather,
:func:`iris_fw.ccl.prepared`); it multiplies straight into ``out=`` or a functional call's new
tensor (``library_into``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import gemm_tiles as tiles
from iris_fw import gluon_tiles as gtiles
from iris_fw import trace as tr
from iris_fw.engine.contract import BindCache, Copy, GluonPieces, Pattern, Pieces, Plan
from iris_fw.gemm import (GemmConfig, OperandCache, check_operands, default_config, exact, plan_operands,
                          LocalProduct, storage_of)
from iris_fw.hookspecs import hookimpl

#: Columns of ``A`` one fetch step copies (GPU); the CPU uses the GEMM's ``block_k``.
FETCH_BLOCK_K = 256
#: Copy-engine schedules copy each rank's shard in this many pieces (whole row blocks).
COPY_PIECES = 4


class Args(NamedTuple):
    """Runtime arguments of the pieces (``a``/``b``: TMA descriptors or pointers)."""

    a: Any  # the gathered A as the GEMM reads it (staging) or the shard (fused schedules)
    b: Any
    a_shard: Any  # [M/W, K] on the heap
    a_full: Any  # [M, K] staging
    c: Any  # [M, N/W]
    M: int
    Ms: int  # M/W
    NL: int  # N/W
    K: int
    stride_sm: int  # a_shard strides
    stride_sk: int
    stride_fm: int  # a_full row stride
    stride_bk: int
    stride_bn: int
    stride_cm: int
    rank: int
    world_size: int
    heap_bases: Any
    shift: int  # row-block rotation
    TOP = 2


class AgCfg(NamedTuple):
    """Constexpr configuration: the GEMM's (:class:`~iris_fw.gemm.GemmCfg`, its fields in its
    order) plus the columns one fetch step copies."""

    BM: int
    BN: int
    BK: int
    GROUP_M: int
    A_DESC: bool
    B_DESC: bool
    EXACT: bool
    XCDS: int
    PROGRAMS: int
    FETCH_BK: int


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    """``(row-block sequence number, off_m, off_n)`` of ``tile``."""
    seq, pm, pn = tiles.rotated_tile(tile, tl.cdiv(args.M, CFG.BM), tl.cdiv(args.NL, CFG.BN), args.shift, CFG.GROUP_M,
                                     CFG.XCDS, CFG.PROGRAMS)
    return seq, pm * CFG.BM, pn * CFG.BN


@triton.jit
def _owner_rows(args, off_m, BM: tl.constexpr):
    """For rows ``off_m …``: ``(rows, owner rank, pointer to the row in the owner's shard)``,
    as ``[BM, 1]`` blocks (rows past ``M`` clamp to the last rank; callers mask them)."""
    r = off_m + tl.arange(0, BM)
    owner = tl.minimum(r // args.Ms, args.world_size - 1)
    return r[:, None], owner[:, None], args.a_shard + ((r - owner * args.Ms) * args.stride_sm)[:, None]


@triton.jit
def fetch(args, chunk, CFG: tl.constexpr):
    off_m = ((chunk + args.shift) % tl.cdiv(args.M, CFG.BM)) * CFG.BM
    r, owner, src = _owner_rows(args, off_m, CFG.BM)
    for k0 in range(0, args.K, CFG.FETCH_BK):
        col = k0 + tl.arange(0, CFG.FETCH_BK)[None, :]
        mask = (r < args.M) & (col < args.K)
        tl.store(args.a_full + r * args.stride_fm + col,
                 dv.load(src + col * args.stride_sk, args.rank, owner, args.heap_bases, mask=mask), mask=mask)


@triton.jit
def traffic(args, item, STEP: tl.constexpr, CFG: tl.constexpr):
    """Chunk ``item`` (a row block of ``A``): its rows owned by other ranks, read by ``fetch``."""
    off_m = ((item + args.shift) % tl.cdiv(args.M, CFG.BM)) * CFG.BM
    r = off_m + tl.arange(0, CFG.BM)
    owner = tl.minimum(r // args.Ms, args.world_size - 1)
    peer, rows = tr.rows_peer(owner, (r < args.M) & (owner != args.rank))
    ELEM: tl.constexpr = args.a_full.dtype.element_ty.primitive_bitwidth // 8
    return peer, rows * args.K * ELEM


@triton.jit
def depends(args, tile, CFG: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    return seq


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    if STAGED:
        acc = tiles.matmul_tile(args.a, args.b, off_m, off_n, args.M, args.NL, args.K, args.stride_fm, 1,
                                args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, CFG.A_DESC, CFG.B_DESC,
                                CFG.EXACT)
    else:
        r, owner, src = _owner_rows(args, off_m, CFG.BM)
        rows = dv.translate(src, args.rank, owner, args.heap_bases)
        acc = tiles.matmul_tile_rows(rows, args.b, off_n, args.NL, args.K, args.stride_sk, args.stride_bk,
                                     args.stride_bn, r < args.M, CFG.BM, CFG.BN, CFG.BK, CFG.B_DESC, CFG.EXACT)
    return acc.to(args.c.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    tiles.store_block(args.c, value, off_m, off_n, args.M, args.NL, args.stride_cm, 1, CFG.BM, CFG.BN)


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    consume(args, tile, value, CFG, False)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    seq, off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    col = off_n + tl.arange(0, CFG.BN)
    return tl.load(args.c + r[:, None] * args.stride_cm + col[None, :],
                   mask=(r[:, None] < args.M) & (col[None, :] < args.NL))


GLUON_PIECES = None
if gtiles.AVAILABLE:  # the warp_specialized scheduler's pieces (iris_fw.gluon_tiles)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _ws_fetch(args, chunk, CFG: gl.constexpr, NW: gl.constexpr):
        """Communication partition: chunk ``chunk`` (a row block) from its owner(s) into
        staging (what ``fetch`` does)."""
        off_m = ((chunk + args.shift) % ((args.M + CFG.BM - 1) // CFG.BM)) * CFG.BM
        # BK columns a step, not FETCH_BK: a block of pointers per element lives in the few
        # registers of the communication warps (FETCH_BK = 256 spilled at 128-row chunks)
        r, c = gtiles.block_offsets(off_m, 0, CFG.BM, CFG.BK, NW)
        owner = gl.minimum(r // args.Ms, args.world_size - 1)
        src = args.a_shard + (r - owner * args.Ms) * args.stride_sm
        for k0 in range(0, args.K, CFG.BK):
            col = k0 + c
            mask = (r < args.M) & (col < args.K)
            gl.store(args.a_full + r * args.stride_fm + col,
                     dv.load(src + col * args.stride_sk, args.rank, owner, args.heap_bases, mask=mask), mask=mask)

    @gluon.jit
    def _ws_compute(args, tile, CFG: gl.constexpr, NW: gl.constexpr, MMA: gl.constexpr):
        """Compute partition: tile ``tile`` from staging, stored (``consume(produce(STAGED=True))``)."""
        seq, off_m, off_n = _coords(args, tile, CFG)
        acc = gtiles.matmul_tile(args.a_full, args.b, off_m, off_n, args.M, args.NL, args.K, args.stride_fm, 1,
                                 args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, NW, MMA)
        r, c = gtiles.block_offsets(off_m, off_n, CFG.BM, CFG.BN, NW)
        gl.store(args.c + r * args.stride_cm + c, acc.to(args.c.dtype.element_ty), mask=(r < args.M) & (c < args.NL))

    GLUON_PIECES = GluonPieces(comm=_ws_fetch, compute=_ws_compute)


class AllGatherGemm(Pattern):
    """``C[M, N/W] = all_gather(a_shard[M/W, K]) @ b_local[K, N/W]``."""

    name = "all_gather_gemm"
    description = "A_shard[M/W,K] gathered from every rank, times b_local[K,N/W] -> C[M,N/W]"
    pieces = Pieces(produce, consume, stash, reload, fetch, depends, traffic=traffic, gluon=GLUON_PIECES)
    comm_first = True
    Args = Args
    Config = GemmConfig

    #: what each element of :meth:`signature` is (names in mismatch messages)
    signature_fields = ("M/W", "N/W", "K", "dtype")

    def signature(self, ctx, a_shard, b):
        """Validate; return ``(M/W, N/W, K, dtype)``."""
        a_shard, b = check_operands(a_shard, b, ctx.device, "a_shard [M/W, K]", "b [K, N/W]")
        return a_shard.shape[0], b.shape[1], a_shard.shape[1], a_shard.dtype

    def tuning_key(self, signature, world_size):
        """The global ``(M, N, K)``."""
        Ms, NL, K, _ = signature
        return Ms * world_size, NL * world_size, K

    def default_config(self, ctx, signature, programs=None):
        Ms, NL, K, dtype = signature
        return default_config(Ms * ctx.world_size, NL, K, dtype, ctx.device, programs)

    def setup(self, ctx, signature, config, uses_stash):
        """The output, the staging buffer for the gathered ``A`` (unfused schedules) and the heap
        buffer peers read the shard from."""
        Ms, NL, K, dtype = signature
        M = Ms * ctx.world_size
        staging = torch.empty(M if uses_stash else 1, K, dtype=dtype, device=ctx.device)
        return {"config": config, "out": torch.empty(M, NL, dtype=dtype, device=ctx.device),
                "staging": staging, "staged": uses_stash, "a_heap": ctx.empty(Ms, K, dtype=dtype),
                "shard": [None], "plans": BindCache(), "operands": OperandCache()}

    def bind(self, ctx, buffers, a_shard, b) -> Plan:
        # this call's shard, for the plan's stage_in (the kernel schedules: copied into a_heap)
        # or its library form (read where it is); they let it go once read
        buffers["shard"][0] = a_shard
        # the plan reads the shard from a_heap (or, the library form, from buffers["shard"]):
        # it depends on b alone — on one rank on the shard too (its library form's prepared
        # product reads it where it is)
        key = (b.data_ptr(), b.stride(), exact(b.dtype))
        if ctx.world_size == 1:
            key += (a_shard.data_ptr(), a_shard.stride())
        plan = buffers["plans"].get(key)
        if plan is not None:
            return plan
        Ms, K = a_shard.shape
        NL = b.shape[1]
        cfg, c, a_full, a_heap = buffers["config"], buffers["out"], buffers["staging"], buffers["a_heap"]
        M = Ms * ctx.world_size
        # Staged: the GEMM reads the local staging buffer (TMA where aligned); fused: the shard
        # pointer stands in (produce(STAGED=False) reads every row from its owner instead).
        a_src, b_src, gcfg = plan_operands(cfg, a_full if buffers["staged"] else a_heap, b, a_tma=buffers["staged"],
                                           cache=buffers["operands"])
        shift = (ctx.rank * Ms) // cfg.block_m
        args = Args(a_src, b_src, a_heap, a_full, c, M, Ms, NL, K, a_heap.stride(0), a_heap.stride(1),
                    a_full.stride(0), b.stride(0), b.stride(1), c.stride(0), ctx.rank, ctx.world_size,
                    ctx.heap_bases, shift)
        fetch_bk = cfg.block_k if ctx.device.type == "cpu" else FETCH_BLOCK_K
        tiles_m = triton.cdiv(M, cfg.block_m)
        copies = self._copies(ctx, buffers, a_heap, a_full, Ms, cfg.block_m, shift) if buffers["staged"] else None
        shard = buffers["shard"]

        def stage_in():  # the kernels read every rank's shard from its heap buffer
            src, shard[0] = shard[0], None
            if src.data_ptr() != a_heap.data_ptr() or src.stride() != a_heap.stride():
                a_heap.copy_(src)

        library, library_into = self._library(ctx, buffers, shard, a_heap, b, c)
        return buffers["plans"].put(key, Plan(
            pattern=self.name, pieces=self.pieces, args=args, cfg=AgCfg(*gcfg, FETCH_BK=fetch_bk),
            num_tiles=tiles_m * triton.cdiv(NL, cfg.block_n), num_chunks=tiles_m,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            # fetch copies every row block into staging, this rank's own included: the
            # communication programs move all of A (the SM split's estimate)
            comm_bytes=M * K * a_heap.element_size(), flops=2 * M * NL * K, result=c, copies=copies,
            stage_in=stage_in, library=library, library_into=library_into,
            result_arg="c"))  # (only this rank writes its C: a functional call's kernels write it there)

    @staticmethod
    def _library(ctx, buffers, shard, a_heap, b, c):
        """``(library, library_into)``: the library form — one rank: the local product of the
        shard where it is (:class:`~iris_fw.gemm.LocalProduct`; no copy of the input); more
        ranks: the shard into ``a_heap`` (unless it is that buffer), the all-gather of it into
        a local ``[M, K]`` buffer (the op's, made on its first library call; :func:`iris_fw.ccl.prepared`
        on them, once per op), the local product of that. Either
        multiplies straight into the tensor it is given (``c`` or the caller's), unless that
        tensor shares ``b``'s memory — or, on one rank, the shard's — which the product still
        reads: then into ``c`` and copied."""
        from iris_fw import ccl  # (here, once per plan: an import statement per call costs µs)

        world = ctx.world_size
        b_storage = storage_of(b)

        if world == 1:  # (the plan is bound to the shard's layout too: see bind)
            product = LocalProduct(shard[0], b, c, b_storage | storage_of(shard[0]))

            def library_into(dst):
                shard[0] = None
                return product(dst)
        else:
            product = []  # (made on the plan's first library call: other schedules need none of it)

            def library_into(dst):
                src, shard[0] = shard[0], None
                if src.data_ptr() != a_heap.data_ptr() or src.stride() != a_heap.stride():
                    a_heap.copy_(src)
                if not product:
                    full = buffers.get("gathered")
                    if full is None:
                        full = buffers["gathered"] = torch.empty(world * a_heap.shape[0], a_heap.shape[1],
                                                                 dtype=a_heap.dtype, device=a_heap.device)
                    product.append(LocalProduct(full, b, c, b_storage))
                # (prepared on the op's first library call: the same call on every rank)
                gather = buffers.get("gather") or buffers.setdefault(
                    "gather", ccl.prepared("all_gather_into_tensor", product[0].a, a_heap, ctx=ctx))
                gather()
                return product[0](dst)

        return (lambda: library_into(c)), library_into

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
