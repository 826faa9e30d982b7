"""Iris's ``iris.host.distributed``: host collectives over torch.distributed (``helpers``)."""

from .helpers import (distributed_allgather, distributed_allgather_multidim, distributed_barrier,  # noqa: F401
                      distributed_broadcast_scalar, distributed_broadcast_tensor, extract_group_info,
                      init_distributed)

__all__ = ["distributed_allgather", "distributed_allgather_multidim", "distributed_barrier",
           "distributed_broadcast_scalar", "distributed_broadcast_tensor", "extract_group_info", "init_distributed"]
