"""The public collective calls of :mod:`iris_fw.ccl`: argument checks, groups, and :class:`Work`.

Every call takes the library's one call path (:mod:`iris_fw.callpath`, through :func:`_call`):
a cheap key from the arguments; on a hit the prepared launch; on a miss the arguments checked
fully, exchanged with the group's members (:meth:`Group.exchange`), the algorithm chosen and
planned, the launch kept in the group's call cache. A host failure after the members agreed
aborts their waits.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

import torch
import triton
import triton.language as tl

from .. import callpath as cp
from .. import context as _context
from .. import tilecomm as tc
from .. import trace as tr
from ..errors import ArgumentError, ArgumentTypeError, IrisError, bad_type
from . import algorithm as al
from ..call_identity import describe_call
from .group import Group, default_workspace_bytes

try:
    from torch.distributed import ReduceOp
except ImportError:  # pragma: no cover - torch builds without distributed
    ReduceOp = None

if TYPE_CHECKING:
    from ..context import Context

#: What ``group=`` accepts: ``None`` (every rank), a :class:`Group`, a list of ranks, or a
#: ``torch.distributed.ProcessGroup`` (its ranks are looked up).
GroupLike = Union[Group, Sequence[int], "torch.distributed.ProcessGroup", None]
#: What ``op=`` accepts: a ``torch.distributed.ReduceOp`` or its name (``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"prod"``).
ReduceOpLike = Union["torch.distributed.ReduceOp", str]

#: Prepared calls a group keeps (least recently used dropped; re-validated when called again).
MAX_CACHED_CALLS = cp.MAX_CACHED_CALLS

_OPS: dict = {name: name for name in al.REDUCE_OPS}
_OPS.update({"product": "prod", "average": "avg"})
if ReduceOp is not None:
    _OPS.update({ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
                 ReduceOp.PRODUCT: "prod"})
#: A call key's op: torch's ReduceOp members (module-level objects, never freed) by identity, as
#: their names — hashing a ReduceOp member costs about half a µs, and a hit hashes its key twice;
#: anything else as it is.
_OP_KEYS = {id(op): name for op, name in _OPS.items() if not isinstance(op, str)}


# ---- groups ---------------------------------------------------------------------------------------


_ctx = _context.resolve  # (one frame fewer per call than a wrapper)


def _ranks_of(ctx, group) -> tuple[int, ...]:
    if group is None:
        return tuple(range(ctx.world_size))
    if isinstance(group, Group):
        return group.ranks
    if isinstance(group, (list, tuple, range)):
        ranks = [int(r) for r in group]
    else:
        import torch.distributed as dist

        if not isinstance(group, dist.ProcessGroup):
            raise ArgumentTypeError(f"group must be None, an iris_fw.ccl.Group, a list of ranks or a torch ProcessGroup, "
                                    f"got {type(group).__name__}")
        ranks = dist.get_process_group_ranks(group)
    if len(set(ranks)) != len(ranks) or not ranks or any(not 0 <= r < ctx.world_size for r in ranks):
        raise ArgumentError(f"group must list distinct ranks in [0, {ctx.world_size}), got {list(ranks)}")
    return tuple(sorted(ranks))


def new_group(ranks: GroupLike = None, *, workspace_bytes: int | None = None, ctx: Context | None = None,
              _by: str | None = None) -> Group:
    """Create (or return) the group of ``ranks`` (sorted; group rank = position), like
    ``torch.distributed.new_group``: collective over *every* rank of the context, members or
    not, because the group's workspace is a symmetric heap block (``workspace_bytes``, default
    ``IRIS_FW_CCL_WORKSPACE`` or a quarter of the heap up to 256 MiB)."""
    ctx = _ctx(ctx)
    error, ranks_t, size = None, None, None
    try:
        ranks_t = _ranks_of(ctx, ranks)
        if workspace_bytes is None:
            size = default_workspace_bytes(ctx)
        elif isinstance(workspace_bytes, bool) or not hasattr(type(workspace_bytes), "__index__"):
            raise bad_type("workspace_bytes", "an int (bytes) or None", workspace_bytes)
        else:
            size = operator.index(workspace_bytes)
        if size < Group.min_workspace_bytes():
            raise ArgumentError(f"workspace_bytes must be at least {Group.min_workspace_bytes()} for a group, got {size}")
    except Exception as exc:
        error = exc
    detail = None if _by is None else f"{_by} (its first call creates the world group: iris_fw.ccl.new_group)"
    ctx.agree("iris_fw.ccl.new_group", {"ranks": ranks_t, "workspace_bytes": size}, error, detail)
    groups = cp.state(ctx).groups
    group = groups.get(ranks_t)
    if group is None:
        group = groups[ranks_t] = Group(ctx, ranks_t, size)
        if len(ranks_t) == ctx.world_size:
            groups[None] = group  # group=None finds it in one look-up
        # every rank's workspace is zeroed before any member reads a peer's mailbox or flags
        # (the block may have held an earlier group's)
        ctx.barrier()
    return group


def destroy_group(group: GroupLike = None, *, ctx: Context | None = None) -> None:
    """Drop a group (``None``: every group of the context), like
    ``torch.distributed.destroy_process_group``: collective over every rank. Its workspace is
    reclaimed at the next collective point."""
    ctx = _ctx(ctx)
    ranks = None if group is None else _ranks_of(ctx, group)
    ctx.agree("iris_fw.ccl.destroy_group", {"ranks": ranks})
    groups = cp.state(ctx).groups
    if ranks is None:
        groups.clear()
    else:
        groups.pop(ranks, None)
        if len(ranks) == ctx.world_size:
            groups.pop(None, None)


def made_world_group(ctx) -> Group | None:
    """The world group if a call has made it, else None (a look-up: makes nothing, so no
    collective step)."""
    paths = ctx.extensions.get(cp.EXTENSION)
    return paths.groups.get(None) if paths is not None else None


def group_of(ctx, group: GroupLike = None, collective: str | None = None) -> Group:
    """The :class:`Group` a call with ``group=`` runs on (the world's made by its first call;
    another must have been created with :func:`new_group`); raises if this rank is not in it."""
    groups = cp.state(ctx).groups
    if group is None:
        found = groups.get(None)  # the world group's alias: the common case first
        if found is not None:
            return found
    if isinstance(group, Group) and group.ctx is ctx:
        found = group
    else:
        ranks = _ranks_of(ctx, group)
        found = groups.get(ranks)
        if found is None:
            if len(ranks) != ctx.world_size:
                raise ArgumentError(f"the group {list(ranks)} was not created: call iris_fw.ccl.new_group({list(ranks)}) "
                                    f"on every rank first (as torch.distributed.new_group)")
            by = None if collective is None else f"iris_fw.ccl.{collective}"
            found = new_group(ranks, ctx=ctx, _by=by)  # the world: every rank is in this call
    if found.rank is None:
        raise ArgumentError(f"rank {ctx.rank} is not in the group {list(found.ranks)} it called a collective on")
    return found


def algorithms(collective: str, *, ctx: Context | None = None) -> list[str]:
    """The algorithm names registered for ``collective`` (``"all_reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``, ``"all_to_all"``, ``"broadcast"``, ``"reduce"``, ``"gather"``,
    ``"scatter"``)."""
    return al.names(_ctx(ctx), collective)


# ---- work -----------------------------------------------------------------------------------------


class Work:
    """What ``async_op=True`` returns, as torch's: :meth:`wait` makes the current stream wait
    for the collective (the host does not block), :meth:`is_completed` asks without waiting,
    :meth:`synchronize` blocks the host and raises :class:`~iris_fw.WaitTimeout` if a
    device-side wait of this rank gave up."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._event = None
        if ctx.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self, timeout: Any = None) -> bool:
        if self._event is not None:
            torch.cuda.current_stream(self.ctx.device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return self._event is None or self._event.query()

    def synchronize(self) -> None:
        if self._event is not None:
            self._event.synchronize()
        self.ctx.synchronize()

    def result(self) -> list:
        return []


# ---- the call path --------------------------------------------------------------------------------


def _call(ctx, group, key: tuple | None, prepare: Callable, src, dst, async_op: bool):
    """Run the call ``key`` of ``group`` on ``src``/``dst`` through the call path, preparing it on a
    miss (``key`` None: arguments the cached path does not take, prepared to be reported)."""
    name = "call" if key is None else key[0]
    g = None
    if group is None:  # the common case: the world group (made_world_group, inlined on the hit path)
        paths = ctx.extensions.get(cp.EXTENSION)
        if paths is not None:
            g = paths.groups.get(None)
    if g is None:
        g = group_of(ctx, group, None if key is None else name)
    tracer = ctx.tracer
    if tracer is not None and key is not None:  # traced kernel variants, prepared (and validated) once per session
        key = key + (("traced", tracer.session),)
        tracer.launched()
    cp.call(ctx, g.calls, key, prepare, g, "iris_fw.ccl." + name, src, dst, replay=_addresses)
    return Work(ctx) if async_op else None


def _addresses(args) -> tuple | None:
    """All that a captured collective call bakes in of its ``(src, dst)`` (the call path's
    replay key, :func:`iris_fw.callpath.call`): where both are tensors, their addresses alone —
    every tensor a call's key admits is contiguous on the context's device, of the dtypes and
    sizes that key names, and every algorithm reads it flat. Else (a fused call's tuples, a
    barrier's Nones) what :func:`iris_fw.callpath.address_key` finds."""
    src, dst = args
    if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor):
        return src.data_ptr(), dst.data_ptr()
    return cp.address_key(args)


