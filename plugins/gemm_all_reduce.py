"""GEMM + all-reduce (a row-parallel linear layer): rank ``r`` holds ``a[M, K/W]`` and
``b[K/W, N]``; every rank gets ``sum_r a_r @ b_r + bias[N]`` as ``[M, N]``.

Compute-first, two steps (:mod:`iris_fw.engine.contract`, "Multi-step patterns"); partial tiles
travel in the output dtype, sums are taken in fp32 (in rank order, so every rank gets bitwise
the same result):

* ``one_shot`` — step 0 pushes each partial tile into slot ``rank`` of *every* rank's
  ``partials``; step 1 has every rank sum its slots of the tiles its program computed, add the
  bias and store its own output. A rank receives ``(W-1)·M·N`` elements.
* ``two_shot`` — step 0 pushes each partial tile to the tile's owner (``tile mod W``) only;
  step 1 has the owner sum, add the bias and store the result into every rank's output. A rank
  moves about ``2(W-1)/W·M·N`` elements and its ``partials`` hold ``~M·N`` instead of ``W·M·N``.

Both move the same bytes at ``W = 2``, where one-shot saves a hop; from ``W = 3`` two-shot moves
fewer (:meth:`GemmAllReduce.default_config`). Under ``fused_sequential`` a program reduces its
tiles as soon as the same program of every rank has pushed them (the step barrier), while other
programs still compute; the other schedules reduce in a kernel after theirs. The ``library``
form is the local product (:class:`~iris_fw.gemm.LocalProduct`: ``torch.matmul``, or the Triton
GEMM where the device's tuning row measured it at least as fast) + the all-reduce + the bias (on
one rank no all-reduce: the product is the sum). It delivers into a given tensor
(``Plan.library_into``): a functional call writes ``out`` or a new tensor without a copy — on one
rank the product goes there; on more the product goes into the op's buffer and the all-reduce
(:func:`iris_fw.ccl.prepared` on that buffer, once per op) sums from there into the tensor.

``partials`` are tile-major blocks: block ``j`` of slot ``s`` is ``[BM, BN]`` contiguous, so a
tile's push and its reduction are full-block, unmasked, coalesced moves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw import gemm_tiles as tiles
from iris_fw import tilecomm as tc
from iris_fw import trace as tr
from iris_fw.engine.contract import BindCache, Pattern, PatternError, Pieces, Plan, check_tensor
from iris_fw.gemm import (GemmConfig, OperandCache, check_operands, default_config, operands_key, plan_operands,
                          LocalProduct, storage_of)
from iris_fw.hookspecs import hookimpl

#: The all-reduce algorithms of the pattern (see the module docstring).
ALGORITHMS = ("one_shot", "two_shot")


@dataclass(frozen=True)
class GemmAllReduceConfig(GemmConfig):
    """The GEMM's tile configuration plus the all-reduce ``algorithm`` (``one_shot`` or
    ``two_shot``)."""

    algorithm: str = "one_shot"
    #: the all-reduce algorithms this op fuses (read through the registry: ``pattern.Config.ALGORITHMS``)
    ALGORITHMS: ClassVar[tuple[str, ...]] = ALGORITHMS

    def __post_init__(self):
        super().__post_init__()
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"GemmAllReduceConfig.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")


class Args(NamedTuple):
    """Runtime arguments of the pieces (``a``/``b``: TMA descriptors or pointers)."""

    a: Any
    b: Any
    partials: Any  # heap [W, local_tiles, BM * BN]: slot s holds rank s's partial blocks
    out: Any  # heap [M, N]
    bias: Any  # [N], or any pointer when has_bias is 0
    stash: Any  # [M, N] (unfused schedules)
    M: int
    N: int
    K: int  # K/W
    stride_am: int
    stride_ak: int
    stride_bk: int
    stride_bn: int
    local_tiles: int  # blocks per slot: every tile (one-shot) or the tiles a rank owns (two-shot)
    rank: int
    world_size: int
    heap_bases: Any
    has_bias: int
    two_shot: int
    TOP = 2


@triton.jit
def _offsets(args, tile, CFG: tl.constexpr):
    pm, pn = tiles.grouped_tile(tile, tl.cdiv(args.M, CFG.BM), tl.cdiv(args.N, CFG.BN), CFG.GROUP_M, CFG.XCDS,
                                CFG.PROGRAMS)
    return pm * CFG.BM, pn * CFG.BN


@triton.jit
def _block(args, slot, j, CFG: tl.constexpr):
    """``[BM, BN]`` pointers to block ``j`` of slot ``slot`` of ``partials``."""
    r = tl.arange(0, CFG.BM)
    c = tl.arange(0, CFG.BN)
    return args.partials + (slot * args.local_tiles + j) * (CFG.BM * CFG.BN) + r[:, None] * CFG.BN + c[None, :]


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    off_m, off_n = _offsets(args, tile, CFG)
    acc = tiles.matmul_tile(args.a, args.b, off_m, off_n, args.M, args.N, args.K, args.stride_am, args.stride_ak,
                            args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, CFG.A_DESC, CFG.B_DESC, CFG.EXACT)
    return acc.to(args.partials.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    """Step 0: this rank's partial tile into its slot on every rank (one-shot) or on the tile's
    owner (two-shot). Rows and columns past ``M``/``N`` hold zeros (masked operand loads)."""
    if args.two_shot:
        dv.store(_block(args, args.rank, tile // args.world_size, CFG), value, args.rank, tile % args.world_size,
                    args.heap_bases)
    else:
        tc.tile_store_all(_block(args, args.rank, tile, CFG), value, args.rank, args.world_size, args.heap_bases)


@triton.jit
def step(args, tile, STEP: tl.constexpr, CFG: tl.constexpr):
    """Step 1: the tile's slots summed in rank order (fp32), plus the bias, into this rank's
    output (one-shot) or, by the owner, into every rank's output (two-shot)."""
    mine = (args.two_shot == 0) | (tile % args.world_size == args.rank)
    j = tile
    if args.two_shot:
        j = tile // args.world_size
    if mine:
        acc = tc.tile_reduce_rows(_block(args, 0, j, CFG), args.local_tiles * CFG.BM * CFG.BN, args.world_size)
        off_m, off_n = _offsets(args, tile, CFG)
        r = off_m + tl.arange(0, CFG.BM)
        c = off_n + tl.arange(0, CFG.BN)
        if args.has_bias:
            acc += tl.load(args.bias + c, mask=c < args.N, other=0.0).to(tl.float32)[None, :]
        ptrs = args.out + r[:, None] * args.N + c[None, :]
        mask = (r[:, None] < args.M) & (c[None, :] < args.N)
        if args.two_shot:
            tc.tile_store_all(ptrs, acc, args.rank, args.world_size, args.heap_bases, mask=mask)
        else:
            tl.store(ptrs, acc.to(args.out.dtype.element_ty), mask=mask)


