"""The contract between *pattern* plugins and *scheduler* plugins.

A **pattern** (GEMM + all-scatter, all-gather + GEMM, a collective, …) is a set of tile-level
``@triton.jit`` *pieces* plus host methods; a **scheduler** runs any pattern's pieces with its
kernel skeletons (:mod:`iris_fw.engine.skeletons`) and decides streams, SM split and where the
cross-rank synchronization goes. Neither knows the other's internals.

Pieces (every one takes the pattern's named runtime arguments ``args`` — an instance of the
pattern's :attr:`Pattern.Args` ``NamedTuple``, read as ``args.field`` — and its constexpr
configuration ``CFG``, a ``NamedTuple`` of the pattern's own choosing):

============================================  =================================================
``produce(args, tile, CFG, STAGED) -> value``  compute output tile ``tile`` (a register tile).
                                               ``STAGED``: operands owned by peers were already
                                               fetched into local staging by ``fetch``;
                                               otherwise read them from the peers directly.
``consume(args, tile, value, CFG, FROM_STASH)`` deliver the tile: the communication of
                                               compute-first patterns (stores into peers), the
                                               local epilogue of communicate-first ones.
``stash(args, tile, value, CFG)``              keep a produced tile in memory (unfused schedules).
``reload(args, tile, CFG) -> value``           read a stashed tile back.
``fetch(args, chunk, CFG)``                    communicate-first: bring operand chunk ``chunk``
                                               from its owner into local staging.
``depends(args, tile, CFG) -> chunk``          the chunk ``produce(STAGED=True)`` of a tile needs.
``step(args, tile, STEP, CFG)``                multi-step patterns (``Plan.steps > 1``): step
                                               ``STEP`` (1 … steps-1) of tile ``tile``.
``traffic(args, item, STEP, CFG)``             optional, for traces (:mod:`iris_fw.trace`):
``-> (peer, nbytes)``                          what ``item`` moves between this rank and its
                                               peers — step 0: the ``consume`` of tile ``item``
                                               (compute-first) or the ``fetch`` of chunk
                                               ``item`` (communicate-first); step ``STEP``: that
                                               step of tile ``item``. ``peer``: the one rank
                                               talked to, -1 for several or none; ``nbytes``:
                                               bytes to or from peers (int64), 0 for none.
============================================  =================================================

**Multi-step patterns.** A plan with ``steps = S > 1`` runs, after the produce/consume pass,
``S - 1`` more passes over the same tiles, ``step(args, tile, s, CFG)`` for ``s = 1 … S-1``.
Before each, every program arrives at a per-program cross-rank barrier and waits until the
*same* program of every rank finished the previous step (``skeletons.step_barrier``; values
derived from the call's epoch, so graph-safe). A tile is handled by the same program on every
rank and in every step, so step ``s`` of a tile may read anything that step ``s - 1`` of that
tile delivered on any rank — e.g. step 0 pushes each partial tile to the tile's owner rank,
step 1 has the owner reduce it and push the sum to every rank (a two-shot all-reduce of a
computed result). Schedulers with ``multi_step = True`` run every step in one kernel
(``fused_sequential``, each program going on to its next step as soon as its peers' programs
did); the other schedulers run the later steps after their own kernels, in a kernel of their own
(``skeletons._steps_kernel``: the exit barrier of the kernels before it made step 0's deliveries
complete; later steps are separated by the same per-program step barrier). Waiting for other
programs of the same launch is never needed, so the CPU interpreter runs them too.

Host side, a pattern implements :class:`Pattern`: ``signature`` (validate one rank's inputs and
describe them — the description is compared across ranks once and keys the op cache),
``tuning_key``, ``default_config``, ``setup`` (buffers living with an op), ``bind`` (a
:class:`Plan` for one call) and a float64 ``reference``.

**Why ``Args`` has ``TOP``.** Triton 3.6's launcher accepts TMA tensor descriptors only as
top-level kernel parameters, never inside a tuple. The first ``Args.TOP`` fields (at most 2) of
a pattern's ``Args`` therefore travel as their own kernel parameters and the skeleton rebuilds
``args = Args(top0, top1, *rest)`` inside the kernel (:func:`split_args`); pieces only ever see
the named tuple.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple

import torch

from ..errors import CallMismatch, CollectiveMismatch  # noqa: F401 (re-exported from here too)
from ..errors import ArgumentError, ArgumentTypeError, IrisError

#: Kernel parameters that may carry TMA descriptors (see the module docstring).
MAX_TOP = 2


class PatternError(IrisError, ValueError):
    """Inputs a pattern cannot run on, or a scheduler that cannot run a pattern (the message names
    the argument and what was expected)."""


@dataclass(frozen=True)
class Pieces:
    """A pattern's ``@triton.jit`` pieces (signatures in the module docstring)."""

    produce: Any
    consume: Any
    stash: Any
    reload: Any
    fetch: Any = None
    depends: Any = None
    step: Any = None
    traffic: Any = None
    #: optional :class:`GluonPieces`: the pattern under the ``warp_specialized`` scheduler on a GPU
    gluon: Any = None


