"""The Triton GEMM every GEMM-based pattern is built on: tile configurations, operand
preparation (TMA descriptors where the layout allows them), and :func:`matmul`, the same
tile loop as a plain local GEMM (the "GEMM alone" of the benchmarks).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import gemm_tiles as tiles
from . import tuning
from .devinfo import info, num_sms, persistent_programs
from .engine.contract import PatternError, check_tensor
from .errors import ArgumentError

#: TMA needs 16-byte aligned base addresses and row strides.
TMA_ALIGN_BYTES = 16


#: Input dtypes of the GEMM (the result has the inputs' dtype).
GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class GemmCfg(NamedTuple):
    """The constexpr configuration every GEMM pattern's ``CFG`` starts from (block sizes, tile
    order, whether each operand is a TMA descriptor, exact fp32 products)."""

    BM: int
    BN: int
    BK: int
    GROUP_M: int
    A_DESC: bool
    B_DESC: bool
    EXACT: bool


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch options of the Triton GEMM."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ArgumentError(f"GemmConfig.{name} must be a power of two >= 16, got {v!r}")
        if not isinstance(self.group_m, int) or self.group_m < 1:
            raise ArgumentError(f"GemmConfig.group_m must be a positive int, got {self.group_m!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ArgumentError(f"GemmConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ArgumentError(f"GemmConfig.num_stages must be a positive int, got {self.num_stages!r}")


#: The CPU interpreter: small tiles, so tiny test shapes still have several tiles.
CPU_CONFIG = GemmConfig(16, 16, 16, 2, 4, 1)
#: Hopper, 16-bit inputs: 128x256 tiles, 8 warps (two warpgroups of wgmma), 3 TMA stages.
HOPPER_LARGE = GemmConfig(128, 256, 64, 8, 8, 3)
#: Hopper, 16-bit inputs, shapes with too few 128x256 tiles to fill the SMs.
HOPPER_SMALL = GemmConfig(128, 128, 64, 8, 8, 4)
#: fp32 inputs (tf32 or ieee dot): smaller tiles keep the accumulator in registers.
FP32_CONFIG = GemmConfig(64, 64, 32, 8, 4, 3)


#: The 16-bit tile shapes :func:`default_config` chooses between, with the tensor-core
#: efficiency of each relative to the 128x256 tile (time of a tile ~ its area / efficiency):
#: 128x256 tiles took 1425.5 µs and 128x128 tiles 1491.6 µs on 8192x8192x7168 (H200, one run;
#: docs/performance.md, per-configuration table).
HOPPER_TILES = ((HOPPER_LARGE, 1.0), (HOPPER_SMALL, 0.95))


def default_config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device,
                   programs: int | None = None) -> GemmConfig:
    """The tile configuration for a local ``[m, k] @ [k, n]`` product computed by ``programs``
    persistent programs (default: one per SM). A measured row of ``iris_fw/tuning/gemm.json``
    for ``m`` rows on this device comes first (:func:`measured_config`).

    16-bit inputs on GPUs: of :data:`HOPPER_TILES`, the one with the least estimated time,
    waves x tile time, where waves = ceil(tiles / programs) counts a partly filled last wave
    (or a partly filled last column of tiles) in full. That picks 128x256 tiles for large
    shapes and 128x128 where wide tiles leave SMs idle (few tiles, or ``n`` not a multiple of
    256), as measured at the taxonomy's local shapes (docs/performance.md)."""
    if device.type == "cpu":
        return CPU_CONFIG
    if dtype == torch.float32:
        return FP32_CONFIG
    measured = measured_config(m, device)
    if measured is not None:
        return measured
    if programs is None:
        programs = num_sms(device)

    def estimate(choice):
        cfg, efficiency = choice
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        return triton.cdiv(tiles, programs) * cfg.block_m * cfg.block_n / efficiency

    return min(HOPPER_TILES, key=estimate)[0]


@functools.lru_cache(maxsize=None)
def _measured_rows(device_name: str) -> tuple:
    rows = tuning.load("gemm")["devices"].get(device_name, [])  # measured rows only: no defaults
    return tuple((max_m, GemmConfig(**config)) for max_m, config in rows)


def measured_config(m: int, device: torch.device) -> GemmConfig | None:
    """The measured tile configuration for a 16-bit product of ``m`` rows on ``device``
    (``iris_fw/tuning/gemm.json``: few-row products, where the estimate of
    :func:`default_config` does not hold), or None."""
    for max_m, cfg in _measured_rows(info(device).name):
        if m <= max_m:
            return cfg
    return None


