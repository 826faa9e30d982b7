"""The collective-algorithm contract: what a call is (:class:`Call`), what an algorithm plugin
provides (:class:`Algorithm`), how ``algorithm="auto"`` picks one (a measured table,
``iris_fw/tuning/ccl.json``), and the shared launch machinery (capacity classes, chunking).

An algorithm is registered as ``"<collective>.<name>"`` (hook ``iris_fw_register_algorithms``).
``plan(group, call)`` returns a function ``run(src, dst)`` on flat contiguous tensors that
enqueues the whole call on the current stream: it carves its buffers from the group's workspace
once per *kernel configuration* (:meth:`Group.config`) and launches through
:class:`~iris_fw.kernel_launcher.KernelLauncher`. Every per-call counter lives on the device
(:func:`iris_fw.tilecomm.program_epoch`), so calls replay from CUDA graphs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from .. import devinfo
from .. import tuning
from ..kernel_launcher import KernelLauncher
from ..errors import ArgumentError, IrisError

#: Smallest capacity class (bytes of one rank's message per kernel configuration).
MIN_CAPACITY = 4096
#: Bytes of one tile: a program moves BLOCK = TILE_BYTES / element size elements at a time.
TILE_BYTES = 4096
#: Share of a group's workspace that one algorithm's largest capacity class may take.
LARGEST_CLASS_SHARE = 1 / 8
#: Warps of a communication program.
NUM_WARPS = 4

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
               "all_reduce_rmsnorm")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
INT_DTYPES = (torch.int32, torch.int64)
DTYPES = FLOAT_DTYPES + INT_DTYPES
#: Reductions the kernels implement (``avg`` is a sum divided by the group size, floats only).
REDUCE_OPS = ("sum", "avg", "max", "min", "prod")


@dataclass(frozen=True)
class Call:
    """One collective call as the algorithms see it (validated across the group's members).

    ``numel``: elements of one rank's *unit*: the tensor of all_reduce / broadcast / reduce,
    the input of all_gather / gather, the output of reduce_scatter / scatter. ``op``: a
    :data:`REDUCE_OPS` name or None; ``root``: a group rank or None; ``splits``: all_to_all's
    ``[size][size]`` element counts (``splits[i][j]``: from rank i to rank j) or None;
    ``src_offset``: the heap offset of the source when it lies on the heap at that same offset
    on every member (zero-copy algorithms read it in place), else None."""

    collective: str
    dtype: torch.dtype
    numel: int
    world: int
    op: str | None = None
    root: int | None = None
    splits: tuple | None = None
    src_offset: int | None = None

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


class Algorithm:
    """Base class of collective algorithms. Subclasses set ``collective`` and ``name`` and
    implement :meth:`plan`; :meth:`supports` says which calls they take (default: any dtype
    of :data:`DTYPES`)."""

    collective: str = ""
    name: str = ""
    #: whether calls carry a reduction (``Call.op``), checked by :meth:`supports`
    reduces: bool = False
    #: capacity-sized receive buffers one kernel configuration carves per rank, as a function
    #: of the group size: bounds the largest chunk the workspace holds (see :func:`max_chunk`)
    buffers_per_capacity: Callable[[int], int] = staticmethod(lambda world: 2 * world)

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, call: Call) -> tuple[bool, str]:
        if self.reduces and call.op not in REDUCE_OPS:
            return False, f"op {call.op!r} is not one of {REDUCE_OPS}"
        return True, ""

    def plan(self, group, call: Call) -> Callable[[torch.Tensor, torch.Tensor], None]:  # pragma: no cover
        raise NotImplementedError

    @property
    def key(self) -> str:
        return f"{self.collective}.{self.name}"

    def __repr__(self) -> str:
        return f"<ccl algorithm {self.key}>"


def reduce_constexprs(op: str) -> dict:
    """The kernels' reduction constexprs for ``op``: ``OP`` (a :mod:`iris_fw.tilecomm` reduction)
    and ``AVG`` (divide the sum by the group size)."""
    return {"OP": "sum" if op == "avg" else op, "AVG": op == "avg"}


# ---- capacity classes and chunking ------------------------------------------------------------


def max_chunk(group, algo: Algorithm) -> int:
    """The largest capacity class (bytes, a power of two) ``algo`` uses in ``group``: its receive
    buffers at that class take at most :data:`LARGEST_CLASS_SHARE` of the workspace (all its
    classes together about twice that), so several algorithms fit side by side."""
    budget = int(group.workspace.numel() * LARGEST_CLASS_SHARE) // max(1, algo.buffers_per_capacity(group.size))
    cap = MIN_CAPACITY
    while cap * 2 <= budget:
        cap *= 2
    return cap


def capacity(group, algo: Algorithm, nbytes: int) -> int:
    """The capacity class of a message of ``nbytes``: the next power of two (at least
    :data:`MIN_CAPACITY`), at most :func:`max_chunk` (longer messages go in chunks)."""
    cap = MIN_CAPACITY
    limit = max_chunk(group, algo)
    while cap < nbytes and cap < limit:
        cap *= 2
    return cap


def block_elems(dtype: torch.dtype) -> int:
    """Elements of one tile of ``dtype``."""
    return TILE_BYTES // torch.empty((), dtype=dtype).element_size()


def programs(group, cap_elems: int, block: int) -> int:
    """Programs of a kernel configuration: one per tile, at most one per SM (the CPU
    interpreter's few)."""
    return devinfo.persistent_programs(group.ctx.device, triton.cdiv(cap_elems, block))


def launcher(kernel, nprog: int, options: dict | None = None, **constexprs) -> KernelLauncher:
    """``kernel`` bound to ``nprog`` programs and ``constexprs``; ``options``: Triton launch
    options (``num_warps``, default :data:`NUM_WARPS`; ``num_stages``)."""
    return KernelLauncher(kernel, (nprog,), constexprs=constexprs, **{"num_warps": NUM_WARPS, **(options or {})})


class TracedLaunch:
    """A kernel configuration's launch: the launcher's runtime arguments followed by the kernel's
    ``trace`` buffer handle (``None`` when not tracing; see :mod:`iris_fw.trace`). Called and
    prepared as a :class:`~iris_fw.kernel_launcher.KernelLauncher`."""

    __slots__ = ("launcher", "trace")

    def __init__(self, launcher: KernelLauncher, trace):
        self.launcher, self.trace = launcher, trace

    def __call__(self, *args) -> None:
        self.launcher(*args, self.trace)

    def prepare(self, *args):
        return self.launcher.prepare(*args, self.trace)


def chunks(numel: int, cap_elems: int):
    """``(start, length)`` of each chunk of a ``numel``-element message."""
    for start in range(0, max(numel, 1), cap_elems):
        yield start, min(cap_elems, numel - start)


#: Inputs a one-chunk call keeps a prepared launch for (each holds its input and the output of the
#: call that prepared it alive).
PREPARED_PER_CALL = 4


def chunked_run(launch, args: tuple, numel: int, cap_elems: int, tail: tuple):
    """``run(src, dst)`` launching once per chunk: ``launch(src[start:], dst[start:], *args,
    length, *tail)``, ``start`` counted in *elements* of the flattened (contiguous) tensors —
    whatever their shape, e.g. an all-gather's ``[W, n]`` output; a one-chunk message launches
    without slicing — through a :class:`~iris_fw.kernel_launcher.PreparedLaunch` for each of
    the last :data:`PREPARED_PER_CALL` inputs that came back, given the call's output (an input
    met for the first time: the latest prepared launch with input and output replaced, not a
    launch prepared for it) —, an empty one not at all (every member sees the same size: it is
    part of the validated call)."""
    pieces = list(chunks(numel, cap_elems)) if numel else []
    if len(pieces) == 1:
        length = pieces[0][1]
        prepared = {}
        seen = {}  # inputs met once since they were last prepared (data_ptr), at most PREPARED_PER_CALL

        def run_one(src, dst):
            # the same input again (an engine's loop): one prepared launch, no key computed; a new
            # output tensor (a functional call's, e.g. torch.ops.iris_fw.all_gather_into_tensor)
            # replaces the prepared one for the call (PreparedLaunch.launch_with)
            key = src.data_ptr()
            launch_one = prepared.get(key)
            if launch_one is not None:  # (its own output again: nothing replaced)
                launch_one.launch_with(((1, dst),))
                return
            if prepared and key not in seen:
                # an input met for the first time (e.g. a functional op's new result, all-reduced in
                # place): the latest prepared launch with input and output replaced for this call;
                # an input that comes back is prepared (its own launch, no replacement)
                if len(seen) >= PREPARED_PER_CALL:
                    del seen[next(iter(seen))]
                seen[key] = None
                next(reversed(prepared.values())).launch_with(((0, src), (1, dst)))
                return
            seen.pop(key, None)
            if len(prepared) >= PREPARED_PER_CALL:
                del prepared[next(iter(prepared))]
            launch_one = prepared[key] = launch.prepare(src, dst, *args, length, *tail)
            launch_one()

        return run_one

    def run(src, dst):
        src, dst = src.view(-1), dst.view(-1)
        for start, length in pieces:
            launch(src[start:], dst[start:], *args, length, *tail)

    return run


@triton.jit
def _local_copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    """``dst[i]`` = ``src[i]``, ``i < n``: a one-rank group's collective, whose result is its input."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def local_copy(group, call: Call) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``run(src, dst)`` of a one-rank group's collective whose result is its input (a reduction
    of one value with any op, a gather or scatter of one part): nothing when ``dst`` is ``src``
    (in place), else one prepared copy launch (:func:`chunked_run`: a loop on the same input
    and output costs a prepared launch — on a GPU host cheaper than ``Tensor.copy_``)."""
    block = block_elems(call.dtype)
    numel = max(call.numel, 1)
    copy = chunked_run(launcher(_local_copy_kernel, programs(group, numel, block), BLOCK=block), (), call.numel,
                       numel, ())

    def run(src, dst):
        if dst is not src:
            copy(src, dst)

    return run


# ---- auto selection (data) ----------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def table() -> dict:
    """The parsed ``iris_fw/tuning/ccl.json``."""
    return tuning.load("ccl")


def auto_order(ctx, world: int, collective: str, nbytes: int) -> list[str]:
    """Algorithm names to try for ``collective`` at a message of ``nbytes`` (one rank's unit),
    best first: the rows for this device name and world size, else the table's defaults. A
    row ``[max_bytes, [names…]]`` applies up to ``max_bytes`` (null: any size)."""
    dev = devinfo.info(ctx.device)
    rows = tuning.device_rows(table(), dev.name, dev.type, world_size=world, entry=collective)
    return list(tuning.bounded(rows, nbytes))


def choose(group, call: Call, requested: str) -> Algorithm:
    """The algorithm for ``call``: ``requested`` by name (``"auto"``: the first of
    :func:`auto_order` that supports the call). Raises naming what is registered."""
    registry = group.ctx.registries.algorithm
    if requested != "auto":
        algo = registry.require_available(f"{call.collective}.{requested}")
        ok, why = algo.supports(call)
        if not ok:
            raise ArgumentError(f"algorithm {requested!r} cannot run this {call.collective}: {why}")
        return algo
    tried = []
    for name in auto_order(group.ctx, call.world, call.collective, call.nbytes):
        key = f"{call.collective}.{name}"
        if key not in registry:
            continue
        algo = registry.get(key)
        ok, why = algo.supports(call)
        if ok and registry.entry(key).availability()[0]:
            return algo
        tried.append(f"{name}: {why}")
    raise IrisError(f"no registered algorithm runs this {call.collective} ({'; '.join(tried) or 'none registered'})")


def names(ctx, collective: str) -> list[str]:
    """The registered algorithm names of ``collective``."""
    prefix = collective + "."
    return [k[len(prefix):] for k in ctx.registries.algorithm.names() if k.startswith(prefix)]


# ---- kernel configurations ----------------------------------------------------------------------


def kernel_config(group, key: tuple, kernel, *, nprog: int, constexprs: dict, buffers=(), slots: int = 0,
                  fill=None, options: dict | None = None, label: str | None = None, tracer: Any = "open") -> tuple:
    """A kernel configuration of ``group``: ``key[0]`` names it (the algorithm); its storage —
    the symmetric ``buffers`` (``(numel, dtype, what)`` each) carved from the workspace,
    ``slots`` int64 arrival slots per program (symmetric, if any) and the programs' epoch
    counters (symmetric too: see :mod:`iris_fw.call_identity`) — is made on first use and shared by every call with the same name, buffer
    *bytes*, slots and programs: by every reduction (``constexprs``) and by dtypes of any width,
    each viewing the bytes as its own dtype and launching its own variant. Buffers that
    ``fill(buffers)`` prepares (it returns true: the members then sync before any can send into
    them) are shared only by dtypes of one width. ``options``: Triton launch options of the
    launcher (see :func:`launcher`). Returns ``(launch, buffers)``. A kernel whose last
    parameters are ``trace, TRACE: tl.constexpr`` is traced (:mod:`iris_fw.trace`): ``launch``
    then takes its runtime arguments but ``trace`` (:class:`TracedLaunch`) and, under a trace
    session, launches the traced variant into the configuration's trace buffer, named ``label``
    (default ``"ccl <key[0]> <key[1]>"``: the algorithm and dtype) in traces; a kernel without
    them runs untraced. ``tracer``: the session (:class:`iris_fw.trace_session.Tracer`) to trace in,
    ``None`` for the untraced variant; default the context's open session, if any."""
    sizes = tuple(numel * torch.empty((), dtype=dtype).element_size() for numel, dtype, _ in buffers)
    width = buffers[0][1].itemsize if fill is not None and buffers else 0

    def make():
        raw = [group.carve(nbytes, torch.uint8, f"{key[0]} {what}") for nbytes, (_, _, what) in zip(sizes, buffers)]
        if fill is not None and fill([r.view(dtype) for r, (_, dtype, _) in zip(raw, buffers)]):
            group.sync(f"ccl {key[0]}: receive buffers ready")
        if slots:
            raw.append(group.carve(nprog * slots, torch.int64, f"{key[0]} arrival slots"))
        # the programs' epoch counters, on the heap: a member waiting in the group's exchange reads
        # its peers' to learn that one launched a call it did not make (iris_fw.call_identity)
        counters = group.carve(nprog, torch.int64, f"{key[0]} program epochs")
        group.ctx.calls.track(group, f"a kernel of {key[0]} run by: {group.planning}", counters)
        raw.append(counters)
        return tuple(raw), {}

    config = (key[0], sizes, slots, nprog, width)
    raw, launchers = group.config(config, make)
    group.ctx.calls.describe(group, raw[-1], group.planning)
    bufs = tuple(r.view(dtype) for r, (_, dtype, _) in zip(raw, buffers)) + raw[len(buffers):]
    traceable = "trace" in (kernel.arg_names if hasattr(kernel, "arg_names") else kernel.fn.arg_names)
    if tracer == "open":
        tracer = group.ctx.tracer
    if not traceable:
        tracer = None
    if tracer is not None:
        constexprs = {**constexprs, "TRACE": tracer.mode}
    variant = (tuple(sorted(constexprs.items())), tuple(sorted((options or {}).items())))
    launch = launchers.get(variant)
    if launch is None:
        launch = launchers[variant] = launcher(kernel, nprog, options, **constexprs)
    if not traceable:
        return launch, bufs
    handle = None
    if tracer is not None:
        if label is None:
            label = " ".join(["ccl", *(str(k).replace("torch.", "") for k in key[:2])])
        named = {f"{label} {what}": b for b, (_, _, what) in zip(bufs, buffers)}
        if slots:
            named[f"{label} arrival slots"] = bufs[len(buffers)]
        handle = tracer.handle((id(group), config, variant), nprog, label, buffers=named, pin=group)
    return TracedLaunch(launch, handle), bufs