@dataclass(frozen=True)
class GluonPieces:
    """A pattern's ``@gluon.jit`` pieces for warp-specialized kernels (``warp_specialized``
    scheduler; :mod:`iris_fw.gluon_tiles` says why Gluon and why the ``@triton.jit`` pieces do
    not compile there). Each takes ``(args, item, CFG, NW)``, ``NW`` the warps of the partition
    that runs it, ``compute`` also ``MMA`` (the GEMM tile's tensor-core path for
    :func:`iris_fw.gluon_tiles.matmul_tile`, :func:`iris_fw.gluon_tiles.mma_path` of the
    device), and builds its blocks in :func:`iris_fw.gluon_tiles.rows_layout`. ``args``
    arrive with pointers where the plan had TMA descriptors (the descriptors' tensors).

    ``comm``: communicate-first, fetch chunk ``item`` into staging (what ``fetch`` does);
    compute-first, send tile ``item`` from the stash (``consume(reload(...))``).
    ``compute``: communicate-first, compute tile ``item`` from staging and store it
    (``consume(produce(STAGED=True))``); compute-first, compute it and stash it
    (``stash(produce(...))``)."""

    comm: Any
    compute: Any


@dataclass(frozen=True)
class Copy:
    """A host-side copy that feeds a communicate-first plan's chunks (for schedulers that move
    data with the copy engine instead of ``fetch``): ``dst.copy_(src)``, where ``src`` may be a
    peer's tensor (:meth:`~iris_fw.Context.peer_view`). Once it and every earlier copy of
    :attr:`Plan.copies` are done, chunks ``0 .. ready-1`` are complete."""

    dst: torch.Tensor
    src: torch.Tensor
    ready: int


@dataclass(kw_only=True)
class Plan:
    """One call of a pattern, ready for a scheduler. Built with keywords only.

    ``args``: the pattern's ``Args`` named tuple (runtime values); ``cfg``: its constexpr named
    tuple. ``num_tiles`` output tiles; ``num_chunks`` operand chunks (0 for compute-first
    patterns). ``comm_bytes`` (bytes this rank's communication programs move: to or from
    peers, and the local copies they make, such as a gather's own share) and ``flops`` feed
    the default SM split. ``finish`` (optional) runs on the host after the kernels (a local
    reduction, …) and must only enqueue device work. ``result`` is what the op returns.
    ``finish_into`` (optional, with ``finish``): the same step writing the result into a given
    contiguous tensor of the result's shape and dtype instead of ``result`` — set where the
    result's last writer is this rank's ``finish`` (no peer writes it), so that a functional
    ``iris_fw.ops`` call delivers into a new tensor or ``out`` without a copy
    (:meth:`Scheduler.run` with ``into``). ``result_arg`` (optional, without ``finish``): the
    field of ``args`` holding ``result`` where only this rank's kernels write it (no peer
    stores into it): a functional call's kernels then launch with that field replaced by the
    new tensor or ``out`` and write the result there, no copy
    (:func:`~iris_fw.engine.scheduler.result_change`).
    ``copies`` (optional, communicate-first): the chunks ``fetch`` delivers, as :class:`Copy`
    steps in order. ``steps``: passes over the tiles (see "Multi-step patterns" above; 1 for a
    one-pass pattern). ``memo``: what a scheduler derives from the plan once (its launchers and
    launch arguments), reused while :meth:`Pattern.bind` hands back this same plan
    (:class:`BindCache`). ``library`` (optional): the same call without fusion — vendor
    libraries (cuBLAS through torch) and :mod:`iris_fw.ccl`'s collectives — writing
    ``result``; it must only enqueue device work. The ``library`` scheduler runs it (the
    fallback of ``scheduler="auto"`` where fusing does not pay). ``library_into`` (optional,
    with ``library``): the library form writing the result into a given contiguous tensor of
    the result's shape and dtype instead of ``result`` — what a functional call delivers into
    without a copy under the ``library`` scheduler (see ``finish_into``). ``stage_in``
    (optional): host-side work the kernels need before they start on this call's inputs (e.g.
    ``all_gather_gemm`` copies the shard into the heap buffer peers read); the kernel schedules
    run it (:meth:`Scheduler.run`), the library form does not (it reads the inputs where they
    are)."""

    pattern: str
    pieces: Pieces
    args: NamedTuple
    cfg: NamedTuple
    num_tiles: int
    num_chunks: int = 0
    num_warps: int
    num_stages: int
    comm_bytes: int
    flops: int
    result: Any
    finish: Callable[[], Any] | None = None
    finish_into: Callable[[Any], Any] | None = None
    result_arg: str | None = None
    copies: list[Copy] | None = None
    steps: int = 1
    library: Callable[[], Any] | None = None
    library_into: Callable[[Any], Any] | None = None
    stage_in: Callable[[], Any] | None = None
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def comm_first(self) -> bool:
        return self.num_chunks > 0

    @property
    def num_items(self) -> int:
        """What a producer releases: chunks (communicate-first) or tiles (compute-first)."""
        return self.num_chunks if self.comm_first else self.num_tiles


