"""Iris's ``iris.ops.FusedConfig``: tuning parameters of the fused GEMM + collective ops,
validated as Iris does. iris-fw chooses its own GEMM tiles and schedules (tuned per device),
so the tile sizes, SM counts and cache modifiers are accepted and not applied; the fields that
change a result are ``all_reduce_variant`` (``one_shot``/``two_shot``: the algorithm of
iris-fw's GEMM + all-reduce under ``matmul_all_reduce``) and, for ``matmul_reduce_scatter``, ``block_size_m``/
``block_size_n``, which decide the tiles a rank owns."""

from __future__ import annotations

from dataclasses import dataclass

from ..ccl.config import ALL_REDUCE_VARIANTS, check_positive


@dataclass
class FusedConfig:
    """Iris's fields and defaults."""

    block_size_m: int = 256
    block_size_n: int = 64
    block_size_k: int = 64
    group_size_m: int = 1
    num_sms: int | None = None
    num_xcds: int = 1
    chunk_size: int = 1
    cache_modifier_a: str = ".ca"
    cache_modifier_b: str = ".ca"
    allow_tf32: bool = True
    all_reduce_variant: str = "two_shot"
    all_reduce_num_rings: int = 1
    ksplit: bool = False

    def validate(self, world_size: int | None = None) -> None:
        """Raise ``ValueError`` for a parameter Iris would reject."""
        check_positive(self, ("block_size_m", "block_size_n", "block_size_k", "group_size_m", "num_xcds", "chunk_size",
                              "all_reduce_num_rings"))
        if self.num_sms is not None and self.num_sms <= 0:
            raise ValueError(f"num_sms must be positive, got {self.num_sms}")
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"all_reduce_variant must be one of {list(ALL_REDUCE_VARIANTS)}, "
                             f"got {self.all_reduce_variant}")
        if self.all_reduce_variant == "ring" and world_size is not None and self.block_size_n % world_size:
            raise ValueError(f"For ring variant, block_size_n ({self.block_size_n}) must be divisible by "
                             f"world_size ({world_size})")
