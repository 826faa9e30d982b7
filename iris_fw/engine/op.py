"""Ops: a pattern bound to a scheduler, input shapes and a workspace, validated across ranks once.

Creating an :class:`Op` is collective and is the only moment ranks talk on the host: one small
exchange compares pattern, scheduler, shapes, dtypes, device type, configuration and SM split
(a mismatch, or a rank whose inputs are invalid, raises on every rank naming the ranks and the
argument) and reclaims heap blocks every rank has freed. Afterwards a call compares its inputs'
fingerprint with the op's, binds them and enqueues the kernels — no host synchronization, and
every per-call counter lives on the device, so calls can be captured in a CUDA graph.

``iris_fw.ops.<name>(...)`` calls keep their ops in the context's op cache of the library's one
call path (:mod:`iris_fw.callpath`), by their arguments, so a loop plans (and allocates) once.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import callpath as cp
from .. import context as _context
from ..errors import ArgumentError, ArgumentTypeError, IrisError
from .contract import PatternError, input_fingerprint, labelled_signature
from .auto import lookup


def _shares_storage(t, buffers) -> bool:
    """Whether ``t`` views the memory of a tensor among ``buffers`` (a dict's values, nested one level)."""
    if not isinstance(t, torch.Tensor):
        return False
    ptr = t.untyped_storage().data_ptr()
    for b in buffers.values():
        for x in (b if isinstance(b, (list, tuple)) else (b,)):
            if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr:
                return True
    return False


def check_out(out, op: "Op", pattern: str) -> None:
    """``out`` must hold the op's result: its shape and dtype, on the rank's device (checked
    before anything is launched: a rank whose ``out`` does not fit aborts its peers)."""
    if not isinstance(out, torch.Tensor):
        raise ArgumentTypeError(f"iris_fw.ops.{pattern}: out must be a torch.Tensor or None, got {type(out).__name__}")
    if op.result_meta is None:
        raise ArgumentError(f"iris_fw.ops.{pattern}: this op's result is not a tensor; call it without out")
    shape, dtype, device = op.result_meta
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device:
        raise ArgumentError(f"iris_fw.ops.{pattern}: out must be a {list(shape)} tensor of dtype "
                            f"{str(dtype).replace('torch.', '')} on {device}, got {list(out.shape)} "
                            f"{str(out.dtype).replace('torch.', '')} on {out.device}")


class Op:
    """A pattern bound to a scheduler, input shapes and a workspace on ``ctx``'s heap.

    Creating one is collective (it validates across ranks and allocates symmetric buffers); so
    is every call. A call returns the op's output buffer, overwritten by the next call. Planning
    ends in one settling exchange (:func:`iris_fw.callpath.settled`: every rank's workspace
    zeroed, every rank planned; a rank whose planning failed makes every peer raise there); a
    later call that fails on this rank's host aborts the job's waits
    (:func:`iris_fw.callpath.fail`), so the other ranks raise at once instead of waiting for this
    one. ``buffers`` holds the pattern's buffers (e.g. ``"out"``);
    ``result_in_workspace`` says whether a call's result is one of them (or on the heap), so
    that the functional ``iris_fw.ops`` calls copy it out."""

    def __init__(self, pattern: str, *inputs: Any, ctx=None, scheduler: str = "auto", config=None,
                 comm_sms: int | None = None):
        self.ctx = ctx = _context.resolve(ctx)
        self._abort_epoch = ctx.abort_epoch
        self._planning_inputs = inputs
        label = f"iris_fw.ops {pattern}"

        def check():
            pat = ctx.registries.pattern.require_available(pattern)
            signature = pat.signature(ctx, *inputs)
            sched, cfg, sms = scheduler, config, comm_sms
            if not isinstance(sched, str):
                raise ArgumentTypeError(f"scheduler must be a scheduler name or 'auto', got {sched!r}")
            if sched == "auto":
                choice = lookup(pat, signature, ctx)
                sched = choice.scheduler
                sms = choice.comm_sms if sms is None else sms
                if cfg is None and choice.config is not None:
                    cfg = pat.Config(**choice.config)
            if cfg is not None and not isinstance(cfg, pat.Config):
                raise ArgumentTypeError(f"config must be an {pat.Config.__module__}.{pat.Config.__name__} "
                                        f"or None, got {type(cfg).__name__}")
            sched_obj = ctx.registries.scheduler.require_available(sched)
            fields = {"pattern": pattern, "scheduler": sched if scheduler == sched else (scheduler, sched),
                      **labelled_signature(pat, signature), "config": cfg, "comm_sms": sms,
                      "device": ctx.device.type}
            return fields, (pat, signature, sched_obj, cfg, sms), None

        # settled: every rank's workspace is zeroed on its device before any peer's kernel announces
        # itself in it (a peer that planned sooner would otherwise launch, write its entry arrival
        # into this rank's state region and have it wiped by the queued zero fill; seen under MPS)
        cp.plan_call(ctx, label, check, lambda fields, error, _: ctx.agree(label, fields, error), self._plan,
                     lambda failure: cp.settled(ctx, label, failure))
        #: what a call's inputs must look like (their shapes, dtypes, devices): compared per call
        self.fingerprint = input_fingerprint(inputs)
        self._planning_inputs = None  # (not kept alive by the op)

    def _plan(self, state, _agreed) -> None:
        """Planning after every rank agreed: configuration, buffers, the first binding, the
        scheduler's workspace (a failure here makes every peer raise in the settling exchange: see
        :func:`iris_fw.callpath.settled`)."""
        self.pattern, self.signature, self.scheduler, config, self.comm_sms = state
        ctx = self.ctx
        if config is None:
            config = self.pattern.default_config(ctx, self.signature)
        self.config = config
        self.buffers = self.pattern.setup(ctx, self.signature, config, self.scheduler.uses_stash)
        first = self.pattern.bind(ctx, self.buffers, *self._planning_inputs)
        ok, why = self.scheduler.supports(first)
        if not ok:
            raise PatternError(f"scheduler {self.scheduler.name!r} cannot run {self.pattern.name}: {why}")
        res = first.result
        #: ``(shape, dtype, device)`` of a call's result
        self.result_meta = ((tuple(res.shape), res.dtype, res.device) if isinstance(res, torch.Tensor)
                            else None)
        #: a dense tensor shaped like a call's result (the op's own buffer), for new results:
        #: ``torch.empty_like`` of it costs about half of ``torch.empty(shape, dtype=, device=)``'s
        #: host time (no argument parsing of the device), and a third less again with
        #: ``memory_format=torch.contiguous_format`` (no strides to work out from it)
        self._result_like = res if isinstance(res, torch.Tensor) and res.is_contiguous() else None
        self.result_in_workspace = (_shares_storage(first.result, self.buffers)
                                    or (isinstance(first.result, torch.Tensor) and ctx.is_symmetric(first.result)))
        #: whether a call can write its result straight into a given tensor (the plan's last
        #: step is this rank's ``finish_into``, or only this rank's kernels write the result,
        #: ``result_arg``, both run by the base scheduler's ``run``; or the library form's
        #: ``library_into``: :meth:`~iris_fw.engine.scheduler.Scheduler.delivers_into`)
        self.delivers_into = self.result_meta is not None and self.scheduler.delivers_into(first)
        self.workspace = self.scheduler.workspace(ctx, first, self.comm_sms)
        self.workspace.name = f"{self.pattern.name}/{self.scheduler.name}"  # labels its kernels in traces
        self._track_counters()
    def _track_counters(self) -> None:
        """Let a rank waiting on the host see that a peer launched this op's kernels while it did
        not (its programs' epoch counters live in the state regions on the heap; iris_fw.call_identity)."""
        from .skeletons import ST_ARRIVE

        grids, state = getattr(self.workspace, "grids", None), getattr(self.workspace, "state", None)
        if not isinstance(grids, dict) or not isinstance(state, dict):
            return
        shown = ", ".join(f"{k}={v}" for k, v in labelled_signature(self.pattern, self.signature).items())
        what = f"iris_fw.ops {self.pattern.name}({shown}) via {self.scheduler.name}"
        first = ST_ARRIVE.value + self.ctx.world_size
        for role, programs in grids.items():
            region = state.get(role)
            if isinstance(programs, int) and region is not None and self.ctx.is_symmetric(region):
                self.ctx.calls.track(self, what, region[first:first + programs])

    def __call__(self, *inputs: Any):
        """Enqueue a call on ``inputs`` (shaped like the planning inputs: their fingerprint is
        compared, the full check runs only when it differs); returns the op's output buffer."""
        ctx = self.ctx
        if ctx._closed:
            ctx._check_open()  # raises: the op's buffers belong to a closed context
        try:
            fingerprint = input_fingerprint(inputs)
            try:
                same = fingerprint == self.fingerprint
            except Exception:  # an input whose == is not a bool (an array): check it in full
                same = False
            if not same:
                signature = self.pattern.signature(ctx, *inputs)
                if signature != self.signature:
                    raise PatternError(f"this {self.pattern.name} op was planned for inputs {self.signature}, "
                                       f"got {signature}")
            return self.launch(*inputs)
        except BaseException as exc:
            # the other ranks are (or will be) in this call's kernels, waiting for this one
            cp.fail(ctx, f"iris_fw.ops {self.pattern.name}", exc)
            raise

    def launch(self, *inputs: Any, into=None):
        """Enqueue a call on ``inputs`` already known to match the op's signature (what
        :meth:`__call__` checks first; the call path found the op by their fingerprint).
        ``into`` (only where :attr:`delivers_into`): a contiguous tensor of the result's shape and
        dtype that the call writes its result into, and returns."""
        ctx = self.ctx
        if self._abort_epoch != ctx.abort_epoch:  # (the one check that the op is armed)
            self._stale()
        plan = self.pattern.bind(ctx, self.buffers, *inputs)
        if into is not None:
            return self.scheduler.run(ctx, plan, self.workspace, into)
        return self.scheduler.run(ctx, plan, self.workspace)

    def _stale(self):
        """Raise: the job was aborted and re-armed since this op was planned."""
        error = IrisError(f"this {self.pattern.name} op was planned before the job was aborted and re-armed: "
                          "its per-call device state may differ across ranks; plan it again (iris_fw.ops."
                          f"{self.pattern.name}(...) calls re-plan by themselves)")
        error._iris_fw_told = True  # every rank knows it alike: no abort for this one
        raise error

    def functional(self, out, *inputs: Any):
        """What an ``iris_fw.ops.<name>(..., out=out)`` call runs on its cached op (the call path
        found it by the inputs' fingerprint). Where only this rank writes the result
        (:attr:`delivers_into`) it writes it straight into ``out`` (checked; contiguous) or a
        new tensor (a plan's ``finish_into`` / ``library_into`` must not write ``out`` while
        something of the call still reads an input that shares its memory; kernels writing a
        replaced ``result_arg`` do not take such an ``out``). Otherwise the
        kernels write the op's result buffer, and when that buffer is in the op's workspace —
        which peers may write and the next call overwrites — it is copied into ``out`` or a new
        tensor; a result outside any workspace is returned as it is.

        (The hit path of every functional call: :meth:`launch` inlined, one frame fewer.)"""
        ctx = self.ctx
        if out is not None:
            meta = self.result_meta
            if meta is None or not isinstance(out, torch.Tensor) or out.shape != meta[0] or out.dtype != meta[1] \
                    or out.device != meta[2]:
                check_out(out, self, self.pattern.name)  # raises, naming what is wrong
            if not (self.delivers_into and out.is_contiguous()):
                return out.copy_(self.launch(*inputs))
        if self._abort_epoch != ctx.abort_epoch:
            self._stale()
        plan = self.pattern.bind(ctx, self.buffers, *inputs)
        if out is not None:
            return self.scheduler.run(ctx, plan, self.workspace, out)
        if self.delivers_into:
            return self.scheduler.run(ctx, plan, self.workspace, self.new_result())
        result = self.scheduler.run(ctx, plan, self.workspace)
        return result.clone() if self.result_in_workspace else result

    def new_result(self) -> torch.Tensor | None:
        """A new dense tensor for a call's result, what a functional call without ``out``
        returns: the call writes it (:attr:`delivers_into`) or copies its workspace result into
        it. None where a call's result is no tensor, or is new already (outside any workspace:
        returned as it is)."""
        meta = self.result_meta
        if meta is None or not (self.delivers_into or self.result_in_workspace):
            return None
        like = self._result_like
        if like is None:
            return torch.empty(meta[0], dtype=meta[1], device=meta[2])
        return torch.empty_like(like, memory_format=torch.contiguous_format)

    def __repr__(self) -> str:
        return f"<iris_fw.ops.Op {self.pattern.name} via {self.scheduler.name} inputs={self.signature}>"
