"""``bulk_sync``: the bulk-synchronous schedule. Compute-first patterns: a kernel computes and
stashes every tile, then a kernel sends every tile. Communicate-first: a kernel fetches every
chunk, then a kernel computes every tile from staging. One stream, no flags: stream order is
the synchronization (the way torch + NCCL code overlaps nothing)."""

from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Scheduler, _consumer_kernel, _producer_kernel, launch_options, kernel_args


class BulkSync(Scheduler):
    name = "bulk_sync"
    description = "all compute, then all communication (or all fetches, then all compute); stream-ordered"
    uses_stash = True

    def launch(self, ctx, plan, ws, comm_sms):
        p, opts = plan.pieces, launch_options(plan)
        items = plan.num_chunks if plan.comm_first else plan.num_tiles
        nprog = self.grid_for(ctx, items)
        _producer_kernel[(nprog,)](*kernel_args(plan), items, ws.flags, ws.epoch, ctx.rank, ctx.heap_bases,
                                   PRODUCE=p.produce, STASH=p.stash, FETCH=p.fetch, CFG=plan.cfg, NPROG=nprog,
                                   COMM_FIRST=plan.comm_first, SYNC=False, **opts)
        nprog = self.grid_for(ctx, plan.num_tiles)
        _consumer_kernel[(nprog,)](*kernel_args(plan), plan.num_tiles, ws.flags, ws.epoch, 0, ctx.rank, ctx.heap_bases,
                                   PRODUCE=p.produce, CONSUME=p.consume, RELOAD=p.reload, DEPENDS=p.depends,
                                   CFG=plan.cfg, NPROG=nprog, COMM_FIRST=plan.comm_first, SYNC=False, QUEUE=False,
                                   **opts)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(BulkSync())
