"""Flash-decode algorithms (``flash_decode(..., scheduler=name)``, :mod:`iris_fw.flash_decode`):
``fused`` (what ``"auto"`` runs) and ``bulk_sync``.

Both start like every flash-decode plan: each split program attends over its share of this
rank's slice, and a unit's last split combines the unit's splits into this rank's partial
(:func:`iris_fw.flash_decode_kernels._flash_decode_kernel`). Then:

* ``fused``: that program pushes the rank's partial into slot ``rank`` of every rank's receive
  buffer (symmetric, double-buffered by the call's epoch parity), arrives on the unit's slots
  of every rank, waits — bounded — for every rank's arrival on this unit, and combines the
  ``W`` partials (in rank order) into ``o``. One launch per call (the kernel's ``FUSED``
  variant, a kernel configuration of the group's workspace: receive buffers and arrival
  slots, shared by calls of equal bytes), no host synchronization. No program waits for
  another program of its own launch (only for programs of other ranks), so the kernel is
  also correct under Triton's CPU interpreter, which runs a launch's programs one after
  another. Every program is resident on a GPU at once (grid <= SMs x ``programs_per_sm``,
  the plan capping ``programs_per_sm`` at what one SM holds of the compiled ``FUSED``
  variant: :meth:`Fused.resident_constexprs`), so the waits progress.
* ``bulk_sync``: the same kernel stores the rank's partial locally (the plan's ``local``
  launch, into a buffer carved from the group's workspace), then
  :func:`iris_fw.ccl.all_gather_into_tensor` gathers every rank's partials and the combine
  kernel computes ``o`` — three launches: the bulk-synchronous reference on our side.

Each is a :class:`iris_fw.flash_decode.DecodeAlgorithm` registered through
``iris_fw_register_algorithms`` as ``"flash_decode.<name>"``, exactly as a third party's
would be (docs/architecture.md, "add a flash-decode algorithm").
"""

from __future__ import annotations

import torch

from iris_fw.ccl import algorithm as al
from iris_fw.ccl import api
from iris_fw.flash_decode import DecodeAlgorithm
from iris_fw.flash_decode_kernels import _combine_kernel, _flash_decode_kernel
from iris_fw.hookspecs import hookimpl
from iris_fw.kernel_launcher import KernelLauncher


class Fused(DecodeAlgorithm):
    """One launch per call: the attention kernel's ``FUSED`` variant pushes, waits for and
    combines the ranks' partials itself."""

    name = "fused"

    def resident_constexprs(self, fd) -> dict:
        """Its programs wait for other ranks: every one must be resident at once."""
        return {"FUSED": True}

    def launches(self, fd, tracer) -> dict:
        group = fd.group
        fused, (recv, slots, epochs) = al.kernel_config(
            group, (self.key,), _flash_decode_kernel, nprog=fd.nprog,
            constexprs={**fd.constexprs, "FUSED": True}, options=fd.options, label=self.key,
            tracer=tracer,
            buffers=[(2 * group.size * fd.pack, torch.float32, "partials exchange"),
                     (fd.units * group.size, torch.int64, "arrival slots")])
        return {"fused": fused.launcher.bind(**fd.kernel_args(), mine=None, recv=recv, slots=slots, epochs=epochs,
                                             trace=fused.trace)}

    def run(self, fd, launches, q, k, v, kv_lens, block_table, out) -> None:
        fd.launch(launches, "fused", q, k, v, kv_lens, block_table, out, "out")


class BulkSync(DecodeAlgorithm):
    """Three launches per call: the local kernel, :func:`iris_fw.ccl.all_gather_into_tensor` of
    the packed partials, the combine kernel."""

    name = "bulk_sync"

    def setup(self, fd) -> None:
        group, pack, f32 = fd.group, fd.pack, torch.float32
        # symmetric within the group — carved from its workspace, which every rank of the world
        # made, so members-only calls keep the world's heap symmetric — and shared by every
        # call of this size: an all-gather may read it in place
        fd.mine = group.config(("flash_decode.bulk_sync partial", pack),
                               lambda: group.carve(pack, f32, "flash_decode.bulk_sync partial"))
        fd.gathered = torch.empty(group.size * pack, dtype=f32, device=group.ctx.device)

    def launches(self, fd, tracer) -> dict:
        units = max(1, fd.units)
        traced = {} if tracer is None else {"TRACE": tracer.mode}
        combine = KernelLauncher(_combine_kernel, (units,), constexprs={
            **{k: fd.constexprs[k] for k in ("HQ", "HKV", "DV", "ROWS", "BDV")}, **traced},
            num_warps=fd.tune.num_warps)
        return {"combine": combine.bind(gathered=fd.gathered, batch=fd.call.batch, world_size=fd.group.size,
                                        trace=fd.trace_handle(tracer, "combine", units))}

    def run(self, fd, launches, q, k, v, kv_lens, block_table, out) -> None:
        fd.launch(launches, "local", q, k, v, kv_lens, block_table, fd.mine)
        api.all_gather_into_tensor(fd.gathered, fd.mine, group=fd.group, ctx=fd.group.ctx)
        launches["combine"](out=out)


@hookimpl
def iris_fw_register_algorithms(registry):
    for algo in (Fused(), BulkSync()):
        registry.register(algo, algo.key)
