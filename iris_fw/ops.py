"""Public compute + communication operations: a pattern run by a scheduler.

Each function is collective (every rank calls it with same-shaped inputs) and returns this
rank's result::

    c = iris_fw.ops.gemm_all_scatter(a, b_local)              # [M, K] @ [K, N/W] -> [M, N]
    c = iris_fw.ops.all_gather_gemm(a_shard, b_local)         # [M/W, K] gathered @ [K, N/W] -> [M, N/W]
    c = iris_fw.ops.gemm_reduce_scatter(a_local, b_local)     # [M, K/W] @ [K/W, N] summed -> [M/W, N]

``scheduler`` is a registered scheduler's name (``bulk_sync``, ``producer_consumer``,
``fused_sequential``, ``wg_specialized``, or a plugin's) or ``"auto"``: the schedule (with its
SM split and tile configuration) measured fastest for the shape (:data:`AUTO`), else the
default for the pattern's kind. ``comm_sms``
sets the SM split of the two-role schedules; ``config`` a :class:`~iris_fw.gemm.GemmConfig`.

The functions allocate their workspace per call. In a loop, make an :class:`Op` once with
:func:`plan` and call it: it keeps its workspace (the returned tensor is the op's output
buffer, overwritten by the next call).
"""

from __future__ import annotations

from typing import Any

import torch

from . import context as _context
from .gemm import GemmConfig, matmul
from .overlap import PatternError, Scheduler

__all__ = ["AUTO", "Op", "all_gather_gemm", "gemm_all_scatter", "gemm_reduce_scatter", "matmul", "plan"]

#: Scheduler per (pattern, world size, global M, N, K) measured fastest on 4x H200, bf16
#: (docs/performance.md, "Taxonomy"; docs/results/2026-11-21_4xH200_taxonomy*). Shapes not
#: listed use :data:`DEFAULT_SCHEDULER`. A value is ``(scheduler, comm_sms, config)``:
#: ``comm_sms`` None means the default estimate, ``config`` None the default tile configuration.
AUTO: dict[tuple, tuple[str, int | None, GemmConfig | None]] = {
    ("gemm_all_scatter", 4, 8192, 28672, 8192): ("producer_consumer", None, None),
    ("gemm_all_scatter", 4, 4096, 8192, 8192): ("producer_consumer", 16, GemmConfig(128, 128, 64, 8, 8, 4)),
    ("gemm_all_scatter", 4, 1024, 8192, 8192): ("fused_sequential", None, None),
    ("gemm_all_scatter", 4, 8192, 4608, 36864): ("producer_consumer", 16, None),
    ("all_gather_gemm", 4, 8192, 28672, 8192): ("copy_engine", None, None),
    ("all_gather_gemm", 4, 16384, 14336, 4096): ("producer_consumer", 8, None),
    ("gemm_reduce_scatter", 4, 8192, 8192, 28672): ("producer_consumer", 8, None),
}

#: The input dtypes :data:`AUTO` was measured for (16-bit: the same tensor-core rate).
TUNED_DTYPES = (torch.bfloat16, torch.float16)

#: Default when a shape was not measured (the schedules that won most often on 4x H200):
#: compute-first patterns send each tile from registers as soon as it exists; communicate-first
#: ones fetch on a few SMs (a second kernel) while the others compute.
DEFAULT_SCHEDULER = {True: "producer_consumer", False: "fused_sequential"}


