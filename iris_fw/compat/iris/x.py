"""Iris's earlier tile-level API ``iris.x``: the types of :mod:`.tiles` and the tile collectives
as functions taking the device context last (``iris.x.all_gather(tile, dst_view, dim, ctx)``).
Each calls the :class:`~.tiles.DeviceContext` method of the same name. ``iris.x.DeviceContext``
is built directly, ``DeviceContext(rank, world_size, heap_bases)``; views come from
``make_tensor_view`` (a ``TensorView`` takes tensors for its sizes and strides)."""

import triton
import triton.language as tl

from .tiles import DeviceContext, Tile, TileView, TensorView, make_tensor_view, tile_layout  # noqa: F401


@triton.jit
def all_gather(tile, dst_view, dim: tl.constexpr, ctx):
    ctx.all_gather(tile, dst_view, dim)


@triton.jit
def all_reduce_atomic(tile, dst_view, ctx):
    ctx.all_reduce_atomic(tile, dst_view)


@triton.jit
def all_reduce_spinlock(tile, dst_view, locks, ctx):
    ctx.all_reduce_spinlock(tile, dst_view, locks)


@triton.jit
def all_reduce_one_shot(tile, src_view, dst_view, locks, ctx):
    ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)


@triton.jit
def all_reduce_two_shot(tile, src_view, dst_view, locks, ctx):
    ctx.all_reduce_two_shot(tile, src_view, dst_view, locks)


@triton.jit
def all_reduce_ring(tile, src_view, dst_view, ctx):
    ctx.all_reduce_ring(tile, src_view, dst_view)


@triton.jit
def gather(tile, src_view, source_rank: tl.constexpr, ctx):
    return ctx.gather(tile, src_view, source_rank)


@triton.jit
def all_to_all(tile, src_view, dst_view, N_per_rank: tl.constexpr, ctx):
    ctx.all_to_all(tile, src_view, dst_view, N_per_rank)


@triton.jit
def reduce_scatter(tile, src_view, dst_view, locks, ctx):
    ctx.reduce_scatter(tile, src_view, dst_view, locks)
