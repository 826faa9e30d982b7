"""Multi-step patterns: a pattern whose second pass reads what the first delivered on every rank.

The test pattern is a two-shot all-reduce of a computed tile: step 0 computes ``2 * x`` tile by
tile and pushes each tile to its owner rank (``tile mod W``); step 1 — after the per-program
cross-rank step barrier — has the owner sum the ranks' copies (in rank order) and store the sum
into every rank's output. Run under ``fused_sequential`` (steps inside its kernel) at world
sizes 1-4, and under the other compute-first schedulers (later steps in a kernel after theirs)
at world sizes 2 and 3, with fresh inputs on every call and no host synchronization between
calls.
"""

from typing import Any, NamedTuple

import pytest
import torch
import triton
import triton.language as tl

from helpers import cpu_extended, fresh_seed, on_worlds
from iris_fw import device as dv
from iris_fw import tilecomm as tc
from iris_fw.engine.contract import Pattern, Pieces, Plan, check_tensor


class Args(NamedTuple):
    x: Any  # [n], any local tensor
    recv: Any  # heap [W, n]: slot r holds rank r's copy of the tiles this rank owns
    out: Any  # heap [n]
    n: int
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
    return tl.load(args.x + offs, mask=mask) * 2.0


@triton.jit
def _consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    """Step 0's delivery: the tile to its owner's slot for this rank."""
    offs, mask = _offsets(args, tile, CFG)
    dv.store(args.recv + args.rank * args.n + offs, value, args.rank, tile % args.world_size, args.heap_bases,
             mask=mask)


@triton.jit
def _step(args, tile, STEP: tl.constexpr, CFG: tl.constexpr):
    """Step 1: the owner reduces the ranks' copies and stores the sum on every rank."""
    if tile % args.world_size == args.rank:
        offs, mask = _offsets(args, tile, CFG)
        acc = tc.tile_reduce_rows(args.recv + offs, args.n, args.world_size, mask=mask)
        tc.tile_store_all(args.out + offs, acc, args.rank, args.world_size, args.heap_bases, mask=mask)


@triton.jit
def _stash(args, tile, value, CFG: tl.constexpr):
    """Unfused schedules: nothing to keep, :func:`_reload` computes the tile again."""
    pass


@triton.jit
def _reload(args, tile, CFG: tl.constexpr):
    return _produce(args, tile, CFG, False)


class TwoShotScale(Pattern):
    """``out[n]`` = sum over ranks of ``2 * x_r``, on every rank, in two steps."""

    name = "test_two_shot_scale"
    description = "two-step test pattern: push tiles to owners, owners reduce and broadcast"
    pieces = Pieces(_produce, _consume, _stash, _reload, step=_step)
    comm_first = False
    Args = Args
    Config = Cfg

    def signature(self, ctx, x):
        x = check_tensor(x, "x", 1, ctx.device)
        return x.shape[0], x.dtype

    def tuning_key(self, signature, world_size):
        return signature[0], world_size

    def default_config(self, ctx, signature, programs=None):
        return Cfg(64 if ctx.device.type == "cpu" else 1024)

    def setup(self, ctx, signature, config, uses_stash):
        n, dtype = signature
        return {"config": config, "recv": ctx.zeros(ctx.world_size, n, dtype=dtype), "out": ctx.empty(n, dtype=dtype)}

    def bind(self, ctx, buffers, x):
        n, block = x.shape[0], buffers["config"].BLOCK
        args = Args(x, buffers["recv"], buffers["out"], n, ctx.rank, ctx.world_size, ctx.heap_bases)
        return Plan(pattern=self.name, pieces=self.pieces, args=args, cfg=Cfg(block), num_tiles=triton.cdiv(n, block),
                    num_warps=4, num_stages=1, comm_bytes=2 * n * x.element_size(), flops=n, result=buffers["out"],
                    steps=2)

    @staticmethod
    def reference(rank, world_size, inputs):
        return sum(2 * inputs[r][0].double() for r in range(world_size))


def _register(ctx):
    if TwoShotScale.name not in ctx.registries.pattern:
        ctx.registries.pattern.register(TwoShotScale())


def _steps_rank(ctx, calls, scheduler="fused_sequential"):
    from iris_fw.engine.op import Op

    _register(ctx)
    n = 1000 + 37 if ctx.device.type == "cpu" else (1 << 20) + 37
    g = torch.Generator().manual_seed(fresh_seed(ctx))
    xs = [[torch.randn(n, generator=g) for _ in range(ctx.world_size)] for _ in range(calls)]
    x = torch.empty(n, device=ctx.device)
    op = Op(TwoShotScale.name, x, ctx=ctx, scheduler=scheduler)
    results = []
    for i in range(calls):  # fresh inputs, no host synchronization between calls
        x.copy_(xs[i][ctx.rank])
        results.append(op(x).clone())
    ctx.synchronize()
    for i, got in enumerate(results):
        want = TwoShotScale.reference(ctx.rank, ctx.world_size, [(t,) for t in xs[i]])
        err = (got.cpu().double() - want).abs().max().item()
        assert err <= 1e-5 * max(1.0, want.abs().max().item()), f"{scheduler} call {i}: max error {err}"
    outs = ctx.bootstrap.all_gather(results[-1].cpu())
    assert all(torch.equal(o, outs[0]) for o in outs), "ranks differ"
    del op, x, results


@on_worlds(1, 3)  # (CPU ranks: 2 under -m extended; the step barrier loops over the ranks)
def test_two_step_pattern(world):
    world.run(_steps_rank, 3)


@pytest.mark.parametrize("scheduler", ["bulk_sync", "wg_specialized", cpu_extended("producer_consumer")])
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])
def test_steps_after_one_step_schedules(iris_pool, world_size, scheduler):
    """Schedules without in-kernel step barriers run the later steps in a kernel of their own.
    (CPU ranks: 3 by default, 2 under ``-m extended``.)"""
    iris_pool(world_size).run(_steps_rank, 3, scheduler)