def exact(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` must multiply exactly: fp32 inputs unless torch allows TF32 matmuls
    (``torch.backends.cuda.matmul.allow_tf32``), as torch does."""
    return dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D ``t`` can be read through a TMA descriptor (row-major, aligned)."""
    elem = t.element_size()
    return (t.stride(1) == 1 and t.data_ptr() % TMA_ALIGN_BYTES == 0
            and (t.stride(0) * elem) % TMA_ALIGN_BYTES == 0 and t.shape[0] > 0 and t.shape[1] > 0)


def operand(t: torch.Tensor, block: list[int]):
    """``(source, is_descriptor)`` for a 2-D operand read in ``block``-shaped pieces: a TMA
    descriptor when :func:`tma_ok`, else the tensor itself (pointer loads)."""
    if tma_ok(t):
        return TensorDescriptor.from_tensor(t, block), True
    return t, False


class OperandCache:
    """:func:`operand` results by what a TMA descriptor encodes — ``data_ptr()``, shape,
    strides, dtype and block shape — so a tensor read again in the same blocks reuses its
    descriptor (building one costs several µs of host time per call). Bounded: beyond
    ``capacity`` entries the oldest goes (an entry holds its tensor alive until then)."""

    __slots__ = ("capacity", "_entries")

    def __init__(self, capacity: int = 4):
        if capacity < 1:
            raise ArgumentError(f"OperandCache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: dict = {}

    def operand(self, t: torch.Tensor, block: tuple[int, int]):
        """:func:`operand` of ``t`` read in ``block``-shaped pieces, cached."""
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype, block)
        entry = self._entries.get(key)
        if entry is None:
            entries = self._entries
            if len(entries) >= self.capacity:
                del entries[next(iter(entries))]
            entry = entries[key] = operand(t, list(block))
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def operands_key(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """What a GEMM pattern's plan depends on beyond its op's signature (shapes, dtypes, device):
    where the operands are and how they are laid out, and whether products are exact (a torch
    global). The key of the patterns' :class:`~iris_fw.engine.contract.BindCache`."""
    return a.data_ptr(), a.stride(), b.data_ptr(), b.stride(), exact(a.dtype)


def check_operands(a, b, device, a_label: str = "a [M, K]", b_label: str = "b [K, N]", k: str = "K"):
    """``(a, b)`` checked as the two operands of a product on ``device`` (2-D, same supported
    dtype, inner dimensions equal); errors name them with their labels (``"a [M, K]"``)."""
    a_name, b_name = a_label.split()[0], b_label.split()[0]
    a = check_tensor(a, a_name, 2, device, dtypes=GEMM_DTYPES)
    b = check_tensor(b, b_name, 2, device, a.dtype)
    if a.shape[1] != b.shape[0]:
        raise PatternError(f"{a_label} and {b_label} must agree on {k}, got {a_name} {list(a.shape)} and {b_name} {list(b.shape)}")
    return a, b


def plan_operands(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, *, a_tma: bool = True,
                  cache: OperandCache | None = None):
    """``(a source, b source, GemmCfg)`` for a pattern's plan: each operand as a TMA descriptor
    where :func:`tma_ok` (``a_tma=False`` keeps ``a`` a pointer), and the constexpr
    configuration every GEMM pattern's ``CFG`` starts from. ``cache``: reuse descriptors of
    operands seen before."""
    get = cache.operand if cache is not None else (lambda t, block: operand(t, list(block)))
    a_src, a_desc = get(a, (cfg.block_m, cfg.block_k)) if a_tma else (a, False)
    b_src, b_desc = get(b, (cfg.block_k, cfg.block_n))
    return a_src, b_src, GemmCfg(cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, a_desc, b_desc, exact(a.dtype))


@triton.jit
def _matmul_kernel(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   A_DESC: tl.constexpr, B_DESC: tl.constexpr, EXACT: tl.constexpr, NPROG: tl.constexpr):
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, NPROG):
        pm, pn = tiles.grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        acc = tiles.matmul_tile(a, b, pm * BM, pn * BN, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                BM, BN, BK, A_DESC, B_DESC, EXACT)
        tiles.store_block(c, acc, pm * BM, pn * BN, M, N, stride_cm, stride_cn, BM, BN)


def matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
           config: GemmConfig | None = None) -> torch.Tensor:
    """``a[M, K] @ b[K, N]`` with the patterns' Triton GEMM (persistent, TMA where possible).

    fp16 / bf16 / fp32; the result has ``a``'s dtype. ``out``: an ``[M, N]`` tensor to write.
    """
    a, b = check_operands(a, b, a.device if isinstance(a, torch.Tensor) else None)
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty(M, N, dtype=a.dtype, device=a.device)
    else:
        check_tensor(out, "out", 2, a.device, a.dtype)
        if tuple(out.shape) != (M, N):
            raise ArgumentError(f"out must have shape [M, N] = {[M, N]}, got {list(out.shape)}")
    if M == 0 or N == 0:
        return out
    cfg = config or default_config(M, N, K, a.dtype, a.device)
    a_src, a_desc = operand(a, [cfg.block_m, cfg.block_k])
    b_src, b_desc = operand(b, [cfg.block_k, cfg.block_n])
    nprog = persistent_programs(a.device, triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n))
    _matmul_kernel[(nprog,)](
        a_src, b_src, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=cfg.group_m, A_DESC=a_desc, B_DESC=b_desc,
        EXACT=exact(a.dtype), NPROG=nprog, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
