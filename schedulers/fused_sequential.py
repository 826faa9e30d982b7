"""``fused_sequential``: one persistent kernel; each program computes a tile and delivers it at
once, the tile never leaving registers. Communicate-first patterns read remote operands
straight from their owners' heaps inside the tile's K loop."""

from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Scheduler, _fused_kernel, launch_options, kernel_args


class FusedSequential(Scheduler):
    name = "fused_sequential"
    description = "one persistent kernel: compute a tile, send it from registers, next tile"
    uses_stash = False

    def launch(self, ctx, plan, ws, comm_sms):
        nprog = self.grid_for(ctx, plan.num_tiles)
        _fused_kernel[(nprog,)](*kernel_args(plan), plan.num_tiles, ws.flags, PRODUCE=plan.pieces.produce,
                                CONSUME=plan.pieces.consume, CFG=plan.cfg, NPROG=nprog, **launch_options(plan))


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(FusedSequential())
