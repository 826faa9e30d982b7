"""The Triton GEMM every GEMM-based pattern is built on: tile configurations, operand
preparation (TMA descriptors where the layout allows them), and :func:`matmul`, the same
tile loop as a plain local GEMM (the "GEMM alone" of the benchmarks).

**Split-K** (:attr:`GemmConfig.split_k` > 1, :func:`matmul` only): few-row products
(decode: ``M`` ≤ :data:`SPLIT_K_MAX_M` rows) have too few output tiles to fill the SMs, so
each tile's K loop is cut into ``split_k`` contiguous ranges of whole ``BK`` steps, one work
item each (``tiles x split_k`` items over the persistent grid; a tile's splits are adjacent
items, so they run at the same time on neighbouring programs). Each split accumulates in
fp32 and stores its partial tile to an fp32 workspace; a per-tile counter
(``atomic_add``, acq_rel) tells the split that finishes *last* — it sums the tile's
``split_k`` partials in split order (0, 1, …: the result does not depend on which split came
last, so it is deterministic, bit for bit from call to call), casts once, stores the tile and
resets the counter to 0 for the next call. No program ever waits for another (the
interpreter runs them one after another). The counters belong to a context
(:class:`SplitCounters` in ``ctx.extensions``: ``matmul(..., ctx=)``, by default the current
context when one is open), by device and stream (calls on one stream run one after another, two
streams never share them); a call with no context open zeroes counters of its own (one more
memset), and so does a call captured in a CUDA graph on a stream that has none yet — a memset
node of the graph (about a microsecond per replay: run one split-K call on the capture stream
before capturing to use the stream's). Split rows come from the measured rows of
``iris_fw/tuning/gemm.json`` (``max_m`` / ``max_n`` / ``max_k`` bounds, :class:`RowBounds`);
the patterns' kernels do not split, so :func:`default_config` gives them only rows without a split.

**Tile order**: ``group_m`` (tile rows visited together) and ``xcds`` (:class:`GemmConfig`):
on GPUs that deal programs round-robin to chiplets with an L2 each (AMD Instinct MI300X /
MI355X: 8 XCDs) the tiles of each wave are renumbered so that every chiplet's programs take
consecutive ones (:func:`iris_fw.gemm_tiles.xcd_item`); the device's ``tile_order`` row of
the table gives both (:func:`measured_tile_order`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import context as _context
from . import gemm_tiles as tiles
from . import lifecycle
from . import tuning
from .devinfo import info, num_sms, persistent_programs
from .engine.contract import PatternError, check_tensor
from .errors import ArgumentError
from .kernel_launcher import KernelLauncher

#: TMA needs 16-byte aligned base addresses and row strides.
TMA_ALIGN_BYTES = 16


#: Input dtypes of the GEMM (the result has the inputs' dtype).
GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class GemmCfg(NamedTuple):
    """The constexpr configuration every GEMM pattern's ``CFG`` starts from (block sizes, tile
    order, whether each operand is a TMA descriptor, exact fp32 products). ``XCDS`` /
    ``PROGRAMS``: the chiplet renumbering of the tile order (:func:`iris_fw.gemm_tiles.xcd_item`:
    ``XCDS`` chiplets, waves of ``PROGRAMS`` programs — the device's SMs / CUs, the programs of
    a persistent kernel over the whole device); 1 and 1 where there is none."""

    BM: int
    BN: int
    BK: int
    GROUP_M: int
    A_DESC: bool
    B_DESC: bool
    EXACT: bool
    XCDS: int = 1
    PROGRAMS: int = 1


#: Rows up to which measured split-K rows apply (few-row products: decode, small prefill).
SPLIT_K_MAX_M = 256


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch options of the Triton GEMM. ``split_k``: K ranges per output tile
    (1: none; more: :func:`matmul` only, see the module's docstring). ``group_m`` and ``xcds``
    are the tile order: tile rows visited together, and the chiplets (AMD's XCDs, each with its
    own L2) whose programs get consecutive tiles (1: no renumbering;
    :func:`iris_fw.gemm_tiles.xcd_item`).

    ``persistent`` (:func:`matmul` only: the patterns' kernels run their own tile loops, and
    :func:`measured_config` gives them no persistent row): the persistent schedule for large products
    (:func:`_matmul_persistent_kernel`) — one program per SM looping over the tiles in the same
    order, each tile stored by :func:`iris_fw.gemm_tiles.store_tile` (a TMA store where the
    output allows one, in ``epilogue_subtile`` column pieces) — with ``flatten`` (the tile loop
    and its K loop pipelined as one loop, so the next tile's loads overlap this tile's
    epilogue), ``warp_specialize`` (the compiler's producer / consumer partitions of that loop;
    Blackwell only: :func:`warp_specializes`) and ``stream_k`` (0: none; n: the partly filled last wave and the ``n - 1``
    full waves before it are shared out over the programs in equal runs of ``BK`` steps —
    stream-K — so no program idles while a few finish the last tiles). Measured rows of
    ``iris_fw/tuning/gemm.json`` select it (``"persistent": true``); no row, no change."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    xcds: int = 1
    persistent: bool = False
    flatten: bool = False
    warp_specialize: bool = False
    stream_k: int = 0
    epilogue_subtile: int = 1

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
        if not isinstance(self.split_k, int) or isinstance(self.split_k, bool) or self.split_k < 1:
            raise ArgumentError(f"GemmConfig.split_k must be a positive int, got {self.split_k!r}")
        if not isinstance(self.xcds, int) or isinstance(self.xcds, bool) or self.xcds < 1:
            raise ArgumentError(f"GemmConfig.xcds must be a positive int, got {self.xcds!r}")
        for name in ("persistent", "flatten", "warp_specialize"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"GemmConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.stream_k, int) or isinstance(self.stream_k, bool) or self.stream_k < 0:
            raise ArgumentError(f"GemmConfig.stream_k must be a non-negative int, got {self.stream_k!r}")
        if self.epilogue_subtile not in (1, 2, 4) or self.block_n // self.epilogue_subtile < 16:
            raise ArgumentError(f"GemmConfig.epilogue_subtile must be 1, 2 or 4 and leave pieces of at least 16 "
                                f"columns of block_n {self.block_n}, got {self.epilogue_subtile!r}")
        schedule = [name for name in PERSISTENT_FIELDS if getattr(self, name) != _FIELD_DEFAULTS[name]]
        if schedule and not self.persistent:
            raise ArgumentError(f"GemmConfig.{schedule[0]} applies to the persistent schedule only (persistent=True)")
        if self.persistent and self.split_k > 1:
            raise ArgumentError("GemmConfig.persistent and split_k > 1 exclude each other: the persistent schedule "
                                "shares out the last waves along K itself (stream_k)")


#: The fields of the persistent schedule beyond ``persistent`` itself (:class:`GemmConfig`).
PERSISTENT_FIELDS = ("flatten", "warp_specialize", "stream_k", "epilogue_subtile")
_FIELD_DEFAULTS = {f.name: f.default for f in fields(GemmConfig)}


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
                   programs: int | None = None, split: bool = False) -> GemmConfig:
    """The tile configuration for a local ``[m, k] @ [k, n]`` product computed by ``programs``
    persistent programs (default: one per SM). A measured row of ``iris_fw/tuning/gemm.json``
    for the shape on this device comes first (:func:`measured_config`; rows with ``split_k`` >
    1 only with ``split``: :func:`matmul`'s kernel splits K, the patterns' kernels do not).

    16-bit inputs on GPUs: of :data:`HOPPER_TILES`, the one with the least estimated time,
    waves x tile time, where waves = ceil(tiles / programs) counts a partly filled last wave
    (or a partly filled last column of tiles) in full. That picks 128x256 tiles for large
    shapes and 128x128 where wide tiles leave SMs idle (few tiles, or ``n`` not a multiple of
    256), as measured at the taxonomy's local shapes (docs/performance.md).

    The device's tile order (:func:`measured_tile_order`) gives every configuration chosen here
    its ``xcds`` (a measured row may set its own) and the estimated 16-bit ones their
    ``group_m``."""
    order = measured_tile_order(device)
    if device.type == "cpu":
        cfg = CPU_CONFIG
    elif dtype == torch.float32:
        cfg = FP32_CONFIG
    else:
        measured = measured_config(m, device, n=n, k=k, split=split)
        if measured is not None:
            return measured  # (its xcds: the row's own, else the device's: _measured_rows)
        if programs is None:
            programs = num_sms(device)

        def estimate(choice):
            cfg, efficiency = choice
            tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
            return triton.cdiv(tiles, programs) * cfg.block_m * cfg.block_n / efficiency

        cfg = min(HOPPER_TILES, key=estimate)[0]
        if order.group_m is not None:
            cfg = replace(cfg, group_m=order.group_m)
    return cfg if cfg.xcds == order.xcds else replace(cfg, xcds=order.xcds)


#: Keys of a measured row's config that bound the products it applies to (not configuration
#: fields): ``max_n`` / ``max_k`` (at most; absent: any) and ``min_m`` / ``min_n`` (at least;
#: absent: 0) — beside the row's ``max_m``.
ROW_BOUNDS = ("max_n", "max_k", "min_m", "min_n")
#: A measured row's flag (not a configuration field): ``local`` true where the row's kernel at
#: least matched cuBLAS at every shape its sweep measured — one-rank ops run it
#: (:func:`local_kernel`).
ROW_FLAGS = ("local",)


class RowBounds(NamedTuple):
    """The products a measured row of ``iris_fw/tuning/gemm.json`` applies to (None: any)."""

    max_m: int | None
    max_n: int | None = None
    max_k: int | None = None
    min_m: int = 0
    min_n: int = 0
    #: whether one-rank ops' products take the row (:data:`ROW_FLAGS`)
    local: bool = False

    def hold(self, m: int, n: int | None, k: int | None) -> bool:
        """Whether ``[m, k] @ [k, n]`` is within the bounds (a bound on ``n`` / ``k`` holds when
        that size is not given)."""
        return ((self.max_m is None or m <= self.max_m) and m >= self.min_m
                and (n is None or ((self.max_n is None or n <= self.max_n) and n >= self.min_n))
                and (k is None or self.max_k is None or k <= self.max_k))


@functools.lru_cache(maxsize=None)
def _measured_rows(device_name: str) -> tuple:
    """``(RowBounds, GemmConfig)`` rows of the device. A row is ``[max_m, config]`` (``max_m``
    null: any); ``config`` may carry :data:`ROW_BOUNDS` too. A row without ``xcds`` takes the
    device's tile order's."""
    rows = tuning.load("gemm")["devices"].get(device_name, [])  # measured rows only: no defaults
    xcds = _tile_orders().get(device_name, NO_TILE_ORDER).xcds
    return tuple(parse_row(max_m, config, xcds) for max_m, config in rows)


def parse_row(max_m: int | None, config: dict, xcds: int = 1) -> tuple:
    """A measured row ``[max_m, config]`` of ``iris_fw/tuning/gemm.json`` as ``(RowBounds,
    GemmConfig)``: the config's :data:`ROW_BOUNDS` and :data:`ROW_FLAGS` go to the bounds, its
    notes (what chose the row) are dropped; ``xcds``: the tile order's, unless the row has its own."""
    config = tuning.fields(config)
    bounds = RowBounds(max_m, **{key: config.pop(key) for key in ROW_BOUNDS + ROW_FLAGS if key in config})
    return bounds, GemmConfig(**{"xcds": xcds, **config})


