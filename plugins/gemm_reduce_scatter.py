"""GEMM + reduce-scatter: rank ``r`` holds ``a[M, K/W]`` and ``b[K/W, N]``; the partial
products are summed over ranks and rank ``r`` keeps rows ``r*M/W … (r+1)*M/W``.

Compute-first: ``produce`` is a partial GEMM tile; ``consume`` stores it, in the output dtype,
into slot ``rank`` of the row owner's ``partials[W, M/W, N]`` buffer. After the kernels each
rank sums its ``W`` slots in fp32 (``finish``). Row blocks start with the next rank's rows, so
at any moment the ranks send to different peers.

Two launches per call under the kernel schedules: the GEMM kernel, then this rank's reduction
(``finish`` / ``finish_into``), which needs every peer's partials (the GEMM kernel's exit barrier)
and writes the caller's tensor. It is not folded into the kernel as a second step (as
``gemm_all_reduce``'s fused form is): a step may only read what the *same program* of every rank
delivered (the per-program step barrier), and the row rotation above gives that program other
rows on every rank; the unfused schedules run later steps in a kernel of their own anyway. The ``library``
form (``auto``'s pick on one rank, where the op is a plain GEMM) is one local product
(:class:`~iris_fw.gemm.LocalProduct`),
straight into the tensor a functional call delivers into; on more ranks the product goes into
a local buffer and the reduce-scatter (:func:`iris_fw.ccl.prepared`) from there into that tensor.
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
from iris_fw.engine.contract import BindCache, GluonPieces, Pattern, PatternError, Pieces, Plan
from iris_fw.kernel_launcher import KernelLauncher
from iris_fw.gemm import (GemmConfig, OperandCache, check_operands, default_config, operands_key, plan_operands,
                          LocalProduct, storage_of)
from iris_fw.hookspecs import hookimpl

#: Elements per program of the final reduction (GPU; the CPU uses a small block).
REDUCE_BLOCK = 2048
CPU_REDUCE_BLOCK = 256


class Args(NamedTuple):
    """Runtime arguments of the pieces (``a``/``b``: TMA descriptors or pointers)."""

    a: Any
    b: Any
    partials: Any  # [W, M/W, N] on the heap
    stash: Any  # [M, N] (unfused schedules)
    M: int
    N: int
    K: int  # K/W
    Mo: int  # M/W
    stride_am: int
    stride_ak: int
    stride_bk: int
    stride_bn: int
    rank: int
    world_size: int
    heap_bases: Any
    shift: int  # row-block rotation
    TOP = 2


@triton.jit
def _coords(args, tile, CFG: tl.constexpr):
    seq, pm, pn = tiles.rotated_tile(tile, tl.cdiv(args.M, CFG.BM), tl.cdiv(args.N, CFG.BN), args.shift, CFG.GROUP_M,
                                     CFG.XCDS, CFG.PROGRAMS)
    return pm * CFG.BM, pn * CFG.BN


@triton.jit
def produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    off_m, off_n = _coords(args, tile, CFG)
    acc = tiles.matmul_tile(args.a, args.b, off_m, off_n, args.M, args.N, args.K, args.stride_am, args.stride_ak,
                            args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, CFG.A_DESC, CFG.B_DESC, CFG.EXACT)
    return acc.to(args.partials.dtype.element_ty)


@triton.jit
def consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    col = off_n + tl.arange(0, CFG.BN)
    owner = tl.minimum(r // args.Mo, args.world_size - 1)
    dst = args.partials + ((args.rank * args.Mo + r - owner * args.Mo) * args.N)[:, None] + col[None, :]
    dv.store(dst, value, args.rank, owner[:, None], args.heap_bases,
             mask=(r[:, None] < args.M) & (col[None, :] < args.N))


@triton.jit
def traffic(args, item, STEP: tl.constexpr, CFG: tl.constexpr):
    """Tile ``item``'s rows owned by other ranks go to their owners' ``partials``."""
    off_m, off_n = _coords(args, item, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    owner = tl.minimum(r // args.Mo, args.world_size - 1)
    peer, rows = tr.rows_peer(owner, (r < args.M) & (owner != args.rank))
    cols = tl.minimum(tr.as_i64(args.N) - off_n, CFG.BN)
    ELEM: tl.constexpr = args.partials.dtype.element_ty.primitive_bitwidth // 8
    return peer, rows * cols * ELEM


@triton.jit
def _stash_block(args, tile, CFG: tl.constexpr):
    off_m, off_n = _coords(args, tile, CFG)
    r = off_m + tl.arange(0, CFG.BM)
    col = off_n + tl.arange(0, CFG.BN)
    return args.stash + r[:, None] * args.N + col[None, :], (r[:, None] < args.M) & (col[None, :] < args.N)


@triton.jit
def stash(args, tile, value, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    tl.store(ptrs, value, mask=mask)


@triton.jit
def reload(args, tile, CFG: tl.constexpr):
    ptrs, mask = _stash_block(args, tile, CFG)
    return tl.load(ptrs, mask=mask)


GLUON_PIECES = None
if gtiles.AVAILABLE:  # the warp_specialized scheduler's pieces (iris_fw.gluon_tiles)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _ws_compute(args, tile, CFG: gl.constexpr, NW: gl.constexpr, MMA: gl.constexpr):
        """Compute partition: the partial tile, stashed (``stash(produce(...))``)."""
        off_m, off_n = _coords(args, tile, CFG)
        acc = gtiles.matmul_tile(args.a, args.b, off_m, off_n, args.M, args.N, args.K, args.stride_am,
                                 args.stride_ak, args.stride_bk, args.stride_bn, CFG.BM, CFG.BN, CFG.BK, NW, MMA)
        r, c = gtiles.block_offsets(off_m, off_n, CFG.BM, CFG.BN, NW)
        gl.store(args.stash + r * args.N + c, acc.to(args.stash.dtype.element_ty), mask=(r < args.M) & (c < args.N))

    @gluon.jit
    def _ws_send(args, tile, CFG: gl.constexpr, NW: gl.constexpr):
        """Communication partition: the stashed tile into slot ``rank`` of each row owner's
        ``partials`` (``consume(reload(...))``)."""
        off_m, off_n = _coords(args, tile, CFG)
        # BK columns a step (the communication warps have few registers)
        for c0 in range(0, CFG.BN, CFG.BK):
            r, c = gtiles.block_offsets(off_m, off_n + c0, CFG.BM, CFG.BK, NW)
            mask = (r < args.M) & (c < args.N) & (c < off_n + CFG.BN)
            value = gl.load(args.stash + r * args.N + c, mask=mask)
            owner = gl.minimum(r // args.Mo, args.world_size - 1)
            dst = args.partials + (args.rank * args.Mo + r - owner * args.Mo) * args.N + c
            dv.store(dst, value.to(args.partials.dtype.element_ty), args.rank, owner, args.heap_bases, mask=mask)

    GLUON_PIECES = GluonPieces(comm=_ws_send, compute=_ws_compute)


@triton.jit
def _reduce_kernel(partials, out, n, world, BLOCK: tl.constexpr):
    """``out[:n] = sum over s of partials[s, :n]`` (fp32 sums)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, world):
        acc += tl.load(partials + s * n + offs, mask=mask).to(tl.float32)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