def _prepare(g: Group, label: str, check: Callable, algorithm: str, finish: Callable | None = None):
    """Slow path of a call (:func:`iris_fw.callpath.plan_call`): ``check()`` validates the
    arguments locally and returns ``(fields, call, extra)``; the members exchange them;
    ``finish(call, extras)`` completes the call from every member's ``extra``; the algorithm is
    chosen and planned."""
    def checked():
        fields, call, extra = check()
        if not isinstance(algorithm, str):
            raise ArgumentTypeError(f"algorithm must be a name or 'auto', got {algorithm!r}")
        if algorithm != "auto":  # an unknown name is bad input, raised on every rank before the call
            g.ctx.registries.algorithm.require_available(f"{call.collective}.{algorithm}")
        fields["algorithm"] = algorithm
        return fields, (fields, call), extra

    def plan(state, extras):
        fields, call = state
        if finish is not None:
            call = finish(call, extras)
        algo = al.choose(g, call, algorithm)
        if g.size == 1 and call.collective in _INPUT_IS_RESULT_AT_ONE_RANK:
            return al.local_copy(g, call)
        g.planning = describe_call(label, fields)
        try:
            return algo.plan(g, call)
        finally:
            g.planning = ""

    return cp.plan_call(g.ctx, label, checked, lambda fields, error, extra: g.exchange(label, fields, error, extra),
                        plan)


