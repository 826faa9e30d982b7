"""``wg_specialized``: one kernel whose programs take roles. Programs below the producer
count produce and release (compute tiles, or fetch chunks for communicate-first patterns);
the others acquire and consume. For communicate-first patterns the fetching programs join
the compute queue once their chunks are in. The kernel carries the cross-rank entry and exit
barriers."""

from iris_fw.engine.scheduler import Scheduler, launch_specialized
from iris_fw.hookspecs import hookimpl


class WgSpecialized(Scheduler):
    name = "wg_specialized"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
    description = "one kernel: producer programs compute (or fetch) and release, the others acquire and send"
    uses_stash = True

    def _roles(self, ctx, plan, comm_sms):
        compute, comm = self.split(ctx, plan, comm_sms)
        producers = comm if plan.comm_first else compute
        if plan.comm_first and ctx.device.type == "cpu":
            # The interpreter runs programs one after another: a fetching program that joins
            # the compute queue must not need chunks of fetchers that have not run yet.
            producers = 1
        producers = max(1, min(producers, plan.num_items))
        consumers = max(1, min(compute if plan.comm_first else comm, plan.num_tiles))
        return producers, consumers

    def grids(self, ctx, plan, comm_sms):
        # Every program must be resident at once (consumers spin on producers' flags): the grid
        # never exceeds the SM count, one program per SM.
        producers, consumers = self._roles(ctx, plan, comm_sms)
        return {"specialized": producers + consumers}

    def workspace(self, ctx, plan, comm_sms):
        ws = super().workspace(ctx, plan, comm_sms)
        ws.extra["producers"] = self._roles(ctx, plan, comm_sms)[0]
        return ws

    def launch(self, ctx, plan, ws):
        launch_specialized(ctx, plan, ws, producers=ws.extra["producers"])


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(WgSpecialized())
