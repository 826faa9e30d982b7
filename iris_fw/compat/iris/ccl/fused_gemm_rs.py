"""``gemm_reduce_scatter`` for row-parallel tensor parallelism: every rank's
``input [tokens, H_shard] @ weight_shard [H_shard, K]``, summed over ranks, each rank keeping
its column block ``[tokens, K/W]`` (columns ``[r*K/W, (r+1)*K/W)``). Products are accumulated
in fp32 and reduced in fp32, as Iris does; the result has ``input``'s dtype.

Mapped onto iris-fw: a local ``torch.matmul`` and :func:`iris_fw.ccl.reduce_scatter_tensor` over
the transposed partial products (column blocks become row blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import iris_fw

from .config import Config, resolve
from .utils import as_2d, context_of, group_rank_and_size


@dataclass
class GemmReduceScatterWorkspace:
    """``output_f32 [tokens, K/W]``: this rank's fp32 result of the last call."""

    output_f32: torch.Tensor | None = None


def gemm_reduce_scatter_preamble(input_tensor, weight_shard, shmem, config=None, workspace=None):
    """A workspace whose ``output_f32`` fits ``(input_tensor, weight_shard)`` (reused if it does)."""
    fw = context_of(shmem)
    workspace = workspace if workspace is not None else GemmReduceScatterWorkspace()
    shape = (input_tensor.shape[0], weight_shard.shape[1] // fw.world_size)
    if workspace.output_f32 is None or tuple(workspace.output_f32.shape) != shape:
        workspace.output_f32 = torch.zeros(shape, dtype=torch.float32, device=fw.device)
    return workspace


def gemm_reduce_scatter(input_tensor, weight_shard, shmem, group=None, async_op=False, config=None, workspace=None):
    """This rank's column block ``[tokens, K/W]`` of ``sum_r input_r @ weight_shard_r``."""
    resolve(config, Config(block_size_m=128, block_size_n=128))
    fw = context_of(shmem)
    _, size = group_rank_and_size(group, fw)
    tokens, h_shard = as_2d(input_tensor, "input_tensor").shape
    if as_2d(weight_shard, "weight_shard").shape[0] != h_shard:
        raise ValueError(f"weight_shard.shape[0] ({weight_shard.shape[0]}) must match input_tensor.shape[1] "
                         f"({h_shard}): inner dimension mismatch.")
    K = weight_shard.shape[1]
    if K % size:
        raise ValueError(f"weight output dim K ({K}) must be divisible by world_size ({size}).")
    workspace = gemm_reduce_scatter_preamble(input_tensor, weight_shard, shmem, config, workspace)
    partial_t = torch.matmul(input_tensor.float(), weight_shard.float()).t().contiguous()  # [K, tokens]
    block_t = partial_t.new_empty(K // size, tokens)
    iris_fw.ccl.reduce_scatter_tensor(block_t, partial_t, group=group, ctx=fw)
    workspace.output_f32.copy_(block_t.t())
    return workspace.output_f32.to(input_tensor.dtype)
