"""``reduce_scatter(output, input)`` with Iris's semantics: ``output`` keeps the shape
``(M, N)`` of ``input``, and each rank writes the reduction only where it owns tiles — leaving
the rest of its ``output`` untouched.

Ownership follows Iris's kernels and ``Config``: the ``(M, N)`` matrix is cut into
``block_size_m x block_size_n`` tiles numbered in Iris's swizzled order (groups of
``swizzle_size`` tile rows, column by column within a group); with
``all_reduce_distribution=1`` (the default when ``config`` is None) rank ``r`` owns the
contiguous tile numbers ``[r*T', (r+1)*T')`` with ``T' = ceil(T / W)``, with ``0`` the tiles
``r, r+W, …``. Variants ``"inreg"``/``"twophase"`` own a flat chunk instead: elements
``[r*(M*N//W), (r+1)*(M*N//W))`` of the row-major matrix.

Mapped onto iris-fw: the flat-chunk variants are :func:`iris_fw.ccl.reduce_scatter_tensor`
into the rank's chunk; the tile variants reduce with :func:`iris_fw.ccl.all_reduce` into a
scratch copy and keep the owned tiles (Iris's ≥ 8 MiB shortcut through NCCL, which writes row
blocks ``[r*M/W, (r+1)*M/W)`` instead, is not reproduced: the tile ownership holds at every
size).
"""

from __future__ import annotations

import torch

import iris_fw

from .config import Config, resolve
from .utils import as_2d, context_of, group_rank_and_size, reduce_op


def owned_tiles(M: int, N: int, block_m: int, block_n: int, rank: int, world_size: int, *, group_m: int = 1,
                layout: str = "block", device=None) -> torch.Tensor:
    """Bool ``[M, N]``: the elements of the ``block_m x block_n`` tiles ``rank`` owns. Tiles are
    numbered in Iris's order (groups of ``group_m`` tile rows, column by column within a group;
    ``group_m=1`` is row-major). ``layout``: ``"block"`` — contiguous numbers, ``ceil(T/W)`` per
    rank; ``"block_floor"`` — ``floor(T/W)`` per rank, the last rank also the remainder;
    ``"stride"`` — numbers ``rank, rank+W, …``."""
    tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
    pm = torch.arange(tiles_m, device=device)[:, None]
    pn = torch.arange(tiles_n, device=device)[None, :]
    first = pm // group_m * group_m
    height = torch.clamp(tiles_m - first, max=group_m)
    tile_id = first * tiles_n + pn * height + (pm - first)  # inverse of Iris's grouped tile order
    total = tiles_m * tiles_n
    if layout == "stride":
        mine = tile_id % world_size == rank
    elif layout == "block":
        per_rank = -(-total // world_size)
        mine = (tile_id >= rank * per_rank) & (tile_id < (rank + 1) * per_rank)
    else:
        per_rank = total // world_size
        end = total if rank == world_size - 1 else (rank + 1) * per_rank
        mine = (tile_id >= rank * per_rank) & (tile_id < end)
    return mine.repeat_interleave(block_m, 0)[:M].repeat_interleave(block_n, 1)[:, :N]


def reduce_scatter(output_tensor, input_tensor, ctx, op=None, group=None, async_op=False, config=None,
                   workspace=None):
    """Reduce every rank's ``input_tensor (M, N)`` and write this rank's share into
    ``output_tensor (M, N)`` (see the module docstring for which elements are this rank's)."""
    config = resolve(config, Config(block_size_m=32, block_size_n=64, all_reduce_distribution=1))
    fw = context_of(ctx)
    rank, size = group_rank_and_size(group, fw)
    M, N = as_2d(input_tensor, "input_tensor").shape
    if tuple(as_2d(output_tensor, "output_tensor").shape) != (M, N) or output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"Output tensor {output_tensor.dtype}{tuple(output_tensor.shape)} does not match input "
                         f"{input_tensor.dtype}{(M, N)}: for reduce-scatter, output has the same shape as input")
    name = reduce_op(op)
    if config.reduce_scatter_variant in ("inreg", "twophase"):
        chunk = M * N // size
        iris_fw.ccl.reduce_scatter_tensor(output_tensor.view(-1)[rank * chunk:(rank + 1) * chunk],
                                          input_tensor.reshape(-1)[:size * chunk], name, group=group, ctx=fw)
        return workspace
    reduced = input_tensor.contiguous().clone()
    iris_fw.ccl.all_reduce(reduced, name, group=group, ctx=fw)
    mine = owned_tiles(M, N, config.block_size_m, config.block_size_n, rank, size, group_m=config.swizzle_size,
                       layout="stride" if config.all_reduce_distribution == 0 else "block", device=reduced.device)
    output_tensor.copy_(torch.where(mine, reduced, output_tensor))
    return workspace
