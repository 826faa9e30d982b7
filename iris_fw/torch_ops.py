"""iris-fw's public ops as ``torch.library`` custom ops, so a model that calls them traces under
``torch.compile(fullgraph=True)`` and replays in CUDA graphs.

Importing this module registers, in the ``iris_fw`` namespace (opt-in: nothing registers when
``iris_fw`` or ``iris_fw.ops`` is imported), the collectives of :mod:`iris_fw.ccl.torch_ops`
and::

    torch.ops.iris_fw.flash_decode(q, k, v, kv_lens=None, sm_scale=None, scheduler="auto", ranks=None,
                                   block_table=None) -> Tensor [B, Hq, Dv]   # iris_fw.flash_decode.flash_decode

Each is functional (returns a new tensor, mutates nothing); ``ranks`` is the group (``None``
or ``[]``: every rank). They run on the current context (:func:`iris_fw.context.current`). The
fake implementations give the output shapes, so tracing needs no communication. Under a CUDA
graph the usual rule holds: each distinct call runs once eagerly first (it is validated across
ranks and plans its kernel there).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import flash_decode as _fd
from .ccl import torch_ops as _ccl_ops  # noqa: F401  (registers the collectives)


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
