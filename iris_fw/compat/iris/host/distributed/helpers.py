"""Iris's ``iris.host.distributed.helpers``: host-side collectives over the default
torch.distributed group (Iris's helpers need it initialized; they raise ``RuntimeError``
otherwise). iris-fw's own bootstrap (``ctx.bootstrap``) is what the host object uses; these
are for Iris programs that call the helpers directly. Objects travel with torch's object
collectives (gloo and NCCL alike). ``distributed_device_barrier`` is ``shmem.device_barrier``."""

from __future__ import annotations

import numpy as np
import torch


def _dist():
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("PyTorch distributed is not initialized")
    return dist


def init_distributed():
    """``(None, rank, world_size)`` of the initialized default group (Iris's signature)."""
    dist = _dist()
    return None, dist.get_rank(), dist.get_world_size()


def distributed_allgather(data) -> np.ndarray:
    """Every rank's 1-D array, stacked: ``[world_size, len(data)]``."""
    dist = _dist()
    data = np.asarray(data)
    if data.ndim != 1:
        raise ValueError(f"distributed_allgather takes a 1-D array, got {data.ndim} dimensions")
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, data)
    return np.stack(parts, axis=0)


def distributed_allgather_multidim(data) -> np.ndarray:
    """Every rank's array, each flattened: ``[world_size, data.size]``."""
    dist = _dist()
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, np.asarray(torch.as_tensor(data).cpu()))
    return np.stack(parts, axis=0).reshape(len(parts), -1)


def distributed_broadcast_scalar(value=None, root: int = 0):
    """``root``'s scalar on every rank (``root`` must give one)."""
    dist = _dist()
    if dist.get_rank() == root and value is None:
        raise ValueError("Root must provide a value.")
    box = [value if dist.get_rank() == root else None]
    dist.broadcast_object_list(box, src=root)
    return box[0]


def distributed_broadcast_tensor(value_to_broadcast=None, root: int = 0) -> np.ndarray:
    """``root``'s tensor or array on every rank, as numpy."""
    dist = _dist()
    if dist.get_rank() == root:
        if value_to_broadcast is None:
            raise ValueError("Root must provide a value to broadcast.")
        payload = np.asarray(torch.as_tensor(value_to_broadcast).cpu())
    else:
        payload = None
    box = [payload]
    dist.broadcast_object_list(box, src=root)
    return box[0]


def distributed_barrier(group=None) -> None:
    """torch.distributed's barrier of ``group`` (default: every rank)."""
    _dist().barrier(group=group)


def extract_group_info(group, rank: int, num_ranks: int):
    """``(rank_in_group, rank_global, world_size, rank_start, rank_stride)`` of ``group`` (None:
    every rank). Groups must be strided, as in Iris: other groups raise ``NotImplementedError``,
    a rank outside the group ``RuntimeError``."""
    if group is None:
        return rank, rank, num_ranks, 0, 1
    ranks = list(_dist().get_process_group_ranks(group))
    if rank not in ranks:
        raise RuntimeError(f"Rank {rank} is not part of the specified process group. Group contains ranks: {ranks}")
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    if len(steps) > 1:
        raise NotImplementedError(f"Non-strided process groups are not supported. Group ranks: {ranks}")
    stride = steps.pop() if steps else 1
    if stride == 0:
        raise ValueError(f"Invalid process group: a rank appears twice. Group ranks: {ranks}")
    return ranks.index(rank), rank, len(ranks), ranks[0], stride
