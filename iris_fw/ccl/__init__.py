"""Collectives with torch.distributed's names and signatures, on iris-fw's symmetric heaps.

Switching is one import: ``from iris_fw import ccl as dist`` and the calls below behave like
``torch.distributed``'s (in place where torch's are, ``op`` a ``torch.distributed.ReduceOp`` or
its name, ``group`` ``None``/a :class:`Group`/a list of ranks/a torch ``ProcessGroup``,
``async_op=True`` returns a :class:`Work`). Any tensor on the rank's device works; kernels read
sources in place and data travels through the group's registered receive buffers.

* ``all_reduce(tensor, op=SUM, group=None, async_op=False)``
* ``all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False)``
* ``reduce_scatter_tensor(output, input, op=SUM, group=None, async_op=False)``
* ``all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False)``
* ``broadcast(tensor, src, group=None, async_op=False)``, ``reduce(tensor, dst, op=SUM, …)``,
  ``gather(tensor, gather_list=None, dst=0, …)``, ``scatter(tensor, scatter_list=None, src=0, …)``
* ``barrier(group=None, async_op=False)``; ``new_group(ranks)``, ``destroy_group(group)``
* ``prepared(collective, *tensors, op=None, group=None, algorithm="auto")``: an all-reduce,
  all-gather or reduce-scatter prepared once on fixed tensors (a :class:`Prepared` to call,
  source and destination replaceable): for a library calling one collective on its own buffers

Every call also takes ``algorithm=`` (``"auto"``, or a registered name: ``ccl.algorithms(...)``)
and ``ctx=`` (default: the current context). The first call with given arguments is validated
across the group's members (a mismatch raises on every member naming the ranks and argument);
later identical calls enqueue one kernel and nothing else, so they can be captured in a CUDA
graph (see docs/collectives.md).
"""

from __future__ import annotations

from .api import (
    Prepared,
    ReduceOp,
    Work,
    algorithms,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    destroy_group,
    gather,
    new_group,
    prepared,
    reduce,
    reduce_scatter_tensor,
    scatter,
)
from .fused import all_reduce_rmsnorm, all_reduce_rmsnorm_reference
from .group import Group, WorkspaceFull

__all__ = [
    "Group",
    "Prepared",
    "ReduceOp",
    "Work",
    "WorkspaceFull",
    "algorithms",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_rmsnorm",
    "all_reduce_rmsnorm_reference",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "destroy_group",
    "gather",
    "new_group",
    "prepared",
    "reduce",
    "reduce_scatter_tensor",
    "scatter",
]
