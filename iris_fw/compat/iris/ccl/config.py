"""Iris's ``iris.ccl.Config``: kernel parameters of the collectives, with Iris's fields, defaults
and validation (every check Iris makes in ``__post_init__``, the same ``ValueError``\\ s).

iris-fw chooses its own kernels and launch configurations (``iris_fw.ccl``, tuned per device),
so most fields are accepted and checked but do not change how a collective runs. What each
field does here:

* **mapped** — ``all_reduce_variant`` (``"one_shot"``/``"two_shot"``/``"ring"`` select iris-fw's
  algorithm of that name; ``"atomic"``/``"spinlock"``, which iris-fw has no counterpart for,
  select ``"auto"``); for reduce-scatter ``block_size_m``/``block_size_n``/``swizzle_size``/
  ``all_reduce_distribution``/``reduce_scatter_variant`` decide which tiles a rank owns
  (see :func:`iris.ccl.reduce_scatter.reduce_scatter`); ``all_gather_variant``
  (``"persistent"``/``"partitioned"``: two schedules of one result) is validated and iris-fw's
  all-gather runs either way.
* **validated, not applied** (iris-fw tunes its own kernels) — ``block_size_*`` elsewhere,
  ``swizzle_size``, ``comm_sms``, ``all_reduce_num_rings``, ``all_reduce_ring_slice_n``,
  ``num_stages``, ``num_warps``.
* **AMD-only tuning, ignored with a one-time note** on the ``iris`` logger — ``num_xcds`` and
  ``chunk_size`` (XCD chiplet scheduling), ``waves_per_eu`` (AMD occupancy hint),
  ``threads_per_warp`` (64 is AMD's wavefront, 32 NVIDIA's warp; Gluon layouts only).
  ``num_xcds=None`` is 1: iris-fw has no XCC query.
* **refused** — ``use_gluon=True`` (Gluon kernels), at call time.

:data:`AUTOTUNE` (Iris's sentinel) may stand for the whole config (``config=AUTOTUNE``) or for
single fields (``Config(block_size_m=AUTOTUNE)``, ``Config.autotune(comm_sms=64)``): as in Iris
the fields are then not validated until resolved, and a collective resolves them to the values
of its default config (iris-fw's ``"auto"`` choice for the all-reduce variant).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..logging import logger
from ...state import state as _state


class _AutoTune:
    """Iris's ``AUTOTUNE``: one object, usable for a whole config or for single fields."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "AUTOTUNE"

    def __bool__(self):
        raise TypeError("AUTOTUNE cannot be used as a boolean")

    def __reduce__(self):
        return (_AutoTune, ())


#: ``config=AUTOTUNE`` (or a field set to it): let the library choose.
AUTOTUNE = _AutoTune()

ALL_GATHER_VARIANTS = ("persistent", "partitioned")
ALL_REDUCE_VARIANTS = ("atomic", "ring", "two_shot", "one_shot", "spinlock")
#: Iris's releases accepted these reduce-scatter variants (``two_shot`` in every one).
REDUCE_SCATTER_VARIANTS = ("two_shot", "ring_chunked", "inreg", "twophase", "auto")

#: Fields tuning AMD hardware only (XCD chiplets, wavefronts, EU occupancy): accepted, ignored,
#: noted once per process when set to something other than the default.
AMD_ONLY_FIELDS = {
    "num_xcds": "XCD (chiplet) count for scheduling tiles across an MI300's XCDs",
    "chunk_size": "tiles per XCD chunk of the XCD-aware schedule",
    "waves_per_eu": "AMD occupancy hint (waves per execution unit)",
    "threads_per_warp": "wavefront width of Gluon layouts (64 on AMD; iris-fw runs Triton kernels)",
}


def note_amd_only(name: str, value) -> None:
    """Once per process and field: say that ``name`` (AMD-only tuning) is ignored."""
    if not _state().first_note(f"ccl.Config.{name}"):
        return
    logger.info(f"iris.ccl.Config: {name}={value!r} is ignored by iris-fw ({AMD_ONLY_FIELDS[name]}; iris-fw tunes "
                f"its own kernels per device)")


