"""Iris's trace event ids (``iris.TraceEvent``, ``EVENT_NAMES``) and how they map onto iris-fw's
trace records (:mod:`iris_fw.trace`): an Iris event ``e`` is recorded as the user kind
``iris_fw.trace.USER + e``, named as Iris names it, with the role its id range gives it — ids
below 2048 (Iris's operations and user data movement) communicate, 2048-3071 compute,
3072-4095 wait."""

import triton
import triton.language as tl

from iris_fw import trace as _tr

from ..._aggregate import aggregate

#: Iris's event ids by name (its id ranges: 0-1023 its operations, 1024-2047 user data
#: movement, 2048-3071 user compute, 3072-4095 synchronization).
EVENT_IDS = {
    "load": 0, "store": 1, "get": 2, "put": 3, "copy": 4, "atomic_add": 5, "atomic_sub": 6, "atomic_cas": 7,
    "atomic_xchg": 8, "atomic_xor": 9, "atomic_and": 10, "atomic_or": 11, "atomic_min": 12, "atomic_max": 13,
    "wg_fetch": 14, "wg_gemm": 15, "wg_gemm_wait": 16, "wg_sdma": 17,
    "fetch": 1024, "compute": 2048, "reduce": 2049, "wait": 3072, "barrier": 3073,
}
#: id -> name (Iris's ``EVENT_NAMES``).
EVENT_NAMES = {code: name for name, code in EVENT_IDS.items()}
#: First ids of Iris's compute and synchronization ranges.
COMPUTE_FIRST = 2048
WAIT_FIRST = 3072


def kind_names() -> dict:
    """iris-fw trace kinds of Iris's events -> their names (a trace session's ``kinds``)."""
    return {_tr.USER.value + code: name for code, name in EVENT_NAMES.items()}


def role_of(event_id: int) -> int:
    """The iris-fw role of Iris event ``event_id`` (by its id range)."""
    if event_id >= WAIT_FIRST:
        return _tr.WAIT.value
    if event_id >= COMPUTE_FIRST:
        return _tr.COMPUTE.value
    return _tr.COMMUNICATE.value


class _TraceEvent:
    """``iris.TraceEvent()``: Iris's event ids as constexpr fields (``TraceEvent().put`` …), the
    values of :data:`EVENT_IDS` (Triton reads the body of ``__init__``: one line per field)."""

    __annotations__ = {name: tl.constexpr for name in EVENT_IDS}

    @triton.constexpr_function
    def __init__(self):
        # iris operations
        self.load, self.store, self.get, self.put = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
        self.copy, self.atomic_add, self.atomic_sub = tl.constexpr(4), tl.constexpr(5), tl.constexpr(6)
        self.atomic_cas, self.atomic_xchg, self.atomic_xor = tl.constexpr(7), tl.constexpr(8), tl.constexpr(9)
        self.atomic_and, self.atomic_or = tl.constexpr(10), tl.constexpr(11)
        self.atomic_min, self.atomic_max = tl.constexpr(12), tl.constexpr(13)
        # workgroup-level profiling
        self.wg_fetch, self.wg_gemm = tl.constexpr(14), tl.constexpr(15)
        self.wg_gemm_wait, self.wg_sdma = tl.constexpr(16), tl.constexpr(17)
        # user data movement, user compute, synchronization
        self.fetch = tl.constexpr(1024)
        self.compute, self.reduce = tl.constexpr(2048), tl.constexpr(2049)
        self.wait, self.barrier = tl.constexpr(3072), tl.constexpr(3073)


TraceEvent = aggregate(_TraceEvent)
