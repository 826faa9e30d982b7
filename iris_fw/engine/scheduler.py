"""The scheduler half of the contract: :class:`Scheduler`, the per-op :class:`Workspace`, and the
launch helpers that bind a skeleton kernel (:mod:`iris_fw.engine.skeletons`) to a plan through
the lean launch path (:mod:`iris_fw.engine.launcher`).

A scheduler is prepared once per op (:meth:`Scheduler.workspace`: grids fixed, state regions
and item flags allocated on the heap, zeroed) and then only enqueues kernels per call
(:meth:`Scheduler.launch`) — no host synchronization, no host-side counters: everything that
changes from call to call lives on the device, so a call can be captured in a CUDA graph and
replayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import devinfo
from .contract import Plan, split_args
from .launcher import KernelLauncher
from .skeletons import (_consumer_kernel, _fused_kernel, _producer_kernel, _specialized_kernel, no_depends,
                        no_fetch, state_slots)

#: Estimates behind the default SM split (H100/H200 class): what one SM moves over NVLink with
#: plain loads/stores, and the bf16 tensor-core rate of one SM.
PER_SM_LINK_BYTES_PER_S = 25e9
PER_SM_FLOPS_PER_S = 5.5e12


def default_comm_sms(plan: Plan, sms: int) -> int:
    """Enough communication SMs to move ``plan.comm_bytes`` while the others compute, at least
    1 and at most half the SMs."""
    if sms <= 2:
        return 1
    compute_s = plan.flops / (sms * PER_SM_FLOPS_PER_S)
    need = plan.comm_bytes / max(compute_s, 1e-9) / PER_SM_LINK_BYTES_PER_S
    return int(min(max(1, math.ceil(need)), sms // 2))


@dataclass
class Workspace:
    """Per-op scheduler state: ``grids`` (programs per kernel role, fixed for the op's life),
    one device state region per role (``state[role]``, int64 on the heap), the item ``flags``
    (int64 on the heap), cached launchers, and a side stream for two-stream schedules."""

    grids: dict[str, int]
    state: dict[str, torch.Tensor]
    flags: torch.Tensor
    side_stream: Any = None
    launchers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


class Scheduler:
    """Base of schedulers. Subclasses set ``name``, ``description``, ``uses_stash`` and implement
    :meth:`grids` and :meth:`launch`.

    The barrier policy is the scheduler's: the kernel that communicates carries ``ENTRY``
    (every rank's inputs are ready, outputs free to overwrite) and ``EXIT`` (every delivery is
    complete when the kernel ends) — folded into the kernel, not separate launches."""

    name = ""
    description = ""
    #: whether the schedule keeps produced tiles in memory (patterns allocate stash space)
    uses_stash = False

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, plan: Plan) -> tuple[bool, str]:
        """Whether this scheduler can run ``plan`` (and if not, why)."""
        return True, ""

    def grids(self, ctx, plan: Plan, comm_sms: int | None) -> dict[str, int]:
        """Programs of each kernel role this schedule launches (fixed for the op)."""
        raise NotImplementedError

    def workspace(self, ctx, plan: Plan, comm_sms: int | None) -> Workspace:
        """Grids, state regions and item flags for an op whose first call is ``plan``."""
        grids = self.grids(ctx, plan, comm_sms)
        state = {role: ctx.zeros(state_slots(ctx.world_size, n), dtype=torch.int64) for role, n in grids.items()}
        flags = ctx.zeros(max(plan.num_items, 1), dtype=torch.int64)
        return Workspace(grids=grids, state=state, flags=flags)

    def launch(self, ctx, plan: Plan, ws: Workspace) -> None:
        """Enqueue one call's kernels."""
        raise NotImplementedError

    def run(self, ctx, plan: Plan, ws: Workspace):
        self.launch(ctx, plan, ws)
        if plan.finish is not None:
            plan.finish()
        return plan.result

    @staticmethod
    def split(ctx, plan: Plan, comm_sms: int | None) -> tuple[int, int]:
        """``(compute programs, communication programs)`` for the two-role schedules."""
        sms = devinfo.num_sms(ctx.device)
        comm = default_comm_sms(plan, sms) if comm_sms is None else comm_sms
        if not isinstance(comm, int) or isinstance(comm, bool) or not 1 <= comm < sms:
            raise ValueError(f"comm_sms must be an int in [1, {sms - 1}] on this device ({sms} SMs), got {comm_sms!r}")
        return sms - comm, comm

    @staticmethod
    def no_split(comm_sms: int | None, name: str) -> None:
        """Schedules that do not split the SMs refuse ``comm_sms`` rather than ignore it."""
        if comm_sms is not None:
            raise ValueError(f"comm_sms does not apply to {name} (it does not split the SMs), got {comm_sms!r}")


def side_stream(ctx, ws: Workspace):
    """The workspace's second stream (created once), made to wait for the current stream; None
    on the CPU."""
    if ctx.device.type != "cuda":
        return None
    if ws.side_stream is None:
        ws.side_stream = torch.cuda.Stream(device=ctx.device)
    ws.side_stream.wait_stream(torch.cuda.current_stream(ctx.device))
    return ws.side_stream


def bind_kernel(ws: Workspace, role: str, kernel, plan: Plan, constexprs: dict) -> KernelLauncher:
    """The launcher of skeleton ``kernel`` for ``role`` (grid ``ws.grids[role]``) with the plan's
    named-args type, config and pieces plus ``constexprs`` bound; made once per role and config.
    Its runtime parameters start ``top0, top1, rest`` (:func:`~iris_fw.engine.contract.split_args`)."""
    key = (role, plan.cfg)
    launcher = ws.launchers.get(key)
    if launcher is None:
        args = plan.args
        p = plan.pieces
        pieces = {"PRODUCE": p.produce, "CONSUME": p.consume, "STASH": p.stash, "RELOAD": p.reload,
                  "FETCH": p.fetch or no_fetch, "DEPENDS": p.depends or no_depends}
        names = kernel.arg_names if hasattr(kernel, "arg_names") else kernel.fn.arg_names
        constexprs = {"ARGS": type(args), "NTOP": getattr(type(args), "TOP", 0), "CFG": plan.cfg,
                      **{k: v for k, v in pieces.items() if k in names}, **constexprs}
        launcher = ws.launchers[key] = KernelLauncher(kernel, (ws.grids[role],), constexprs=constexprs,
                                                      num_warps=plan.num_warps, num_stages=plan.num_stages)
    return launcher


def launch_producer(ctx, plan: Plan, ws: Workspace, *, role: str = "producer", sync: bool,
                    entry: bool = False, exit: bool = False) -> None:
    """The producer skeleton over the plan's chunks (communicate-first) or tiles."""
    nprog = ws.grids[role]
    launcher = bind_kernel(ws, role, _producer_kernel, plan,
                         dict(NPROG=nprog, COMM_FIRST=plan.comm_first, SYNC=sync, ENTRY=entry, EXIT=exit))
    launcher(*split_args(plan.args), ws.state[role], ws.flags, plan.num_items, ctx.rank, ctx.world_size,
             ctx.heap_bases)


def launch_consumer(ctx, plan: Plan, ws: Workspace, *, role: str = "consumer", sync: bool, queue: bool,
                    fixed_flag: int = 0, entry: bool = False, exit: bool = False) -> None:
    """The consumer skeleton over the plan's tiles; ``fixed_flag``: items are published with this
    constant (not the epoch) and reset by the kernel's last program."""
    nprog = ws.grids[role]
    launcher = bind_kernel(ws, role, _consumer_kernel, plan,
                         dict(NPROG=nprog, COMM_FIRST=plan.comm_first, SYNC=sync, QUEUE=queue,
                              FIXED=bool(fixed_flag), ENTRY=entry, EXIT=exit))
    launcher(*split_args(plan.args), ws.state[role], ws.flags, plan.num_tiles, plan.num_items, fixed_flag,
             ctx.rank, ctx.world_size, ctx.heap_bases)


def launch_fused(ctx, plan: Plan, ws: Workspace, *, role: str = "fused", entry: bool = True,
                 exit: bool = True) -> None:
    """The fused skeleton: compute a tile, deliver it from registers."""
    launcher = bind_kernel(ws, role, _fused_kernel, plan, dict(NPROG=ws.grids[role], ENTRY=entry, EXIT=exit))
    launcher(*split_args(plan.args), ws.state[role], ws.flags, plan.num_tiles, ctx.rank, ctx.world_size,
             ctx.heap_bases)


def launch_specialized(ctx, plan: Plan, ws: Workspace, *, producers: int, role: str = "specialized",
                       entry: bool = True, exit: bool = True) -> None:
    """The role-specialized skeleton: ``producers`` programs produce, the rest consume."""
    launcher = bind_kernel(ws, role, _specialized_kernel, plan,
                         dict(NPROG=ws.grids[role], PRODUCERS=producers, COMM_FIRST=plan.comm_first,
                              ENTRY=entry, EXIT=exit))
    launcher(*split_args(plan.args), ws.state[role], ws.flags, plan.num_tiles, plan.num_items, ctx.rank,
             ctx.world_size, ctx.heap_bases)
