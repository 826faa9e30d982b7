"""``library``: no fusion — the pattern's library form (:attr:`Plan.library`): the local GEMM
(:class:`iris_fw.gemm.LocalProduct`: the Triton GEMM where the device's table measured it at
least as fast as cuBLAS for the shape, a prepared launch; else cuBLAS through torch) and
:mod:`iris_fw.ccl`'s best collective for the communication (:func:`iris_fw.ccl.prepared`), one
after the other on the current stream; on one rank, where the op is a plain GEMM, the product
alone. The reference every fused schedule must beat, and what
``scheduler="auto"`` falls back to where fusing does not pay (``iris_fw/tuning/auto.json``).
It launches no skeleton kernel; the collectives validate and synchronize themselves."""

from iris_fw.engine.scheduler import Scheduler, Workspace
from iris_fw.hookspecs import hookimpl


class Library(Scheduler):
    name = "library"
    description = ("no fusion: the local GEMM (cuBLAS, or the Triton GEMM where the device's tuning row measured "
                   "it at least as fast), then iris_fw.ccl's collective (the pattern's library form)")
    uses_stash = False

    def supports(self, plan):
        if plan.library is None:
            return False, f"pattern {plan.pattern} has no library form (Plan.library)"
        return True, ""

    def grids(self, ctx, plan, comm_sms):
        self.no_split(comm_sms, self.name)
        return {}

    def workspace(self, ctx, plan, comm_sms):
        return Workspace(grids=self.grids(ctx, plan, comm_sms), state={}, flags=None)

    def launch(self, ctx, plan, ws):
        plan.library()

    def delivers_into(self, plan):
        return plan.library_into is not None

    def run(self, ctx, plan, ws, into=None):
        """The library form is the whole call: no later steps, no ``finish``. ``into`` (where
        :meth:`delivers_into`): the form that writes the result there (:attr:`Plan.library_into`)."""
        if into is not None:
            plan.library_into(into)
            return into
        plan.library()
        return plan.result


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(Library())
