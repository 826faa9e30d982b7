"""A pattern: ``scale_all_gather``, ``y[W, n]`` with row ``r`` = ``alpha * x_r`` on every rank.

A pattern is tile-level ``@triton.jit`` pieces plus host methods (the contract is
:class:`iris_fw.engine.contract.Pattern`); any scheduler runs it. Here ``produce`` computes a
tile of ``alpha * x`` and ``consume`` stores it into row ``rank`` of ``y`` on every rank;
``stash``/``reload`` keep a tile in local memory for the schedulers that compute every tile
before sending (``bulk_sync``, ``producer_consumer``).
"""

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw.engine.contract import Pattern, Pieces, Plan, check_tensor

class Args(NamedTuple):
    x: Any
    y: Any  # heap [W, n]
    n: int
    alpha: float
    rank: int
    world_size: int
    heap_bases: Any


class Cfg(NamedTuple):
    BLOCK: int


@triton.jit
def _offsets(args, tile, CFG: tl.constexpr):
    offs = tile * CFG.BLOCK + tl.arange(0, CFG.BLOCK)
    return offs, offs < args.n


@triton.jit
def _produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    return tl.load(args.x + offs, mask=mask) * args.alpha


@triton.jit
def _consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    if FROM_STASH:
        first: tl.constexpr = 1
    else:
        first: tl.constexpr = 0
    for i in range(first, args.world_size):
        dv.store(args.y + args.rank * args.n + offs, value, args.rank, (args.rank + i) % args.world_size,
                 args.heap_bases, mask=mask)


@triton.jit
def _stash(args, tile, value, CFG: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    tl.store(args.y + args.rank * args.n + offs, value, mask=mask)


@triton.jit
def _reload(args, tile, CFG: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    return tl.load(args.y + args.rank * args.n + offs, mask=mask)


class ScaleConfig(NamedTuple):
    block: int = 64


class ScaleAllGather(Pattern):
    """``y[W, n]``: row ``r`` is ``alpha * x_r``; ``x`` is ``[n]`` on every rank."""

    name = "scale_all_gather"
    description = "y[r] = alpha * x_r gathered on every rank"
    pieces = Pieces(_produce, _consume, _stash, _reload)
    comm_first = False
    Args = Args
    Config = ScaleConfig

    def signature(self, ctx, x, alpha):
        x = check_tensor(x, "x", 1, ctx.device)
        if not isinstance(alpha, (int, float)):
            raise TypeError(f"alpha must be a number, got {type(alpha).__name__}")
        return x.shape[0], x.dtype

    def tuning_key(self, signature, world_size):
        return signature[0], world_size

    def default_config(self, ctx, signature, programs=None):
        return ScaleConfig()

    def setup(self, ctx, signature, config, uses_stash):
        return {"config": config, "out": ctx.empty(ctx.world_size, signature[0], dtype=signature[1])}

    def bind(self, ctx, buffers, x, alpha):
        n, y, block = x.shape[0], buffers["out"], buffers["config"].block
        args = Args(x, y, n, float(alpha), ctx.rank, ctx.world_size, ctx.heap_bases)
        return Plan(pattern=self.name, pieces=self.pieces, args=args, cfg=Cfg(block),
                    num_tiles=triton.cdiv(n, block), num_warps=4, num_stages=1,
                    comm_bytes=n * x.element_size() * (ctx.world_size - 1), flops=n, result=y)

    @staticmethod
    def reference(rank, world_size, inputs):
        return torch.stack([inputs[r][0].double() * inputs[r][1] for r in range(world_size)])


