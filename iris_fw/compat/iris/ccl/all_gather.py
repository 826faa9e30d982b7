"""``all_gather``: every rank's ``input (M, N)`` concatenated along rows into ``output
(world_size * M, N)`` — :func:`iris_fw.ccl.all_gather_into_tensor`."""

from __future__ import annotations

import iris_fw

from .config import Config, resolve
from .utils import as_2d, context_of, group_rank_and_size


def all_gather(output_tensor, input_tensor, ctx, group=None, async_op=False, config=None):
    """``output_tensor (W*M, N)`` = every rank's ``input_tensor (M, N)`` in rank order.
    ``async_op`` is accepted: iris-fw's collectives are ordered on the stream either way."""
    resolve(config, Config())
    fw = context_of(ctx)
    _, size = group_rank_and_size(group, fw)
    M, N = as_2d(input_tensor, "input_tensor").shape
    if tuple(as_2d(output_tensor, "output_tensor").shape) != (size * M, N):
        raise ValueError(f"output_tensor must have shape (world_size * M, N) = {(size * M, N)}, "
                         f"got {tuple(output_tensor.shape)}")
    iris_fw.ccl.all_gather_into_tensor(output_tensor, input_tensor, group=group, ctx=fw)
