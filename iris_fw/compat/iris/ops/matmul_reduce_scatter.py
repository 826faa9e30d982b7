"""Iris's ``iris.ops.matmul_reduce_scatter`` module: ``C[M, N]``: this rank's tiles of ``Σ_r A_r @ B_r``, zeros elsewhere (see :mod:`iris_fw.compat.iris.ops`)."""

from ._ops import matmul_reduce_scatter, matmul_reduce_scatter_preamble  # noqa: F401

__all__ = ["matmul_reduce_scatter", "matmul_reduce_scatter_preamble"]