class GemmReduceScatter(Pattern):
    """``out[M/W, N]`` = rows ``rank*M/W …`` of ``sum_r a_r[M, K/W] @ b_r[K/W, N]``."""

    name = "gemm_reduce_scatter"
    description = "partials a[M,K/W] @ b[K/W,N] summed over ranks; rank r keeps rows r*M/W.."
    pieces = Pieces(produce, consume, stash, reload, traffic=traffic, gluon=GLUON_PIECES)
    comm_first = False
    Args = Args
    Config = GemmConfig

    #: what each element of :meth:`signature` is (names in mismatch messages)
    signature_fields = ("M", "N", "K/W", "dtype")

    def signature(self, ctx, a, b):
        """Validate; return ``(M, N, K/W, dtype)``."""
        a, b = check_operands(a, b, ctx.device, "a [M, K/W]", "b [K/W, N]", "K/W")
        if a.shape[0] % ctx.world_size:
            raise PatternError(f"a's rows M={a.shape[0]} must divide evenly over the {ctx.world_size} ranks "
                               f"(rank r keeps rows r*M/W .. (r+1)*M/W)")
        return a.shape[0], b.shape[1], a.shape[1], a.dtype

    def tuning_key(self, signature, world_size):
        """The global ``(M, N, K)``."""
        M, N, K, _ = signature
        return M, N, K * world_size

    def default_config(self, ctx, signature, programs=None):
        M, N, K, dtype = signature
        return default_config(M, N, K, dtype, ctx.device, programs)

    def setup(self, ctx, signature, config, uses_stash):
        """``partials[W, M/W, N]`` on the heap, the output, a stash for unfused schedules and the
        reduction's launcher."""
        M, N, K, dtype = signature
        Mo, world = M // ctx.world_size, ctx.world_size
        block = CPU_REDUCE_BLOCK if ctx.device.type == "cpu" else REDUCE_BLOCK
        return {"config": config, "partials": ctx.empty(world, Mo, N, dtype=dtype),
                "stash": torch.empty(M if uses_stash else 1, N, dtype=dtype, device=ctx.device),
                "out": torch.empty(Mo, N, dtype=dtype, device=ctx.device),
                "reduce": KernelLauncher(_reduce_kernel, (max(1, triton.cdiv(Mo * N, block)),),
                                         constexprs={"BLOCK": block}),
                "plans": BindCache(), "operands": OperandCache()}

    def bind(self, ctx, buffers, a, b) -> Plan:
        key = operands_key(a, b)
        plan = buffers["plans"].get(key)
        if plan is not None:
            return plan
        M, K = a.shape
        N = b.shape[1]
        cfg, partials, out = buffers["config"], buffers["partials"], buffers["out"]
        Mo, world = M // ctx.world_size, ctx.world_size
        a_src, b_src, gcfg = plan_operands(cfg, a, b, cache=buffers["operands"])
        shift = (((ctx.rank + 1) % world) * Mo) // cfg.block_m
        args = Args(a_src, b_src, partials, buffers["stash"], M, N, K, Mo, a.stride(0), a.stride(1), b.stride(0),
                    b.stride(1), ctx.rank, world, ctx.heap_bases, shift)
        n = Mo * N
        reduce = buffers["reduce"].prepare(partials, out, n, world)  # (the output: runtime argument 1)

        def finish():
            if n:
                reduce()

        def finish_into(dst):  # the reduction straight into dst (a functional call's new tensor or out)
            if n:
                reduce.launch_with(((1, dst),))

        library, library_into = self._library(ctx, buffers, a, b, out)
        return buffers["plans"].put(key, Plan(
            pattern=self.name, pieces=self.pieces, args=args, cfg=gcfg,
            num_tiles=triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            comm_bytes=(M - Mo) * N * a.element_size(), flops=2 * M * N * K, result=out, finish=finish,
            finish_into=finish_into, library=library, library_into=library_into))

    @staticmethod
    def _library(ctx, buffers, a, b, out):
        """``(library, library_into)``: the library form, writing into the tensor given
        (``out`` or the caller's). One rank: the local product
        (:class:`~iris_fw.gemm.LocalProduct`; the sum of one partial is the product) straight
        into it — one launch — unless it shares an operand's memory, which the product still
        reads: then into ``out`` and copied. More ranks: the product into a local ``[M, N]``
        buffer (the op's, made on its first library call) and the reduce-scatter from there into it
        (:func:`iris_fw.ccl.prepared` on those buffers, once per op): two launches."""
        from iris_fw import ccl  # (here, once per plan: an import statement per call costs µs)

        world = ctx.world_size
        if world == 1:
            library_into = LocalProduct(a, b, out, storage_of(a, b))
            return (lambda: library_into(out)), library_into
        product = []  # (made on the plan's first library call: other schedules need none of it)

        def library_into(dst):
            if not product:
                full = buffers.get("full")
                if full is None:
                    full = buffers["full"] = torch.empty(a.shape[0], b.shape[1], dtype=out.dtype, device=out.device)
                product.append(LocalProduct(a, b, full, storage_of(a, b)))
            full = product[0].buffer
            # (prepared on the op's first library call: the same call on every rank)
            scatter = buffers.get("scatter") or buffers.setdefault(
                "scatter", ccl.prepared("reduce_scatter_tensor", out, full, ctx=ctx))
            product[0](full)
            scatter(full, dst)
            return dst

        return (lambda: library_into(out)), library_into

    @staticmethod
    def reference(rank, world_size, inputs):
        """``inputs[r] = (a_r, b_r)``: float64 rows ``rank*M/W …`` of ``sum_r a_r @ b_r``."""
        total = sum(inputs[r][0].double() @ inputs[r][1].double() for r in range(world_size))
        Mo = total.shape[0] // world_size
        return total[rank * Mo:(rank + 1) * Mo]


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(GemmReduceScatter())
