"""``producer_consumer``: two kernels on two streams, sharing the SMs. The producer kernel
(compute for compute-first patterns, fetch for communicate-first ones) releases a flag per
tile or chunk; the consumer kernel acquires it and sends (or computes). The producer is
launched first, so a consumer never waits for work that cannot be scheduled."""

import contextlib

import torch

from iris_fw.hookspecs import hookimpl
from iris_fw.overlap import Scheduler, launch_consumer, launch_producer


class ProducerConsumer(Scheduler):
    name = "producer_consumer"
    description = "compute kernel + communication kernel on two streams, per-tile release/acquire flags"
    uses_stash = True

    def launch(self, ctx, plan, ws, comm_sms):
        compute, comm = self.split(ctx, plan, comm_sms)
        items = plan.num_chunks if plan.comm_first else plan.num_tiles
        # The producer gets the compute SMs when it computes, the communication SMs when it fetches.
        n_prod = max(1, min(items, comm if plan.comm_first else compute))
        n_cons = max(1, min(plan.num_tiles, compute if plan.comm_first else comm))
        side = None
        if ctx.device.type == "cuda":
            if ws.side_stream is None:
                ws.side_stream = torch.cuda.Stream(device=ctx.device)
            side = ws.side_stream
            side.wait_stream(torch.cuda.current_stream(ctx.device))
        launch_producer(ctx, plan, ws, n_prod, sync=True)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            launch_consumer(ctx, plan, ws, n_cons, sync=True, queue=plan.comm_first)
        if plan.comm_first:
            ws.queue_base += plan.num_tiles + n_cons
        if side is not None:
            torch.cuda.current_stream(ctx.device).wait_stream(side)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ProducerConsumer())
