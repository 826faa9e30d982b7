"""Iris's ``iris.ops``: fused GEMM + collective operations (``shmem.ops.<name>(output, A, B, …)``
or ``iris.ops.<name>(shmem, output, A, B, …)``), mapped onto iris-fw:

=========================  =======================================================  ==================================
Iris                        computes (every rank)                                    iris-fw
=========================  =======================================================  ==================================
``matmul_all_reduce``       ``C[M, N] = Σ_r A_r[M, K] @ B_r[K, N]``                  ``iris_fw.ops.gemm_all_reduce``
``all_gather_matmul``       ``C[M, N] = concat_K(A_r[M, K/W]) @ B[K, N] (+ bias[M])`` ``iris_fw.ccl.all_gather_into_tensor`` + ``torch.addmm``
``matmul_all_gather``       ``C[W·M, N]``: rows ``r·M…`` = ``A_r[M, K] @ B (+ bias_r[M])``  ``iris_fw.ops.gemm_all_scatter`` (on the transposes)
``matmul_reduce_scatter``   ``C[M, N]``: this rank's tiles of ``Σ_r A_r @ B_r``, zeros elsewhere  ``iris_fw.ops.gemm_all_reduce``, owned tiles kept
=========================  =======================================================  ==================================

``matmul_all_reduce`` is iris-fw's fused GEMM + all-reduce (partial tiles in the output dtype,
summed in fp32 in rank order); Iris's ``one_shot``/``two_shot`` variants pick that op's
algorithm of the same name, the others leave the choice to it. ``matmul_reduce_scatter``'s tiles: the
``block_size_m x block_size_n`` tiles of ``config`` numbered row-major, ``T // W`` consecutive
ones per rank (the last rank also the remainder), as Iris's kernel assigns them. Iris's
``async_op`` is accepted; iris-fw's calls are ordered on the stream either way.
"""

import sys
import types

from . import _ops
from ._ops import OpsNamespace
from .config import FusedConfig
from .workspace import FusedWorkspace

# Iris's per-op modules (``iris.ops.matmul_reduce_scatter`` …); loading a submodule sets the
# package attribute of its name to the module, so the functions are bound after them
from . import all_gather_matmul as _all_gather_matmul_module  # noqa: E402
from . import matmul_all_gather as _matmul_all_gather_module  # noqa: E402
from . import matmul_all_reduce as _matmul_all_reduce_module  # noqa: E402
from . import matmul_reduce_scatter as _matmul_reduce_scatter_module  # noqa: E402

all_gather_matmul, all_gather_matmul_preamble = _ops.all_gather_matmul, _ops.all_gather_matmul_preamble
matmul_all_gather, matmul_all_gather_preamble = _ops.matmul_all_gather, _ops.matmul_all_gather_preamble
matmul_all_reduce, matmul_all_reduce_preamble = _ops.matmul_all_reduce, _ops.matmul_all_reduce_preamble
matmul_reduce_scatter, matmul_reduce_scatter_preamble = _ops.matmul_reduce_scatter, _ops.matmul_reduce_scatter_preamble



class _Package(types.ModuleType):
    """Keeps ``iris.ops.<op>`` the function once the op's module is loaded under another name
    (``import iris.ops.matmul_reduce_scatter`` through the ``iris`` alias loads it afresh, and the
    import system then sets the package attribute of that name to the module), as in Iris, whose
    package imports its op modules first and binds the functions after."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and callable(self.__dict__.get(name)):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "FusedConfig", "FusedWorkspace", "OpsNamespace", "all_gather_matmul", "all_gather_matmul_preamble",
    "matmul_all_gather", "matmul_all_gather_preamble", "matmul_all_reduce", "matmul_all_reduce_preamble",
    "matmul_reduce_scatter", "matmul_reduce_scatter_preamble",
]