#: Collectives whose result on a one-rank group is their input (a reduction of one value with
#: any op, a gather or scatter of one part): the call path's ``dst`` = ``src``
#: (:func:`~iris_fw.ccl.algorithm.local_copy`).
_INPUT_IS_RESULT_AT_ONE_RANK = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter"})


def _check_tensor(ctx, t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != ctx.device:
        raise ArgumentError(f"{name} must be on this rank's device {ctx.device}, got a tensor on {t.device}")
    if t.dtype not in al.DTYPES:
        raise ArgumentTypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in al.DTYPES)}")
    if not t.is_contiguous():
        raise ArgumentError(f"{name} must be contiguous (shape {list(t.shape)}, strides {list(t.stride())})")
    return t


def _op_name(op, dtype) -> str:
    try:
        name = _OPS[op]
    except (KeyError, TypeError):
        raise ArgumentError(f"op must be a torch.distributed.ReduceOp (SUM, AVG, MAX, MIN, PRODUCT) or one of "
                            f"{al.REDUCE_OPS}, got {op!r}") from None
    if name == "avg" and dtype not in al.FLOAT_DTYPES:
        raise ArgumentError(f"op AVG needs a floating dtype, got {dtype}")
    return name


def _fast_ok(ctx, *tensors) -> bool:
    """Whether the call's tensors can take the cached path (else the full checks report them)."""
    dev = ctx.device
    for t in tensors:  # (a loop: a generator per call costs a µs on the hit path)
        if not (isinstance(t, torch.Tensor) and t.device == dev and t.is_contiguous()):
            return False
    return True


def _group_rank(g: Group, rank, name: str, group_rank=None) -> int:
    if group_rank is not None:
        if isinstance(group_rank, bool) or not isinstance(group_rank, int):
            raise bad_type(f"group_{name}", f"a rank of the group in [0, {g.size})", group_rank)
        if not 0 <= group_rank < g.size:
            raise ArgumentError(f"group_{name} must be a rank of the group in [0, {g.size}), got {group_rank!r}")
        return group_rank
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise bad_type(name, f"a (global) rank of the group {list(g.ranks)}", rank)
    if rank not in g.ranks:
        raise ArgumentError(f"{name} must be a (global) rank of the group {list(g.ranks)}, got {rank!r}")
    return g.ranks.index(rank)


