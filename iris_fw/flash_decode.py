"""Distributed flash-decode: attention of one new token per sequence over a KV cache whose
sequence is split across the ranks, combined across ranks inside the attention kernel.

``flash_decode(q, k, v, *, kv_lens=None, sm_scale=None, out=None, scheduler="auto",
block_table=None, group=None, ctx=None) -> o`` — shapes::

    q       [B, Hq, D]        the same on every rank
    k       [B, S_r, Hkv, D]  this rank's contiguous slice of the sequence (rank order = sequence
    v       [B, S_r, Hkv, Dv]   order); S_r may differ between ranks, 0 included
    kv_lens [B] int32         valid tokens of this rank's slice per sequence (optional; clamped to [0, S_r])
    o       [B, Hq, Dv]       softmax(q·Kᵀ·sm_scale)·V over the whole sequence, on every rank

or paged (as vLLM)::

    block_table [B, pages] int32        each sequence's pages of this rank's slice, in order
    k [num_pages, page_size, Hkv, D]    the pages; S_r = pages * page_size
    v [num_pages, page_size, Hkv, Dv]

Query head ``h`` reads kv head ``h // (Hq / Hkv)`` (GQA; MQA and MHA alike); fp16, bf16, fp32;
``D`` and ``Dv`` any size up to 256 (masked to the next power of two). A sequence without any
valid token gets zeros. Every rank's ``o`` is bitwise the same.

**Work decomposition.** A *unit* is (sequence b, kv head, block of at most ``max_rows`` query
heads of that kv head: all ``G = Hq / Hkv`` of them unless G is large); each unit's slice of
this rank is cut into ``n_split`` block-aligned *splits* (per sequence, from its valid
length, on the device). A persistent grid of ``programs_per_sm`` programs per SM (tuning
table; a ``fused`` plan caps it at what one SM holds of the compiled kernel:
:meth:`FlashDecode._fit_residency`) takes the work items (unit, split) ``pid, pid + programs,
…``; ``n_split`` is chosen from the unit count so that the items about fill the grid (batch 1 ×
8 kv heads on 132 SMs, one program per SM: 16 splits).
A split program loads the unit's query heads as one ``[ROWS, D]`` tile (padded to 16 rows so
``tl.dot`` applies: the K and V tiles are read once for all query heads of the kv head), runs
the online softmax over its ``BLOCK_N``-token K/V tiles (the row's ``swap_ab``: the products
transposed, tokens on the MMA's M side and the query heads on N — on Hopper ``wgmma`` from
shared memory, fewer registers a thread), and stores its partial (normalized
``o`` and log-sum-exp) in a local scratch. It then counts itself on the unit's counter (local
atomic); the split that arrives *last* combines the unit's ``n_split`` partials (in split
order; their loads in unrolled groups, in flight together) into this rank's partial of the
unit. Or, where the row says ``cluster_combine`` and the plan can (NVIDIA sm_90+, one work item
a program, the GPU holding every cluster of the grid at once: :meth:`FlashDecode._fit_clusters`),
the unit's splits are one thread-block cluster: each stores its partial into the shared memory
of the unit's first split (:mod:`iris_fw.dsmem`), which combines them after the cluster's
barrier — no counter, no L2 round trips in series. What follows is the *algorithm*'s
(``scheduler=``; see below): ``fused`` (``"auto"``) pushes the partial to every rank, waits
for theirs and combines them in the same kernel (one launch per call, no host
synchronization); ``bulk_sync`` stores it locally, all-gathers the partials and combines
them in a second kernel (three launches: the bulk-synchronous reference on our side).

Per-call state lives on the device: per-program epoch counters (:func:`iris_fw.tilecomm.program_epoch`),
unit counters reset by the last split, arrival slots holding epochs. A call issued again with
the same host arguments — a CUDA-graph replay with fresh ``q``/``k``/``v``/``kv_lens`` in the
same tensors — is correct; so is a decode loop whose ``S_r`` grows (``S_r`` is a runtime
argument, not part of the cached call).

**Calls.** The first call of a shape class (B, Hq, Hkv, D, Dv, dtype, kv_lens given or not,
sm_scale, scheduler) on a group is validated across its members through the group's mailbox
(:meth:`iris_fw.ccl.Group.exchange`; ``S_r`` may differ): a mismatch raises on every rank
naming the ranks and the argument. It then plans (:class:`FlashDecode`): tuning row, split
count, scratch, the local kernel's launch, and the algorithm's part — for ``fused`` a kernel
configuration of the group's workspace (:func:`iris_fw.ccl.algorithm.kernel_config`: receive
buffers and arrival slots, shared by calls of equal bytes). Later calls are one dictionary
look-up and the algorithm's launches. Launch configurations are data:
``iris_fw/tuning/flash_decode.json``, keyed by device name.

**Algorithms.** ``scheduler=`` names a flash-decode algorithm of the context's algorithm
registry, registered (hook ``iris_fw_register_algorithms``) as ``"flash_decode.<name>"`` like
a collective algorithm of :mod:`iris_fw.ccl`; ``"auto"`` is :data:`AUTO_SCHEDULER`, and a name
not registered raises :class:`~iris_fw.ArgumentError` on every rank, naming the argument and
the registered ones (:func:`schedulers`). The built-ins, ``fused`` and ``bulk_sync``, are the
plugin module :mod:`iris_fw.collectives.flash_decode`; a third party registers its own the same
way. An algorithm is a :class:`DecodeAlgorithm`: the ccl contract (:class:`iris_fw.ccl.algorithm.Algorithm`:
``name``, ``supports(call)``, ``plan(group, call)``) for an op of several inputs — the call a
:class:`DecodeCall`, the plan a :class:`FlashDecode`, which keeps what every algorithm shares
and asks the algorithm for its buffers (``setup``), its launches (``launches``) and each call's
launch sequence (``run``). Not a ccl ``run(src, dst)``: flash-decode takes ``q``, ``k``,
``v``, ``kv_lens`` and ``block_table`` and writes ``out``, and its operands are prepared per
layout (:meth:`FlashDecode.launch`) rather than per input pointer.

This module holds the API, the checks, the tuning rows and the plan; the Triton kernels are
:mod:`iris_fw.flash_decode_kernels`. :func:`flash_decode_reference` (float64, from every rank's
slices) and :func:`combine_partials` (torch: the combine of per-rank partials, the
bulk-synchronous baseline's last step) sit beside the op, as every op's reference does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton

from . import callpath as cp
from . import context as _context
from . import devinfo, driver
from . import tuning as tuning_tables
from .ccl import algorithm as al
from .ccl import api
from .errors import ArgumentError, ArgumentTypeError, IrisError
from .flash_decode_kernels import LOG2E, _flash_decode_kernel, cluster_region_bytes
from .kernel_launcher import (KernelLauncher, cluster_launch_supported, compiled_resources, pdl_launch_supported,
                              resolved)
from .trace_session import clock_mode

__all__ = ["AUTO_SCHEDULER", "DTYPES", "MAX_HEAD_DIM", "SCHEDULERS", "DecodeAlgorithm", "FlashDecode",
           "combine_partials", "flash_decode", "flash_decode_reference", "plan", "schedulers", "tuning"]

#: dtypes of q, k, v (and of o).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Largest head dim (D and Dv).
MAX_HEAD_DIM = 256
#: The built-in ``scheduler=`` values (flash-decode algorithms of :mod:`iris_fw.collectives.flash_decode`);
#: :func:`schedulers` lists those registered in a context, plugins' included.
SCHEDULERS = ("fused", "bulk_sync")
#: The algorithm ``scheduler="auto"`` runs.
AUTO_SCHEDULER = "fused"
#: The algorithm registry's prefix of flash-decode algorithms (``"flash_decode.<name>"``).
COLLECTIVE = "flash_decode"
#: Operand layouts (q, k, v, kv_lens, block_table pointers and strides) a plan keeps a prepared
#: launch for, per set of launches (untraced; traced): double-buffered inputs hit. Each holds its
#: tensors alive, and the output of the call that prepared it.
PREPARED_LAYOUTS = 4
#: Smallest tile side ``tl.dot`` takes.
MIN_DOT = 16
#: A tuning row's ``max_registers`` (NVIDIA's register cap a thread), when not 0: between
#: ``ptxas``'s least cap (``--maxrregcount``) and the most a thread may hold.
MIN_REGISTERS, MAX_REGISTERS = 16, 255
#: Tokens of the slice a plan's compile ahead of its first call assumes (``seq`` and the strides
#: of contiguous operands: a multiple of 16, as a decode loop's usually are; see
#: :meth:`FlashDecode.programs_fitting`).
SAMPLE_SEQ = 4096
#: A device address as a compile ahead of the first call specializes one (a trace buffer's
#: handle: 64-bit, a multiple of 16).
SAMPLE_ADDRESS = 1 << 40


# ---- tuning (data) --------------------------------------------------------------------------------


#: Fields a row's ``by_units`` entries may override (the split count and the tile, not the
#: query-head tiling that decides the unit count).
UNIT_OVERRIDES = ("block_n", "num_warps", "num_stages", "programs_per_sm", "items_per_program", "max_splits",
                  "swap_ab", "max_registers", "combine_unroll", "cluster_combine", "pdl")


@dataclass(frozen=True)
class Tuning:
    """One row of ``iris_fw/tuning/flash_decode.json`` (see its ``_doc``). ``by_units``:
    ``((max_units, {field: value}), …)`` — for a call of at most ``max_units`` work units
    (batch x kv heads x head tiles; the first bound that holds) the fields of
    :data:`UNIT_OVERRIDES` given there replace the row's (small batches: more splits per unit,
    another tile); :meth:`for_units` applies them."""

    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    items_per_program: int
    max_splits: int
    max_rows: int
    by_units: tuple = ()
    #: the split's products with their operands swapped (tokens on the MMA's M side:
    #: :func:`~iris_fw.flash_decode_kernels._split_attention_swapped`; Hopper's ``wgmma``, K and V
    #: read from shared memory, fewer registers a thread); False: query heads on M (padded to 16)
    swap_ab: bool = False
    #: NVIDIA: registers a thread at most (Triton's ``maxnreg``; ``ptxas`` spills beyond it),
    #: so that ``programs_per_sm`` programs fit an SM's register file; 0: the compiler's choice
    #: (AMD: always)
    max_registers: int = 0
    #: splits whose partials the unit's combine loads as one tile (a power of two; the plan
    #: takes at most the split count's; at least the split count: every load in flight
    #: together), the groups one after another
    #: (:func:`~iris_fw.flash_decode_kernels._combine_partials`)
    combine_unroll: int = 8
    #: the unit's splits launched as one thread-block cluster and combined in its distributed
    #: shared memory (each split stores its partial into the shared memory of the unit's first
    #: split, which combines them after the cluster's barrier: no L2 round trips in series),
    #: where the plan can — an NVIDIA GPU of compute capability 9.0 or later, every work item a
    #: program of its own, a power-of-two split count of at most :data:`iris_fw.driver.MAX_CLUSTER`, and every
    #: cluster of the grid resident at once (:meth:`FlashDecode._fit_clusters`); else (and False)
    #: the unit's counter and its last split's loads (``combine_unroll``)
    cluster_combine: bool = False
    #: each call a programmatic dependent launch where the GPU can (NVIDIA compute capability
    #: 9.0+: :func:`iris_fw.kernel_launcher.pdl_launch_supported`): its programs may be placed
    #: on the SMs while the kernel before it in the stream ends, and wait for that kernel
    #: (``gdc_wait``) before their first read; each program lets the next kernel launch once it
    #: has read its last work item's tokens (``gdc_launch_dependents``: not at its start, so
    #: the next call's programs cannot take SMs beside this call's streaming ones)
    pdl: bool = False

    def __post_init__(self):
        if isinstance(self.combine_unroll, bool) or not isinstance(self.combine_unroll, int) or (
                self.combine_unroll < 1 or self.combine_unroll & (self.combine_unroll - 1)):
            raise ValueError(f"flash_decode tuning: combine_unroll is a power of two >= 1, got {self.combine_unroll!r}")
        for name in ("swap_ab", "cluster_combine", "pdl"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"flash_decode tuning: {name} is true or false, got {getattr(self, name)!r}")
        if isinstance(self.max_registers, bool) or not isinstance(self.max_registers, int) or not (
                self.max_registers == 0 or MIN_REGISTERS <= self.max_registers <= MAX_REGISTERS):
            raise ValueError(f"flash_decode tuning: max_registers is 0 (the compiler's choice) or "
                             f"{MIN_REGISTERS}-{MAX_REGISTERS}, got {self.max_registers!r}")
        entries = []
        for bound, fields in self.by_units:
            fields = dict(fields)
            unknown = set(fields) - set(UNIT_OVERRIDES)
            if unknown or not isinstance(bound, int) or bound < 1:
                fields_text = ", ".join(UNIT_OVERRIDES)
                raise ValueError(f"flash_decode tuning: a by_units entry is [max units >= 1, {{{fields_text}}}], "
                                 f"got {[bound, fields]!r}")
            entries.append((bound, tuple(sorted(fields.items()))))
        object.__setattr__(self, "by_units", tuple(entries))

    def for_units(self, units: int) -> "Tuning":
        """This row for a call of ``units`` work units: the first ``by_units`` entry whose bound
        holds applied (without ``by_units``)."""
        for bound, fields in self.by_units:
            if units <= bound:
                return replace(self, by_units=(), **dict(fields))
        return replace(self, by_units=())


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    return tuning_tables.load("flash_decode")


def tuning(device: torch.device, head_dim: int) -> Tuning:
    """The launch configuration for ``device`` at head dim ``head_dim`` (the larger of D, Dv):
    the device name's rows, else the device type's defaults."""
    data = _table()
    dev = devinfo.info(device)
    rows = data["devices"].get(dev.name) or data["defaults"]["cpu" if dev.type == "cpu" else "cuda"]
    for bound, cfg in rows:
        if bound is None or head_dim <= bound:
            return Tuning(**tuning_tables.fields(cfg))
    return Tuning(**tuning_tables.fields(rows[-1][1]))


# ---- the call ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeCall:
    """A flash_decode call as validated across the group (every field but ``seq`` agrees)."""

    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: torch.dtype
    has_lens: bool
    sm_scale: float
    scheduler: str
    #: tokens per page of a paged KV cache (0: contiguous slices)
    page_size: int = 0

    def fields(self, device_type: str) -> dict:
        return {"batch (q.shape[0])": self.batch, "query heads (q.shape[1])": self.q_heads,
                "kv heads (k.shape[2])": self.kv_heads, "head dim (q.shape[2])": self.head_dim,
                "value head dim (v.shape[3])": self.v_head_dim, "dtype": self.dtype,
                "kv_lens given": self.has_lens, "sm_scale": self.sm_scale, "scheduler": self.scheduler,
                "page size (block_table given; k.shape[1])": self.page_size, "device type": device_type}


def _check_tensor(ctx, t, name: str, dims: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flash_decode: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != ctx.device:
        raise ValueError(f"flash_decode: {name} must be on this rank's device {ctx.device}, got {t.device}")
    if t.dim() != dims:
        raise ValueError(f"flash_decode: {name} must have {dims} dimensions, got shape {list(t.shape)}")
    return t


def schedulers(ctx: Any = None) -> list[str]:
    """The ``scheduler=`` names registered in ``ctx`` (default the current context): every
    flash-decode algorithm (``"flash_decode.<name>"`` in its algorithm registry), the built-ins
    :data:`SCHEDULERS` and any a plugin registered; ``"auto"`` (= :data:`AUTO_SCHEDULER`) besides."""
    return al.names(_context.resolve(ctx), COLLECTIVE)


def algorithm_of(ctx, scheduler: str) -> "DecodeAlgorithm":
    """The registered algorithm a ``scheduler=`` name (``"auto"``: :data:`AUTO_SCHEDULER`) runs
    in ``ctx``. Raises :class:`~iris_fw.ArgumentError` naming the argument and the registered
    names when none is registered under it (or it is not available here)."""
    if not isinstance(scheduler, str):
        raise ArgumentTypeError(f"flash_decode: scheduler must be a name (str), got {type(scheduler).__name__} "
                                f"{scheduler!r}")
    name = AUTO_SCHEDULER if scheduler == "auto" else scheduler
    registry = ctx.registries.algorithm
    key = f"{COLLECTIVE}.{name}"
    if key not in registry:
        known = ", ".join(al.names(ctx, COLLECTIVE)) or (
            "none registered: the built-ins load from iris-fw's entry point 'flash_decode_algorithms'; "
            "reinstall iris-fw")
        raise ArgumentError(f"flash_decode: scheduler must be 'auto' or a registered flash-decode algorithm "
                            f"({known}), got {scheduler!r}")
    try:
        return registry.require_available(key)
    except IrisError as exc:  # the registry's reason, as bad input of this argument
        raise ArgumentError(f"flash_decode: scheduler {name!r}: {exc}") from None


def check_out(out, call: DecodeCall, device) -> None:
    """``out`` must be a contiguous ``[B, Hq, Dv]`` tensor of q's dtype on the rank's device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"flash_decode: out must be a torch.Tensor or None, got {type(out).__name__}")
    shape = (call.batch, call.q_heads, call.v_head_dim)
    if out.shape != shape or out.dtype != call.dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"flash_decode: out must be a contiguous {list(shape)} tensor of dtype {call.dtype} on "
                         f"{device}, got {list(out.shape)} {out.dtype} on {out.device}"
                         + ("" if out.is_contiguous() else " (not contiguous)"))