class Op:
    """A pattern bound to a scheduler, input shapes and a workspace on ``ctx``'s heap.

    Creating one is collective (it allocates symmetric buffers); so is every call.
    """

    def __init__(self, pattern: str, *inputs: Any, ctx=None, scheduler: str = "auto",
                 config: GemmConfig | None = None, comm_sms: int | None = None):
        self.ctx = ctx if ctx is not None else _context.current()
        regs = self.ctx.registries
        self.pattern = regs.pattern.require_available(pattern)
        self.shape = self.pattern.shape(self.ctx, *inputs)
        if config is not None and not isinstance(config, GemmConfig):
            raise TypeError(f"config must be an iris_fw.gemm.GemmConfig or None, got {type(config).__name__}")
        if not isinstance(scheduler, str):
            raise TypeError(f"scheduler must be a scheduler name or 'auto', got {scheduler!r}")
        if scheduler == "auto":
            scheduler, tuned_sms, tuned_config = self._auto(getattr(inputs[0], "dtype", None) if inputs else None)
            comm_sms = tuned_sms if comm_sms is None else comm_sms
            config = tuned_config if config is None else config
        self.scheduler: Scheduler = regs.scheduler.require_available(scheduler)
        self.comm_sms = comm_sms
        self.buffers = self.pattern.setup(self.ctx, self.shape, config, self.scheduler.uses_stash)
        first = self.pattern.bind(self.ctx, self.buffers, *inputs)
        ok, why = self.scheduler.supports(first)
        if not ok:
            raise PatternError(f"scheduler {self.scheduler.name!r} cannot run {self.pattern.name}: {why}")
        self.workspace = self.scheduler.workspace(self.ctx, first.num_chunks or first.num_tiles)
        if comm_sms is not None:
            self.scheduler.split(self.ctx, first, comm_sms)  # validate now, not at the first call

    def _auto(self, dtype) -> tuple[str, int | None, GemmConfig | None]:
        key = (self.pattern.name, self.ctx.world_size, *self.pattern.global_shape(self.shape, self.ctx.world_size))
        if key in AUTO and self.ctx.device.type == "cuda" and dtype in TUNED_DTYPES:
            return AUTO[key]
        return DEFAULT_SCHEDULER[self.pattern.comm_first], None, None

    def __call__(self, *inputs: Any):
        shape = self.pattern.shape(self.ctx, *inputs)
        if shape != self.shape:
            raise ValueError(f"this {self.pattern.name} op was planned for inputs of shape/dtype {self.shape}, got {shape}")
        plan_ = self.pattern.bind(self.ctx, self.buffers, *inputs)
        return self.scheduler.run(self.ctx, plan_, self.workspace, self.comm_sms)

    def __repr__(self) -> str:
        return f"<iris_fw.ops.Op {self.pattern.name} via {self.scheduler.name} shape={self.shape}>"


def plan(pattern: str, *inputs: Any, ctx=None, scheduler: str = "auto", config: GemmConfig | None = None,
         comm_sms: int | None = None) -> Op:
    """An :class:`Op` for ``pattern`` on inputs shaped like ``inputs``."""
    return Op(pattern, *inputs, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)


def gemm_all_scatter(a, b, *, ctx=None, scheduler: str = "auto", config: GemmConfig | None = None,
                     comm_sms: int | None = None):
    """``a[M, K] @ b[K, N/W]`` on every rank, gathered column-wise: returns ``C[M, N]`` (on the
    symmetric heap), column block ``r`` being rank ``r``'s product."""
    return plan("gemm_all_scatter", a, b, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)(a, b)


def all_gather_gemm(a_shard, b, *, ctx=None, scheduler: str = "auto", config: GemmConfig | None = None,
                    comm_sms: int | None = None):
    """``all_gather(a_shard[M/W, K]) @ b[K, N/W]``: returns ``C[M, N/W]``."""
    return plan("all_gather_gemm", a_shard, b, ctx=ctx, scheduler=scheduler, config=config,
                comm_sms=comm_sms)(a_shard, b)


def gemm_reduce_scatter(a, b, *, ctx=None, scheduler: str = "auto", config: GemmConfig | None = None,
                        comm_sms: int | None = None):
    """``sum over ranks of a[M, K/W] @ b[K/W, N]``, rows ``rank*M/W …``: returns ``[M/W, N]``."""
    return plan("gemm_reduce_scatter", a, b, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)(a, b)