class TileOrder(NamedTuple):
    """A device's tile order (``tile_order`` of ``iris_fw/tuning/gemm.json``): ``group_m``, the
    ``GROUP_M`` of the estimated configurations (None: their own), and ``xcds``, the chiplets
    whose programs get consecutive tiles in every configuration (1: none)."""

    group_m: int | None = None
    xcds: int = 1


#: A device without a ``tile_order`` entry.
NO_TILE_ORDER = TileOrder()


@functools.lru_cache(maxsize=None)
def _tile_orders() -> dict:
    table = tuning.load("gemm")
    return {name: TileOrder(**tuning.fields(row))  # (without the note of what measured it)
            for name, row in table.get("tile_order", {}).items() if not name.startswith("_")}


def measured_tile_order(device: torch.device) -> TileOrder:
    """The tile order of ``device`` (``tile_order`` of ``iris_fw/tuning/gemm.json`` by device
    name): ``GROUP_M`` (tile rows visited together, sharing ``B``'s columns in L2) of the
    estimated configurations, chosen by time and L2 hit rate, and the chiplet count ``xcds`` of
    GPUs that deal programs round-robin to chiplets with an L2 each (AMD Instinct's XCDs);
    :data:`NO_TILE_ORDER` where the table has none."""
    orders = _tile_orders()
    return orders.get(info(device).name, NO_TILE_ORDER) if orders else NO_TILE_ORDER


