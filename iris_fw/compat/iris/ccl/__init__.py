"""Iris's ``iris.ccl``: ``Config``, ``AUTOTUNE``, ``ReduceOp``, the collectives in submodules
(``iris.ccl.all_gather.all_gather`` …, each ``fn(output, input, shmem, …)``) and the
``shmem.ccl`` namespace (:class:`CCL`). Every collective maps onto :mod:`iris_fw.ccl`; see each
submodule for the shape semantics (Iris's reduce-scatter keeps ``(M, N)``; its all-to-all
exchanges column chunks)."""

from __future__ import annotations

from .config import AUTOTUNE, Config
from .utils import ReduceOp

__all__ = ["AUTOTUNE", "CCL", "Config", "ReduceOp"]


class CCL:
    """``shmem.ccl``: Iris's collectives bound to a host object."""

    def __init__(self, iris_instance):
        self._iris = iris_instance

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """Column-chunked all-to-all of ``(M, N * world_size)`` tensors."""
        from .all_to_all import all_to_all

        all_to_all(output_tensor, input_tensor, self._iris, group=group, async_op=async_op, config=config)

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """``output (W*M, N)`` = every rank's ``input (M, N)`` along rows."""
        from .all_gather import all_gather

        all_gather(output_tensor, input_tensor, self._iris, group=group, async_op=async_op, config=config)

    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None):
        """A workspace for :meth:`all_reduce`."""
        from .all_reduce import all_reduce_preamble

        return all_reduce_preamble(output_tensor, input_tensor, self._iris, config=config, workspace=workspace)

    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                   workspace=None):
        """``output`` = the sum (``op``) of every rank's ``input``; returns the workspace."""
        from .all_reduce import all_reduce

        return all_reduce(output_tensor, input_tensor, self._iris, op=op, group=group, async_op=async_op,
                          config=config, workspace=workspace)

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                       workspace=None):
        """Reduce into this rank's tiles of ``output (M, N)`` (see :mod:`iris.ccl.reduce_scatter`)."""
        from .reduce_scatter import reduce_scatter

        return reduce_scatter(output_tensor, input_tensor, self._iris, op=op, group=group, async_op=async_op,
                              config=config, workspace=workspace)

    def gemm_reduce_scatter_preamble(self, input_tensor, weight_shard, config=None, workspace=None):
        from .fused_gemm_rs import gemm_reduce_scatter_preamble

        return gemm_reduce_scatter_preamble(input_tensor, weight_shard, self._iris, config=config,
                                            workspace=workspace)

    def gemm_reduce_scatter(self, input_tensor, weight_shard, group=None, async_op=False, config=None,
                            workspace=None):
        """This rank's column block of the summed ``input @ weight_shard``."""
        from .fused_gemm_rs import gemm_reduce_scatter

        return gemm_reduce_scatter(input_tensor, weight_shard, self._iris, group=group, async_op=async_op,
                                   config=config, workspace=workspace)