@triton.jit
def traffic(args, item, STEP: tl.constexpr, CFG: tl.constexpr):
    """Step 0: tile ``item``'s partial block to every other rank (one-shot) or to its owner
    (two-shot, nothing when this rank owns it). Step 1: two-shot, the owner's sum to every other
    rank; one-shot reduces locally."""
    ELEM: tl.constexpr = args.partials.dtype.element_ty.primitive_bitwidth // 8
    owner = tr.as_i64(item) % args.world_size
    mine = owner == args.rank
    if STEP == 0:
        block = tr.as_i64(CFG.BM * CFG.BN * ELEM)
        peer = tl.where(args.two_shot != 0, tl.where(mine, -1, owner), tr.only_peer(args.rank, args.world_size))
        nbytes = tl.where(args.two_shot != 0, tl.where(mine, 0, block), block * (args.world_size - 1))
    else:
        OUT: tl.constexpr = args.out.dtype.element_ty.primitive_bitwidth // 8
        off_m, off_n = _offsets(args, item, CFG)
        rows = tl.minimum(tr.as_i64(args.M) - off_m, CFG.BM)
        cols = tl.minimum(tr.as_i64(args.N) - off_n, CFG.BN)
        sends = (args.two_shot != 0) & mine
        peer = tl.where(sends, tr.only_peer(args.rank, args.world_size), -1)
        nbytes = tl.where(sends, rows * cols * (args.world_size - 1) * OUT, 0)
    return peer, nbytes


