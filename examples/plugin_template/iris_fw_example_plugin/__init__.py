"""A third-party iris-fw plugin, installed and loaded exactly as any other package's would be.

It registers a transport (``private_shm``: host shared memory under its own segment-name
prefix, built on the built-in ``host_shm``), a pattern (``scale_all_gather``: every rank ends
with ``alpha * x_r`` of every rank ``r``) and a scheduler (``reverse_fused``: tiles in reverse
order, each sent from registers). The pattern runs under the built-in schedulers and the
scheduler runs the built-in patterns: both only speak the contract in ``iris_fw.engine``.
"""

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw.devinfo import persistent_programs
from iris_fw.engine.contract import Pattern, Pieces, Plan, check_tensor, split_args
from iris_fw.engine.scheduler import Scheduler, bind_kernel
from iris_fw.engine.skeletons import begin_call, end_call, entry_barrier, rebuild_args
from iris_fw.hookspecs import hookimpl
from iris_fw.transports.host_shm import HostShmTransport


class PrivateShmTransport(HostShmTransport):
    """host_shm with segments named after this plugin."""

    name = "private_shm"
    shm_prefix = "iris_fw_example_"


# ---- a pattern: y[r, :] = alpha * x_r on every rank ------------------------------------------


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


# ---- a scheduler: fused, tiles in reverse order ----------------------------------------------


@triton.jit
def _reverse_kernel(top0, top1, rest, st, flags, num_tiles, rank, world_size, heap_bases,
                    ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                    PRODUCE: tl.constexpr, CONSUME: tl.constexpr, NPROG: tl.constexpr):
    args = rebuild_args(top0, top1, rest, ARGS, NTOP)
    epoch = begin_call(st, world_size)
    if entry_barrier(st, epoch, rank, world_size, heap_bases):
        for i in range(tl.program_id(0), num_tiles, NPROG):
            tile = num_tiles - 1 - i
            CONSUME(args, tile, PRODUCE(args, tile, CFG, False), CFG, False)
    end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, True, False)


class ReverseFused(Scheduler):
    name = "reverse_fused"
    description = "fused sequential with the tiles in reverse order"
    uses_stash = False

    def supports(self, plan):
        if plan.comm_first:
            return False, f"it runs compute-first patterns only; {plan.pattern} fetches operands first"
        return True, ""

    def grids(self, ctx, plan, comm_sms):
        self.no_split(comm_sms, self.name)
        return {"reverse": persistent_programs(ctx.device, plan.num_tiles)}

    def launch(self, ctx, plan, ws):
        launcher = bind_kernel(ws, "reverse", _reverse_kernel, plan, {"NPROG": ws.grids["reverse"]})
        launcher(*split_args(plan.args), ws.state["reverse"], ws.flags, plan.num_tiles, ctx.rank,
                 ctx.world_size, ctx.heap_bases)


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(PrivateShmTransport)


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(ScaleAllGather())


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ReverseFused())
