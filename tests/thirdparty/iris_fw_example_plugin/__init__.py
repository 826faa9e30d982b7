"""A third-party iris-fw plugin, installed and loaded exactly as any other package's would be.

It registers a transport (``private_shm``: host shared memory under its own segment-name
prefix, built on the built-in ``host_shm``), a pattern (``scale_all_gather``: every rank ends
with ``alpha * x_r`` of every rank ``r``) and a scheduler (``reverse_fused``: tiles in reverse
order, each sent from registers). The pattern runs under the built-in schedulers and the
scheduler runs the built-in patterns: both only speak the contract in ``iris_fw.overlap``.
"""

import torch
import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Pieces, Plan, Scheduler, check_tensor, kernel_args, launch_options, release_fence
from iris_fw.transports.host_shm import HostShmTransport


class PrivateShmTransport(HostShmTransport):
    """host_shm with segments named after this plugin."""

    name = "private_shm"
    shm_prefix = "iris_fw_example_"


# ---- a pattern: y[r, :] = alpha * x_r on every rank ------------------------------------------
# args: 0 x, 1 y (heap [W, n]), 2 n, 3 alpha, 4 rank, 5 world size, 6 heap_bases; CFG: (BLOCK,)


@triton.jit
def _offsets(args, tile, CFG: tl.constexpr):
    BLOCK: tl.constexpr = CFG[0]
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < args[2]


@triton.jit
def _produce(args, tile, CFG: tl.constexpr, STAGED: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    return tl.load(args[0] + offs, mask=mask) * args[3]


@triton.jit
def _consume(args, tile, value, CFG: tl.constexpr, FROM_STASH: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    rank, world = args[4], args[5]
    if FROM_STASH:
        first: tl.constexpr = 1
    else:
        first: tl.constexpr = 0
    for i in range(first, world):
        dv.store(args[1] + rank * args[2] + offs, value, rank, (rank + i) % world, args[6], mask=mask)


@triton.jit
def _stash(args, tile, value, CFG: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    tl.store(args[1] + args[4] * args[2] + offs, value, mask=mask)


@triton.jit
def _reload(args, tile, CFG: tl.constexpr):
    offs, mask = _offsets(args, tile, CFG)
    return tl.load(args[1] + args[4] * args[2] + offs, mask=mask)


class ScaleAllGather:
    """``y[W, n]``: row ``r`` is ``alpha * x_r``; ``x`` is ``[n]`` on every rank."""

    name = "scale_all_gather"
    description = "y[r] = alpha * x_r gathered on every rank"
    pieces = Pieces(_produce, _consume, _stash, _reload)
    comm_first = False
    BLOCK = 64

    def shape(self, ctx, x, alpha):
        x = check_tensor(x, "x", 1, ctx.device)
        return x.shape[0], x.dtype

    @staticmethod
    def global_shape(shape, world_size):
        return shape[0], world_size, 1

    def setup(self, ctx, shape, config, uses_stash):
        return {"out": ctx.empty(ctx.world_size, shape[0], dtype=shape[1])}

    def bind(self, ctx, ws, x, alpha):
        n = x.shape[0]
        y = ws["out"]
        args = (x, y, n, float(alpha), ctx.rank, ctx.world_size, ctx.heap_bases)
        return Plan(self.name, self.pieces, args, (self.BLOCK,), triton.cdiv(n, self.BLOCK), 0, 4, 1,
                    comm_bytes=n * x.element_size() * (ctx.world_size - 1), flops=n, result=y)

    @staticmethod
    def reference(rank, world_size, inputs):
        return torch.stack([inputs[r][0].double() * inputs[r][1] for r in range(world_size)])


# ---- a scheduler: fused, tiles in reverse order ----------------------------------------------


@triton.jit
def _reverse_kernel(op0, op1, rest, num_tiles, flags, PRODUCE: tl.constexpr, CONSUME: tl.constexpr,
                    CFG: tl.constexpr, NPROG: tl.constexpr):
    args = (op0, op1) + rest
    for i in range(tl.program_id(0), num_tiles, NPROG):
        tile = num_tiles - 1 - i
        CONSUME(args, tile, PRODUCE(args, tile, CFG, False), CFG, False)
    release_fence(flags)


class ReverseFused(Scheduler):
    name = "reverse_fused"
    description = "fused sequential with the tiles in reverse order"
    uses_stash = False

    def launch(self, ctx, plan, ws, comm_sms):
        if plan.comm_first:
            raise ValueError(f"reverse_fused runs compute-first patterns only; {plan.pattern} fetches operands first")
        nprog = self.grid_for(ctx, plan.num_tiles)
        _reverse_kernel[(nprog,)](*kernel_args(plan), plan.num_tiles, ws.flags, PRODUCE=plan.pieces.produce,
                                  CONSUME=plan.pieces.consume, CFG=plan.cfg, NPROG=nprog, **launch_options(plan))


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(PrivateShmTransport)


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(ScaleAllGather())


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ReverseFused())
