"""GEMM + all-scatter: every rank computes ``a[M, K] @ b_local[K, N/W]`` and scatters its
tiles so every rank ends with ``C[M, N]`` (rank ``r``'s product in columns
``r*N/W … (r+1)*N/W``). Compute-first: ``produce`` is a GEMM tile, ``consume`` stores it into
every rank's ``C``. The ``library`` form (``auto``'s pick on one rank, where the op is a plain
GEMM) is the local product (:class:`~iris_fw.gemm.LocalProduct`) straight into the tensor a
functional call delivers into; on more
ranks the product into a local buffer, the all-gather (:func:`iris_fw.ccl.prepared`) and the
column blocks copied into place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import gemm_tiles as tiles
from iris_fw import trace as tr
from iris_fw.engine.contract import BindCache, Pattern, Pieces, Plan
from iris_fw.gemm import (GemmConfig, OperandCache, check_operands, default_config, operands_key, plan_operands,
                          LocalProduct, storage_of)
from iris_fw.hookspecs import hookimpl


class Args(NamedTuple):
    """Runtime arguments of the pieces (``a``/``b``: TMA descriptors or pointers)."""

    a: Any
    b: Any
    c: Any  # [M, N] on the heap
    M: int
    NL: int  # N/W
    K: int
    stride_am: int
    stride_ak: int
    stride_bk: int
    stride_bn: int
    stride_cm: int
    rank: int
    world_size: int
    heap_bases: Any
    TOP = 2


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    pm, pn = tiles.grouped_tile(tile, tl.cdiv(args.M, CFG.BM), tl.cdiv(args.NL, CFG.BN), CFG.GROUP_M, CFG.XCDS,
                                CFG.PROGRAMS)
    return pm * CFG.BM, pn * CFG.BN


@triton.jit
def _c_block(args, tile, CFG: tl.constexpr):
    """Pointers into ``C`` for this rank's tile ``tile`` and their mask."""
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    col = off_n + tl.arange(0, CFG.BN)
    ptrs = args.c + r[:, None] * args.stride_cm + (args.rank * args.NL + col)[None, :]
    return ptrs, (r[:, None] < args.M) & (col[None, :] < args.NL)


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    off_m, off_n = _coords(args, tile, CFG)
    acc = tiles.matmul_tile(args.a, args.b, off_m, off_n, args.M, args.NL, args.K, args.stride_am, args.stride_ak,
                            args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, CFG.A_DESC, CFG.B_DESC, CFG.EXACT)
    return acc.to(args.c.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    ptrs, mask = _c_block(args, tile, CFG)
    if FROM_STASH:
        first: tl.constexpr = 1  # stash already wrote this rank's own C
    else:
        first: tl.constexpr = 0
    for i in range(first, args.world_size):
        dv.store(ptrs, value, args.rank, (args.rank + i) % args.world_size, args.heap_bases, mask=mask)


@triton.jit
def traffic(args, item, STEP: tl.constexpr, CFG: tl.constexpr):
    """Tile ``item``'s block of ``C`` goes to the ``W - 1`` other ranks."""
    off_m, off_n = _coords(args, item, CFG)
    rows = tl.minimum(tr.as_i64(args.M) - off_m, CFG.BM)
    cols = tl.minimum(tr.as_i64(args.NL) - off_n, CFG.BN)
    ELEM: tl.constexpr = args.c.dtype.element_ty.primitive_bitwidth // 8
    return tr.only_peer(args.rank, args.world_size), rows * cols * (args.world_size - 1) * ELEM


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    ptrs, mask = _c_block(args, tile, CFG)
    tl.store(ptrs, value, mask=mask)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    ptrs, mask = _c_block(args, tile, CFG)
    return tl.load(ptrs, mask=mask)


class GemmAllScatter(Pattern):
    """``C[M, N] = a[M, K] @ concat_r(b_r[K, N/W])`` on every rank."""

    name = "gemm_all_scatter"
    description = "each rank a[M,K] @ b_local[K,N/W], tiles scattered: every rank gets C[M,N]"
    pieces = Pieces(produce, consume, stash, reload, traffic=traffic)
    comm_first = False
    Args = Args
    Config = GemmConfig

    #: what each element of :meth:`signature` is (names in mismatch messages)
    signature_fields = ("M", "N/W", "K", "dtype")

    def signature(self, ctx, a, b):
        """Validate; return ``(M, N/W, K, dtype)``."""
        a, b = check_operands(a, b, ctx.device, "a [M, K]", "b [K, N/W]")
        return a.shape[0], b.shape[1], a.shape[1], a.dtype

    def tuning_key(self, signature, world_size):
        """The global ``(M, N, K)``."""
        M, NL, K, _ = signature
        return M, NL * world_size, K

    def default_config(self, ctx, signature, programs=None):
        M, NL, K, dtype = signature
        return default_config(M, NL, K, dtype, ctx.device, programs)

    def setup(self, ctx, signature, config, uses_stash):
        """The output ``C[M, N]`` on the heap (peers write their column blocks into it)."""
        M, NL, K, dtype = signature
        return {"config": config, "out": ctx.empty(M, NL * ctx.world_size, dtype=dtype),
                "plans": BindCache(), "operands": OperandCache()}

    def bind(self, ctx, buffers, a, b) -> Plan:
        key = operands_key(a, b)
        plan = buffers["plans"].get(key)
        if plan is not None:
            return plan
        M, K = a.shape
        NL = b.shape[1]
        cfg, c = buffers["config"], buffers["out"]
        a_src, b_src, gcfg = plan_operands(cfg, a, b, cache=buffers["operands"])
        args = Args(a_src, b_src, c, M, NL, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                    ctx.rank, ctx.world_size, ctx.heap_bases)
        library_into = self._library_into(ctx, buffers, a, b, c)
        return buffers["plans"].put(key, Plan(
            pattern=self.name, pieces=self.pieces, args=args, cfg=gcfg,
            num_tiles=triton.cdiv(M, cfg.block_m) * triton.cdiv(NL, cfg.block_n),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            comm_bytes=M * NL * c.element_size() * (ctx.world_size - 1), flops=2 * M * NL * K, result=c,
            library=lambda: library_into(c), library_into=library_into))

    @staticmethod
    def _library_into(ctx, buffers, a, b, c):
        """The library form writing ``C`` into a given contiguous ``[M, N]`` tensor. One rank:
        the local product straight into it (``C`` is the product;
        :class:`~iris_fw.gemm.LocalProduct`) — unless it shares an operand's memory, which the product still
        reads: then into ``c`` and copied. More ranks: the
        product into a local ``[M, N/W]`` buffer, the all-gather into a ``[W, M, N/W]`` one (both
        the op's, made on its first library call; :func:`iris_fw.ccl.prepared` on them, once per op), and
        the column blocks copied into place — a copy the layout needs, not a copy of a finished
        result."""
        from iris_fw import ccl  # (here, once per plan: an import statement per call costs µs)

        world = ctx.world_size
        if world == 1:
            return LocalProduct(a, b, c, storage_of(a, b))
        M, NL = a.shape[0], b.shape[1]
        product = []  # (made on the plan's first library call: other schedules need none of it)

        def library_into(dst):
            if not product:
                local = buffers.get("local")
                if local is None:
                    local = buffers["local"] = torch.empty(M, NL, dtype=c.dtype, device=c.device)
                    buffers["gathered"] = torch.empty(world, M, NL, dtype=c.dtype, device=c.device)
                product.append(LocalProduct(a, b, local, storage_of(a, b)))
            local, gathered = product[0].buffer, buffers["gathered"]
            # (prepared on the op's first library call: the same call on every rank)
            gather = buffers.get("gather") or buffers.setdefault(
                "gather", ccl.prepared("all_gather_into_tensor", gathered, local, ctx=ctx))
            product[0](local)
            gather()
            dst.view(M, world, NL).copy_(gathered.transpose(0, 1))
            return dst

        return library_into

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_r, b_r)`` for every rank: float64 ``C`` (column block ``r`` is
        ``a_r @ b_r``; usually every rank holds the same ``a``)."""
        return torch.cat([inputs[r][0].double() @ inputs[r][1].double() for r in range(world_size)], dim=1)


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(GemmAllScatter())