@triton.jit
def _stash_block(args, tile, CFG: tl.constexpr):
    off_m, off_n = _offsets(args, tile, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    c = off_n + tl.arange(0, CFG.BN)
    return args.stash + r[:, None] * args.N + c[None, :], (r[:, None] < args.M) & (c[None, :] < args.N)


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    tl.store(ptrs, value, mask=mask)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    return tl.load(ptrs, mask=mask, other=0.0)


class GemmAllReduce(Pattern):
    """``out[M, N]`` = ``sum_r a_r[M, K/W] @ b_r[K/W, N] + bias[N]`` on every rank. ``bias`` is a
    replicated parameter: every rank passes the same values (they are not compared)."""

    name = "gemm_all_reduce"
    description = "partials a[M,K/W] @ b[K/W,N] summed over ranks (+ bias[N]) on every rank"
    pieces = Pieces(produce, consume, stash, reload, step=step, traffic=traffic)
    comm_first = False
    Args = Args
    Config = GemmAllReduceConfig

    #: what each element of :meth:`signature` is (names in mismatch messages)
    signature_fields = ("M", "N", "K/W", "dtype", "bias")

    def signature(self, ctx, a, b, bias=None):
        """Validate; return ``(M, N, K/W, dtype, has_bias)``."""
        a, b = check_operands(a, b, ctx.device, "a [M, K/W]", "b [K/W, N]", "K/W")
        if bias is not None:
            check_tensor(bias, "bias", 1, ctx.device, a.dtype)
            if bias.shape[0] != b.shape[1]:
                raise PatternError(f"bias must have shape [N] = [{b.shape[1]}], got {list(bias.shape)}")
        return a.shape[0], b.shape[1], a.shape[1], a.dtype, bias is not None

    def tuning_key(self, signature, world_size):
        """The global ``(M, N, K)``."""
        M, N, K = signature[:3]
        return M, N, K * world_size

    def default_config(self, ctx, signature, programs=None):
        """The GEMM's default tiles; ``one_shot`` up to 2 ranks, ``two_shot`` beyond (it moves
        ``2(W-1)/W`` instead of ``W-1`` times the output per rank and holds one slot's worth of
        partials instead of ``W``)."""
        M, N, K, dtype, _ = signature
        gemm = default_config(M, N, K, dtype, ctx.device, programs)
        return GemmAllReduceConfig(**asdict(gemm), algorithm="one_shot" if ctx.world_size <= 2 else "two_shot")

    def setup(self, ctx, signature, config, uses_stash):
        """``partials`` and the output on the heap, a stash for unfused schedules."""
        M, N, K, dtype, _ = signature
        world = ctx.world_size
        num_tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
        local = triton.cdiv(num_tiles, world) if config.algorithm == "two_shot" else num_tiles
        return {"config": config, "local_tiles": local, "num_tiles": num_tiles,
                "partials": ctx.empty(world, max(local, 1), config.block_m * config.block_n, dtype=dtype),
                "out": ctx.empty(M, N, dtype=dtype),
                "stash": torch.empty(M if uses_stash else 1, N, dtype=dtype, device=ctx.device),
                "plans": BindCache(), "operands": OperandCache()}

    def bind(self, ctx, buffers, a, b, bias=None) -> Plan:
        key = (operands_key(a, b), None if bias is None else bias.data_ptr())
        plan = buffers["plans"].get(key)
        if plan is not None:
            return plan
        M, K = a.shape
        N = b.shape[1]
        cfg, out = buffers["config"], buffers["out"]
        a_src, b_src, gcfg = plan_operands(cfg, a, b, cache=buffers["operands"])
        two_shot = cfg.algorithm == "two_shot"
        args = Args(a_src, b_src, buffers["partials"], out, out if bias is None else bias, buffers["stash"],
                    M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), buffers["local_tiles"],
                    ctx.rank, ctx.world_size, ctx.heap_bases, int(bias is not None), int(two_shot))
        world = ctx.world_size
        moved = int((2 * (world - 1) / world if two_shot else world - 1) * M * N * a.element_size())
        # one rank: the product is the result, written where the caller wants it (a call into a
        # tensor that shares the operands' memory, out=a, goes through the op's buffer). More
        # ranks: the product into the op's buffer, all-reduced from there into the tensor the
        # caller wants (the op's buffer itself in place); a bias added after the sum.
        from iris_fw import ccl  # (here, once per plan: an import statement per call costs µs)

        if world == 1:
            library_into = LocalProduct(a, b, out, storage_of(a, b, bias), bias)
        else:
            product = LocalProduct(a, b, out, storage_of(a, b))
            bias_storage = storage_of(bias)

            def library_into(dst):
                # (prepared on the op's first library call: the same call on every rank)
                reduce = buffers.get("reduce") or buffers.setdefault("reduce", ccl.prepared("all_reduce", out, ctx=ctx))
                product(out)
                if bias is None:
                    reduce(out, dst)
                elif dst.untyped_storage().data_ptr() in bias_storage:  # the sum would overwrite the bias
                    reduce(out, out)
                    dst.copy_(out.add_(bias))
                else:
                    reduce(out, dst)
                    dst.add_(bias)
                return dst

        def library():
            library_into(out)

        return buffers["plans"].put(key, Plan(
            pattern=self.name, pieces=self.pieces, args=args, cfg=gcfg, num_tiles=buffers["num_tiles"],
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, comm_bytes=moved, flops=2 * M * N * K,
            result=out, steps=2, library=library, library_into=library_into,
            # one-shot: only this rank's step 1 writes its output (two-shot: the tile's owner
            # stores into every rank's), so a functional call's kernels write it where the
            # caller wants it
            result_arg=None if two_shot else "out"))

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_r, b_r[, bias])``: float64 ``sum_r a_r @ b_r (+ bias)``."""
        total = sum(inputs[r][0].double() @ inputs[r][1].double() for r in range(world_size))
        bias = inputs[0][2] if len(inputs[0]) > 2 else None
        return total if bias is None else total + bias.double()


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(GemmAllReduce())