# ---- collectives ----------------------------------------------------------------------------------


def all_reduce(tensor: torch.Tensor, op: ReduceOpLike = ReduceOp.SUM if ReduceOp else "sum", group: GroupLike = None,
               async_op: bool = False, *, algorithm: str = "auto", ctx: Context | None = None) -> Work | None:
    """``tensor`` = ``tensor`` reduced with ``op`` over the group's ranks, in place, bitwise the
    same on every rank. 8/16-bit floats accumulate in fp32; AVG divides the sum.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    return _call(ctx, group, *_all_reduce_call(ctx, tensor, op, algorithm), async_op)


def _all_reduce_call(ctx, tensor, op, algorithm):
    """``(key, prepare, src, dst)`` of an all-reduce (:func:`_call`'s arguments)."""
    key = (("all_reduce", tensor.dtype, tensor.numel(), _OP_KEYS.get(id(op), op), algorithm) if _fast_ok(ctx, tensor)
           else None)

    def prepare(g):
        def check():
            _check_tensor(ctx, tensor, "tensor")
            name = _op_name(op, tensor.dtype)
            fields = {"dtype": tensor.dtype, "numel": tensor.numel(), "op": name}
            return fields, al.Call("all_reduce", tensor.dtype, tensor.numel(), g.size, op=name), None

        return _prepare(g, "iris_fw.ccl.all_reduce", check, algorithm)

    return key, prepare, tensor, tensor


def _heap_offset(ctx, t) -> int | None:
    return ctx.heap.offset_of(t) if t.device == ctx.device else None


def _contiguous_heap_offset(heap, t, numel: int) -> int | None:
    """:meth:`~iris_fw.heap.SymmetricHeap.offset_of` of a contiguous tensor of ``numel`` elements
    on this rank's device (a hit's key: :func:`_fast_ok` checked that much, nothing read twice)."""
    if not numel:
        return heap.offset_of(t)
    offset = t.data_ptr() - heap.base
    if heap.start <= offset and offset + numel * t.element_size() <= heap.size:
        return offset
    return None


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: GroupLike = None,
                           async_op: bool = False, *, algorithm: str = "auto",
                           ctx: Context | None = None) -> Work | None:
    """``output_tensor`` (``size * input.numel()`` elements, e.g. ``[size * d0, …]`` or
    ``[size, …]``) = every rank's ``input_tensor`` concatenated in group-rank order.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    return _call(ctx, group, *_all_gather_call(ctx, output_tensor, input_tensor, algorithm), async_op)


def _all_gather_call(ctx, output_tensor, input_tensor, algorithm):
    """``(key, prepare, src, dst)`` of an all-gather (:func:`_call`'s arguments)."""
    key = None
    if _fast_ok(ctx, output_tensor, input_tensor):
        n = input_tensor.numel()
        key = ("all_gather", input_tensor.dtype, output_tensor.dtype, n, output_tensor.numel(),
               _contiguous_heap_offset(ctx.heap, input_tensor, n), algorithm)

    def prepare(g):
        def check():
            _check_tensor(ctx, input_tensor, "input_tensor")
            _check_tensor(ctx, output_tensor, "output_tensor")
            if output_tensor.dtype != input_tensor.dtype:
                raise ArgumentTypeError(f"output_tensor has dtype {output_tensor.dtype}, input_tensor {input_tensor.dtype}")
            if output_tensor.numel() != g.size * input_tensor.numel():
                raise ArgumentError(f"output_tensor must hold {g.size} x input_tensor.numel() = "
                                    f"{g.size * input_tensor.numel()} elements, got {output_tensor.numel()} "
                                    f"(shape {list(output_tensor.shape)})")
            fields = {"dtype": input_tensor.dtype, "input numel": input_tensor.numel()}
            call = al.Call("all_gather", input_tensor.dtype, input_tensor.numel(), g.size)
            return fields, call, _heap_offset(ctx, input_tensor)

        def finish(call, offsets):
            same = offsets[0] is not None and all(o == offsets[0] for o in offsets)
            return al.Call(**{**call.__dict__, "src_offset": offsets[0] if same else None})

        return _prepare(g, "iris_fw.ccl.all_gather_into_tensor", check, algorithm, finish)

    return key, prepare, input_tensor, output_tensor


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: ReduceOpLike = ReduceOp.SUM if ReduceOp else "sum",
                          group: GroupLike = None, async_op: bool = False, *, algorithm: str = "auto",
                          ctx: Context | None = None) -> Work | None:
    """``output`` = chunk ``r`` (``output.numel()`` elements) of ``input`` reduced with ``op``
    over the group, on group rank ``r``; ``input`` holds ``size * output.numel()`` elements.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    return _call(ctx, group, *_reduce_scatter_call(ctx, output, input, op, algorithm), async_op)


def _reduce_scatter_call(ctx, output, input, op, algorithm):
    """``(key, prepare, src, dst)`` of a reduce-scatter (:func:`_call`'s arguments)."""
    key = (("reduce_scatter", input.dtype, output.dtype, input.numel(), output.numel(), _OP_KEYS.get(id(op), op),
            algorithm)
           if _fast_ok(ctx, output, input) else None)

    def prepare(g):
        def check():
            _check_tensor(ctx, input, "input")
            _check_tensor(ctx, output, "output")
            if output.dtype != input.dtype:
                raise ArgumentTypeError(f"output has dtype {output.dtype}, input {input.dtype}")
            if input.numel() != g.size * output.numel():
                raise ArgumentError(f"input must hold {g.size} x output.numel() = {g.size * output.numel()} elements, "
                                    f"got {input.numel()} (shape {list(input.shape)})")
            name = _op_name(op, input.dtype)
            fields = {"dtype": input.dtype, "output numel": output.numel(), "op": name}
            return fields, al.Call("reduce_scatter", input.dtype, output.numel(), g.size, op=name), None

        return _prepare(g, "iris_fw.ccl.reduce_scatter_tensor", check, algorithm)

    return key, prepare, input, output


class Prepared:
    """One collective call prepared on fixed tensors (:func:`prepared`): calling it enqueues
    the call — the call path's key and look-up paid once, at preparation: for a library that
    calls one collective on its own buffers every time.

    ``prepared(src=None, dst=None)``: ``src`` / ``dst`` default to the prepared tensors (an
    all-reduce's are both its ``tensor``: in place). ``dst`` can be replaced per call by a
    contiguous tensor of the prepared one's dtype, size and device, and so can an all-reduce's
    or a reduce-scatter's ``src`` (an all-reduce then sums ``src`` into ``dst``); an
    all-gather's input is fixed (an algorithm may have peers read it where it lies). The caller
    guarantees the replacements' match: nothing is checked per call. While a tracer is active a
    call takes the traced variant through the call path (prepared once per session). After the
    job was aborted and re-armed, a call raises (prepare again)."""

    __slots__ = ("ctx", "group", "key", "prepare", "entry", "src", "dst", "label", "fixed_src", "_epoch")

    def __init__(self, ctx, group, key, prepare, entry, src, dst, label, fixed_src):
        self.ctx, self.group, self.key, self.prepare, self.entry = ctx, group, key, prepare, entry
        self.src, self.dst, self.label, self.fixed_src, self._epoch = src, dst, label, fixed_src, ctx.abort_epoch

    def __call__(self, src=None, dst=None) -> None:
        ctx = self.ctx
        if ctx._closed:
            ctx._check_open()  # raises: the call's buffers belong to a closed context
        if self._epoch != ctx.abort_epoch:
            error = IrisError(f"{self.label} was prepared before the job was aborted and re-armed: prepare it again")
            error._iris_fw_told = True
            raise error
        if src is None:
            src = self.src
        elif self.fixed_src and src is not self.src:
            raise ArgumentError(f"{self.label}: a prepared call's input is fixed (peers may read it where it lies); "
                                "prepare another")
        if dst is None:
            dst = self.dst
        if ctx.tracer is not None:  # the traced variant, through the call path (prepared once per session)
            _call(ctx, self.group, self.key, self.prepare, src, dst, False)
            return
        entry = self.entry
        if entry is None:  # prepared while a tracer was active: the plain variant, on the first plain call
            entry = self.entry = self._entry()
        try:
            entry(src, dst)
        except BaseException as exc:
            cp.fail(ctx, self.label, exc)
            raise

    def _entry(self):
        """The plain call's prepared entry (planned and validated across the group on a miss: a
        collective step, taken by every member at the same call)."""
        calls = self.group.calls
        entry = calls.get(self.key)
        if entry is None:
            entry = calls.put(self.key, self.prepare(self.group))
        return entry


#: The collectives :func:`prepared` takes: name -> (the function giving ``(key, prepare, src,
#: dst)``, the number of tensors, whether it takes ``op``).
_PREPARABLE = {"all_reduce": (_all_reduce_call, 1, True), "all_gather_into_tensor": (_all_gather_call, 2, False),
               "reduce_scatter_tensor": (_reduce_scatter_call, 2, True)}


def prepared(collective: str, *tensors, op: ReduceOpLike | None = None, group: GroupLike = None,
             algorithm: str = "auto", ctx: Context | None = None) -> Prepared:
    """``collective`` (``"all_reduce"``, ``"all_gather_into_tensor"``, ``"reduce_scatter_tensor"``)
    on ``tensors`` (its public function's tensor arguments, in order; ``op`` where it takes
    one, default SUM), prepared — validated across the group's members on the group's call
    cache's miss, like the call itself: a collective step, every member prepares it at the same
    point — and returned as a :class:`Prepared` to call later, without launching now. Prepared
    while a tracer is active, the plain variant is planned on the first call without one."""
    ctx = _ctx(ctx)
    known = _PREPARABLE.get(collective)
    if known is None:
        raise ArgumentError(f"collective must be one of {sorted(_PREPARABLE)}, got {collective!r}")
    make, count, takes_op = known
    if len(tensors) != count:
        raise ArgumentTypeError(f"{collective} takes {count} tensor(s), got {len(tensors)}")
    if op is not None and not takes_op:
        raise ArgumentTypeError(f"{collective} takes no op, got op={op!r}")
    if takes_op:
        tensors = (*tensors, (ReduceOp.SUM if ReduceOp else "sum") if op is None else op)
    key, prepare, src, dst = make(ctx, *tensors, algorithm)
    if key is None:  # arguments the cached path does not take: the full checks report them
        prepare(group_of(ctx, group, collective))
        raise ArgumentError(f"{collective}: its tensors must be contiguous on this rank's device")  # pragma: no cover
    g = group_of(ctx, group, key[0])
    made = Prepared(ctx, g, key, prepare, None, src, dst, "iris_fw.ccl." + key[0], not takes_op)
    if ctx.tracer is None:
        made.entry = made._entry()
    return made


def _splits(t, sizes, world: int, name: str) -> tuple[int, ...]:
    """Elements per rank of ``t`` split along dim 0 by ``sizes`` (rows; None: equal)."""
    rows = t.shape[0] if t.dim() else 1
    row = t.numel() // rows if rows else 0
    if sizes is None:
        if rows % world:
            raise ArgumentError(f"{name} has {rows} rows, not divisible by the group size {world}; pass split sizes")
        return tuple([rows // world * row] * world)
    sizes = [int(s) for s in sizes]
    if len(sizes) != world or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise ArgumentError(f"{name} split sizes must be {world} non-negative row counts summing to {rows}, got {sizes}")
    return tuple(s * row for s in sizes)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group: GroupLike = None, async_op: bool = False,
                      *, algorithm: str = "auto", ctx: Context | None = None) -> Work | None:
    """Rank ``r`` sends rows ``input_split_sizes[p]`` of ``input`` (dim 0, in order) to rank
    ``p`` and receives ``output_split_sizes[p]`` rows from it into ``output`` (in order);
    ``None`` splits equally. Every rank's send to ``p`` must match ``p``'s receive.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    key = (("all_to_all", input.dtype, output.dtype, tuple(input.shape), tuple(output.shape),
            None if input_split_sizes is None else tuple(input_split_sizes),
            None if output_split_sizes is None else tuple(output_split_sizes), algorithm)
           if _fast_ok(ctx, output, input) else None)

    def prepare(g):
        def check():
            _check_tensor(ctx, input, "input")
            _check_tensor(ctx, output, "output")
            if output.dtype != input.dtype:
                raise ArgumentTypeError(f"output has dtype {output.dtype}, input {input.dtype}")
            if tuple(input.shape[1:]) != tuple(output.shape[1:]):
                raise ArgumentError(f"input and output must have the same shape past dim 0, got "
                                    f"{list(input.shape)} and {list(output.shape)}")
            send = _splits(input, input_split_sizes, g.size, "input")
            recv = _splits(output, output_split_sizes, g.size, "output")
            call = al.Call("all_to_all", input.dtype, input.numel(), g.size)
            return {"dtype": input.dtype, "row shape": tuple(input.shape[1:])}, call, (send, recv)

        def finish(call, extras):
            for i, (send, _) in enumerate(extras):
                for j, (_, recv) in enumerate(extras):
                    if send[j] != recv[i]:
                        raise ArgumentError(
                            f"iris_fw.ccl.all_to_all_single: rank {g.ranks[i]} sends {send[j]} elements to rank "
                            f"{g.ranks[j]}, which expects {recv[i]} from it (input/output split sizes)")
            return al.Call(**{**call.__dict__, "splits": tuple(send for send, _ in extras)})

        return _prepare(g, "iris_fw.ccl.all_to_all_single", check, algorithm, finish)

    return _call(ctx, group, key, prepare, input, output, async_op)


def broadcast(tensor: torch.Tensor, src: int | None = None, group: GroupLike = None, async_op: bool = False, *,
              group_src: int | None = None, algorithm: str = "auto", ctx: Context | None = None) -> Work | None:
    """``tensor`` = rank ``src``'s ``tensor`` (``src`` a global rank, or ``group_src`` a rank
    of the group), in place. Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    key = ("broadcast", tensor.dtype, tensor.numel(), src, group_src, algorithm) if _fast_ok(ctx, tensor) else None

    def prepare(g):
        def check():
            _check_tensor(ctx, tensor, "tensor")
            root = _group_rank(g, src, "src", group_src)
            fields = {"dtype": tensor.dtype, "numel": tensor.numel(), "src": g.ranks[root]}
            return fields, al.Call("broadcast", tensor.dtype, tensor.numel(), g.size, root=root), None

        return _prepare(g, "iris_fw.ccl.broadcast", check, algorithm)

    return _call(ctx, group, key, prepare, tensor, tensor, async_op)


def reduce(tensor: torch.Tensor, dst: int | None = None, op: ReduceOpLike = ReduceOp.SUM if ReduceOp else "sum",
           group: GroupLike = None, async_op: bool = False, *, group_dst: int | None = None, algorithm: str = "auto",
           ctx: Context | None = None) -> Work | None:
    """Rank ``dst``'s ``tensor`` = ``tensor`` reduced with ``op`` over the group, in place;
    the other ranks' tensors are left as they were. Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)
    key = (("reduce", tensor.dtype, tensor.numel(), dst, group_dst, _OP_KEYS.get(id(op), op), algorithm)
           if _fast_ok(ctx, tensor) else None)

    def prepare(g):
        def check():
            _check_tensor(ctx, tensor, "tensor")
            root = _group_rank(g, dst, "dst", group_dst)
            name = _op_name(op, tensor.dtype)
            fields = {"dtype": tensor.dtype, "numel": tensor.numel(), "dst": g.ranks[root], "op": name}
            return fields, al.Call("reduce", tensor.dtype, tensor.numel(), g.size, op=name, root=root), None

        return _prepare(g, "iris_fw.ccl.reduce", check, algorithm)

    return _call(ctx, group, key, prepare, tensor, tensor, async_op)


def _rooted_list(ctx, g: Group, items, tensor, root: int, name: str):
    """The root's list of ``size`` tensors like ``tensor`` (validated), else None."""
    if g.rank != root:
        return None
    if not isinstance(items, (list, tuple)) or len(items) != g.size:
        raise ArgumentError(f"{name} must be a list of {g.size} tensors on the root, got {type(items).__name__}"
                            + (f" of {len(items)}" if isinstance(items, (list, tuple)) else ""))
    for i, t in enumerate(items):
        _check_tensor(ctx, t, f"{name}[{i}]")
        if t.dtype != tensor.dtype or t.numel() != tensor.numel():
            raise ArgumentError(f"{name}[{i}] must have tensor's dtype {tensor.dtype} and {tensor.numel()} elements, "
                                f"got {t.dtype} with {t.numel()}")
    return list(items)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int | None = None,
           group: GroupLike = None, async_op: bool = False, *, group_dst: int | None = None, algorithm: str = "auto",
           ctx: Context | None = None) -> Work | None:
    """The root's ``gather_list[p]`` = group rank ``p``'s ``tensor`` (``dst``: a global rank,
    or ``group_dst``; default rank 0 of the group). Other ranks pass no list.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    return _rooted_list_call("gather", "dst", tensor, gather_list, dst, group_dst, group, async_op, algorithm, ctx)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int | None = None,
            group: GroupLike = None, async_op: bool = False, *, group_src: int | None = None, algorithm: str = "auto",
            ctx: Context | None = None) -> Work | None:
    """Group rank ``p``'s ``tensor`` = the root's ``scatter_list[p]`` (``src``: a global rank,
    or ``group_src``; default rank 0 of the group). Other ranks pass no list.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    return _rooted_list_call("scatter", "src", tensor, scatter_list, src, group_src, group, async_op, algorithm, ctx)


