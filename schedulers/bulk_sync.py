"""``bulk_sync``: the bulk-synchronous schedule. Compute-first patterns: a kernel computes and
stashes every tile, then a kernel sends every tile. Communicate-first: a kernel fetches every
chunk, then a kernel computes every tile from staging. One stream, no item flags: stream order
is the synchronization (the way torch + NCCL code overlaps nothing). The communicating kernel
carries the cross-rank entry and exit barriers."""

from iris_fw.engine.scheduler import Scheduler, launch_consumer, launch_producer
from iris_fw.devinfo import persistent_programs
from iris_fw.hookspecs import hookimpl


class BulkSync(Scheduler):
    name = "bulk_sync"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
    description = "all compute, then all communication (or all fetches, then all compute); stream-ordered"
    uses_stash = True

    def grids(self, ctx, plan, comm_sms):
        self.no_split(comm_sms, self.name)
        return {"producer": persistent_programs(ctx.device, plan.num_items),
                "consumer": persistent_programs(ctx.device, plan.num_tiles)}

    def launch(self, ctx, plan, ws):
        fetches = plan.comm_first  # the producer communicates (fetch) or the consumer does (send)
        launch_producer(ctx, plan, ws, sync=False, entry=fetches, exit=fetches)
        launch_consumer(ctx, plan, ws, sync=False, queue=False, entry=not fetches, exit=not fetches)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(BulkSync())
