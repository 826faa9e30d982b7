"""The collectives as ``torch.library`` custom ops, so a model that calls them traces under
``torch.compile(fullgraph=True)`` and replays in CUDA graphs.

Importing this module registers, in the ``iris_fw`` namespace (opt-in: ``import
iris_fw.ccl.custom_ops``; nothing registers when ``iris_fw`` or ``iris_fw.ccl`` is imported)::

    torch.ops.iris_fw.all_reduce(x, op="sum", ranks=None, algorithm="auto") -> Tensor
    torch.ops.iris_fw.all_gather_into_tensor(x, ranks=None, algorithm="auto") -> Tensor   # [W * d0, ...]
    torch.ops.iris_fw.reduce_scatter_tensor(x, op="sum", ranks=None, algorithm="auto") -> Tensor  # [d0 / W, ...]
    torch.ops.iris_fw.all_reduce_rmsnorm(x, residual, weight, eps, ranks=None, algorithm="auto") -> (out, residual)

Each is *functional* (returns new tensors, mutates nothing), as compilers want; ``ranks`` is
the group (``None`` or ``[]``: every rank), ``op`` a reduction name. They run on the current context
(:func:`iris_fw.context.current`). Their fake (meta) implementations give the output shapes,
so tracing needs no communication. Under a CUDA graph the usual rule holds: each distinct call
runs once eagerly first (that call is validated across ranks and plans its kernel).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import context as _context
from ..errors import ArgumentError
from . import api
from .fused import all_reduce_rmsnorm as _all_reduce_rmsnorm


def _group(ranks: list[int]):
    return list(ranks) if ranks else None


def _world(ranks: list[int]) -> int:
    return len(ranks) if ranks else _context.current().world_size


@torch.library.custom_op("iris_fw::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, op: str = "sum", ranks: Optional[list[int]] = None, algorithm: str = "auto") -> torch.Tensor:
    """``x`` reduced over the group (a new tensor; ``x`` is unchanged)."""
    out = x.contiguous().clone()
    api.all_reduce(out, op=op, group=_group(ranks), algorithm=algorithm)
    return out


@all_reduce.register_fake
def _all_reduce_fake(x, op="sum", ranks=None, algorithm="auto"):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("iris_fw::all_gather_into_tensor", mutates_args=())
def all_gather_into_tensor(x: torch.Tensor, ranks: Optional[list[int]] = None, algorithm: str = "auto") -> torch.Tensor:
    """Every rank's ``x[d0, ...]`` concatenated along dim 0: ``[W * d0, ...]``."""
    x = x.contiguous()
    out = x.new_empty((_world(ranks) * x.shape[0], *x.shape[1:]))
    api.all_gather_into_tensor(out, x, group=_group(ranks), algorithm=algorithm)
    return out


@all_gather_into_tensor.register_fake
def _all_gather_fake(x, ranks=None, algorithm="auto"):
    return x.new_empty((_world(ranks) * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("iris_fw::reduce_scatter_tensor", mutates_args=())
def reduce_scatter_tensor(x: torch.Tensor, op: str = "sum", ranks: Optional[list[int]] = None,
                          algorithm: str = "auto") -> torch.Tensor:
    """Group rank ``r``'s chunk ``r`` (along dim 0) of ``x`` reduced over the group:
    ``[d0 / W, ...]``."""
    x = x.contiguous()
    w = _world(ranks)
    if x.shape[0] % w:
        raise ArgumentError(f"reduce_scatter_tensor: dim 0 of x ({x.shape[0]}) must divide by the group size {w}")
    out = x.new_empty((x.shape[0] // w, *x.shape[1:]))
    api.reduce_scatter_tensor(out, x, op=op, group=_group(ranks), algorithm=algorithm)
    return out


@reduce_scatter_tensor.register_fake
def _reduce_scatter_fake(x, op="sum", ranks=None, algorithm="auto"):
    return x.new_empty((x.shape[0] // _world(ranks), *x.shape[1:]))


@torch.library.custom_op("iris_fw::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                       ranks: Optional[list[int]] = None, algorithm: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``h = all_reduce(x) + residual``; returns ``(rmsnorm(h) * weight, h)`` as new tensors."""
    res = residual.contiguous().clone()
    out, res = _all_reduce_rmsnorm(x.contiguous(), res, weight.contiguous(), eps, group=_group(ranks),
                                   algorithm=algorithm)
    return out, res


@all_reduce_rmsnorm.register_fake
def _all_reduce_rmsnorm_fake(x, residual, weight, eps=1e-6, ranks=None, algorithm="auto"):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        residual, memory_format=torch.contiguous_format)
