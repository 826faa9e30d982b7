"""The fused ops of :mod:`iris_fw.compat.iris.ops` (see the package docstring); each has its
Iris module (``iris.ops.matmul_reduce_scatter`` …) re-exporting it."""

from __future__ import annotations

from dataclasses import asdict

import torch

import iris_fw
import iris_fw.gemm
import iris_fw.ops

from ..ccl.reduce_scatter import owned_tiles
from ..ccl.utils import context_of
from .config import FusedConfig
from .workspace import FusedWorkspace



def _config(config, shmem) -> FusedConfig:
    config = config if config is not None else FusedConfig()
    if not isinstance(config, FusedConfig):
        raise TypeError(f"config must be an iris.ops.FusedConfig, got {type(config).__name__}")
    config.validate(world_size=context_of(shmem).world_size)
    return config


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _gemm_shapes(A, B) -> tuple[int, int, int]:
    _check(isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor) and A.dim() == 2 and B.dim() == 2,
           f"A and B must be 2D tensors, got {getattr(A, 'shape', A)} and {getattr(B, 'shape', B)}")
    _check(A.shape[1] == B.shape[0], f"Incompatible matrix dimensions: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    _check(A.dtype == B.dtype, f"A and B must have the same dtype, got {A.dtype} and {B.dtype}")
    return A.shape[0], B.shape[1], A.shape[1]


def _gemm_into(C, A, B) -> tuple[int, int, int]:
    """``(M, N, K)`` of ``C[M, N] = A[M, K] @ B[K, N]``, all of one dtype (else ``ValueError``)."""
    M, N, K = _gemm_shapes(A, B)
    _check(tuple(C.shape) == (M, N), f"Output tensor shape {tuple(C.shape)} doesn't match expected ({M}, {N})")
    _check(C.dtype == A.dtype, f"All tensors must have same dtype, got A:{A.dtype}, B:{B.dtype}, C:{C.dtype}")
    return M, N, K


def _workspace(workspace, operation, shape, dtype, shmem, config, variant="") -> FusedWorkspace:
    workspace = workspace if workspace is not None else FusedWorkspace()
    workspace.operation, workspace.shape, workspace.dtype = operation, tuple(shape), dtype
    workspace.world_size, workspace.variant, workspace.config = context_of(shmem).world_size, variant, config
    workspace.prepared = True
    return workspace


# ---- matmul_all_reduce --------------------------------------------------------------------------------


def matmul_all_reduce_preamble(shmem, C, A, B, config=None, workspace=None) -> FusedWorkspace:
    """Validate the call; a workspace for :func:`matmul_all_reduce`."""
    config = _config(config, shmem)
    M, N, K = _gemm_into(C, A, B)
    return _workspace(workspace, "matmul_all_reduce", (M, N, K), A.dtype, shmem, config, config.all_reduce_variant)


def matmul_all_reduce(shmem, C, A, B, async_op=False, config=None, workspace=None) -> FusedWorkspace:
    """``C[M, N]`` = the sum over ranks of ``A[M, K] @ B[K, N]`` (each rank its own ``A``, ``B``)."""
    config = _config(config, shmem)
    fw = context_of(shmem)
    workspace = matmul_all_reduce_preamble(shmem, C, A, B, config, workspace)
    op_config = None  # the op's choice of tiles and algorithm
    Config = fw.registries.pattern.get("gemm_all_reduce").Config  # the plugin, through the registry
    if config.all_reduce_variant in Config.ALGORITHMS:
        M, N, K = workspace.shape
        tiles = iris_fw.gemm.default_config(M, N, K, A.dtype, fw.device)
        op_config = Config(**asdict(tiles), algorithm=config.all_reduce_variant)
    iris_fw.ops.gemm_all_reduce(A, B, ctx=fw, config=op_config, out=C)
    return workspace


# ---- all_gather_matmul --------------------------------------------------------------------------------


def all_gather_matmul_preamble(shmem, A_sharded, B, config=None) -> FusedWorkspace:
    """Validate ``A_sharded[M, K/W]`` against ``B[K, N]``; a workspace for :func:`all_gather_matmul`."""
    config = _config(config, shmem)
    world = context_of(shmem).world_size
    _check(A_sharded.dim() == 2 and B.dim() == 2, "A_sharded and B must be 2D tensors")
    M, k_local = A_sharded.shape
    K, N = B.shape
    _check(K == world * k_local, f"K ({K}) must equal world_size ({world}) * K_local ({k_local})")
    return _workspace(None, "all_gather_matmul", (M, N, K), A_sharded.dtype, shmem, config)


def all_gather_matmul(shmem, output_tensor, A_sharded, B, bias=None, async_op=False, config=None,
                      workspace=None) -> FusedWorkspace:
    """``output[M, N]`` = (every rank's ``A_sharded[M, K/W]`` concatenated along K) ``@ B[K, N]``,
    plus ``bias[M]`` per row if given."""
    config = _config(config, shmem)
    fw = context_of(shmem)
    if workspace is None:
        workspace = all_gather_matmul_preamble(shmem, A_sharded, B, config)
    M, k_local = A_sharded.shape
    K, N = B.shape
    _check(K == fw.world_size * k_local, f"K ({K}) must equal world_size ({fw.world_size}) * K_local ({k_local})")
    _check(A_sharded.dtype == B.dtype == output_tensor.dtype,
           f"A_sharded, B and output must share a dtype, got {A_sharded.dtype}, {B.dtype}, {output_tensor.dtype}")
    _check(tuple(output_tensor.shape) == (M, N), f"Output must be ({M}, {N}), got {tuple(output_tensor.shape)}")
    gathered = A_sharded.new_empty(fw.world_size, M, k_local)
    iris_fw.ccl.all_gather_into_tensor(gathered, A_sharded.contiguous(), ctx=fw)
    a_full = gathered.permute(1, 0, 2).reshape(M, K)
    if bias is None:
        torch.matmul(a_full, B, out=output_tensor)
    else:
        _check(bias.shape[0] == M, f"bias must have M = {M} elements, got shape {tuple(bias.shape)}")
        torch.addmm(bias.reshape(M, 1).to(output_tensor.dtype), a_full, B, out=output_tensor)
    return workspace


# ---- matmul_all_gather --------------------------------------------------------------------------------


def matmul_all_gather_preamble(shmem, A, B, config=None) -> FusedWorkspace:
    """Validate ``A[M_local, K] @ B[K, N]``; a workspace for :func:`matmul_all_gather`."""
    config = _config(config, shmem)
    m_local, N, K = _gemm_shapes(A, B)
    return _workspace(None, "matmul_all_gather", (m_local * context_of(shmem).world_size, N, K), A.dtype, shmem,
                      config)


def matmul_all_gather(shmem, output_tensor, A, B, bias=None, async_op=False, config=None,
                      workspace=None) -> FusedWorkspace:
    """``output[W·M_local, N]``: rows ``r·M_local …`` are rank ``r``'s ``A[M_local, K] @ B[K, N]``
    (plus its ``bias[M_local]`` per row). iris-fw's fused GEMM + all-scatter computes the
    transpose, ``B^T @ A^T`` gathered column-wise."""
    config = _config(config, shmem)
    fw = context_of(shmem)
    if workspace is None:
        workspace = matmul_all_gather_preamble(shmem, A, B, config)
    m_local, N, _ = _gemm_shapes(A, B)
    M = m_local * fw.world_size
    _check(tuple(output_tensor.shape) == (M, N), f"Output must be ({M}, {N}), got {tuple(output_tensor.shape)}")
    _check(output_tensor.dtype == A.dtype, f"output must have A's dtype {A.dtype}, got {output_tensor.dtype}")
    gathered_t = iris_fw.ops.gemm_all_scatter(B.t(), A.t(), ctx=fw)  # [N, W·M_local]
    output_tensor.copy_(gathered_t.t())
    if bias is not None:
        _check(bias.shape[0] == m_local, f"bias must have M_local = {m_local} elements, got shape {tuple(bias.shape)}")
        biases = bias.new_empty(fw.world_size, m_local)
        iris_fw.ccl.all_gather_into_tensor(biases, bias.reshape(m_local).contiguous(), ctx=fw)
        output_tensor.add_(biases.reshape(M, 1).to(output_tensor.dtype))
    return workspace


# ---- matmul_reduce_scatter ----------------------------------------------------------------------------


def matmul_reduce_scatter_preamble(shmem, C, A, B, config=None, workspace=None) -> FusedWorkspace:
    """Validate the call and zero ``C`` (tiles this rank does not own stay zero, as in Iris)."""
    config = _config(config, shmem)
    M, N, K = _gemm_into(C, A, B)
    C.zero_()
    return _workspace(workspace, "matmul_reduce_scatter", (M, N, K), A.dtype, shmem, config, "two_shot")


def matmul_reduce_scatter(shmem, C, A, B, async_op=False, config=None, workspace=None) -> FusedWorkspace:
    """``C[M, N]``: on the tiles this rank owns, the sum over ranks of ``A @ B``; zeros elsewhere."""
    config = _config(config, shmem)
    fw = context_of(shmem)
    workspace = matmul_reduce_scatter_preamble(shmem, C, A, B, config, workspace)
    M, N = C.shape
    total = iris_fw.ops.gemm_all_reduce(A, B, ctx=fw)
    mine = owned_tiles(M, N, config.block_size_m, config.block_size_n, fw.rank, fw.world_size,
                       layout="block_floor", device=C.device)
    C.copy_(torch.where(mine, total, C))
    return workspace


class OpsNamespace:
    """``shmem.ops``: the fused operations bound to a host object."""

    def __init__(self, shmem):
        self._shmem = shmem

    def matmul_all_reduce(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output`` = the sum over ranks of ``A @ B``. Iris's ``matmul_all_reduce`` does not apply
        ``bias`` (its namespace drops it); passing one is refused rather than ignored."""
        if bias is not None:
            raise ValueError("matmul_all_reduce: bias is not applied by Iris's kernel; add it to the output instead")
        return matmul_all_reduce(self._shmem, output_tensor, A, B, async_op, config, workspace)

    def all_gather_matmul(self, output_tensor, A_sharded, B, bias=None, async_op=False, config=None,
                          workspace=None):
        return all_gather_matmul(self._shmem, output_tensor, A_sharded, B, bias, async_op, config, workspace)

    def matmul_all_gather(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        return matmul_all_gather(self._shmem, output_tensor, A, B, bias, async_op, config, workspace)

    def matmul_reduce_scatter(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output (M, N)``: this rank's tiles of the summed ``A @ B``. Iris's standalone
        ``matmul_reduce_scatter`` takes no bias; passing one is refused rather than ignored."""
        if bias is not None:
            raise ValueError("matmul_reduce_scatter: bias is not applied by Iris's kernel; add it to the output "
                             "instead")
        return matmul_reduce_scatter(self._shmem, output_tensor, A, B, async_op, config, workspace)