def check_positive(config, names) -> None:
    """``ValueError`` naming the first of ``config``'s fields ``names`` that is not positive (Iris's check)."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")


def _tuned(default, space, collectives=None):
    meta = {"search_space": space}
    if collectives is not None:
        meta["collectives"] = collectives
    return field(default=default, metadata=meta)


@dataclass
class Config:
    """Collective parameters: Iris's fields, defaults, search spaces and validation."""

    block_size_m: int = _tuned(32, [8, 16, 32, 64, 128])
    block_size_n: int = _tuned(64, [32, 64, 128, 256])
    swizzle_size: int = _tuned(4, [2, 4, 6, 8])
    comm_sms: int = _tuned(64, [32, 48, 64, 80, 96, 108])
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_gather_variant: str = _tuned("persistent", list(ALL_GATHER_VARIANTS), ["all_gather"])
    all_reduce_variant: str = _tuned("two_shot", ["two_shot", "one_shot", "atomic"], ["all_reduce"])
    all_reduce_distribution: int = _tuned(1, [0, 1], ["all_reduce", "reduce_scatter"])
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    reduce_scatter_variant: str = "two_shot"
    num_stages: int = _tuned(1, [1, 2])
    num_warps: int = _tuned(4, [2, 4, 8])
    threads_per_warp: int = 64
    waves_per_eu: int = _tuned(0, [0, 1, 2])

    def __post_init__(self):
        if self.get_autotune_fields():
            return  # validated once the tuned fields are resolved (Iris)
        for name, default in (("num_xcds", None), ("chunk_size", None), ("waves_per_eu", 0), ("threads_per_warp", 64)):
            if getattr(self, name) != default:
                note_amd_only(name, getattr(self, name))
        if self.num_xcds is None:
            self.num_xcds = 1
        check_positive(self, ("block_size_m", "block_size_n", "swizzle_size", "comm_sms", "num_xcds"))
        if self.chunk_size is None:
            self.chunk_size = min(self.swizzle_size * self.swizzle_size, self.comm_sms // self.num_xcds)
        if self.all_gather_variant not in ALL_GATHER_VARIANTS:
            raise ValueError(f"all_gather_variant must be one of: {', '.join(map(repr, ALL_GATHER_VARIANTS))}, "
                             f"got {self.all_gather_variant}")
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"all_reduce_variant must be one of: {', '.join(map(repr, ALL_REDUCE_VARIANTS))}, "
                             f"got {self.all_reduce_variant}")
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(f"all_reduce_distribution must be 0 (striding) or 1 (block), "
                             f"got {self.all_reduce_distribution}")
        check_positive(self, ("all_reduce_num_rings",))
        if self.all_reduce_ring_slice_n is None:
            self.all_reduce_ring_slice_n = self.block_size_n
        slice_n = self.all_reduce_ring_slice_n
        if slice_n <= 0:
            raise ValueError(f"all_reduce_ring_slice_n must be positive, got {slice_n}")
        if self.block_size_n % slice_n:
            raise ValueError(f"all_reduce_ring_slice_n must divide block_size_n "
                             f"(block_size_n={self.block_size_n}, slice={slice_n})")
        if slice_n & (slice_n - 1):
            raise ValueError(f"all_reduce_ring_slice_n must be a power of two, got {slice_n}")
        if self.reduce_scatter_variant not in REDUCE_SCATTER_VARIANTS:
            raise ValueError(f"reduce_scatter_variant must be one of {REDUCE_SCATTER_VARIANTS}, "
                             f"got '{self.reduce_scatter_variant}'")
        if self.threads_per_warp not in (32, 64):
            raise ValueError(f"threads_per_warp must be 32 (NVIDIA) or 64 (AMD), got {self.threads_per_warp}")
        check_positive(self, ("num_warps",))

    # ---- Iris's autotuning helpers -----------------------------------------------------------------
    def get_autotune_fields(self) -> list[str]:
        """Names of the fields set to :data:`AUTOTUNE`."""
        return [f.name for f in fields(self) if getattr(self, f.name) is AUTOTUNE]

    def with_resolved(self, **values) -> "Config":
        """A copy with ``values`` replacing fields (validated like a new config)."""
        return replace(self, **values)

    @classmethod
    def autotune(cls, **fixed) -> "Config":
        """A config whose fields are all :data:`AUTOTUNE` but ``fixed`` (``num_xcds`` and
        ``chunk_size`` are derived, never tuned). Unknown names raise ``TypeError``."""
        names = {f.name for f in fields(cls)}
        unknown = set(fixed) - names
        if unknown:
            raise TypeError(f"Unknown Config fields: {sorted(unknown)}")
        values = {name: AUTOTUNE for name in names if name not in fixed}
        values.update(fixed)
        values["num_xcds"] = None
        values["chunk_size"] = None
        return cls(**values)

    @classmethod
    def get_tunable_fields(cls, collective: str) -> list[str]:
        """Fields with a search space that apply to ``collective``."""
        return list(cls.get_search_space(collective))

    @classmethod
    def get_search_space(cls, collective: str) -> dict[str, list]:
        """``{field: candidate values}`` for ``collective``."""
        space = {}
        for f in fields(cls):
            if "search_space" not in f.metadata:
                continue
            only = f.metadata.get("collectives")
            if only is None or collective in only:
                space[f.name] = list(f.metadata["search_space"])
        return space


def resolve(config, default: Config) -> Config:
    """``config`` with its :data:`AUTOTUNE` fields taken from ``default`` (``None`` or
    ``AUTOTUNE``: ``default`` itself); refuses Gluon."""
    if config is None or config is AUTOTUNE:
        return default
    if not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config, None or iris.ccl.AUTOTUNE, got {type(config).__name__}")
    tuned = config.get_autotune_fields()
    if tuned:
        config = config.with_resolved(**{name: getattr(default, name) for name in tuned})
    if config.use_gluon:
        raise ValueError("use_gluon=True is not provided: Gluon kernels (AMD's Triton dialect) have no iris-fw "
                         "counterpart; use the default config (use_gluon=False)")
    return config
