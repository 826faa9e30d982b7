"""Iris's ``iris.ops.all_gather_matmul`` module: ``C[M, N]`` = (every rank's ``A_sharded[M, K/W]`` concatenated along K) ``@ B[K, N]`` (see :mod:`iris_fw.compat.iris.ops`)."""

from ._ops import all_gather_matmul, all_gather_matmul_preamble  # noqa: F401

__all__ = ["all_gather_matmul", "all_gather_matmul_preamble"]
