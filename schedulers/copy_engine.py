"""``copy_engine``: communicate-first patterns only. The GPU's copy engine moves the operand
chunks (the pattern's :attr:`~iris_fw.engine.contract.Plan.copies`, read from the peers' heaps) on a
side stream and publishes each completed chunk with a stream memory write
(``cuStreamWriteValue32``: ordered after the copy, no kernel, no SM); one persistent kernel
on every SM computes tiles from the dynamic queue, acquiring each tile's chunk flag. No SM
is spent on communication — the way torch symmetric memory's fused all-gather matmul feeds
cuBLAS.

On the CPU (host shared memory) the copies run first and the flags are set by the host, then
the compute kernel runs: same flags, same kernel."""

from __future__ import annotations

import ctypes

import torch

from iris_fw.errors import ArgumentError, IrisError
from iris_fw.hookspecs import hookimpl
from iris_fw.devinfo import persistent_programs
from iris_fw.engine.scheduler import Scheduler, launch_consumer, side_stream

#: cuStreamWriteValue32 / hipStreamWriteValue32 flags: 0 = the write is ordered after all
#: earlier work of the stream, with a memory barrier before it (a release).
_WRITE_VALUE_DEFAULT = 0
#: The value a stream write publishes a chunk with.
_PUBLISHED = 1


class _StreamWriter:
    """``write(stream, address, value)``: a 32-bit store executed by ``stream`` in order."""

    def __init__(self):
        if torch.version.hip:
            names, symbols = ["libamdhip64.so"], ["hipStreamWriteValue32"]
        else:
            names, symbols = ["libcuda.so.1", "libcuda.so"], ["cuStreamWriteValue32_v2", "cuStreamWriteValue32"]
        lib = None
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                pass
        if lib is None:
            raise IrisError(f"copy_engine: cannot load the GPU driver library (tried {names})")
        for symbol in symbols:
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                fn.restype = ctypes.c_int
                self._fn, self._name = fn, symbol
                return
        raise IrisError(f"copy_engine: the GPU driver library has none of {symbols}")

    def write(self, stream: torch.cuda.Stream, address: int, value: int) -> None:
        rc = self._fn(stream.cuda_stream, address, value, _WRITE_VALUE_DEFAULT)
        if rc != 0:
            raise IrisError(f"copy_engine: {self._name} failed with error {rc}")


class CopyEngine(Scheduler):
    name = "copy_engine"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
    description = ("communicate-first: the copy engine fetches chunks on a side stream, one kernel on every SM "
                   "computes as they arrive (per-chunk flags)")
    uses_stash = True  # patterns allocate their staging buffers

    def __init__(self):
        self._writer = None  # loaded on the first GPU launch

    def supports(self, plan):
        if not plan.comm_first or plan.copies is None:
            return False, ("it runs communicate-first patterns that list their chunk copies (Plan.copies); "
                           f"{plan.pattern} has none")
        ready = max((step.ready for step in plan.copies), default=0)
        if ready < plan.num_chunks:
            return False, f"{plan.pattern}'s copies complete {ready} of its {plan.num_chunks} chunks"
        return True, ""

    def grids(self, ctx, plan, comm_sms):
        """Every SM computes: ``comm_sms`` must be None."""
        if comm_sms is not None:
            raise ArgumentError(f"comm_sms does not apply to {self.name} (it uses no SM to communicate), got {comm_sms!r}")
        return {"consumer": persistent_programs(ctx.device, plan.num_tiles)}

    def launch(self, ctx, plan, ws):
        ok, why = self.supports(plan)  # checked before anything is launched: no kernel waits in vain
        if not ok:
            raise IrisError(f"{self.name}: {why}")
        flags = ws.flags
        # Chunk flags are published with the constant 1 (a stream write carries no device-side
        # epoch) and the kernel's last program resets them: replays of a captured call work.
        if ctx.device.type != "cuda":
            ctx.device_barrier()  # entry: every rank's shard is ready
            self._copy(plan.copies, lambda first, end: flags[first:end].fill_(_PUBLISHED))
            launch_consumer(ctx, plan, ws, sync=True, queue=True, fixed_flag=_PUBLISHED)
            ctx.device_barrier()  # exit: every rank is done reading our shard
            return
        if self._writer is None:
            self._writer = _StreamWriter()
        ctx.device_barrier()  # entry: every rank's shard is ready (the copies below wait for it)
        side = side_stream(ctx, ws)
        main = side.fork()
        slot_bytes = flags.element_size()
        base = flags.data_ptr()

        def publish(first, end):  # the low 32 bits of each int64 flag (little-endian; reset to 0)
            for item in range(first, end):
                self._writer.write(side.stream, base + item * slot_bytes, _PUBLISHED)

        # A copy whose source lives on this GPU (this rank's own shard; every peer's when ranks
        # share the GPU) runs on the GPU's SMs, not on a copy engine, and the kernel spinning on
        # the chunk flags on every SM it may use would hold them (seen on one H100: under MPS with
        # peers on the GPU, and at W = 1 — the flags stayed 0 until the wait bound). Streams give
        # no order between the two, so the copies up to the last such one go first and the kernel
        # waits for them; the rest (peers' GPUs, over the copy engines) overlap with it.
        steps = plan.copies
        first = max((i + 1 for i, step in enumerate(steps) if self._on_this_gpu(ctx, step.src)), default=0)
        done = 0
        if first:
            with torch.cuda.stream(side.stream):
                done = self._copy(steps[:first], publish)
            side.join(main)
        launch_consumer(ctx, plan, ws, sync=True, queue=True, fixed_flag=_PUBLISHED)
        with torch.cuda.stream(side.stream):
            self._copy(steps[first:], publish, done)
        side.join(main)
        ctx.device_barrier()  # exit: every rank is done reading our shard

    @staticmethod
    def _on_this_gpu(ctx, src: torch.Tensor) -> bool:
        """Whether ``src`` (on a rank's heap) is memory of this GPU: this rank's heap, or any heap
        when ranks share the GPU."""
        if ctx.transport.ranks_on_device > 1:
            return True
        base = ctx.transport.bases[ctx.rank]
        return base <= src.data_ptr() < base + ctx.heap_size

    @staticmethod
    def _copy(steps, publish, done: int = 0) -> int:
        """Queue ``steps``' copies, publishing chunks ``[done, step.ready)`` after each; returns
        the chunks published so far."""
        for step in steps:
            step.dst.copy_(step.src, non_blocking=True)
            if step.ready > done:
                publish(done, step.ready)
                done = step.ready
        return done


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(CopyEngine())

