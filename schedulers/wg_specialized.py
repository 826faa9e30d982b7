"""``wg_specialized``: one kernel whose programs take roles. Programs below the producer
count produce and release (compute tiles, or fetch chunks for communicate-first patterns);
the others acquire and consume. For communicate-first patterns the fetching programs join
the compute queue once their chunks are in."""

from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Scheduler, _specialized_kernel, launch_options, kernel_args


class WgSpecialized(Scheduler):
    name = "wg_specialized"
    description = "one kernel: producer programs compute (or fetch) and release, the others acquire and send"
    uses_stash = True

    def launch(self, ctx, plan, ws, comm_sms):
        p = plan.pieces
        compute, comm = self.split(ctx, plan, comm_sms)
        items = plan.num_chunks if plan.comm_first else plan.num_tiles
        producers = comm if plan.comm_first else compute
        if plan.comm_first and ctx.device.type == "cpu":
            # The interpreter runs programs one after another: a fetching program that joins
            # the compute queue must not need chunks of fetchers that have not run yet.
            producers = 1
        producers = max(1, min(producers, items))
        consumers = compute if plan.comm_first else comm
        consumers = max(1, min(consumers, plan.num_tiles))
        nprog = producers + consumers
        # Every program must be resident at once (consumers spin on producers' flags): the
        # grid never exceeds the SM count, one program per SM.
        _specialized_kernel[(nprog,)](*kernel_args(plan), plan.num_tiles, items, ws.flags, ws.epoch, ws.queue_base,
                                      ctx.rank, ctx.heap_bases, PRODUCE=p.produce, CONSUME=p.consume,
                                      STASH=p.stash, RELOAD=p.reload, FETCH=p.fetch, DEPENDS=p.depends,
                                      CFG=plan.cfg, NPROG=nprog, PRODUCERS=producers,
                                      COMM_FIRST=plan.comm_first, **launch_options(plan))
        if plan.comm_first:
            ws.queue_base += plan.num_tiles + nprog


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(WgSpecialized())