def check_args(ctx, q, k, v, kv_lens, sm_scale, scheduler, block_table=None) -> DecodeCall:
    """Validate one rank's arguments locally; the :class:`DecodeCall` they describe."""
    _check_tensor(ctx, q, "q", 3)
    _check_tensor(ctx, k, "k", 4)
    _check_tensor(ctx, v, "v", 4)
    if q.dtype not in DTYPES:
        raise TypeError(f"flash_decode: q has dtype {q.dtype}; supported: {', '.join(map(str, DTYPES))}")
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype != q.dtype:
            raise TypeError(f"flash_decode: {name} has dtype {t.dtype}, q has {q.dtype} (they must agree)")
    batch, hq, d = q.shape
    page_size = 0
    if block_table is None:
        if k.shape[0] != batch or v.shape[0] != batch:
            raise ValueError(f"flash_decode: k and v must have q's batch {batch} in dim 0, got k {list(k.shape)}, "
                             f"v {list(v.shape)}")
        if v.shape[1] != k.shape[1] or v.shape[2] != k.shape[2]:
            raise ValueError(f"flash_decode: v must be [B, S_r, Hkv, Dv] with k's S_r and Hkv, got k "
                             f"{list(k.shape)}, v {list(v.shape)}")
    else:
        _check_tensor(ctx, block_table, "block_table", 2)
        if block_table.dtype != torch.int32 or block_table.shape[0] != batch or block_table.stride(1) != 1:
            raise ValueError(f"flash_decode: block_table must be an int32 tensor [B, pages] = [{batch}, …] with "
                             f"contiguous rows, got {block_table.dtype} {list(block_table.shape)} strides "
                             f"{list(block_table.stride())}")
        if v.shape[:3] != k.shape[:3] or k.shape[1] < 1:
            raise ValueError(f"flash_decode: with a block_table, k and v must be [pages, page_size, Hkv, D] and "
                             f"[pages, page_size, Hkv, Dv] (the same pages), got k {list(k.shape)}, v {list(v.shape)}")
        page_size = k.shape[1]
    hkv, dv = k.shape[2], v.shape[3]
    if k.shape[3] != d:
        raise ValueError(f"flash_decode: k's head dim (k.shape[3] = {k.shape[3]}) must be q's ({d})")
    if hq < 1 or hkv < 1 or hq % hkv:
        raise ValueError(f"flash_decode: the query heads ({hq}) must be a positive multiple of the kv heads ({hkv})")
    for dim, name in ((d, "head dim D"), (dv, "value head dim Dv")):
        if not 1 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"flash_decode: {name} must be in [1, {MAX_HEAD_DIM}], got {dim}")
    if kv_lens is not None:
        _check_tensor(ctx, kv_lens, "kv_lens", 1)
        if kv_lens.dtype != torch.int32 or kv_lens.shape[0] != batch:
            raise ValueError(f"flash_decode: kv_lens must be an int32 tensor [B] = [{batch}], got {kv_lens.dtype} "
                             f"{list(kv_lens.shape)}")
        if not kv_lens.is_contiguous():
            raise ValueError("flash_decode: kv_lens must be contiguous")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise ValueError(f"flash_decode: sm_scale must be a finite number or None, got {sm_scale!r}")
    algo = algorithm_of(ctx, scheduler)
    name = AUTO_SCHEDULER if scheduler == "auto" else scheduler
    call = DecodeCall(batch, hq, hkv, d, dv, q.dtype, kv_lens is not None, float(sm_scale), name, page_size)
    ok, why = algo.supports(call)
    if not ok:
        raise ArgumentError(f"flash_decode: scheduler {name!r} cannot run this call: {why}")
    return call