def _rooted_list_call(collective: str, role: str, tensor, items, root_rank, group_root, group, async_op, algorithm,
                      ctx):
    """gather / scatter: the root's list of ``size`` tensors like ``tensor`` goes through one
    contiguous buffer; an invalid root or list raises on every member (through the exchange)."""
    ctx = _ctx(ctx)
    g = group_of(ctx, group, collective)
    root, rejected = None, None
    try:
        root = _group_rank(g, g.ranks[0] if root_rank is None and group_root is None else root_rank, role, group_root)
        items = _rooted_list(ctx, g, items, tensor, root, f"{collective}_list")
    except Exception as exc:  # reported to every member by the exchange
        rejected, items = exc, None
    key = (collective, tensor.dtype, tensor.numel(), root, algorithm) if rejected is None and _fast_ok(ctx, tensor) else None

    def prepare(g):
        def check():
            if rejected is not None:
                raise rejected
            _check_tensor(ctx, tensor, "tensor")
            fields = {"dtype": tensor.dtype, "numel": tensor.numel(), role: g.ranks[root]}
            return fields, al.Call(collective, tensor.dtype, tensor.numel(), g.size, root=root), None

        return _prepare(g, f"iris_fw.ccl.{collective}", check, algorithm)

    n = tensor.numel() if isinstance(tensor, torch.Tensor) else 0
    if collective == "gather":
        src, dst = tensor, (torch.empty(g.size * n, dtype=tensor.dtype, device=ctx.device) if items else tensor)
    else:
        src, dst = (torch.cat([t.reshape(-1) for t in items]) if items else tensor), tensor
    work = _call(ctx, g, key, prepare, src, dst, async_op)
    if collective == "gather" and items:
        for p, t in enumerate(items):
            t.view(-1).copy_(dst[p * n:(p + 1) * n])
    return work


