"""``bulk_sync``: the bulk-synchronous schedule. Compute-first patterns: a kernel computes and
stashes every tile, then a kernel sends every tile. Communicate-first: a kernel fetches every
chunk, then a kernel computes every tile from staging. One stream, no flags: stream order is
the synchronization (the way torch + NCCL code overlaps nothing)."""

from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Scheduler, launch_consumer, launch_producer


class BulkSync(Scheduler):
    name = "bulk_sync"
    description = "all compute, then all communication (or all fetches, then all compute); stream-ordered"
    uses_stash = True

    def launch(self, ctx, plan, ws, comm_sms):
        items = plan.num_chunks if plan.comm_first else plan.num_tiles
        launch_producer(ctx, plan, ws, self.grid_for(ctx, items), sync=False)
        launch_consumer(ctx, plan, ws, self.grid_for(ctx, plan.num_tiles), sync=False, queue=False)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(BulkSync())