def _key(q, k, v, kv_lens, sm_scale, scheduler, block_table):
    """The cached call's key (None when an argument is not a tensor: the full checks report it).
    Not in it: what may change from call to call on one rank and not on another — ``S_r``
    (``k.shape[1]``), or with a block table the pages per sequence (``block_table.shape[1]``)
    and in the cache (``k.shape[0]``) — else such a rank would validate alone."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    if kv_lens is not None and not isinstance(kv_lens, torch.Tensor):
        return None
    lens = None if kv_lens is None else (kv_lens.dtype, kv_lens.shape, kv_lens.device, kv_lens.is_contiguous())
    ks, vs = k.shape, v.shape  # (each .shape makes a new torch.Size: read once)
    kd, vd = len(ks), len(vs)
    if block_table is None:
        if kd == 4 and vd == 4:  # (the usual case: no torch.Size slices, each a new object)
            layout = (ks[0], ks[2], ks[3], vs[0], vs[2], vs[3], ks[1] == vs[1])
        else:
            layout = (ks[:1] + ks[2:], vs[:1] + vs[2:], False)
    elif isinstance(block_table, torch.Tensor):
        layout = (ks[1:], vs[1:], ks[0] == vs[0], block_table.dtype, block_table.shape[:1],
                  block_table.device, block_table.dim() == 2 and block_table.stride(-1) == 1)
    else:
        return None
    return ("flash_decode", scheduler, q.dtype, k.dtype, v.dtype, q.shape, q.device, k.device, v.device,
            kd, vd, layout, lens, sm_scale)


# ---- algorithms -------------------------------------------------------------------------------------


class DecodeAlgorithm(al.Algorithm):
    """Base class of flash-decode algorithms: how a plan's per-rank partials become ``o`` on every
    rank. Registered like a collective algorithm of :mod:`iris_fw.ccl` (hook
    ``iris_fw_register_algorithms``) as ``"flash_decode.<name>"``; ``flash_decode(...,
    scheduler=name)`` runs it (``"auto"``: :data:`AUTO_SCHEDULER`). The built-ins are
    ``flash_decode.fused`` and ``flash_decode.bulk_sync`` (:mod:`iris_fw.collectives.flash_decode`).

    It keeps :class:`~iris_fw.ccl.algorithm.Algorithm`'s contract — ``collective``
    (``"flash_decode"``), ``name``, ``available()``, ``supports(call)``, ``plan(group, call)``,
    ``key`` — with what flash-decode's several inputs need instead of ``run(src, dst)``: the
    call is a :class:`DecodeCall` and the plan a :class:`FlashDecode`, which owns what every
    algorithm shares (tuning, split count, the local scratch, the local kernel's launch, the
    prepared launch per operand layout) and asks its algorithm for the rest:

    * :meth:`setup` (once per plan, on every member of the group alike): the algorithm's own
      buffers, e.g. symmetric ones carved from the group's workspace (``group.config``,
      ``group.carve``, :func:`iris_fw.ccl.algorithm.kernel_config`);
    * :meth:`launches` (per plan, and again per trace session with ``tracer``): its launches
      by role, each a :class:`~iris_fw.kernel_launcher.BoundLaunch` with the plan's arguments
      bound by name (:meth:`FlashDecode.kernel_args`, :meth:`FlashDecode.trace_handle`); a
      launch of the attention kernel takes ``fd.constexprs`` *with* ``fd.options`` (which carry
      the clustered launch a ``CLUSTER`` constexpr needs: launched otherwise, the kernel traps);
    * :meth:`run` (every call, the hit path: keep it short): enqueue the call on the current
      stream — through :meth:`FlashDecode.launch` for a launch that takes the attention
      kernel's per-call operands, by calling the bound launch for the others.

    A call has passed :meth:`supports` on every rank before it is planned; no host
    synchronization may happen in :meth:`run` (calls are captured in CUDA graphs)."""

    collective = COLLECTIVE

    def supports(self, call: DecodeCall) -> tuple[bool, str]:
        return True, ""

    def plan(self, group, call: DecodeCall) -> "FlashDecode":
        """The call planned on ``group`` (validated already): a :class:`FlashDecode` running this
        algorithm."""
        return FlashDecode(group, call, algorithm=self)

    def resident_constexprs(self, fd: "FlashDecode") -> dict | None:
        """The constexprs (beside ``fd.constexprs``) of this algorithm's attention-kernel variant
        whose programs must all be resident at once — they wait for programs of other ranks —
        or ``None`` (default): then ``programs_per_sm`` stands as the row gives it; else the
        plan caps it at what one SM holds of that variant as compiled (on a GPU)."""
        return None

    def setup(self, fd: "FlashDecode") -> None:
        """Make this algorithm's state of the plan ``fd`` (default: none)."""

    def launches(self, fd: "FlashDecode", tracer) -> dict:
        """This algorithm's launches of the plan ``fd`` beside its ``"local"`` one, by role;
        ``tracer``: the trace session to record into (:mod:`iris_fw.trace`), ``None`` for the
        untraced variants (default: none)."""
        return {}

    def run(self, fd: "FlashDecode", launches: dict, q, k, v, kv_lens, block_table, out) -> None:  # pragma: no cover
        """One call of the plan ``fd`` into ``out`` (``[B, Hq, Dv]``, q's dtype, contiguous; the
        batch is not empty): ``launches`` are the plan's current ones (``"local"``, this
        algorithm's, ``"prepared"``: :meth:`FlashDecode.launch`'s cache)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<flash-decode algorithm {self.key}>"


# ---- the plan ---------------------------------------------------------------------------------------


class FlashDecode:
    """A flash_decode prepared for one :class:`DecodeCall` on a group (kept in the group's call
    cache): tuning (``tune``: default the table's row), split count, scratch, the local kernel's
    launch and its algorithm's part (``algorithm``: default the one registered under
    ``call.scheduler``, :class:`DecodeAlgorithm`); made on every member of the group alike.
    ``fd(q, k, v, kv_lens=None, out=None) -> o``; ``fd.partial(q, k, v, kv_lens=None) -> packed``
    runs the local kernel alone (no communication): this rank's partial, fp32
    ``[B·Hq·(Dv+1)]`` = ``o [B, Hq, Dv]`` then natural-log ``lse [B, Hq]`` (:meth:`unpack`
    splits it). Inside a trace session (``ctx.trace``) its kernels run their traced variants
    (docs/tracing.md)."""

    def __init__(self, group, call: DecodeCall, tune: Tuning | None = None, algorithm: DecodeAlgorithm | None = None):
        ctx = group.ctx
        self.group, self.call = group, call
        #: ``[B, Hq, Dv]``: the result's shape
        self.out_shape = (call.batch, call.q_heads, call.v_head_dim)
        self.algorithm = algorithm or algorithm_of(ctx, call.scheduler)
        dev = ctx.device
        tune = tune or tuning(dev, max(call.head_dim, call.v_head_dim))
        self.tune = tune
        g = call.q_heads // call.kv_heads
        self.rows = min(max(MIN_DOT, triton.next_power_of_2(g)), max(MIN_DOT, tune.max_rows))
        #: the rows of a unit's combined tiles and of a split's scratch: its query heads (the
        #: products pad them to :attr:`rows`)
        self.combine_rows = min(self.rows, triton.next_power_of_2(g))
        self.units = call.batch * call.kv_heads * triton.cdiv(g, self.rows)
        self._split(tune.for_units(self.units))  # the split count and tile for this many units
        self.qk_scale = call.sm_scale * LOG2E
        self._fit_residency()
        self._fit_clusters()
        self.pack = call.batch * call.q_heads * (call.v_head_dim + 1)
        f32 = torch.float32
        self.partials = torch.empty(max(1, self.units * self.n_split * self.combine_rows * call.v_head_dim),
                                    dtype=f32, device=dev)
        self.partial_lse = torch.empty(max(1, self.units * self.n_split * self.combine_rows), dtype=f32, device=dev)
        self.unit_counters = torch.zeros(max(1, self.units), dtype=torch.int64, device=dev)
        #: a dense tensor shaped like a call's result, for new results (:meth:`new_result`):
        #: ``torch.empty_like`` of it costs a fraction of ``torch.empty(shape, dtype=, device=)``
        self._result_like = torch.empty(self.out_shape, dtype=call.dtype, device=dev)
        self.mine = None  # the local partial (packed), made on first use (or by the algorithm)
        self.algorithm.setup(self)
        self._debug = ctx.debug  # IRIS_FW_DEBUG=1: q compared across the group per call
        self._untraced = self._launches(None)
        self._traced = None  # (session, launches) of the last trace session it ran in

    def _split(self, tune: Tuning) -> None:
        """Plan the grid for ``tune`` (the row for this many units): the split count, the
        programs, the attention kernel's constexprs (:attr:`constexprs`; ``MAX_SPLITS``, the
        bound of its splits' combine, from the row and the grid, not the batch; the combine's
        tile, ``COMBINE_UNROLL``, at most the split count's power of two: batch sizes of one
        row share a compile unless their split counts' powers of two differ) and launch
        options (:attr:`options`)."""
        call = self.call
        self.tune = tune
        slots = devinfo.num_sms(self.group.ctx.device) * tune.programs_per_sm
        self.n_split = max(1, min(tune.max_splits, slots * tune.items_per_program // max(self.units, 1)))
        self.nprog = max(1, min(self.units * self.n_split, slots))
        max_splits = triton.next_power_of_2(min(tune.max_splits, slots * tune.items_per_program))
        n = self.n_split
        #: programs a thread-block cluster: the unit's splits combined in its shared memory (the
        #: row's ``cluster_combine``, where this plan can), else 0
        self.cluster = n if (tune.cluster_combine and 1 < n <= driver.MAX_CLUSTER and not n & (n - 1)
                             and self.nprog == self.units * n
                             and cluster_launch_supported(self.group.ctx.device)) else 0
        #: the attention kernel's constexprs and launch options (an algorithm's variants add theirs)
        self.constexprs = dict(HQ=call.q_heads, HKV=call.kv_heads, D=call.head_dim, DV=call.v_head_dim,
                               ROWS=self.rows, BD=max(MIN_DOT, triton.next_power_of_2(call.head_dim)),
                               BDV=max(MIN_DOT, triton.next_power_of_2(call.v_head_dim)), BLOCK_N=tune.block_n,
                               MAX_SPLITS=max_splits, HAS_LENS=call.has_lens, PAGE=call.page_size,
                               EXACT=call.dtype == torch.float32, SWAP_AB=bool(tune.swap_ab),
                               CROWS=self.combine_rows,
                               COMBINE_UNROLL=min(tune.combine_unroll, triton.next_power_of_2(self.n_split)),
                               CLUSTER=self.cluster)
        self.constexprs["PDL"] = bool(tune.pdl and pdl_launch_supported(self.group.ctx.device))
        self.options = {"num_warps": tune.num_warps, "num_stages": tune.num_stages}
        if self.constexprs["PDL"]:
            self.options["launch_pdl"] = True
        if tune.max_registers and not torch.version.hip:  # (Triton's AMD backend has no maxnreg)
            self.options["maxnreg"] = tune.max_registers
        if self.cluster:  # (KernelLauncher's clustered launch, with the combine's shared memory)
            self.options.update(cluster=self.cluster, cluster_shared=cluster_region_bytes(
                self.cluster, self.combine_rows, self.constexprs["BDV"]))

    def _fit_clusters(self) -> None:
        """Where the splits run as clusters (:attr:`cluster`), keep that only if the GPU holds
        every cluster of the grid at once, with the combine's shared memory: a cluster's programs
        share one GPC, so fewer may fit than SMs / cluster size, and more would run in waves (and
        ``fused``'s programs, waiting for other ranks, must all be resident). The variant the
        algorithm runs (:meth:`DecodeAlgorithm.resident_constexprs`, else the local one; and its
        traced one where it must be resident) is compiled and the driver asked
        (cuOccupancyMaxActiveClusters); else plan again without clusters (the counter combine)."""
        if not self.cluster:
            return
        resident = self.algorithm.resident_constexprs(self)
        variants = [resident or {"FUSED": False}]
        if resident is not None:
            variants.append({**resident, "TRACE": clock_mode(self.group.ctx)})
        limits = devinfo.sm_limits(self.group.ctx.device)
        calls = driver.cluster_calls()
        for variant in variants:
            kernel = resolved(self.compile(variant))
            _, warps, shared = compiled_resources(kernel)
            shared += self.options["cluster_shared"]
            try:
                fits = calls is not None and limits is not None and \
                    shared <= limits.shared_bytes - limits.shared_reserved and \
                    calls.max_active_clusters(kernel.function, self.cluster, warps * limits.warp_size,
                                              shared) * self.cluster >= self.nprog
            except IrisError:  # the driver refused the size or the shared memory: no clusters
                fits = False
            if not fits:
                self._split(replace(self.tune, cluster_combine=False))
                self._fit_residency()  # (the counter's variant, checked as the row's programs per SM)
                return

    def _fit_residency(self) -> None:
        """Where the algorithm's kernel needs every program resident at once
        (:meth:`DecodeAlgorithm.resident_constexprs`: ``fused`` — its programs wait for other
        ranks) and the row asks for more than one program per SM: compile that variant (and its
        traced one) and cap
        ``programs_per_sm`` at what one SM holds by its registers, shared memory and threads
        (:func:`iris_fw.devinfo.resident_programs`), planning again with the cap (which
        changes the split count, so it compiles again until the plan fits). On the CPU
        (nothing compiled) and AMD GPUs (:func:`iris_fw.devinfo.sm_limits`) the row stands."""
        variant = self.algorithm.resident_constexprs(self)
        limits = devinfo.sm_limits(self.group.ctx.device)
        if variant is None or limits is None:
            return
        # its traced variant too (a trace session launches it on the same grid)
        variants = (variant, {**variant, "TRACE": clock_mode(self.group.ctx)})
        while self.tune.programs_per_sm > 1:
            fits = min(self.programs_fitting(v, limits) for v in variants)
            if fits >= self.tune.programs_per_sm:
                return
            self._split(replace(self.tune, programs_per_sm=max(1, fits)))

    def programs_fitting(self, variant: dict, limits: "devinfo.SMLimits | None" = None) -> int:
        """How many programs of the attention kernel's ``variant`` (constexprs beside
        :attr:`constexprs`, e.g. ``{"FUSED": True}``) one SM of this GPU (``limits``: default
        :func:`iris_fw.devinfo.sm_limits`) holds at once, as :meth:`compile` makes it."""
        limits = limits or devinfo.sm_limits(self.group.ctx.device)
        regs, warps, shared = compiled_resources(self.compile(variant))
        # (a cluster's combine region comes on top of Triton's shared memory)
        return devinfo.resident_programs(limits, regs, warps, shared + self.options.get("cluster_shared", 0))

    def compile(self, variant: dict | None = None):
        """The attention kernel's ``variant`` (constexprs beside :attr:`constexprs`; default
        the local one, ``{"FUSED": False}``) compiled for this plan ahead of its first call
        (:meth:`iris_fw.kernel_launcher.KernelLauncher.compile`: not launched; a future inside
        Triton's ``AsyncCompileMode``), specialized as a call on contiguous operands of
        :data:`SAMPLE_SEQ` tokens (a multiple of 16, as such calls' strides are) is: that call
        then finds it compiled. GPU only."""
        variant = {"FUSED": False} if variant is None else variant
        # (the clustered launch's options are the launch's, not the compile's: a kernel compiles alike)
        options = {k: v for k, v in self.options.items() if k not in ("cluster", "cluster_shared")}
        launcher = KernelLauncher(_flash_decode_kernel, (self.nprog,), constexprs={**self.constexprs, **variant},
                                  **options)
        args = self._sample_args(variant.get("FUSED", False), bool(variant.get("TRACE", 0)))
        return launcher.compile(*(args[n] for n in launcher.runtime_params))

    def _sample_args(self, fused: bool, traced: bool = False) -> dict:
        """The attention kernel's runtime arguments for a compile ahead of the first call, by
        name: pointers as their dtypes (what specializes), ``None`` where a launch of the
        variant passes ``None``, strides of contiguous operands of :data:`SAMPLE_SEQ` tokens,
        ``traced``: a trace buffer's handle (:data:`SAMPLE_ADDRESS`)."""
        c, group = self.call, self.group
        f32, i64, i32 = torch.float32, torch.int64, torch.int32
        hkv, d, dv, page = c.kv_heads, c.head_dim, c.v_head_dim, c.page_size
        seq = SAMPLE_SEQ
        # contiguous [B, S, Hkv, D] slices, or pages [pages, page, Hkv, D]: a page's stride for B's
        kb, vb = (page * hkv * d, page * hkv * dv) if page else (seq * hkv * d, seq * hkv * dv)
        return dict(q=c.dtype, k=c.dtype, v=c.dtype, kv_lens=i32 if c.has_lens else None,
                    block_table=i32 if page else None, out=c.dtype if fused else None, partials=f32,
                    partial_lse=f32, unit_counters=i64, mine=None if fused else f32,
                    recv=f32 if fused else None, slots=i64 if fused else None, epochs=i64 if fused else None,
                    batch=c.batch, seq=seq, n_split=self.n_split, stride_qb=c.q_heads * d, stride_qh=d,
                    stride_qd=1, stride_kb=kb, stride_ks=hkv * d, stride_kh=d, stride_kd=1, stride_vb=vb,
                    stride_vs=hkv * dv, stride_vh=dv, stride_vd=1, stride_tb=seq // page if page else 0,
                    qk_scale=self.qk_scale, rank=group.rank, world_size=group.size,
                    heap_bases=group.heap_bases, trace=SAMPLE_ADDRESS if traced else None)

    # ---- launches -------------------------------------------------------------------------------
    def kernel_args(self) -> dict:
        """The attention kernel's (:func:`~iris_fw.flash_decode_kernels._flash_decode_kernel`)
        arguments this plan fixes, by name: the local scratch, sizes, rank and the group's heap
        bases."""
        group, call = self.group, self.call
        return dict(partials=self.partials, partial_lse=self.partial_lse, unit_counters=self.unit_counters,
                    batch=call.batch, n_split=self.n_split, qk_scale=self.qk_scale, rank=group.rank,
                    world_size=group.size, heap_bases=group.heap_bases)

    def trace_handle(self, tracer, role: str, programs: int):
        """The trace buffer handle of this plan's ``role`` launch of ``programs`` programs in the
        session ``tracer`` (named ``"flash_decode.<scheduler> <role>"``); ``None`` untraced."""
        if tracer is None:
            return None
        label = f"{COLLECTIVE}.{self.call.scheduler} {role}"
        return tracer.handle((id(self.group), label), programs, label, pin=self.group)

    def _launches(self, tracer) -> dict:
        """The ``local`` launch (the attention kernel, its partial stored locally) and the
        algorithm's (:meth:`DecodeAlgorithm.launches`), each a
        :class:`~iris_fw.kernel_launcher.BoundLaunch` with the plan's own arguments bound by name
        (scratch, sizes, rank, the trace handle) and the call's given by name at each launch;
        with ``tracer`` (a trace session) their traced variants, recording into the session's
        buffers (:mod:`iris_fw.trace`)."""
        traced = {} if tracer is None else {"TRACE": tracer.mode}
        local = KernelLauncher(_flash_decode_kernel, (self.nprog,),
                               constexprs={**self.constexprs, "FUSED": False, **traced}, **self.options)
        launches = {"local": local.bind(**self.kernel_args(), out=None, recv=None, slots=None, epochs=None,
                                        trace=self.trace_handle(tracer, "local", self.nprog))}
        launches.update(self.algorithm.launches(self, tracer))
        launches["prepared"] = {}  # {operand layout: (PreparedLaunch, index of seq, of the output)}: launch
        return launches

    def _current(self) -> dict:
        """The launches for now: traced inside a trace session (made at its first call there)."""
        tracer = self.group.ctx.tracer
        if tracer is None:
            return self._untraced
        if self._traced is None or self._traced[0] != tracer.session:
            self._traced = (tracer.session, self._launches(tracer))
        tracer.launched()
        return self._traced[1]

    def launch(self, launches: dict, role: str, q, k, v, kv_lens, block_table, buffer, output: str = "mine") -> None:
        """The ``role`` launch of ``launches`` (``"local"`` or an algorithm's, of a kernel taking
        the attention kernel's per-call arguments) on this call's tensors, ``seq`` and strides,
        ``buffer`` being its argument ``output`` (``"mine"``: the local partial; ``"out"``). A
        call on the operands of an earlier one — the same ``data_ptr`` and strides of ``q``,
        ``k``, ``v``, ``kv_lens`` and ``block_table``: the operand layout — reuses that call's
        :class:`~iris_fw.kernel_launcher.PreparedLaunch` (the last :data:`PREPARED_LAYOUTS`
        layouts), given only what may change between such calls, ``seq`` (a decode loop's
        growing slice) and the output; a new layout binds every argument by name once and
        prepares it."""
        if block_table is None:
            seq = k.shape[1]
            layout = (role, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                      None if kv_lens is None else kv_lens.data_ptr(), q.stride(), k.stride(), v.stride())
        else:
            seq = block_table.shape[1] * self.call.page_size
            layout = (role, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                      None if kv_lens is None else kv_lens.data_ptr(), q.stride(), k.stride(), v.stride(),
                      block_table.data_ptr(), block_table.stride(0))
        prepared = launches["prepared"]
        found = prepared.get(layout)
        if found is not None:
            launch, seq_at, buffer_at = found
            launch.launch_with(((seq_at, seq), (buffer_at, buffer)))  # (a loop on one output: nothing replaced)
            return
        bound = launches[role]
        (sqb, sqh, sqd), (skb, sks, skh, skd), (svb, svs, svh, svd) = q.stride(), k.stride(), v.stride()
        args = bound.args(q=q, k=k, v=v, kv_lens=kv_lens, block_table=block_table, seq=seq,
                          stride_qb=sqb, stride_qh=sqh, stride_qd=sqd, stride_kb=skb, stride_ks=sks, stride_kh=skh,
                          stride_kd=skd, stride_vb=svb, stride_vs=svs, stride_vh=svh, stride_vd=svd,
                          stride_tb=0 if block_table is None else block_table.stride(0), **{output: buffer})
        params = bound.launcher.runtime_params
        launch = bound.launcher.prepare(*args)
        if len(prepared) >= PREPARED_LAYOUTS:
            del prepared[next(iter(prepared))]
        prepared[layout] = (launch, params.index("seq"), params.index(output))
        launch()

    def partial(self, q, k, v, kv_lens=None, mine=None, block_table=None) -> torch.Tensor:
        """This rank's packed partial (the local kernel, no communication): into ``mine``
        (fp32 ``[pack]``; default the plan's own buffer, overwritten by the next call)."""
        if mine is None:
            if self.mine is None:
                self.mine = torch.empty(self.pack, dtype=torch.float32, device=q.device)
            mine = self.mine
        if self.call.batch:
            self.launch(self._current(), "local", q, k, v, kv_lens, block_table, mine)
        return mine

    def unpack(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(o [..., B, Hq, Dv], lse [..., B, Hq])`` views of packed partials ``[..., pack]``."""
        c = self.call
        n = c.batch * c.q_heads
        lead = packed.shape[:-1]
        return (packed[..., :n * c.v_head_dim].view(*lead, c.batch, c.q_heads, c.v_head_dim),
                packed[..., n * c.v_head_dim:].view(*lead, c.batch, c.q_heads))

    def __call__(self, q, k, v, kv_lens=None, out=None, block_table=None) -> torch.Tensor:
        c = self.call
        if self._debug:
            check_same_query(self.group, q)
        if out is None:
            out = self.new_result()
        elif not isinstance(out, torch.Tensor) or out.shape != self.out_shape or out.dtype != c.dtype \
                or out.device != q.device or not out.is_contiguous():
            check_out(out, c, q.device)  # raises, naming what is wrong
        if not c.batch:
            return out
        self.algorithm.run(self, self._current(), q, k, v, kv_lens, block_table, out)
        return out

    def new_result(self) -> torch.Tensor:
        """A new ``[B, Hq, Dv]`` tensor for a call's result (on the rank's device), what a call
        without ``out`` returns."""
        return torch.empty_like(self._result_like, memory_format=torch.contiguous_format)

    def __repr__(self) -> str:
        return (f"<FlashDecode {self.call.scheduler} B={self.call.batch} Hq={self.call.q_heads} "
                f"Hkv={self.call.kv_heads} D={self.call.head_dim} Dv={self.call.v_head_dim} {self.call.dtype} "
                f"splits={self.n_split} programs={self.nprog} rows={self.rows}>")


_LABEL = "iris_fw.flash_decode"


def _prepare(ctx, g, q, k, v, kv_lens, sm_scale, scheduler, block_table) -> FlashDecode:
    """The miss path (:func:`iris_fw.callpath.plan_call`): checked here, validated across the group
    through its mailbox, planned by its algorithm (:meth:`DecodeAlgorithm.plan`)."""
    def check():
        call = check_args(ctx, q, k, v, kv_lens, sm_scale, scheduler, block_table)
        return call.fields(ctx.device.type), call, None

    return cp.plan_call(ctx, _LABEL, check, lambda fields, error, _: g.exchange(_LABEL, fields, error),
                        lambda call, _: algorithm_of(ctx, call.scheduler).plan(g, call))


def _run(ctx, group, q, k, v, kv_lens, sm_scale, scheduler, block_table, out, plan_only=False):
    """A call through the library's call path on the group's call cache: the prepared
    :class:`FlashDecode` for these arguments (validated across the group on a miss), called
    (``plan_only``: returned)."""
    g = None
    if group is None:  # the common case: the world group (api.group_of, inlined on the hit path)
        paths = ctx.extensions.get(cp.EXTENSION)
        if paths is not None:
            g = paths.groups.get(None)
    if g is None:
        if ctx._closed:
            ctx._check_open()
        g = api.group_of(ctx, group)
    key = _key(q, k, v, kv_lens, sm_scale, scheduler, block_table)
    if plan_only:
        found = g.calls.get(key)
        if found is None:
            found = g.calls.put(key, _prepare(ctx, g, q, k, v, kv_lens, sm_scale, scheduler, block_table))
        return found
    return cp.call(ctx, g.calls, key, lambda g: _prepare(ctx, g, q, k, v, kv_lens, sm_scale, scheduler, block_table),
                   g, _LABEL, q, k, v, kv_lens, out, block_table, replay=_addresses, fresh=_FRESH)


def _addresses(args) -> tuple | None:
    """All that a captured call bakes in of its ``(q, k, v, kv_lens, out, block_table)`` (the
    call path's replay key, :func:`iris_fw.callpath.call`): every tensor's address and strides,
    the shapes the call's key leaves out (:func:`_key`: K's and V's, the block table's) and the
    result's shape and dtype (a GPU tensor's; else None: never replayed). The call's key names
    every other shape, dtype and device (a call reaches its replay only with a key: ``q``, ``k``
    and ``v`` tensors, ``kv_lens`` and ``block_table`` tensors or None)."""
    q, k, v, kv_lens, out, block_table = args
    if not (isinstance(out, torch.Tensor) and out.is_cuda):
        return None
    return (q.data_ptr(), q.stride(), k.data_ptr(), k.shape, k.stride(), v.data_ptr(), v.shape, v.stride(),
            out.data_ptr(), out.shape, out.stride(), out.dtype,
            None if kv_lens is None else (kv_lens.data_ptr(), kv_lens.stride()),
            None if block_table is None else (block_table.data_ptr(), block_table.shape, block_table.stride()))


#: a call's result slot (``out``, the fifth argument) and what fills it when None: the call
#: path's ``fresh``
_FRESH = (4, lambda fd, args: fd.new_result())


def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_lens: torch.Tensor | None = None,
         sm_scale: float | None = None, scheduler: str = "auto", block_table: torch.Tensor | None = None,
         group: Any = None, ctx: Any = None) -> FlashDecode:
    """The :class:`FlashDecode` that :func:`flash_decode` runs for such arguments (collective
    on first use: validated across the group), e.g. for its local kernel alone
    (:meth:`FlashDecode.partial`) or to call it with an ``out`` of its own."""
    ctx = _context.resolve(ctx)
    return _run(ctx, group, q, k, v, kv_lens, sm_scale, scheduler, block_table, None, plan_only=True)


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_lens: torch.Tensor | None = None,
                 sm_scale: float | None = None, out: torch.Tensor | None = None, scheduler: str = "auto",
                 block_table: torch.Tensor | None = None, group: Any = None, ctx: Any = None) -> torch.Tensor:
    """Decode attention over a sequence split across the group's ranks (collective): returns
    ``o [B, Hq, Dv]`` = softmax(q·Kᵀ·sm_scale)·V over every rank's slice, the same on every
    rank. ``q [B, Hq, D]`` (the same on every rank), ``k [B, S_r, Hkv, D]``, ``v [B, S_r, Hkv,
    Dv]`` (this rank's slice; rank order is sequence order), ``kv_lens`` int32 ``[B]`` (valid
    tokens of this rank's slice; default all ``S_r``), ``sm_scale`` (default ``1/sqrt(D)``),
    ``out`` (a contiguous ``[B, Hq, Dv]`` tensor of q's dtype to write; default a new one),
    ``scheduler``: ``"auto"`` (= ``"fused"``), ``"fused"``, ``"bulk_sync"`` or another
    registered flash-decode algorithm (:func:`schedulers`); ``group``: as
    in :mod:`iris_fw.ccl` (default every rank). Paged KV (as vLLM): ``block_table`` int32
    ``[B, pages]`` lists each sequence's pages of this rank's slice in order, ``k [num_pages,
    page_size, Hkv, D]`` and ``v [num_pages, page_size, Hkv, Dv]`` hold the pages; ``S_r`` is
    ``pages * page_size`` (``kv_lens`` gives the valid tokens). See the module docstring.

    **No copy**: the kernel that writes the result (``fused``: the one kernel; ``bulk_sync``:
    the combine) is launched on ``out`` or the new tensor itself (a prepared launch with the
    output replaced per call); no peer writes it."""
    ctx = _context.resolve(ctx)
    return _run(ctx, group, q, k, v, kv_lens, sm_scale, scheduler, block_table, out)


def check_same_query(group, q: torch.Tensor) -> None:
    """With ``IRIS_FW_DEBUG=1``: every member's ``q`` holds the same values (its bytes' 64-bit
    digest, compared in one exchange of the group), else every member raises
    :class:`~iris_fw.CollectiveMismatch` naming the ranks. ``q`` differing across ranks is the
    caller's broken promise that gives a wrong result on some rank; without the debug flag
    nothing checks it (the exchange and the copy to the host cost a call's latency). Skipped
    while capturing a CUDA graph."""
    import hashlib

    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    data = q.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    group.exchange("iris_fw.flash_decode (IRIS_FW_DEBUG=1: q must be the same on every rank)",
                   {"q (digest of its values)": digest})


# ---- torch references -------------------------------------------------------------------------------


def flash_decode_reference(q, ks, vs, kv_lens=None, sm_scale=None, dtype=torch.float64) -> torch.Tensor:
    """What :func:`flash_decode` computes, in torch (``dtype``, default float64): ``q [B, Hq,
    D]``, ``ks`` / ``vs`` every rank's slices in rank order, ``kv_lens`` None or every rank's
    ``[B]`` lengths. Sequences without a valid token give zeros."""
    batch, hq, d = q.shape
    hkv = ks[0].shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.zeros(batch, hq, vs[0].shape[3], dtype=dtype)
    for b in range(batch):
        kb, vb = [], []
        for r, (kr, vr) in enumerate(zip(ks, vs)):
            n = kr.shape[1] if kv_lens is None else max(0, min(int(kv_lens[r][b]), kr.shape[1]))
            kb.append(kr[b, :n].to("cpu", dtype))
            vb.append(vr[b, :n].to("cpu", dtype))
        kc, vc = torch.cat(kb), torch.cat(vb)  # [N, Hkv, D], [N, Hkv, Dv]
        if kc.shape[0] == 0:
            continue
        heads = torch.arange(hq) // (hq // hkv)
        scores = torch.einsum("hd,nhd->hn", q[b].to("cpu", dtype), kc[:, heads]) * scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), vc[:, heads])
    return out


def combine_partials(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The combine of per-rank partials in torch: ``o [W, B, Hq, Dv]`` (normalized per rank),
    ``lse [W, B, Hq]`` (natural log; ``-inf``: no tokens) → ``[B, Hq, Dv]`` in ``o``'s dtype
    (the bulk-synchronous baseline's last step; heads without any token get zeros)."""
    top = lse.max(dim=0).values
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(lse - top)
    total = w.sum(dim=0)
    acc = (w.unsqueeze(-1) * o).sum(dim=0)
    return torch.where(total.unsqueeze(-1) > 0, acc / total.clamp_min(torch.finfo(total.dtype).tiny).unsqueeze(-1),
                       torch.zeros_like(acc))