def measured_config(m: int, device: torch.device, n: int | None = None, k: int | None = None,
                    split: bool = False) -> GemmConfig | None:
    """The measured tile configuration for a 16-bit ``[m, k] @ [k, n]`` product on ``device``
    (``iris_fw/tuning/gemm.json``: few-row products, where the estimate of
    :func:`default_config` does not hold, and large ones a sweep found faster than it), or
    None: the first row whose bounds hold (:class:`RowBounds`: ``max_m``; ``max_n`` /
    ``max_k`` / ``min_m`` / ``min_n`` where the row has them and ``n`` / ``k`` are given). Rows
    with ``split_k`` > 1 or the persistent schedule count only with ``split`` (:func:`matmul`'s
    kernels; the patterns' kernels run their own tile loops, so a tile row after a persistent
    one can serve them at the same shapes)."""
    row = _measured_row(m, device, n, k, split)
    return None if row is None else row[1]


def _measured_row(m: int, device: torch.device, n: int | None, k: int | None, split: bool):
    """``(RowBounds, GemmConfig)`` of :func:`measured_config`'s row, or None."""
    for bounds, cfg in _measured_rows(info(device).name):
        if (cfg.split_k > 1 or cfg.persistent) and not split:
            continue
        if bounds.hold(m, n, k):
            return bounds, cfg
    return None


