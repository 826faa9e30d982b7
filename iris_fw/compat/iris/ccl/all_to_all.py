"""``all_to_all`` on column chunks: ``input (M, N * W)``'s columns ``[r*N, (r+1)*N)`` go to
rank ``r``, which stores what rank ``s`` sent into its ``output`` columns ``[s*N, (s+1)*N)``
— :func:`iris_fw.ccl.all_to_all_single` on the chunks laid out as rows."""

from __future__ import annotations

import iris_fw

from .config import Config, resolve
from .utils import as_2d, context_of, group_rank_and_size


def all_to_all(output_tensor, input_tensor, ctx, group=None, async_op=False, config=None):
    """Column-chunked all-to-all of ``(M, N * world_size)`` tensors (Iris's layout)."""
    resolve(config, Config(block_size_m=32, block_size_n=128))
    fw = context_of(ctx)
    _, size = group_rank_and_size(group, fw)
    M, cols = as_2d(input_tensor, "input_tensor").shape
    if tuple(as_2d(output_tensor, "output_tensor").shape) != (M, cols) or cols % size:
        raise ValueError(f"input_tensor and output_tensor must both be (M, N * world_size) with world_size={size}, "
                         f"got {tuple(input_tensor.shape)} and {tuple(output_tensor.shape)}")
    n = cols // size
    rows_in = input_tensor.reshape(M, size, n).permute(1, 0, 2).contiguous()  # [W, M, N]: chunk r → row block r
    rows_out = rows_in.new_empty(rows_in.shape)
    iris_fw.ccl.all_to_all_single(rows_out, rows_in, group=group, ctx=fw)
    output_tensor.copy_(rows_out.permute(1, 0, 2).reshape(M, cols))
