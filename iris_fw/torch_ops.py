"""The public ops and the collectives as ``torch.library`` custom ops, so a model that calls them
traces under ``torch.compile(fullgraph=True)`` and replays in CUDA graphs.

Importing this module (opt-in: ``import iris_fw.torch_ops``; nothing registers when ``iris_fw``
or ``iris_fw.ops`` is imported) registers, in the ``iris_fw`` namespace, the collectives of
:mod:`iris_fw.ccl.custom_ops` and the ops of :mod:`iris_fw.ops`::

    torch.ops.iris_fw.gemm_all_reduce(a, b, bias=None, scheduler="auto") -> Tensor      # [M, N]
    torch.ops.iris_fw.gemm_reduce_scatter(a, b, scheduler="auto") -> Tensor             # [M / W, N]
    torch.ops.iris_fw.gemm_all_scatter(a, b, scheduler="auto") -> Tensor                # [M, N/W * W]
    torch.ops.iris_fw.all_gather_gemm(a_shard, b, scheduler="auto") -> Tensor           # [M/W * W, N/W]
    torch.ops.iris_fw.flash_decode(q, k, v, kv_lens=None, sm_scale=None, scheduler="auto", ranks=None,
                                   block_table=None) -> Tensor [B, Hq, Dv]   # iris_fw.flash_decode.flash_decode

Each is functional (a new tensor, inputs unchanged) and runs on the current context
(:func:`iris_fw.context.current`); ``ranks`` is a group (``None`` or ``[]``: every rank). Fake
implementations give the shapes, so tracing needs no communication. Under a CUDA graph the usual
rule holds: each distinct call runs once eagerly first (that call plans its op or kernel,
validated across ranks).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import context as _context
from . import flash_decode as _fd
from . import ops as _ops
from .ccl import custom_ops as _ccl_custom_ops  # noqa: F401  (registers the collectives)


def _world() -> int:
    return _context.current().world_size


@torch.library.custom_op("iris_fw::gemm_all_reduce", mutates_args=())
def gemm_all_reduce(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                    scheduler: str = "auto") -> torch.Tensor:
    """``sum over ranks of a[M, K/W] @ b[K/W, N] (+ bias[N])`` on every rank."""
    return _ops.gemm_all_reduce(a, b, bias=bias, scheduler=scheduler)


@gemm_all_reduce.register_fake
def _gemm_all_reduce_fake(a, b, bias=None, scheduler="auto"):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("iris_fw::gemm_reduce_scatter", mutates_args=())
def gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, scheduler: str = "auto") -> torch.Tensor:
    """Rows ``rank*M/W …`` of ``sum over ranks of a[M, K/W] @ b[K/W, N]``."""
    return _ops.gemm_reduce_scatter(a, b, scheduler=scheduler)


@gemm_reduce_scatter.register_fake
def _gemm_reduce_scatter_fake(a, b, scheduler="auto"):
    return a.new_empty((a.shape[0] // _world(), b.shape[1]))


@torch.library.custom_op("iris_fw::gemm_all_scatter", mutates_args=())
def gemm_all_scatter(a: torch.Tensor, b: torch.Tensor, scheduler: str = "auto") -> torch.Tensor:
    """``a[M, K] @ b[K, N/W]`` gathered column-wise: ``[M, N]``."""
    return _ops.gemm_all_scatter(a, b, scheduler=scheduler)


@gemm_all_scatter.register_fake
def _gemm_all_scatter_fake(a, b, scheduler="auto"):
    return a.new_empty((a.shape[0], b.shape[1] * _world()))


@torch.library.custom_op("iris_fw::all_gather_gemm", mutates_args=())
def all_gather_gemm(a_shard: torch.Tensor, b: torch.Tensor, scheduler: str = "auto") -> torch.Tensor:
    """``all_gather(a_shard[M/W, K]) @ b[K, N/W]``: ``[M, N/W]``."""
    return _ops.all_gather_gemm(a_shard, b, scheduler=scheduler)


@all_gather_gemm.register_fake
def _all_gather_gemm_fake(a_shard, b, scheduler="auto"):
    return a_shard.new_empty((a_shard.shape[0] * _world(), b.shape[1]))


@torch.library.custom_op("iris_fw::flash_decode", mutates_args=())
def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor] = None,
                 sm_scale: Optional[float] = None, scheduler: str = "auto", ranks: Optional[list[int]] = None,
                 block_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode attention over a sequence split across the ranks (:func:`iris_fw.flash_decode.flash_decode`):
    ``q [B, Hq, D]``, ``k [B, S_r, Hkv, D]``, ``v [B, S_r, Hkv, Dv]`` (or paged, with
    ``block_table``) → ``[B, Hq, Dv]``."""
    return _fd.flash_decode(q, k, v, kv_lens=kv_lens, sm_scale=sm_scale, scheduler=scheduler,
                            block_table=block_table, group=list(ranks) if ranks else None)


@flash_decode.register_fake
def _flash_decode_fake(q, k, v, kv_lens=None, sm_scale=None, scheduler="auto", ranks=None, block_table=None):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[3]))