class BindCache:
    """The plans a pattern's :meth:`~Pattern.bind` made for the last ``capacity`` operand
    layouts, so that a call on the same tensors as an earlier one gets that call's plan back —
    TMA descriptors, named arguments and the scheduler's launch arguments (:attr:`Plan.memo`)
    included — instead of building them again.

    The key is whatever the plan depends on beyond the op's signature (which the op already
    checked): for the built-in patterns each operand's ``data_ptr()`` and ``stride()``
    (:func:`iris_fw.gemm.operands_key`), plus any global the plan reads. A plan holds its
    operands, so the cache keeps the tensors of its last ``capacity`` plans alive until newer
    ones replace them (two by default: double-buffered inputs hit)."""

    __slots__ = ("capacity", "_plans")

    def __init__(self, capacity: int = 2):
        if capacity < 1:
            raise ArgumentError(f"BindCache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._plans: dict = {}

    def get(self, key):
        """The plan stored under ``key``, or None."""
        return self._plans.get(key)

    def put(self, key, plan):
        """Store ``plan`` under ``key`` (dropping the oldest beyond ``capacity``); returns it."""
        plans = self._plans
        if key not in plans and len(plans) >= self.capacity:
            del plans[next(iter(plans))]
        plans[key] = plan
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._plans.clear()


@functools.lru_cache(maxsize=None)
def _loses_nested_constexprs() -> bool:
    """Whether this Triton loses the constexpr leaves of a tuple nested in a tuple inside a
    loop (3.6 does, 3.9 does not; releases in between are not known)."""
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)


def split_args(args: NamedTuple) -> tuple[Any, Any, tuple]:
    """``(top0, top1, rest)``: how a pattern's ``args`` reach a skeleton kernel (its first
    ``TOP`` fields on their own, ``None`` for unused top slots, the rest as one tuple).

    Before Triton 3.9 a :class:`iris_fw.device.DeviceHeaps` field goes as its bare ``bases``:
    that Triton loses the constexprs of a tuple nested in ``rest`` inside the skeletons' loops,
    so pattern pieces there compile with a bare pointer's switches (no GPU pointer checks;
    NVSHMEM calls need 3.9 anyway). The skeletons' own waits use the kernel's ``heap_bases``."""
    top = getattr(type(args), "TOP", 0)
    if not 0 <= top <= MAX_TOP:
        raise PatternError(f"{type(args).__name__}.TOP must be 0..{MAX_TOP}, got {top}")
    if _loses_nested_constexprs():
        from ..device import DeviceHeaps

        args = type(args)(*[a.bases if type(a) is DeviceHeaps else a for a in args])
    head = tuple(args[:top]) + (None,) * (MAX_TOP - top)
    return head[0], head[1], tuple(args[top:])


