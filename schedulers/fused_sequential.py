"""``fused_sequential``: one persistent kernel; each program computes a tile and delivers it at
once, the tile never leaving registers. Communicate-first patterns read remote operands
straight from their owners' heaps inside the tile's K loop. The kernel carries the cross-rank
entry and exit barriers, and runs multi-step patterns (their later steps after a per-program
cross-rank step barrier)."""

from iris_fw.devinfo import persistent_programs
from iris_fw.engine.scheduler import Scheduler, launch_fused
from iris_fw.hookspecs import hookimpl


class FusedSequential(Scheduler):
    name = "fused_sequential"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
    description = "one persistent kernel: compute a tile, send it from registers, next tile"
    uses_stash = False
    multi_step = True

    def grids(self, ctx, plan, comm_sms):
        self.no_split(comm_sms, self.name)
        return {"fused": persistent_programs(ctx.device, plan.num_tiles)}

    def launch(self, ctx, plan, ws):
        launch_fused(ctx, plan, ws)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(FusedSequential())
