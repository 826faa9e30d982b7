"""Iris's ``iris.ops.matmul_all_gather`` module: ``C[W·M, N]``: rank ``r``'s rows are its ``A[M, K] @ B[K, N]`` (see :mod:`iris_fw.compat.iris.ops`)."""

from ._ops import matmul_all_gather, matmul_all_gather_preamble  # noqa: F401

__all__ = ["matmul_all_gather", "matmul_all_gather_preamble"]
