"""``all_reduce(output, input)``: every rank's ``input`` reduced into ``output`` —
:func:`iris_fw.ccl.all_reduce` on ``output`` (after copying ``input`` into it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import iris_fw

from .config import Config, resolve
from .utils import context_of, reduce_op

#: Iris's all-reduce variants → iris-fw's algorithm names ("atomic" and "spinlock" have none).
_ALGORITHMS = {"one_shot": "one_shot", "two_shot": "two_shot", "ring": "ring", "atomic": "auto", "spinlock": "auto"}


@dataclass
class AllReduceWorkspace:
    """What ``all_reduce_preamble`` prepared: the call's shape, dtype and variant. iris-fw keeps
    the buffers of a collective with its group (planned once per call signature), so the
    workspace holds no tensors."""

    shape: tuple = ()
    dtype: torch.dtype | None = None
    variant: str = ""
    prepared: bool = False


def _check(output_tensor, input_tensor) -> None:
    for name, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if output_tensor.shape != input_tensor.shape or output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"output_tensor and input_tensor must have the same shape and dtype, got "
                         f"{output_tensor.dtype}{list(output_tensor.shape)} and {input_tensor.dtype}{list(input_tensor.shape)}")


def all_reduce_preamble(output_tensor, input_tensor, ctx, config=None, workspace=None):
    """Validate the call and return a workspace to pass to :func:`all_reduce` (reused if given)."""
    config = resolve(config, Config(block_size_m=32, block_size_n=64, all_reduce_distribution=1))
    _check(output_tensor, input_tensor)
    workspace = workspace if workspace is not None else AllReduceWorkspace()
    workspace.shape, workspace.dtype = tuple(input_tensor.shape), input_tensor.dtype
    workspace.variant, workspace.prepared = config.all_reduce_variant, True
    return workspace


def all_reduce(output_tensor, input_tensor, ctx, op=None, group=None, async_op=False, config=None, workspace=None):
    """``output_tensor`` = ``op`` (default sum) of every rank's ``input_tensor``, same shape;
    ``output_tensor`` may be ``input_tensor``. Returns the workspace."""
    config = resolve(config, Config(block_size_m=32, block_size_n=64, all_reduce_distribution=1))
    workspace = all_reduce_preamble(output_tensor, input_tensor, ctx, config, workspace)
    name = reduce_op(op)
    if output_tensor.data_ptr() != input_tensor.data_ptr():
        output_tensor.copy_(input_tensor)
    iris_fw.ccl.all_reduce(output_tensor, name, group=group, algorithm=_ALGORITHMS[config.all_reduce_variant],
                           ctx=context_of(ctx))
    return workspace
