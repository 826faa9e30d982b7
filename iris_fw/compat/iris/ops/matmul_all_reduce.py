"""Iris's ``iris.ops.matmul_all_reduce`` module: ``C[M, N] = Σ_r A_r @ B_r`` on every rank (see :mod:`iris_fw.compat.iris.ops`)."""

from ._ops import matmul_all_reduce, matmul_all_reduce_preamble  # noqa: F401

__all__ = ["matmul_all_reduce", "matmul_all_reduce_preamble"]
