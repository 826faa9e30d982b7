"""Ops: a pattern bound to a scheduler, input shapes and a workspace, validated across ranks once.

Creating an :class:`Op` is collective and is the only moment ranks talk on the host: one small
exchange compares pattern, scheduler, shapes, dtypes, device type, configuration and SM split
(a mismatch, or a rank whose inputs are invalid, raises on every rank naming the ranks and the
argument) and reclaims heap blocks every rank has freed. Afterwards a call validates its inputs
locally, binds them and enqueues the kernels — no host synchronization, and every per-call
counter lives on the device, so calls can be captured in a CUDA graph.

:class:`OpCache` keeps the ops of ``iris_fw.ops.<name>(...)`` calls by their arguments, so a
loop plans (and allocates) once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .. import context as _context
from .. import env
from ..errors import ArgumentError, ArgumentTypeError, IrisError
from .contract import PatternError, input_fingerprint, labelled_signature
from .scheduler import Scheduler
from .tuning import lookup

#: Ops an :class:`OpCache` keeps (``IRIS_FW_OP_CACHE_SIZE`` overrides).
DEFAULT_OP_CACHE_SIZE = env.variable("IRIS_FW_OP_CACHE_SIZE").default


class Op:
    """A pattern bound to a scheduler, input shapes and a workspace on ``ctx``'s heap.

    Creating one is collective (it validates across ranks and allocates symmetric buffers); so
    is every call. A call returns the op's output buffer, overwritten by the next call. A call
    that fails on this rank's host aborts the job's waits (:meth:`iris_fw.Context.abort`), so
    the other ranks raise at once instead of waiting for this one.
    ``buffers`` holds the pattern's buffers (e.g. ``"out"``)."""

    def __init__(self, pattern: str, *inputs: Any, ctx=None, scheduler: str = "auto", config=None,
                 comm_sms: int | None = None):
        self.ctx = _context.resolve(ctx)
        self._abort_epoch = self.ctx.abort_epoch
        label = f"iris_fw.ops {pattern}"
        fields, error = {}, None
        try:
            self.pattern = self.ctx.registries.pattern.require_available(pattern)
            self.signature = self.pattern.signature(self.ctx, *inputs)
            if not isinstance(scheduler, str):
                raise ArgumentTypeError(f"scheduler must be a scheduler name or 'auto', got {scheduler!r}")
            requested = scheduler
            if scheduler == "auto":
                choice = lookup(self.pattern, self.signature, self.ctx)
                scheduler = choice.scheduler
                comm_sms = choice.comm_sms if comm_sms is None else comm_sms
                if config is None and choice.config is not None:
                    config = self.pattern.Config(**choice.config)
            if config is not None and not isinstance(config, self.pattern.Config):
                raise ArgumentTypeError(f"config must be an {self.pattern.Config.__module__}.{self.pattern.Config.__name__} "
                                        f"or None, got {type(config).__name__}")
            self.scheduler: Scheduler = self.ctx.registries.scheduler.require_available(scheduler)
            fields = {"pattern": pattern, "scheduler": scheduler if requested == scheduler else (requested, scheduler),
                      **labelled_signature(self.pattern, self.signature), "config": config, "comm_sms": comm_sms,
                      "device": self.ctx.device.type}
        except Exception as exc:  # every rank must hear of it, or the others would wait for this one
            error = exc
        self.ctx.agree(label, fields, error)
        self.comm_sms = comm_sms
        if config is None:
            config = self.pattern.default_config(self.ctx, self.signature)
        self.config = config
        self.buffers = self.pattern.setup(self.ctx, self.signature, config, self.scheduler.uses_stash)
        first = self.pattern.bind(self.ctx, self.buffers, *inputs)
        ok, why = self.scheduler.supports(first)
        if not ok:
            raise PatternError(f"scheduler {self.scheduler.name!r} cannot run {self.pattern.name}: {why}")
        self.workspace = self.scheduler.workspace(self.ctx, first, comm_sms)
        self.workspace.name = f"{self.pattern.name}/{self.scheduler.name}"  # labels its kernels in traces
        self._track_counters()
        # inputs whose signature was checked: a call with the same shapes, dtypes and devices
        # skips the pattern's check (see Pattern.signature)
        self._checked = input_fingerprint(inputs)

    def _track_counters(self) -> None:
        """Let a rank waiting on the host see that a peer launched this op's kernels while it did
        not (its programs' epoch counters live in the state regions on the heap; iris_fw.calls)."""
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

    def _check_armed(self) -> None:
        if self._abort_epoch != self.ctx.abort_epoch:  # every rank knows it alike: no abort for this one
            raise IrisError(f"this {self.pattern.name} op was planned before the job was aborted and re-armed: "
                            "its per-call device state may differ across ranks; plan it again (iris_fw.ops."
                            f"{self.pattern.name}(...) calls re-plan by themselves)")

    def __call__(self, *inputs: Any):
        if self.ctx.closed:
            self.ctx._check_open()  # raises: the op's buffers belong to a closed context
        self._check_armed()
        try:
            fingerprint = input_fingerprint(inputs)
            try:
                same = fingerprint == self._checked
            except Exception:  # an input whose == is not a bool (an array): check it in full
                same = False
            if not same:
                signature = self.pattern.signature(self.ctx, *inputs)
                if signature != self.signature:
                    raise PatternError(f"this {self.pattern.name} op was planned for inputs {self.signature}, "
                                       f"got {signature}")
                self._checked = fingerprint
            return self.launch(*inputs)
        except Exception as exc:
            # the other ranks are (or will be) in this call's kernels, waiting for this one
            self.ctx.abort(f"iris_fw.ops {self.pattern.name}: {type(exc).__name__}: {exc}")
            raise

    def launch(self, *inputs: Any):
        """Enqueue a call on ``inputs`` already known to match the op's signature (what
        :meth:`__call__` checks first; :class:`OpCache` found the op by that signature)."""
        self._check_armed()
        plan = self.pattern.bind(self.ctx, self.buffers, *inputs)
        return self.scheduler.run(self.ctx, plan, self.workspace)

    def __repr__(self) -> str:
        return f"<iris_fw.ops.Op {self.pattern.name} via {self.scheduler.name} inputs={self.signature}>"