# ---- barrier --------------------------------------------------------------------------------------


@triton.jit
def _barrier_kernel(slots, counters, rank, world_size, heap_bases, trace, TRACE: tl.constexpr = 0):
    """Every rank arrives at ``slots`` (symmetric int64 ``[world_size]``) and waits for all.
    Traced: the program's span and one ``arrivals`` wait (arriving included), item = epoch."""
    epoch = tc.program_epoch(counters)
    if TRACE:
        started = tr.record_start(trace, TRACE)
    tc.arrive(slots, epoch, rank, world_size, heap_bases)
    tc.wait_arrivals(slots, epoch, rank, world_size, heap_bases)
    if TRACE:
        tr.record_wait(trace, TRACE, started, tr.ARRIVALS, slots, rank, heap_bases, epoch)
        tr.record_end(trace, TRACE, started, tr.PROGRAM, tr.SPAN, epoch)


def barrier(group: GroupLike = None, async_op: bool = False, device_ids: Any = None, *,
            ctx: Context | None = None) -> Work | None:
    """Every member's work queued before the barrier finishes before any member's work after
    it starts; unless ``async_op`` (or while capturing a CUDA graph) the host also waits, as
    torch's barrier does, and raises :class:`~iris_fw.WaitTimeout` if a member never came.
    Returns a :class:`Work` when ``async_op``, else ``None``."""
    ctx = _ctx(ctx)

    def prepare(g):
        g.exchange("iris_fw.ccl.barrier", {})
        g.planning = "iris_fw.ccl.barrier()"
        launch, bufs = al.kernel_config(g, ("barrier",), _barrier_kernel, nprog=1, constexprs={}, slots=g.size)
        return lambda src, dst: launch(*bufs, g.rank, g.size, g.heap_bases)

    work = _call(ctx, group, ("barrier",), prepare, None, None, async_op)
    capturing = ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not async_op and not capturing:
        ctx.synchronize()
    return work
