"""A scheduler: ``reverse_fused``, one persistent kernel that computes each tile and sends it
from registers, visiting the tiles in reverse order.

A scheduler builds its kernels from the skeleton pieces of :mod:`iris_fw.engine.skeletons`
(the call's epoch, the cross-rank entry/exit barriers) and the pattern's pieces, and runs any
pattern that it ``supports`` (contract: :class:`iris_fw.engine.scheduler.Scheduler`).
"""

import triton
import triton.language as tl

from iris_fw.devinfo import persistent_programs
from iris_fw.engine.contract import split_args
from iris_fw.engine.scheduler import Scheduler, bind_kernel
from iris_fw.engine.skeletons import begin_call, end_call, entry_barrier

@triton.jit
def _reverse_tiles(args, num_tiles, CFG: tl.constexpr, PRODUCE: tl.constexpr, CONSUME: tl.constexpr,
                   NPROG: tl.constexpr):
    for i in range(tl.program_id(0), num_tiles, NPROG):
        tile = num_tiles - 1 - i
        CONSUME(args, tile, PRODUCE(args, tile, CFG, False), CFG, False)


@triton.jit
def _reverse_kernel(top0, top1, rest, st, flags, num_tiles, rank, world_size, heap_bases,
                    ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                    PRODUCE: tl.constexpr, CONSUME: tl.constexpr, NPROG: tl.constexpr):
    epoch = begin_call(st, world_size)
    if entry_barrier(st, epoch, rank, world_size, heap_bases):
        # args built where passed on, never assigned nor returned: args.heap_bases carries
        # constexprs (iris_fw.engine.skeletons' docstring, "args", says why)
        _reverse_tiles((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                       num_tiles, CFG, PRODUCE, CONSUME, NPROG)
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


