"""``all_reduce(output, input)``: every rank's ``input`` reduced into ``output`` —
:func:`iris_fw.ccl.all_reduce` on ``output`` (after copying ``input`` into it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import iris_fw

from .config import AUTOTUNE, Config, resolve
from .utils import context_of, reduce_op

#: Iris's all-reduce variants → iris-fw's algorithm names ("atomic" and "spinlock" have none).
_ALGORITHMS = {"one_shot": "one_shot", "two_shot": "two_shot", "ring": "ring", "atomic": "auto", "spinlock": "auto"}


@dataclass
class AllReduceWorkspace:
    """What ``all_reduce_preamble`` prepared: the call's shape, dtype and variant, and — as in
    Iris — the per-tile synchronization arrays its variant needs, zeroed int32 heap tensors:
    ``locks`` (``spinlock``: one per ``block_size_m x block_size_n`` tile) and ``flags``
    (``ring``: one per tile). iris-fw's own all-reduce keeps its buffers with its group, so
    these arrays serve Iris's capacity check only: a later call whose config needs more tiles
    than they hold raises ``ValueError`` (Iris does not reallocate on the hot path)."""

    shape: tuple = ()
    dtype: torch.dtype | None = None
    variant: str = ""
    locks: torch.Tensor | None = None
    flags: torch.Tensor | None = None
    num_rings: int = 1
    flags_per_tile: int = 0
    prepared: bool = False


def _tiles(shape, config) -> int:
    """Tiles of ``config``'s block sizes over ``shape[:2]`` (Iris's ``M, N``)."""
    M, N = (tuple(shape) + (1, 1))[:2]
    return -(-M // config.block_size_m) * -(-N // config.block_size_n)


def _check(output_tensor, input_tensor) -> None:
    for name, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if output_tensor.shape != input_tensor.shape or output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"output_tensor and input_tensor must have the same shape and dtype, got "
                         f"{output_tensor.dtype}{list(output_tensor.shape)} and {input_tensor.dtype}{list(input_tensor.shape)}")


_DEFAULT = dict(block_size_m=32, block_size_n=64, all_reduce_distribution=1)


def all_reduce_preamble(output_tensor, input_tensor, ctx, config=None, workspace=None):
    """Validate the call and return a workspace to pass to :func:`all_reduce` (reused if given).
    Collective (it may allocate heap arrays, as Iris's does). Like Iris, it zeroes
    ``output_tensor`` for the variants that accumulate into it (``atomic``, ``spinlock``,
    ``one_shot``, ``ring``) unless it is ``input_tensor`` itself."""
    config = resolve(config, Config(**_DEFAULT))
    _check(output_tensor, input_tensor)
    fw = context_of(ctx)
    workspace = workspace if workspace is not None else AllReduceWorkspace()
    variant = config.all_reduce_variant
    workspace.shape, workspace.dtype = tuple(input_tensor.shape), input_tensor.dtype
    workspace.variant, workspace.num_rings = variant, config.all_reduce_num_rings
    tiles = _tiles(workspace.shape, config)
    if variant == "spinlock":
        if workspace.locks is None or workspace.locks.numel() != tiles:
            workspace.locks = fw.zeros(tiles, dtype=torch.int32)
        else:
            workspace.locks.zero_()
    if variant == "ring":
        workspace.flags_per_tile = 1
        if workspace.flags is None or workspace.flags.numel() != tiles * workspace.flags_per_tile:
            workspace.flags = fw.zeros(tiles * workspace.flags_per_tile, dtype=torch.int32)
        else:
            workspace.flags.zero_()
    if variant in ("atomic", "spinlock", "one_shot", "ring") and output_tensor.data_ptr() != input_tensor.data_ptr():
        output_tensor.zero_()
    workspace.prepared = True
    return workspace


def _check_capacity(workspace: AllReduceWorkspace, config: Config) -> None:
    """Iris's check: the workspace's lock / flag array covers this call's tiles."""
    tiles = _tiles(workspace.shape, config)
    for name, arr, need in (("Lock", workspace.locks if workspace.variant == "spinlock" else None, tiles),
                            ("Flag", workspace.flags if workspace.variant == "ring" else None,
                             tiles * max(1, workspace.flags_per_tile))):
        if arr is not None and arr.numel() < need:
            raise ValueError(f"{name} array too small: have {arr.numel()} but need {need} "
                             f"(block_size_m={config.block_size_m}, block_size_n={config.block_size_n}). "
                             f"Pre-allocate the workspace with the smallest block sizes you intend to use.")


def all_reduce(output_tensor, input_tensor, ctx, op=None, group=None, async_op=False, config=None, workspace=None):
    """``output_tensor`` = ``op`` (default sum) of every rank's ``input_tensor``, same shape;
    ``output_tensor`` may be ``input_tensor``. Returns the workspace. A workspace prepared for
    this shape, dtype and variant is used as it is: if this call's tiles (its config's block
    sizes) outnumber its lock or flag array, ``ValueError`` (Iris's check); otherwise (no
    workspace, or one prepared for another call) the preamble runs first."""
    # no config, AUTOTUNE, or an AUTOTUNE variant: iris-fw's own choice ("auto")
    chosen = config is not None and config is not AUTOTUNE and config.all_reduce_variant is not AUTOTUNE
    config = resolve(config, Config(**_DEFAULT))
    _check(output_tensor, input_tensor)
    ready = (workspace is not None and workspace.prepared and workspace.shape == tuple(input_tensor.shape)
             and workspace.dtype == input_tensor.dtype and workspace.variant == config.all_reduce_variant)
    if ready:
        _check_capacity(workspace, config)
    else:
        workspace = all_reduce_preamble(output_tensor, input_tensor, ctx, config, workspace)
    name = reduce_op(op)
    if output_tensor.data_ptr() != input_tensor.data_ptr():
        output_tensor.copy_(input_tensor)
    algorithm = _ALGORITHMS[config.all_reduce_variant] if chosen else "auto"
    iris_fw.ccl.all_reduce(output_tensor, name, group=group, algorithm=algorithm, ctx=context_of(ctx))
    return workspace
