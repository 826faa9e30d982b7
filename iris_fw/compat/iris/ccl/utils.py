"""Iris's ``iris.ccl.utils``: :class:`ReduceOp` and the mapping of reductions and groups onto
:mod:`iris_fw.ccl`."""

from __future__ import annotations

from enum import IntEnum

import torch

import iris_fw


class ReduceOp(IntEnum):
    """Iris's reduction names (torch.distributed's). Iris runs only ``SUM``; iris-fw also runs
    ``PRODUCT``, ``MIN`` and ``MAX``; the bitwise ones raise ``ValueError``."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6


_IRIS_FW_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}


def reduce_op(op) -> str:
    """iris-fw's name of the reduction ``op`` (``None``: sum)."""
    if op is None:
        return "sum"
    try:
        return _IRIS_FW_OPS[ReduceOp(op)]
    except (KeyError, ValueError):
        raise ValueError(f"op must be ReduceOp.SUM, PRODUCT, MIN or MAX, got {op!r}") from None


def context_of(shmem) -> iris_fw.Context:
    """The iris-fw context behind an Iris host object (or the context itself)."""
    return shmem if isinstance(shmem, iris_fw.Context) else shmem.ctx


def group_rank_and_size(group, ctx) -> tuple[int, int]:
    """This rank's position in ``group`` (``None``: every rank; or a torch ``ProcessGroup``) and
    the group's size."""
    if group is None:
        return ctx.rank, ctx.world_size
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group)
    return ranks.index(ctx.rank), len(ranks)


def as_2d(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor (M, N), got "
                         f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t