class OpCache:
    """Ops by ``(pattern, scheduler, config, comm_sms, input signature)``, least recently used
    dropped beyond ``capacity`` (default :data:`DEFAULT_OP_CACHE_SIZE`, or
    ``IRIS_FW_OP_CACHE_SIZE``). A dropped op's heap blocks are reclaimed at the next collective
    point (the next op created, or a barrier). Every rank makes the same calls, so every rank
    keeps and drops the same ops."""

    def __init__(self, capacity: int | None = None):
        if capacity is None:
            capacity = env.get("IRIS_FW_OP_CACHE_SIZE")
        if capacity < 1:
            raise ArgumentError(f"op cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ops: OrderedDict = OrderedDict()

    def get(self, ctx, pattern: str, inputs: tuple, scheduler: str, config, comm_sms) -> Op:
        """The cached op for these arguments, planned (collectively) on a miss."""
        try:
            signature = ctx.registries.pattern.get(pattern).signature(ctx, *inputs)
        except Exception:  # planning repeats the check inside the exchange, so every rank raises
            return Op(pattern, *inputs, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)
        key = (pattern, scheduler, config, comm_sms, signature)
        op = self._ops.get(key)
        if op is None:
            op = Op(pattern, *inputs, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)
            self._ops[key] = op
            while len(self._ops) > self.capacity:
                self._ops.popitem(last=False)
        else:
            self._ops.move_to_end(key)
        return op

    def __len__(self) -> int:
        return len(self._ops)

    def clear(self) -> None:
        """Drop every op (local; every rank does it at the same point)."""
        self._ops.clear()