def exact(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` must multiply exactly: fp32 inputs unless torch allows TF32 matmuls
    (``torch.backends.cuda.matmul.allow_tf32``), as torch does."""
    if dtype != torch.float32:
        return False
    get = getattr(torch._C, "_get_cublas_allow_tf32", None)  # what the attribute returns, without its
    return not (get() if get is not None else torch.backends.cuda.matmul.allow_tf32)  # __getattr__ (µs)


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
    operands seen before. With ``cfg.xcds`` > 1 the chiplet renumbering's waves are the
    device's SM (CU) count: a pattern's kernels run one program per SM, and a kernel with
    fewer (a two-role schedule's compute side) maps tiles alike, with less of the locality."""
    get = cache.operand if cache is not None else (lambda t, block: operand(t, list(block)))
    a_src, a_desc = get(a, (cfg.block_m, cfg.block_k)) if a_tma else (a, False)
    b_src, b_desc = get(b, (cfg.block_k, cfg.block_n))
    wave = num_sms(b.device) if cfg.xcds > 1 else 1
    return a_src, b_src, GemmCfg(cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, a_desc, b_desc, exact(a.dtype),
                                 cfg.xcds, wave)


@triton.jit
def _split_tile(a, b, c, partials, counters, tile, split, pm, pn, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, A_DESC: tl.constexpr,
                B_DESC: tl.constexpr, EXACT: tl.constexpr, SPLIT_K: tl.constexpr):
    """Split ``split`` of output tile ``tile``: its K range's fp32 partial into ``partials``
    (``[tiles, SPLIT_K, BM, BN]``); the tile's last split to finish sums the partials in split
    order, stores the tile and resets the tile's counter."""
    steps = tl.cdiv(K, BK)
    per = tl.cdiv(steps, SPLIT_K)
    first = split * per
    acc = tiles.matmul_tile_k(a, b, pm * BM, pn * BN, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              first, tl.minimum(first + per, steps), BM, BN, BK, A_DESC, B_DESC, EXACT)
    r = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    slots = partials + tile.to(tl.int64) * (SPLIT_K * BM * BN)
    tl.store(slots + split * (BM * BN) + r, acc)
    # every thread's partial stored before the count (release); the last sees them all (acquire)
    tl.debug_barrier()
    done = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if done == SPLIT_K - 1:
        total = tl.zeros((BM, BN), dtype=tl.float32)
        for j in range(0, SPLIT_K):  # split order: the same sum whichever split came last
            total += tl.load(slots + j * (BM * BN) + r, cache_modifier=".cg")
        tl.store(counters + tile, 0)
        tiles.store_block(c, total, pm * BM, pn * BN, M, N, stride_cm, stride_cn, BM, BN)


@triton.jit
def _matmul_kernel(a, b, c, partials, counters, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                   stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   A_DESC: tl.constexpr, B_DESC: tl.constexpr, EXACT: tl.constexpr, NPROG: tl.constexpr,
                   SPLIT_K: tl.constexpr = 1, XCDS: tl.constexpr = 1):
    """``c[M, N] = a[M, K] @ b[K, N]``, persistent over the ``tiles x SPLIT_K`` work items (item
    ``tile * SPLIT_K + split``). ``SPLIT_K`` 1: each tile whole (``partials`` and ``counters``
    unused); more: :func:`_split_tile` (fp32 ``partials [tiles, SPLIT_K, BM, BN]``, int32
    ``counters [tiles]`` zero between calls). ``XCDS`` > 1: items renumbered chiplet by chiplet
    over waves of ``NPROG`` (:func:`~iris_fw.gemm_tiles.xcd_item`)."""
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    items = tiles_m * tiles_n * SPLIT_K
    for item in range(tl.program_id(0), items, NPROG):
        if SPLIT_K == 1:
            pm, pn = tiles.grouped_tile(item, tiles_m, tiles_n, GROUP_M, XCDS, NPROG)
            acc = tiles.matmul_tile(a, b, pm * BM, pn * BN, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                    BM, BN, BK, A_DESC, B_DESC, EXACT)
            tiles.store_block(c, acc, pm * BM, pn * BN, M, N, stride_cm, stride_cn, BM, BN)
        else:
            work = tiles.xcd_item(item, items, NPROG, XCDS)  # a tile's splits: on one chiplet
            tile = work // SPLIT_K
            pm, pn = tiles.grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
            _split_tile(a, b, c, partials, counters, tile, work % SPLIT_K, pm, pn, M, N, K, stride_am, stride_ak,
                        stride_bk, stride_bn, stride_cm, stride_cn, BM, BN, BK, A_DESC, B_DESC, EXACT, SPLIT_K)


@triton.jit
def _part(partials, slot, BM: tl.constexpr, BN: tl.constexpr):
    """The ``[BM, BN]`` pointers of slot ``slot`` of the fp32 ``partials`` (computed where used:
    a block of offsets kept across the stream-K loop would hold registers the tile needs)."""
    return partials + slot.to(tl.int64) * (BM * BN) + (tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :])


@triton.jit
def _stream_k_tail(a, b, c, partials, counters, first_tile, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, A_DESC: tl.constexpr, B_DESC: tl.constexpr, C_DESC: tl.constexpr,
                   EXACT: tl.constexpr, NPROG: tl.constexpr, XCDS: tl.constexpr, SUBTILE: tl.constexpr):
    """Stream-K over the tiles ``first_tile …`` (the last waves): their ``BK`` steps, tile after
    tile, cut into ``NPROG`` equal runs, one per program. A run covers a tile's steps whole
    (stored at once) or in part: a part goes to the program's slot of ``partials`` (fp32 ``[NPROG,
    2, BM, BN]``: slot 0 for the run's first tile, 1 for its last) and adds its step count to the
    tile's counter (int32 ``counters``, from ``first_tile`` on, zero between calls); the part that
    completes the count sums the tile's parts in program order (the same sum whichever came last:
    deterministic), stores the tile and resets the counter. No program waits for another."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    steps = tl.cdiv(K, BK)
    total = ((tiles_m * tiles_n - first_tile) * steps).to(tl.int64)
    start = pid * total // NPROG
    end = (pid + 1) * total // NPROG
    cur = start
    while cur < end:
        t = cur // steps
        k0 = (cur - t * steps).to(tl.int32)
        k1 = tl.minimum(steps, k0 + (end - cur)).to(tl.int32)
        pm, pn = tiles.grouped_tile(first_tile + t.to(tl.int32), tiles_m, tiles_n, GROUP_M, XCDS, NPROG)
        acc = tiles.matmul_tile_k(a, b, pm * BM, pn * BN, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                  k0, k1, BM, BN, BK, A_DESC, B_DESC, EXACT)
        if (k0 == 0) & (k1 == steps):
            tiles.store_tile(c, acc, pm * BM, pn * BN, M, N, stride_cm, stride_cn, BM, BN, C_DESC, SUBTILE)
        else:
            slot = (cur != start).to(tl.int64)
            tl.store(_part(partials, pid * 2 + slot, BM, BN), acc)
            # every thread's part stored before the count (release); the last sees them all (acquire)
            tl.debug_barrier()
            done = tl.atomic_add(counters + t, k1 - k0, sem="acq_rel", scope="gpu")
            tl.debug_barrier()
            if done + (k1 - k0) == steps:
                # the tile's programs: from the one whose run holds its first step to the one
                # whose run holds its last (programs with empty runs, total < NPROG, skipped)
                q_first = ((t * steps + 1) * NPROG + total - 1) // total - 1
                q_last = (((t + 1) * steps) * NPROG + total - 1) // total - 1
                out = tl.zeros((BM, BN), dtype=tl.float32)
                for q in range(q_first, q_last + 1):
                    q_start = q * total // NPROG
                    if (q + 1) * total // NPROG > q_start:
                        q_slot = (q_start // steps != t).to(tl.int64)
                        out += tl.load(_part(partials, q * 2 + q_slot, BM, BN), cache_modifier=".cg")
                tl.store(counters + t, 0)
                tiles.store_tile(c, out, pm * BM, pn * BN, M, N, stride_cm, stride_cn, BM, BN, C_DESC, SUBTILE)
        cur += k1 - k0


@triton.jit
def _matmul_persistent_kernel(a, b, c, partials, counters, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              stride_cm, stride_cn, dp_tiles, BM: tl.constexpr, BN: tl.constexpr,
                              BK: tl.constexpr, GROUP_M: tl.constexpr, A_DESC: tl.constexpr, B_DESC: tl.constexpr,
                              C_DESC: tl.constexpr, EXACT: tl.constexpr, NPROG: tl.constexpr,
                              XCDS: tl.constexpr = 1, FLATTEN: tl.constexpr = False,
                              WARP_SPECIALIZE: tl.constexpr = False, SUBTILE: tl.constexpr = 1,
                              STREAM_K: tl.constexpr = False):
    """``c[M, N] = a[M, K] @ b[K, N]``, the persistent schedule (:class:`GemmConfig`
    ``persistent``): ``NPROG`` programs, program ``p`` computing tiles ``p, p + NPROG, …`` below
    ``dp_tiles`` whole, in :func:`~iris_fw.gemm_tiles.grouped_tile` order, in one loop
    (``FLATTEN``: pipelined with its K loop as one; ``WARP_SPECIALIZE``: split into the
    compiler's producer / consumer partitions), each tile stored by
    :func:`~iris_fw.gemm_tiles.store_tile` (``C_DESC``: ``c`` a descriptor of ``[BM, BN //
    SUBTILE]`` blocks). ``STREAM_K``: the tiles from ``dp_tiles`` on by :func:`_stream_k_tail`
    (``partials`` fp32 ``[NPROG, 2, BM, BN]``, ``counters`` int32 ``[tiles - dp_tiles]``);
    without, ``dp_tiles`` is every tile."""
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    # the epilogue's tile, counted apart from the loop's (the idiom of Triton's persistent
    # matmul: a value used both where the pipeliner hoists the loads and in the epilogue is not)
    stored = tl.program_id(0) - NPROG
    for tile in tl.range(tl.program_id(0), dp_tiles, NPROG, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pm, pn = tiles.grouped_tile(tile, tiles_m, tiles_n, GROUP_M, XCDS, NPROG)
        acc = tiles.matmul_tile(a, b, pm * BM, pn * BN, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                BM, BN, BK, A_DESC, B_DESC, EXACT)
        stored += NPROG
        sm, sn = tiles.grouped_tile(stored, tiles_m, tiles_n, GROUP_M, XCDS, NPROG)
        tiles.store_tile(c, acc, sm * BM, sn * BN, M, N, stride_cm, stride_cn, BM, BN, C_DESC, SUBTILE)
    if STREAM_K:
        _stream_k_tail(a, b, c, partials, counters, dp_tiles, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       stride_cm, stride_cn, BM, BN, BK, GROUP_M, A_DESC, B_DESC, C_DESC, EXACT, NPROG, XCDS,
                       SUBTILE)


#: The key under which a context holds its :class:`SplitCounters` (``ctx.extensions``).
EXTENSION = "iris_fw.gemm"


class SplitCounters:
    """One context's split-K tile counters by (device, stream): int32, zero between calls (the
    last split of a tile resets its counter), grown as needed. Calls on one stream run one after
    another, so they share one array; calls on two streams never share one. The context holds
    it (:func:`split_counters`) without importing this module: its ``rearm()`` (after an abort,
    which may have stopped an interpreted call between a tile's splits) zeroes the counters in
    place — a CUDA graph that captured them keeps valid pointers; ``close()`` / ``clear()``
    drop them (a later call makes fresh ones)."""

    __slots__ = ("by_stream",)

    def __init__(self) -> None:
        self.by_stream: dict = {}

    def get(self, device: torch.device, tiles: int) -> torch.Tensor:
        """Zeroed int32 counters for a call of ``tiles`` tiles on ``device``'s current stream.
        During CUDA-graph capture, when the capture stream has none large enough yet, counters
        of this call only: zeroed by a memset captured with it (memory of the graph's pool, kept
        by the graph), since what would be kept could not be zeroed before the graph's first
        replay."""
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        key = (device, stream)
        counters = self.by_stream.get(key)
        if counters is None or counters.numel() < tiles:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return torch.zeros(tiles, dtype=torch.int32, device=device)
            counters = self.by_stream[key] = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        return counters

    def rearm(self) -> None:
        for counters in self.by_stream.values():
            counters.zero_()

    def close(self) -> None:
        self.by_stream.clear()

    clear = close


def split_counters(ctx) -> SplitCounters:
    """The :class:`SplitCounters` of ``ctx`` (made on first use)."""
    found = ctx.extensions.get(EXTENSION)
    if found is None:
        found = ctx.extensions[EXTENSION] = SplitCounters()
    return found


def _split_counters(ctx, device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 tile counters for a split-K call: ``ctx``'s (or the current context's)
    counters, or, with no context open, counters of this call only."""
    if ctx is None:
        ctx = lifecycle.process().current(required=False)
    if ctx is None:
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    return split_counters(ctx).get(device, tiles)


def storage_of(*tensors) -> frozenset:
    """The storage pointers of ``tensors`` (None skipped): what a :class:`LocalProduct` must not
    multiply into. A plan computes its fixed operands' once."""
    return frozenset(t.untyped_storage().data_ptr() for t in tensors if t is not None)


def _product_launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg: GemmConfig, counters) -> tuple:
    """``(grid, runtime arguments, constexprs, options)`` of :func:`_matmul_kernel` for ``c =
    a @ b`` in ``cfg`` (split-K capped at the ``BK`` steps of K; ``counters(tiles)``: the split
    tiles' zeroed counters, asked only for a split)."""
    M, K = a.shape
    N = b.shape[1]
    n_tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    split = max(1, min(cfg.split_k, triton.cdiv(K, cfg.block_k)))
    partials = split_counts = c  # unused without a split
    if split > 1:
        split_counts = counters(n_tiles)
        partials = torch.empty(n_tiles * split * cfg.block_m * cfg.block_n, dtype=torch.float32, device=a.device)
    a_src, a_desc = operand(a, [cfg.block_m, cfg.block_k])
    b_src, b_desc = operand(b, [cfg.block_k, cfg.block_n])
    nprog = persistent_programs(a.device, n_tiles * split)
    args = (a_src, b_src, c, partials, split_counts, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))
    constexprs = dict(BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=cfg.group_m, A_DESC=a_desc,
                      B_DESC=b_desc, EXACT=exact(a.dtype), NPROG=nprog, SPLIT_K=split, XCDS=cfg.xcds)
    return (nprog,), args, constexprs, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def local_kernel(m: int, n: int, k: int, device: torch.device, dtype: torch.dtype) -> GemmConfig | None:
    """The configuration in which an op's local product ``[m, k] @ [k, n]`` runs the Triton GEMM
    instead of ``torch.matmul`` (:class:`LocalProduct`), or None: on a GPU whose tuning table's
    row for the shape (:func:`measured_config`, split-K rows included) is flagged ``local`` — its
    sweep found the kernel at least as fast as cuBLAS in the same run — where a prepared launch
    costs the host a fraction of ``torch.matmul``'s dispatch; elsewhere (CPU ranks, fp32 — the
    rows are measured for 16-bit inputs —, shapes no sweep measured, rows slower than cuBLAS)
    cuBLAS / torch."""
    if device.type != "cuda" or not m or not n or dtype not in (torch.float16, torch.bfloat16):
        return None
    row = _measured_row(m, device, n, k, True)
    # (the persistent schedule's rows serve gemm.matmul only: products too large for host time to matter)
    return row[1] if row is not None and row[0].local and not row[1].persistent else None


class LocalProduct:
    """``dst = a @ b`` (``+ bias``) for one plan's fixed operands ``a [M, K]``, ``b [K, N]``:
    the local product of an op's library form, writing where the caller wants it. Called with ``dst``
    (a contiguous ``[M, N]`` tensor of ``a``'s dtype), returns it.

    Where :func:`local_kernel` gives a configuration (``kernel``; or ``config`` is given) the product is
    one :class:`~iris_fw.kernel_launcher.PreparedLaunch` of the Triton GEMM, prepared on the
    first call into ``buffer`` (the op's own result tensor) with the split tiles' counters of
    its own; another ``dst`` takes that launch with the output replaced for the call
    (:meth:`~iris_fw.kernel_launcher.PreparedLaunch.launch_with`: a functional call's new
    tensor), and from its second call in a row a launch of its own
    (:meth:`~iris_fw.kernel_launcher.PreparedLaunch.with_args`: a loop on one ``out``, the
    prepared launch alone); else ``torch.matmul``. Straight
    into ``dst``, unless ``dst`` shares memory with an operand (``operands``:
    :func:`storage_of`, e.g. ``out=a``), which the product still reads: then into ``buffer``
    and copied. A bias is added by torch after the product. ``kernel=False``: always
    ``torch.matmul``."""

    __slots__ = ("a", "b", "buffer", "operands", "bias", "config", "_launch", "_out_at", "_last")

    def __init__(self, a: torch.Tensor, b: torch.Tensor, buffer: torch.Tensor, operands: frozenset,
                 bias: torch.Tensor | None = None, config: GemmConfig | None = None, kernel: bool = True):
        self.a, self.b, self.buffer, self.operands, self.bias = a, b, buffer, operands, bias
        if config is None and kernel:
            config = local_kernel(a.shape[0], b.shape[1], a.shape[1], a.device, a.dtype)
        self.config = config
        self._launch = None
        self._last = (None, None)  # (the last output other than buffer, its prepared launch)

    def _prepare(self):
        buffer = self.buffer
        grid, args, constexprs, options = _product_launch(
            self.a, self.b, buffer, self.config,
            lambda n: torch.zeros(n, dtype=torch.int32, device=buffer.device))  # reset by each call's last split
        launcher = KernelLauncher(_matmul_kernel, grid, constexprs=constexprs, **options)
        self._out_at = launcher.runtime_params.index("c")
        self._launch = launcher.prepare(*args)
        return self._launch

    def __call__(self, dst: torch.Tensor) -> torch.Tensor:
        target = self.buffer if dst.untyped_storage().data_ptr() in self.operands else dst
        if self.config is None:
            torch.matmul(self.a, self.b, out=target)
        else:
            launch = self._launch or self._prepare()
            if target is self.buffer:
                launch()
            else:
                last, into = self._last
                if last is not target:  # a new output (a functional call's): replaced
                    self._last = (target, None)
                    launch.launch_with(((self._out_at, target),))
                else:  # the same output again (a loop on one out=): a launch of its own, kept
                    if into is None:
                        into = launch.with_args(((self._out_at, target),))
                        self._last = (target, into)
                    into.launch_with(((self._out_at, target),))  # (nothing replaced unless it moved)
        if self.bias is not None:
            target.add_(self.bias)
        return dst if target is dst else dst.copy_(target)


def matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
           config: GemmConfig | None = None, ctx=None) -> torch.Tensor:
    """``a[M, K] @ b[K, N]`` with the patterns' Triton GEMM (persistent, TMA where possible).

    fp16 / bf16 / fp32; the result has ``a``'s dtype, accumulated in fp32. ``out``: an
    ``[M, N]`` tensor to write. ``config``: default :func:`default_config` (split-K rows of the
    tuning table included); ``config.split_k`` > 1 splits K (module docstring), capped at the
    ``BK`` steps of K. ``ctx``: the context whose split-K counters the call uses (default: the
    current context if one is open; with none, a split call zeroes counters of its own). The
    GEMM itself is local: no other rank takes part.
    """
    a, b = check_operands(a, b, a.device if isinstance(a, torch.Tensor) else None)
    if ctx is not None:
        ctx = _context.resolve(ctx)
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
    cfg = config or default_config(M, N, K, a.dtype, a.device, split=True)
    counters = lambda n: _split_counters(ctx, a.device, n)  # noqa: E731
    if cfg.persistent:
        grid, args, constexprs, options = _persistent_launch(a, b, out, cfg, counters)
        _matmul_persistent_kernel[grid](*args, **constexprs, **options)
        return out
    grid, args, constexprs, options = _product_launch(a, b, out, cfg, counters)
    _matmul_kernel[grid](*args, **constexprs, **options)
    return out


def stream_k_tiles(tiles: int, programs: int, waves: int) -> int:
    """The tiles the stream-K tail of the persistent schedule shares out (:class:`GemmConfig`
    ``stream_k`` = ``waves``): none without (``waves`` 0) or when the tiles fill every wave;
    else the partly filled last wave's and the ``waves - 1`` full waves' before it (all of
    them, when there are fewer)."""
    rem = tiles % programs
    if waves == 0 or rem == 0:
        return 0
    return min(tiles, rem + (waves - 1) * programs)


#: The first NVIDIA architecture whose Triton (3.6, 3.9) lowers ``tl.range(...,
#: warp_specialize=True)`` into producer / consumer partitions: Blackwell. On Hopper the loop
#: compiles to the same code as without at 8 warps and Triton's Hopper pass can fail at 4; AMD's
#: lowers it for gfx1250 only.
WARP_SPECIALIZE_MIN_SM = 100


def warp_specializes(cfg: GemmConfig, device: torch.device) -> bool:
    """Whether ``cfg``'s ``warp_specialize`` reaches the kernel on ``device``: on NVIDIA GPUs
    from :data:`WARP_SPECIALIZE_MIN_SM` on (and under the interpreter, which ignores it);
    elsewhere the flattened loop is software-pipelined as without."""
    arch = info(device).arch
    if not cfg.warp_specialize or arch.startswith("gfx"):
        return False
    return not arch.startswith("sm_") or int(arch[3:]) >= WARP_SPECIALIZE_MIN_SM


def _persistent_launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg: GemmConfig, counters) -> tuple:
    """``(grid, runtime arguments, constexprs, options)`` of :func:`_matmul_persistent_kernel`
    for ``c = a @ b`` under the persistent schedule (``cfg.persistent``): one program per SM
    (:func:`~iris_fw.devinfo.persistent_programs`), the tiles data-parallel but for the stream-K
    tail (:func:`stream_k_tiles`; ``counters(tiles)``: that many zeroed tile counters, asked only
    for a tail). ``c`` is written through a TMA descriptor where :func:`tma_ok` (a launch reused
    for another output needs that output's descriptor)."""
    M, K = a.shape
    N = b.shape[1]
    n_tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    steps = triton.cdiv(K, cfg.block_k)
    nprog = persistent_programs(a.device, n_tiles * steps if cfg.stream_k else n_tiles)
    sk_tiles = stream_k_tiles(n_tiles, nprog, cfg.stream_k) if steps else 0  # (K 0: every tile zeros, whole)
    partials = tile_counts = c  # unused without a stream-K tail
    if sk_tiles:
        tile_counts = counters(sk_tiles)
        partials = torch.empty(nprog * 2 * cfg.block_m * cfg.block_n, dtype=torch.float32, device=a.device)
    a_src, a_desc = operand(a, [cfg.block_m, cfg.block_k])
    b_src, b_desc = operand(b, [cfg.block_k, cfg.block_n])
    c_dst, c_desc = operand(c, [cfg.block_m, cfg.block_n // cfg.epilogue_subtile])
    args = (a_src, b_src, c_dst, partials, tile_counts, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), n_tiles - sk_tiles)
    constexprs = dict(BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=cfg.group_m, A_DESC=a_desc,
                      B_DESC=b_desc, C_DESC=c_desc, EXACT=exact(a.dtype), NPROG=nprog, XCDS=cfg.xcds,
                      FLATTEN=cfg.flatten, WARP_SPECIALIZE=warp_specializes(cfg, a.device),
                      SUBTILE=cfg.epilogue_subtile,
                      STREAM_K=sk_tiles > 0)
    return (nprog,), args, constexprs, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
