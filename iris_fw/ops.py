"""Public compute + communication operations: a pattern run by a scheduler.

Each function is collective (every rank calls it with same-shaped inputs) and returns this
rank's result — in ``out`` when given (``out=``: a tensor of the result's shape and dtype on the
rank's device, returned), else as a new tensor::

    c = iris_fw.ops.gemm_all_scatter(a, b_local)              # [M, K] @ [K, N/W] -> [M, N]
    c = iris_fw.ops.all_gather_gemm(a_shard, b_local)         # [M/W, K] gathered @ [K, N/W] -> [M, N/W]
    c = iris_fw.ops.gemm_reduce_scatter(a_local, b_local)     # [M, K/W] @ [K/W, N] summed -> [M/W, N]
    c = iris_fw.ops.gemm_all_reduce(a_local, b_local, bias=b) # [M, K/W] @ [K/W, N] summed (+ bias) -> [M, N]
    o = iris_fw.ops.flash_decode(q, k_local, v_local)         # decode attention over a sequence split by rank
    d = iris_fw.ops.moe_dispatch(x, topk_idx, topk_w, E, max_tokens_per_rank=T)  # tokens -> experts' rows [E/W, C, H]
    y = iris_fw.ops.moe_combine(expert_out, d.handle)         # experts' rows -> [T, H], top-k weighted, token order
    g = iris_fw.ops.moe_dispatch_gemm(x, topk_idx, topk_w, w1, E, max_tokens_per_rank=T)  # + [E/W, C, H] @ w1 [E/W, H, N]
    y = iris_fw.ops.moe_gemm_combine(h, w2, g.handle)         # h [E/W, C, N] @ w2 [E/W, N, H] straight back -> [T, H]

``moe_dispatch``/``moe_combine`` (:mod:`iris_fw.moe`) are expert-parallel exchanges with their
own modes; ``moe_dispatch_gemm``/``moe_gemm_combine`` (:mod:`iris_fw.moe_gemm`) fuse them with
the experts' grouped GEMMs. ``flash_decode`` (:mod:`iris_fw.flash_decode`) has its own schedulers — registered flash-decode
algorithms, ``"fused"`` (one kernel that combines across ranks), ``"bulk_sync"`` or a plugin's —;
the GEMM schedulers below are the engine's.

``scheduler`` is a registered scheduler's name (``bulk_sync``, ``producer_consumer``,
``fused_sequential``, ``wg_specialized``, ``copy_engine``, ``library`` — no fusion: cuBLAS
through torch, then :mod:`iris_fw.ccl` —, or a plugin's) or ``"auto"``: the schedule (with its
SM split and tile configuration) measured fastest for the shape on this device and world size
(``iris_fw/tuning/auto.json``), else the pattern's default there, else the default for its kind.
``comm_sms`` sets the SM split of the two-role schedules; ``config`` a pattern's config
(:class:`~iris_fw.gemm.GemmConfig` for these three).

Every call takes the library's one call path (:mod:`iris_fw.callpath`): the first call with
given arguments plans an op (one cross-rank exchange that validates the arguments on every rank,
then workspace allocation) and keeps it in the context's op cache (``IRIS_FW_OP_CACHE_SIZE`` ops,
least recently used dropped); later calls with inputs of the same shapes, dtypes and devices
compare that fingerprint and launch — a loop allocates nothing after its first call. A host
failure on one rank inside a call (an ``out`` that does not fit, an error while planning)
aborts the peers' waits: they raise :class:`~iris_fw.PeerFailure` naming the rank at once.

**Results.** Without ``out`` a call returns a new tensor, with ``out`` (checked before anything
is launched) it fills ``out`` and returns it; no call hands back memory the next call overwrites.
Whether that costs a copy depends on where the op's last step writes (per op):

On one rank ``auto`` runs the three taxonomy ops below in their ``library`` form (each is a plain
GEMM there; ``iris_fw/tuning/auto.json``, ``one_rank``): the local product straight into ``out``
(when contiguous) or the new tensor — one launch, no copy of the input or the result. That
product (:class:`~iris_fw.gemm.LocalProduct`) is a prepared launch of the Triton GEMM where the
device's tuning table measured it against cuBLAS for the shape (a fraction of ``torch.matmul``'s
host time per call), else ``torch.matmul``.

* ``gemm_reduce_scatter``: under a kernel schedule the last step is this rank's reduction of the
  partials, which writes straight into ``out`` (when contiguous) or the new tensor — no copy; two
  launches (the GEMM kernel, then the reduction, which needs every peer's partials and writes the
  caller's tensor, which the GEMM kernel's prepared arguments cannot take per call). Under
  ``library`` on more ranks: the local product into the op's buffer, then the reduce-scatter
  (:func:`iris_fw.ccl.prepared` on that buffer) straight into ``out`` or the new tensor — no copy.
* ``gemm_all_reduce`` under the ``library`` schedule (what ``auto`` picks wherever no fused row
  is measured: every device and world size today): on one rank its library form multiplies
  straight into ``out`` (when contiguous) or the new tensor — no copy (and no all-reduce); on
  more ranks it multiplies into the op's buffer and all-reduces from there into that tensor
  (:func:`iris_fw.ccl.prepared`) — no copy either. Under a fused schedule the result is the op's symmetric workspace (with ``two_shot``
  peers store into it; the next call overwrites it): copied into ``out`` or a new tensor.
* ``gemm_all_scatter``: under a kernel schedule the result is the op's symmetric workspace
  (peers write their blocks into it; the next call overwrites it): copied into ``out`` or a new
  tensor. Under ``library`` (one rank: ``auto``'s pick) no copy of the result: on one rank the
  product is computed into that tensor; on more ranks the local product is all-gathered in the
  op's buffers and its column blocks copied into place (the layout copy, in place of a clone).
* ``all_gather_gemm``: under a kernel schedule the result is the op's output buffer, bound into
  its prepared GEMM launches (the next call overwrites it): copied into ``out`` or a new tensor;
  its input is copied too (peers read ``a_shard`` from the op's heap buffer, unless ``a_shard``
  is that buffer; the staged schedules copy it again into staging, on one rank as well). Under
  ``library`` no copy of the result (the gathered ``A`` is multiplied into that tensor) and, on
  one rank, none of the input (the shard is multiplied where it is).
* ``flash_decode`` writes straight into ``out`` or a new tensor (its result is never a workspace).
* ``moe_dispatch`` / ``moe_combine`` / ``moe_dispatch_gemm`` / ``moe_gemm_combine``: see
  :mod:`iris_fw.moe` and :mod:`iris_fw.moe_gemm` (they have calls of their own, not this path).

A copy costs one device op per call (``clone``: an allocation and a copy kernel); binding a new
output per call instead would replace a tensor inside the prepared launches' nested arguments
(not done yet: docs/performance.md, "one-rank gemm_all_reduce without its result copy", says why).

**Repeated calls replay as CUDA graphs.** A call that comes back with every tensor at the same
address (a decode loop on static buffers) is captured on its third such call and replayed from then
on, one graph launch in place of its launches — where its quickest replay took less host time than
its quickest eager call, timed in turn after the capture (:class:`iris_fw.callpath.Replay`;
``IRIS_FW_GRAPH_REPLAY=0`` turns it off). A call without ``out=`` makes its new result first
(:meth:`Op.new_result`) and writes it, so it replays whenever torch's allocator hands that address
back — a loop that drops its last result gets two addresses in turn; results kept alive get new
addresses and run eagerly.

For zero-copy use (in loops and CUDA graphs) make an :class:`Op` with :func:`plan` and call it:
it returns its own output buffer, overwritten by the next call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import callpath as cp
from . import context as _context
from .engine.contract import input_fingerprint
from .engine.op import Op
from .flash_decode import flash_decode
from .gemm import GemmConfig, matmul
from .moe import moe_combine, moe_dispatch
from .moe_gemm import moe_dispatch_gemm, moe_gemm_combine

if TYPE_CHECKING:
    from .context import Context

__all__ = ["Op", "all_gather_gemm", "flash_decode", "gemm_all_reduce", "gemm_all_scatter", "gemm_reduce_scatter",
           "matmul", "moe_combine", "moe_dispatch", "moe_dispatch_gemm", "moe_gemm_combine", "plan"]


def plan(pattern: str, *inputs: Any, ctx: Context | None = None, scheduler: str = "auto", config: Any = None,
         comm_sms: int | None = None) -> Op:
    """A new :class:`Op` for ``pattern`` on inputs shaped like ``inputs`` (collective)."""
    return Op(pattern, *inputs, ctx=ctx, scheduler=scheduler, config=config, comm_sms=comm_sms)


def _call(pattern: str, inputs: tuple, ctx, scheduler, config, comm_sms, out):
    """One functional op call through the call path: the cached op for these arguments (planned on
    a miss) launched on ``inputs``, its result delivered (see "Results" above)."""
    ctx = _context.resolve(ctx)
    key = (pattern, scheduler, config, comm_sms, input_fingerprint(inputs))
    return cp.call(ctx, cp.state(ctx).ops, key,
                   lambda _: Op(pattern, *inputs, ctx=ctx, scheduler=scheduler, config=config,
                                comm_sms=comm_sms).functional,
                   None, "iris_fw.ops." + pattern, out, *inputs, replay=_addresses, fresh=_FRESH)


def _addresses(args) -> tuple | None:
    """All that a captured op call bakes in of its ``(out, *inputs)`` (the call path's replay
    key, :func:`iris_fw.callpath.call`): each input tensor's address and strides — the call's
    key names their shapes, dtypes and devices and every other input itself
    (:func:`~iris_fw.engine.contract.input_fingerprint`) — and the result's address, shape,
    strides and dtype (a GPU tensor's; else None: never replayed). Inputs other than tensors,
    None and plain values: what :func:`iris_fw.callpath.address_key` finds."""
    out = args[0]
    if not (isinstance(out, torch.Tensor) and out.is_cuda):
        return None
    key = [out.data_ptr(), out.shape, out.stride(), out.dtype]
    for x in args[1:]:  # (by position: an input that is ``out`` too is an input all the same)
        if isinstance(x, torch.Tensor):
            key += (x.data_ptr(), x.stride())
        elif x is not None and not isinstance(x, cp.PLAIN):
            return cp.address_key(args)
    return tuple(key)


def _new_result(functional, _args):
    """The new tensor a call without ``out`` returns, made before the call (the call path's
    ``fresh``): its cached op's :meth:`Op.new_result`."""
    return functional.__self__.new_result()


#: a functional call's result slot (its first argument, ``out``) and what fills it when None
_FRESH = (0, _new_result)


def gemm_all_scatter(a: torch.Tensor, b: torch.Tensor, *, ctx: Context | None = None, scheduler: str = "auto",
                     config: GemmConfig | None = None, comm_sms: int | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``a[M, K] @ b[K, N/W]`` on every rank, gathered column-wise: returns ``C[M, N]``, column
    block ``r`` being rank ``r``'s product — in ``out`` (``[M, N]``) when given, else a new tensor.

    **No copy of the result** under ``scheduler="library"`` (``auto``'s pick on one rank; a
    non-contiguous ``out`` gets one): one rank multiplies straight into that tensor; more ranks
    all-gather the local products (:func:`iris_fw.ccl.all_gather_into_tensor`) and copy the
    column blocks into place. **Copies** under a kernel schedule: the result is the op's
    symmetric workspace, because peers store their column blocks into it (a plain tensor is not
    addressable by peers) and the next call overwrites it."""
    return _call("gemm_all_scatter", (a, b), ctx, scheduler, config, comm_sms, out)


def all_gather_gemm(a_shard: torch.Tensor, b: torch.Tensor, *, ctx: Context | None = None, scheduler: str = "auto",
                    config: GemmConfig | None = None, comm_sms: int | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """``all_gather(a_shard[M/W, K]) @ b[K, N/W]``: returns ``C[M, N/W]`` — in ``out`` (``[M, N/W]``)
    when given, else a new tensor.

    **No copy of the result** (a non-contiguous ``out``, or one sharing memory with ``b`` or
    with a buffer of the op, gets one): under ``scheduler="library"`` (``auto``'s pick on one rank) the gathered ``A`` is
    multiplied straight into that tensor, and on one rank the shard is multiplied where it is
    (no copy of the input either); under a kernel schedule the GEMM kernels write it, launched
    with their output replaced (only this rank writes its ``C``). **Copies its input** under a
    kernel schedule: the shard into the op's heap buffer (peers read it there; pass that buffer,
    ``op.buffers["a_heap"]`` of :func:`plan`'s op, to skip it)."""
    return _call("all_gather_gemm", (a_shard, b), ctx, scheduler, config, comm_sms, out)


def gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, *, ctx: Context | None = None, scheduler: str = "auto",
                        config: GemmConfig | None = None, comm_sms: int | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum over ranks of a[M, K/W] @ b[K/W, N]``, rows ``rank*M/W …``: returns ``[M/W, N]`` — in
    ``out`` when given, else a new tensor, written there by the op's last step (this rank's
    reduction of the partials).

    **No copy** (a non-contiguous ``out`` gets one) under a kernel schedule: the last writer is
    this rank's own reduction kernel, launched on the new tensor or ``out`` (two launches: the
    GEMM kernel, then the reduction) — and on one rank under ``library`` (``auto``'s pick there):
    one product (:class:`~iris_fw.gemm.LocalProduct`) into that tensor; on more ranks the
    product into the op's buffer and the reduce-scatter from there into that tensor."""
    return _call("gemm_reduce_scatter", (a, b), ctx, scheduler, config, comm_sms, out)


def gemm_all_reduce(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
                    ctx: Context | None = None, scheduler: str = "auto", config: Any = None,
                    comm_sms: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum over ranks of a[M, K/W] @ b[K/W, N]`` plus ``bias[N]`` (the same on every rank),
    on every rank: returns ``[M, N]`` (a row-parallel linear layer). ``config``: a
    :class:`~iris_fw.plugins.gemm_all_reduce.GemmAllReduceConfig` (tiles and ``one_shot`` /
    ``two_shot``). ``scheduler="library"``: the local product + the all-reduce.
    The result goes into ``out`` (``[M, N]``) when given, else into a new tensor.

    **No copy** (a non-contiguous ``out``, or one sharing memory with an operand, gets one)
    under the ``library`` schedule (``auto``'s pick today): on one rank the product is computed
    into that tensor, nothing more; on more the product goes into the op's buffer and the
    all-reduce sums from there into that tensor. Under a kernel schedule with ``one_shot`` (the
    default up to two ranks) the kernel's last step sums the partials straight into that
    tensor. **Copies** under a kernel schedule with ``two_shot`` (the result is the op's
    symmetric output buffer: peers store the sums into it; the next call overwrites it)."""
    return _call("gemm_all_reduce", (a, b, bias), ctx, scheduler, config, comm_sms, out)
