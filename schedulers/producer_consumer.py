"""``producer_consumer``: two kernels on two streams, sharing the SMs. The producer kernel
(compute for compute-first patterns, fetch for communicate-first ones) releases a flag per
tile or chunk; the consumer kernel acquires it and sends (or computes). The producer is
launched first, so a consumer never waits for work that cannot be scheduled. The kernel that
communicates carries the cross-rank entry and exit barriers."""

from iris_fw.engine.scheduler import Scheduler, launch_consumer, launch_producer, side_stream
from iris_fw.hookspecs import hookimpl


class ProducerConsumer(Scheduler):
    name = "producer_consumer"
    description = "compute kernel + communication kernel on two streams, per-tile release/acquire flags"
    uses_stash = True

    def grids(self, ctx, plan, comm_sms):
        compute, comm = self.split(ctx, plan, comm_sms)
        # The producer gets the compute SMs when it computes, the communication SMs when it fetches.
        return {"producer": max(1, min(plan.num_items, comm if plan.comm_first else compute)),
                "consumer": max(1, min(plan.num_tiles, compute if plan.comm_first else comm))}

    def launch(self, ctx, plan, ws):
        side = side_stream(ctx, ws)
        fetches = plan.comm_first
        main = side.fork() if side is not None else None
        launch_producer(ctx, plan, ws, sync=True, entry=fetches, exit=fetches)
        launch_consumer(ctx, plan, ws, sync=True, queue=fetches, entry=not fetches, exit=not fetches,
                        stream=side.stream if side is not None else None)
        if side is not None:
            side.join(main)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ProducerConsumer())
