"""Iris's ``iris.ccl.Config``: kernel parameters of the collectives, validated as Iris does.

iris-fw chooses its own kernels and launch configurations (``iris_fw.ccl``, tuned per device),
so most fields are accepted and checked but do not change how the collective runs. The ones
that do: ``all_reduce_variant`` (``"one_shot"``/``"two_shot"``/``"ring"`` select iris-fw's
algorithm of that name; ``"atomic"``/``"spinlock"``, which iris-fw has no counterpart for,
select ``"auto"``), and, for reduce-scatter, ``block_size_m``/``block_size_n``/``swizzle_size``/
``all_reduce_distribution``/``reduce_scatter_variant``, which decide which tiles a rank owns
(Iris's semantics, see :func:`iris.ccl.reduce_scatter.reduce_scatter`). ``use_gluon=True``
(Gluon kernels) is refused at call time. ``num_xcds=None`` is 1: iris-fw has no XCC query.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``config=AUTOTUNE``: let the library choose (iris-fw's ``"auto"`` algorithm selection).
AUTOTUNE = "autotune"

ALL_REDUCE_VARIANTS = ("atomic", "ring", "two_shot", "one_shot", "spinlock")
REDUCE_SCATTER_VARIANTS = ("two_shot", "ring_chunked", "inreg", "twophase", "auto")


def check_positive(config, names) -> None:
    """``ValueError`` naming the first of ``config``'s fields ``names`` that is not positive (Iris's check)."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")


@dataclass
class Config:
    """Collective parameters (Iris's fields and defaults)."""

    block_size_m: int = 128
    block_size_n: int = 128
    swizzle_size: int = 6
    comm_sms: int = 64
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_reduce_variant: str = "atomic"
    all_reduce_distribution: int = 0
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    reduce_scatter_variant: str = "two_shot"
    num_stages: int = 1
    num_warps: int = 4
    waves_per_eu: int = 0

    def __post_init__(self):
        if self.num_xcds is None:
            self.num_xcds = 1
        check_positive(self, ("block_size_m", "block_size_n", "swizzle_size", "comm_sms", "num_xcds",
                              "all_reduce_num_rings"))
        if self.chunk_size is None:
            self.chunk_size = min(self.swizzle_size * self.swizzle_size, max(1, self.comm_sms // self.num_xcds))
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"all_reduce_variant must be one of: {', '.join(map(repr, ALL_REDUCE_VARIANTS))}, "
                             f"got {self.all_reduce_variant}")
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(f"all_reduce_distribution must be 0 (striding) or 1 (block), "
                             f"got {self.all_reduce_distribution}")
        if self.all_reduce_ring_slice_n is None:
            self.all_reduce_ring_slice_n = self.block_size_n
        slice_n = self.all_reduce_ring_slice_n
        if slice_n <= 0 or self.block_size_n % slice_n or slice_n & (slice_n - 1):
            raise ValueError(f"all_reduce_ring_slice_n must be a positive power of two dividing block_size_n "
                             f"(block_size_n={self.block_size_n}), got {slice_n}")
        if self.reduce_scatter_variant not in REDUCE_SCATTER_VARIANTS:
            raise ValueError(f"reduce_scatter_variant must be one of {REDUCE_SCATTER_VARIANTS}, "
                             f"got '{self.reduce_scatter_variant}'")


def resolve(config, default: Config) -> Config:
    """``config`` if given (``None`` or :data:`AUTOTUNE`: ``default``); refuses Gluon."""
    if config is None or config is AUTOTUNE or config == AUTOTUNE:
        return default
    if not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config, None or iris.ccl.AUTOTUNE, got {type(config).__name__}")
    if config.use_gluon:
        raise ValueError("use_gluon=True is not provided: Gluon kernels (AMD's Triton dialect) have no iris-fw "
                         "counterpart; use the default config (use_gluon=False)")
    return config