class Pattern:
    """Base class of patterns: documents the host half of the contract. Subclasses set the class
    attributes and implement the methods; see :mod:`iris_fw.plugins` for three of them."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: whether the pattern communicates first (fetches operand chunks) or computes first
    comm_first: ClassVar[bool] = False
    #: the pattern's ``@triton.jit`` pieces
    pieces: ClassVar[Pieces]
    #: ``NamedTuple`` of the runtime kernel arguments (``TOP`` class attribute: see the module)
    Args: ClassVar[type]
    #: the pattern's configuration type (``config=`` of an op; a frozen dataclass)
    Config: ClassVar[type]
    #: names of the elements of :meth:`signature`'s tuple, in order (e.g. ``("M", "N/W", "K",
    #: "dtype")``): a mismatch across ranks names the element that differs
    signature_fields: ClassVar[tuple] = ()

    def available(self) -> tuple[bool, str]:
        return True, ""

    def signature(self, ctx, *inputs) -> tuple:
        """Validate this rank's ``inputs`` (raise naming the argument and what was expected) and
        return a hashable description of everything that must agree across ranks (shapes,
        dtypes, devices). Host only, no device synchronization. It must depend on the inputs
        only through each tensor's shape, dtype and device and each other input's value: an op
        skips it for a call whose inputs match those of a call it already checked
        (:func:`input_fingerprint`)."""
        raise NotImplementedError

    def tuning_key(self, signature: tuple, world_size: int) -> tuple:
        """The key of this pattern's rows in the tuning tables (e.g. the global ``(M, N, K)``)."""
        raise NotImplementedError

    def default_config(self, ctx, signature: tuple, programs: int | None = None):
        """The configuration to use when neither the caller nor a tuning table gives one;
        ``programs``: how many programs will compute."""
        raise NotImplementedError

    def setup(self, ctx, signature: tuple, config, uses_stash: bool) -> dict:
        """Buffers that live as long as the op (symmetric ones allocated with ``ctx``)."""
        raise NotImplementedError

    def bind(self, ctx, buffers: dict, *inputs) -> Plan:
        """A :class:`Plan` for one call on ``inputs`` (already validated by :meth:`signature`).
        Enqueues nothing that synchronizes the host. Called on every call: a pattern keeps a
        :class:`BindCache` in its buffers and hands back the same plan for the same operands,
        so that nothing is rebuilt (and the scheduler's :attr:`Plan.memo` is reused)."""
        raise NotImplementedError

    @staticmethod
    def reference(rank: int, world_size: int, inputs: list) -> torch.Tensor:
        """Float64 torch result of rank ``rank`` given every rank's ``inputs[r]``."""
        raise NotImplementedError


def labelled_signature(pattern, signature) -> dict:
    """``signature`` as ``{name: value}`` by :attr:`Pattern.signature_fields` (unnamed elements
    as ``"input element i"``), for messages and cross-rank comparison."""
    names = tuple(getattr(pattern, "signature_fields", ()) or ())
    if not isinstance(signature, tuple):
        return {"inputs": signature}
    out = {}
    for i, value in enumerate(signature):
        name = names[i] if i < len(names) else f"input element {i}"
        out[name] = str(value).replace("torch.", "") if isinstance(value, torch.dtype) else value
    return out


def input_fingerprint(inputs: tuple) -> tuple:
    """What :meth:`Pattern.signature` may depend on: each tensor's shape, dtype and device, each
    other input itself. Equal fingerprints mean equal signatures (and equally valid inputs)."""
    # (a list comprehension: a generator per call costs a µs on the hit path)
    return tuple([(x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else (type(x), x) for x in inputs])


def check_tensor(t: Any, name: str, ndim: int, device: torch.device, dtype: torch.dtype | None = None,
                 dtypes: tuple = ()) -> torch.Tensor:
    """``t`` as a torch tensor with ``ndim`` dims on ``device`` (and ``dtype``, one of ``dtypes``),
    else a ``ValueError``/``TypeError`` naming ``name`` and what was expected."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise PatternError(f"{name} must have {ndim} dimensions, got shape {list(t.shape)}")
    if t.device != device:
        raise PatternError(f"{name} must be on {device} (this rank's device), got {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise PatternError(f"{name} must have dtype {dtype} like the other operand, got {t.dtype}")
    if dtypes and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise PatternError(f"{name} must have dtype {names}, got {t.dtype}")
    return t
