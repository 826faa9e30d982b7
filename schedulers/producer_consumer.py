"""``producer_consumer``: two kernels on two streams, sharing the SMs. The producer kernel
(compute for compute-first patterns, fetch for communicate-first ones) claims and releases a
flag per tile or chunk; the consumer kernel acquires it and sends (or computes).

Nothing orders the two streams' dispatch, and under CUDA MPS other clients' programs share the
SMs: the consumer's programs can be resident on every SM this process may use before the
producer's get one (on one H100 under MPS, ``all_gather_gemm`` hung in its 93rd back-to-back
call, every consumer program spinning on a chunk its own rank's fetch kernel never got an SM to
fetch). So a consumer program never waits for a producer program that may not be running: an
item not yet released whose producer program has not started this call, it claims and produces
itself (``helps``, :func:`iris_fw.engine.skeletons.obtain`); it waits only for an item whose
producer program or claimant is running. While the producer runs, nothing changes: consumers
wait, and the SM split holds. A consumer that may fetch (communicate-first) carries the
cross-rank entry and exit barriers, like the producer; compute-first, the consumer sends and
carries them anyway."""

from iris_fw.engine.scheduler import Scheduler, launch_consumer, launch_producer, side_stream
from iris_fw.hookspecs import hookimpl


class ProducerConsumer(Scheduler):
    name = "producer_consumer"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
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
        # communicate-first, a consumer program may fetch a chunk itself: it needs the barriers too
        launch_consumer(ctx, plan, ws, sync=True, queue=fetches, entry=True, exit=True, helps="producer",
                        stream=side.stream if side is not None else None)
        if side is not None:
            side.join(main)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ProducerConsumer())
