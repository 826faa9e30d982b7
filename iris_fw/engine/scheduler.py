"""The scheduler half of the contract: :class:`Scheduler`, the per-op :class:`Workspace`, and the
launch helpers that bind a skeleton kernel (:mod:`iris_fw.engine.skeletons`) to a plan through
the lean launch path (:mod:`iris_fw.kernel_launcher`).

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

from .. import devinfo, driver
from ..errors import ArgumentError, IrisError
from .contract import Plan, split_args
from ..kernel_launcher import KernelLauncher
from .skeletons import (_consumer_kernel, _fused_kernel, _producer_kernel, _specialized_kernel, _steps_kernel,
                        ST_ARRIVE, no_depends, no_fetch, no_step, no_traffic, state_slots)

#: Estimates behind the default SM split (H100/H200 class): what one SM moves over NVLink with
#: plain loads/stores, and the bf16 tensor-core rate of one SM.
PER_SM_LINK_BYTES_PER_S = 25e9
PER_SM_FLOPS_PER_S = 5.5e12
#: What one communication program spends on an item besides moving its bytes: the acquire of
#: the item's flag (an L2 round trip after the release), its bookkeeping and, traced, its
#: events. Measured on one H100 (run 28, docs/performance.md "tracing overhead"): the single
#: consumer program of gemm_all_scatter at W = 1 (2048 tiles, nothing to move) took ~0.75 us
#: per tile untraced and ~1.1 us traced, longer than the 1.47 ms GEMM: it set the op's time.
PER_ITEM_S = 1.0e-6


def default_comm_sms(plan: Plan, sms: int) -> int:
    """Enough communication SMs to move ``plan.comm_bytes`` and to walk ``plan.num_items``
    items (:data:`PER_ITEM_S` each) while the others compute, at least 1 and at most half the
    SMs."""
    if sms <= 2:
        return 1
    compute_s = max(plan.flops / (sms * PER_SM_FLOPS_PER_S), 1e-9)
    need = max(plan.comm_bytes / compute_s / PER_SM_LINK_BYTES_PER_S, plan.num_items * PER_ITEM_S / compute_s)
    return int(min(max(1, math.ceil(need)), sms // 2))


@dataclass
class Workspace:
    """Per-op scheduler state: ``grids`` (programs per kernel role, fixed for the op's life),
    one device state region per role (``state[role]``, int64 on the heap), the item ``flags``
    (int64 on the heap: ``num_items`` release flags, then as many claim slots — see
    :func:`~iris_fw.engine.skeletons.claim`), cached launchers, and a side stream for two-stream
    schedules. ``name`` labels the op's kernels in traces (``"pattern/scheduler"``, set by the op)."""

    grids: dict[str, int]
    state: dict[str, torch.Tensor]
    flags: torch.Tensor
    side_stream: Any = None
    launchers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    name: str = ""
    #: during a call into a given tensor (:meth:`Scheduler.run`): the change every launch of the
    #: call makes to its arguments (the plan's :attr:`~iris_fw.engine.contract.Plan.result_arg`
    #: replaced; :func:`fire`); None otherwise
    into: Any = None


class Scheduler:
    """Base of schedulers. Subclasses set ``name``, ``description``, ``uses_stash`` and implement
    :meth:`grids` and :meth:`launch`. A subclass whose kernels all launch through :func:`fire`
    (every launch helper of this module does) sets ``replaces_result = True``.

    The barrier policy is the scheduler's: the kernel that communicates carries ``ENTRY``
    (every rank's inputs are ready, outputs free to overwrite) and ``EXIT`` (every delivery is
    complete when the kernel ends) — folded into the kernel, not separate launches."""

    name = ""
    description = ""
    #: whether the schedule keeps produced tiles in memory (patterns allocate stash space)
    uses_stash = False
    #: whether the schedule runs a multi-step pattern's later steps inside its own kernels
    #: (``Plan.steps > 1``; per-program step barriers). Other schedules run them after their
    #: kernels, in :func:`launch_steps` (a ``"steps"`` kernel role).
    multi_step = False
    #: whether every kernel of the schedule launches through :func:`fire`, so that a call into a
    #: given tensor can replace a plan's :attr:`~iris_fw.engine.contract.Plan.result_arg` (a
    #: kernel launched otherwise would write the op's buffer and leave the tensor unwritten)
    replaces_result = False

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
        if plan.steps > 1 and not self.multi_step:
            grids["steps"] = devinfo.persistent_programs(ctx.device, plan.num_tiles)
        state = {role: ctx.zeros(state_slots(ctx.world_size, n), dtype=torch.int64) for role, n in grids.items()}
        flags = ctx.zeros(2 * max(plan.num_items, 1), dtype=torch.int64)  # release flags, then claims
        return Workspace(grids=grids, state=state, flags=flags)

    def launch(self, ctx, plan: Plan, ws: Workspace) -> None:
        """Enqueue one call's kernels."""
        raise NotImplementedError

    def delivers_into(self, plan: Plan) -> bool:
        """Whether :meth:`run` with ``into`` writes ``plan``'s result straight into ``into``:
        this rank's last step is :attr:`Plan.finish_into`, or only this rank's kernels write the
        result (:attr:`Plan.result_arg`) and they launch through :func:`fire` — both run by
        this base ``run``; a scheduler that overrides ``run`` says for itself."""
        if type(self).run is not Scheduler.run:
            return False
        return plan.finish_into is not None or (plan.result_arg is not None and plan.finish is None
                                                and self.replaces_result)

    def run(self, ctx, plan: Plan, ws: Workspace, into=None):
        """Enqueue one call (its kernels, later steps, ``finish``); returns the result. ``into``
        (a contiguous tensor of the result's shape and dtype, where :meth:`delivers_into`):
        ``finish_into(into)`` runs in place of ``finish``, or the kernels run with the plan's
        :attr:`~Plan.result_arg` replaced by ``into`` (unless ``into`` shares memory with
        another argument, which the kernels still read: then they write the result and it is
        copied); ``into`` is returned. The plan's ``stage_in`` (if any) runs first."""
        if plan.stage_in is not None:
            plan.stage_in()
        change = None
        if into is not None and plan.result_arg is not None and plan.finish is None and self.replaces_result:
            change = ws.into = result_change(plan, into)
        try:
            self.launch(ctx, plan, ws)
            if plan.steps > 1 and not self.multi_step:
                launch_steps(ctx, plan, ws)
        finally:
            ws.into = None
        if change is not None:
            return into
        if into is not None and plan.finish_into is not None:
            plan.finish_into(into)
            return into
        if plan.finish is not None:
            plan.finish()
        return plan.result if into is None else into.copy_(plan.result)

    @staticmethod
    def split(ctx, plan: Plan, comm_sms: int | None) -> tuple[int, int]:
        """``(compute programs, communication programs)`` for the two-role schedules."""
        sms = devinfo.num_sms(ctx.device)
        comm = default_comm_sms(plan, sms) if comm_sms is None else comm_sms
        if not isinstance(comm, int) or isinstance(comm, bool) or not 1 <= comm < sms:
            raise ArgumentError(f"comm_sms must be an int in [1, {sms - 1}] on this device ({sms} SMs), got {comm_sms!r}")
        return sms - comm, comm

    @staticmethod
    def no_split(comm_sms: int | None, name: str) -> None:
        """Schedules that do not split the SMs refuse ``comm_sms`` rather than ignore it."""
        if comm_sms is not None:
            raise ArgumentError(f"comm_sms does not apply to {name} (it does not split the SMs), got {comm_sms!r}")


class SideStream:
    """A workspace's second stream with its fork and join events, made once. A two-stream call
    is ``main = side.fork()`` (the side stream waits for the current stream's work so far),
    launches on ``side.stream`` (:meth:`KernelLauncher.launch_on`), then ``side.join(main)``
    (the current stream waits for the side stream): two event records and two waits on raw
    handles — no torch stream or event object per call, and in a CUDA-graph capture the
    usual fork/join edges."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device=device)
        self.index = self.stream.device_index
        self._handle = self.stream.cuda_stream
        self._fork_event, self._join_event = torch.cuda.Event(), torch.cuda.Event()
        for event in (self._fork_event, self._join_event):
            event.record(self.stream)  # creates the driver event (torch creates it lazily)
        self._fork, self._join = self._fork_event.cuda_event, self._join_event.cuda_event
        self._calls = driver.calls()
        self._current = driver.current_stream()

    def fork(self):
        """Make the side stream wait for the current stream; returns the current stream (a raw
        handle, or a torch stream where the driver's calls were not found) for :meth:`join`."""
        calls = self._calls
        if calls is None:
            main = torch.cuda.current_stream(self.index)
            self._fork_event.record(main)
            self.stream.wait_event(self._fork_event)
            return main
        main = self._current(self.index)
        calls.record(self._fork, main)
        calls.wait(self._handle, self._fork)
        return main

    def join(self, main) -> None:
        """Make ``main`` (what :meth:`fork` returned) wait for the side stream's work so far."""
        calls = self._calls
        if calls is None:
            self._join_event.record(self.stream)
            main.wait_event(self._join_event)
            return
        calls.record(self._join, self._handle)
        calls.wait(main, self._join)


def _storages(value):
    """The storage pointers of a plan argument: a tensor's, a TMA descriptor's tensor's, those
    in a tuple (at any depth); none for anything else."""
    if isinstance(value, torch.Tensor):
        yield value.untyped_storage().data_ptr()
    elif isinstance(value, tuple):
        for item in value:
            yield from _storages(item)
    else:
        base = getattr(value, "base", None)
        if isinstance(base, torch.Tensor):
            yield base.untyped_storage().data_ptr()


def result_change(plan: Plan, into: torch.Tensor):
    """The change (:meth:`~iris_fw.kernel_launcher.PreparedLaunch.launch_with`) that makes a
    call's kernels write its result into ``into`` — the plan's :attr:`~Plan.result_arg`
    replaced: the field's runtime argument, or its element of ``rest``
    (:func:`~iris_fw.engine.contract.split_args`) — or None where ``into`` shares memory with
    another argument (an input the kernels still read while they write the result). Worked
    out once per plan (:attr:`Plan.memo`)."""
    seen = plan.memo.get("result_at")
    if seen is None:
        args = plan.args
        fields = type(args)._fields
        f = fields.index(plan.result_arg)
        top = getattr(type(args), "TOP", 0)
        reads = frozenset(p for name, v in zip(fields, args) if name != plan.result_arg for p in _storages(v))
        seen = plan.memo["result_at"] = ((2, f - top) if f >= top else f, reads)
    at, reads = seen
    if into.untyped_storage().data_ptr() in reads:
        return None
    return ((at, into),)


def fire(call, ws: Workspace, stream=None) -> None:
    """Launch a plan's prepared launch ``call`` (on ``stream``, a ``torch.cuda.Stream``; None:
    the current one) — with the result replaced during a call into a given tensor
    (:attr:`Workspace.into`). Every kernel launch of a schedule goes through here."""
    into = ws.into
    if into is None:
        call(stream)
    else:
        call.launch_with(into, stream)


def side_stream(ctx, ws: Workspace) -> SideStream | None:
    """The workspace's :class:`SideStream` (created on the first call); None on the CPU."""
    if ctx.device.type != "cuda":
        return None
    if ws.side_stream is None:
        ws.side_stream = SideStream(ctx.device)
    return ws.side_stream


def bind_kernel(ws: Workspace, role: str, kernel, plan: Plan, constexprs: dict, trace=0) -> KernelLauncher:
    """The launcher of skeleton ``kernel`` for ``role`` (grid ``ws.grids[role]``) with the plan's
    named-args type, config and pieces plus ``constexprs`` bound; made once per role, config and
    ``trace`` (the kernel's ``TRACE`` constexpr: 0, or the clock of a trace session — a traced
    kernel is a variant of its own). Its runtime parameters start ``top0, top1, rest``
    (:func:`~iris_fw.engine.contract.split_args`)."""
    key = (role, plan.cfg, trace)
    launcher = ws.launchers.get(key)
    if launcher is None:
        args = plan.args
        p = plan.pieces
        pieces = {"PRODUCE": p.produce, "CONSUME": p.consume, "STASH": p.stash, "RELOAD": p.reload,
                  "FETCH": p.fetch or no_fetch, "DEPENDS": p.depends or no_depends, "STEP": p.step or no_step,
                  "STEPS": plan.steps, "TRAFFIC": p.traffic or no_traffic, "TRACE": trace}
        names = kernel.arg_names if hasattr(kernel, "arg_names") else kernel.fn.arg_names
        constexprs = {"ARGS": type(args), "NTOP": getattr(type(args), "TOP", 0), "CFG": plan.cfg,
                      **{k: v for k, v in pieces.items() if k in names}, **constexprs}
        launcher = ws.launchers[key] = KernelLauncher(kernel, (ws.grids[role],), constexprs=constexprs,
                                                      num_warps=plan.num_warps, num_stages=plan.num_stages)
    return launcher


def _memoized(ctx, plan: Plan, ws: Workspace, key: tuple):
    """The prepared launch memoized in the plan under ``key`` for this workspace (and, under a
    trace session, for this session), or None."""
    tracer = ctx.tracer
    if tracer is None:
        call = plan.memo.get(key)
    else:
        call = plan.memo.get(key + ("traced",))
        tracer.launched()
    if call is None or call[0] is not ws or call[2] is not tracer:
        return None
    return call[1]


def _prepare(ctx, plan: Plan, ws: Workspace, key: tuple, role: str, kernel, constexprs: dict, *args):
    """Prepare (and memoize under ``key``) the launch of ``kernel`` for ``role`` on the plan's
    arguments followed by ``args`` and the kernel's ``trace``: under a trace session, the traced
    variant writing into the role's trace buffer (:meth:`iris_fw.trace_session.Tracer.handle`)."""
    tracer = ctx.tracer
    handle, mode = None, 0
    if tracer is not None:
        key = key + ("traced",)
        name, st, world, nprog = ws.name or plan.pattern, ws.state[role], ctx.world_size, ws.grids[role]
        arrive = ST_ARRIVE.value
        handle = tracer.handle((id(ws), role), nprog, f"{name} {role}", pin=ws, buffers={
            f"{name} item flags": ws.flags, f"{name} {role} barrier slots": st[arrive:arrive + world],
            f"{name} {role} step slots": st[arrive + world + nprog:], f"{name} {role} state": st})
        mode = tracer.mode
    launcher = bind_kernel(ws, role, kernel, plan, constexprs, mode)
    call = plan.memo[key] = (ws, launcher.prepare(*split_args(plan.args), *args, handle), tracer)
    return call[1]


def launch_producer(ctx, plan: Plan, ws: Workspace, *, role: str = "producer", sync: bool,
                    entry: bool = False, exit: bool = False, stream=None) -> None:
    """The producer skeleton over the plan's chunks (communicate-first) or tiles; ``stream``: a
    ``torch.cuda.Stream`` to launch on instead of the current one."""
    key = ("producer", role, sync, entry, exit)
    call = _memoized(ctx, plan, ws, key)
    if call is None:
        call = _prepare(ctx, plan, ws, key, role, _producer_kernel,
                        dict(NPROG=ws.grids[role], COMM_FIRST=plan.comm_first, SYNC=sync, ENTRY=entry, EXIT=exit),
                        ws.state[role], ws.flags, plan.num_items, ctx.rank, ctx.world_size, ctx.heap_bases)
    fire(call, ws, stream)


def launch_consumer(ctx, plan: Plan, ws: Workspace, *, role: str = "consumer", sync: bool, queue: bool,
                    fixed_flag: int = 0, entry: bool = False, exit: bool = False, helps: str | None = None,
                    stream=None) -> None:
    """The consumer skeleton over the plan's tiles; ``fixed_flag``: items are published with this
    constant (not the epoch) and reset by the kernel's last program; ``helps``: the role of the
    producer kernel (:func:`launch_producer`, with ``sync``) that releases the items — a consumer
    program that needs an item whose producer program has not started this call produces the
    item itself (:func:`~iris_fw.engine.skeletons.obtain`; a communicate-first consumer then
    fetches: give it ``entry`` and ``exit``); ``stream``: as for :func:`launch_producer`."""
    key = ("consumer", role, sync, queue, fixed_flag, entry, exit, helps)
    call = _memoized(ctx, plan, ws, key)
    if call is None:
        owners, nowners = ws.state[role], 1  # (unused without helps)
        if helps is not None:
            if fixed_flag or not sync:
                raise ArgumentError("launch_consumer: helps needs sync and items released with the epoch "
                                    "(no fixed_flag)")
            first = ST_ARRIVE.value + ctx.world_size  # the producer's programs' call counters
            nowners = ws.grids[helps]
            owners = ws.state[helps][first:first + nowners]
        call = _prepare(ctx, plan, ws, key, role, _consumer_kernel,
                        dict(NPROG=ws.grids[role], COMM_FIRST=plan.comm_first, SYNC=sync, QUEUE=queue,
                             FIXED=bool(fixed_flag), ENTRY=entry, EXIT=exit, HELP=helps is not None, OWNERS=nowners),
                        ws.state[role], ws.flags, plan.num_tiles, plan.num_items, fixed_flag, ctx.rank,
                        ctx.world_size, ctx.heap_bases, owners)
    fire(call, ws, stream)


def launch_fused(ctx, plan: Plan, ws: Workspace, *, role: str = "fused", entry: bool = True,
                 exit: bool = True) -> None:
    """The fused skeleton: compute a tile, deliver it from registers."""
    key = ("fused", role, entry, exit)
    call = _memoized(ctx, plan, ws, key)
    if call is None:
        call = _prepare(ctx, plan, ws, key, role, _fused_kernel,
                        dict(NPROG=ws.grids[role], ENTRY=entry, EXIT=exit, COMM_FIRST=plan.comm_first),
                        ws.state[role], ws.flags, plan.num_tiles, ctx.rank, ctx.world_size, ctx.heap_bases)
    fire(call, ws)


def launch_steps(ctx, plan: Plan, ws: Workspace) -> None:
    """A multi-step plan's later steps on a schedule that ran step 0 in its own kernels (see
    :func:`~iris_fw.engine.skeletons._steps_kernel`); role ``"steps"``."""
    key = ("steps",)
    call = _memoized(ctx, plan, ws, key)
    if call is None:
        call = _prepare(ctx, plan, ws, key, "steps", _steps_kernel, dict(NPROG=ws.grids["steps"], EXIT=True),
                        ws.state["steps"], ws.flags, plan.num_tiles, ctx.rank, ctx.world_size, ctx.heap_bases)
    fire(call, ws)


def launch_specialized(ctx, plan: Plan, ws: Workspace, *, producers: int, role: str = "specialized",
                       entry: bool = True, exit: bool = True) -> None:
    """The role-specialized skeleton: ``producers`` programs produce, the rest consume."""
    key = ("specialized", role, producers, entry, exit)
    call = _memoized(ctx, plan, ws, key)
    if call is None:
        call = _prepare(ctx, plan, ws, key, role, _specialized_kernel,
                        dict(NPROG=ws.grids[role], PRODUCERS=producers, COMM_FIRST=plan.comm_first, ENTRY=entry,
                             EXIT=exit),
                        ws.state[role], ws.flags, plan.num_tiles, plan.num_items, ctx.rank, ctx.world_size,
                        ctx.heap_bases)
    fire(call, ws)
