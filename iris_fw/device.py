"""Device primitives: ``@triton.jit`` functions that reach into a peer's symmetric heap.

This is a leaf module: it imports Triton and nothing from iris-fw's host side, so kernels
anywhere can import it; it reads nothing from the environment. Its two compile-time switches
(pointer checks, NVSHMEM calls) travel with ``heap_bases`` (:class:`DeviceHeaps`).

**One argument order for every primitive.** Pointers and values come first (sources before
destinations, as data flows), then ``rank`` (the calling rank), then the peer rank(s), then
``heap_bases``, then keyword options (``mask``, ``other``, ``sem``, ``scope``, …)::

    load(ptr, rank, peer, heap_bases, mask=None, other=None, cache_modifier="", volatile=False, hint=None)
    store(ptr, value, rank, peer, heap_bases, mask=None, cache_modifier="", hint=None)
    get(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None, other=None, load_cache_modifier="",
        store_cache_modifier="", hint=None)                      # put and copy take the same options
    put(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None, other=None, ...)
    copy(src_ptr, dst_ptr, rank, src_rank, dst_rank, heap_bases, mask=None, other=None, ...)
    atomic_<op>(ptr, val, rank, peer, heap_bases, mask=None, sem="acq_rel", scope="sys", hint=None)
    atomic_cas(ptr, cmp, val, rank, peer, heap_bases, sem="acq_rel", scope="sys", hint=None)
    signal(flag_ptr, value, rank, peer, heap_bases, op="set", sem="release", scope="sys")
    wait_until(flag_ptr, cmp, value, rank, peer, heap_bases, sem="acquire", scope="sys")
    barrier(rank, world_size, heap_bases)

``mask``/``other`` are ``tl.load``'s (``other``: what masked-off lanes of a load read; ``get``,
``put`` and ``copy`` store nothing there). Cache modifiers are ``tl.load``/``tl.store``'s
(loads ``".ca"``, ``".cg"``, ``".cv"``; stores ``".wb"``, ``".cg"``, ``".cs"``, ``".wt"``; ``""``
or ``None``: none); ``volatile=True`` issues the load volatile, which subsumes a load cache
modifier (the modifier is then left out: PTX rejects the combination). ``hint`` is a
vectorization hint on the translated pointer (``tl.multiple_of`` + ``tl.max_contiguous``): an
int for a 1-D block, a tuple per dimension for 2-D.

Every pointer argument is an address in the *caller's* heap (a symmetric tensor the caller
allocated); the primitive translates it to the same offset in the peer's heap. ``peer`` may
equal ``rank``. Atomics default to ``scope="sys"``: a gpu-scope flag is invisible to a peer.

The first bytes of every heap are a header of int64 slots (layout below) holding the wait
bound, the error record of a timed-out wait, the device barrier's epoch and slots, and the
fail-fast state: the abort word every wait polls, a heartbeat, and the record of a pointer
that failed its check (docs/reliability.md, "Fail fast").
"""

from typing import Any, NamedTuple

import triton
import triton.language as tl

from . import nvshmem_device as _nvd

# ---- heap header layout: int64 slot indices ------------------------------------------------
HDR_ERR_FLAG = tl.constexpr(0)  # 0: no error; -1: being written; 1: a wait timed out
HDR_ERR_COUNT = tl.constexpr(1)  # waits that timed out since the host last checked
HDR_ERR_RANK = tl.constexpr(2)  # the rank that waited
HDR_ERR_PEER = tl.constexpr(3)  # whose heap held the flag
HDR_ERR_OFFSET = tl.constexpr(4)  # the flag's byte offset in that heap
HDR_ERR_EXPECTED = tl.constexpr(5)  # the value compared against
HDR_ERR_SEEN = tl.constexpr(6)  # the last value read
HDR_ERR_CMP = tl.constexpr(7)  # comparison code, an index into CMP_OPS
HDR_ERR_SPINS = tl.constexpr(8)  # how many polls were made
HDR_WAIT_BOUND = tl.constexpr(9)  # polls before a wait gives up (set by the host)
HDR_BARRIER_EPOCH = tl.constexpr(10)  # device barrier: this rank's epoch
HDR_PROBE = tl.constexpr(11)  # scratch flag the host uses to calibrate the wait bound
HDR_ABORT = tl.constexpr(12)  # the abort word: non-zero makes every wait on this rank give up
HDR_GAVE_UP = tl.constexpr(13)  # waits that gave up because the abort word was set
HDR_HEAP_SIZE = tl.constexpr(14)  # this heap's bytes (set by the host; pointer checks)
HDR_WORLD_SIZE = tl.constexpr(15)  # ranks of the job (set by the host; pointer checks)
HDR_HEARTBEAT = tl.constexpr(16)  # advanced by the host's watchdog thread (peers read it)
HDR_PTR_COUNT = tl.constexpr(17)  # pointer check: lanes that failed it (the first one claims the record)
HDR_PTR_FLAG = tl.constexpr(18)  # pointer check: 0 no record, 1 record complete
HDR_PTR_PEER = tl.constexpr(19)  # pointer check: the peer asked for
HDR_PTR_OFFSET = tl.constexpr(20)  # pointer check: the pointer's byte offset from this heap's base
HDR_PTR_PROGRAM = tl.constexpr(21)  # pointer check: program id of the failing program
HDR_PTR_RANK = tl.constexpr(22)  # pointer check: the rank argument given
HDR_PTR_SEEN = tl.constexpr(23)  # pointer check: set by any failing lane (cleared by the host)
HDR_SCRATCH = tl.constexpr(24)  # 8 slots a failed pointer check redirects its lanes to
HDR_SINK = tl.constexpr(32)  # NVSHMEM calls: masked-off lanes of a remote store land here
HDR_BARRIER_SLOTS = tl.constexpr(40)  # device barrier: one arrival slot per rank from here
HDR_SLOT_BYTES = tl.constexpr(8)

#: Abort word values: set by this rank's device (a wait timed out, a pointer failed its check),
#: by this rank's host (a peer lost, a host error), or ``ABORT_FROM_RANK + r`` by rank r's host.
ABORT_BY_DEVICE = tl.constexpr(1)
ABORT_BY_HOST = tl.constexpr(2)
ABORT_FROM_RANK = tl.constexpr(16)
#: A spinning wait reads the abort word every this many polls (its first spin included): one
#: extra load per this many polls, and none at all for a wait satisfied at its first poll.
ABORT_POLL_EVERY = tl.constexpr(64)

CMP_OPS = ("==", "!=", ">=", ">", "<=", "<")

# Heap bases are aligned to HEAP_BASE_ALIGN bytes (checked by the host), so the distance
# between two bases, in elements of any type up to 8 bytes, is a multiple of
# _DELTA_ALIGN_ELEMS; writing it as such keeps the translated pointer's alignment visible
# to the compiler and loads/stores stay vectorized.
HEAP_BASE_ALIGN = tl.constexpr(4096)
_DELTA_ALIGN_ELEMS = tl.constexpr(16)


class DeviceHeaps(NamedTuple):
    """What kernels receive as ``heap_bases`` from a context (``ctx.heap_bases``): every rank's
    heap base and the two compile-time switches of the primitives, carried *with* the argument
    every primitive already takes, so a kernel never names them and nothing is decided at
    import. Triton specializes a kernel on the constexpr fields of a tuple argument: a kernel
    launched with other switches compiles (and caches) another variant.

    * ``bases``: int64 tensor ``[world_size]`` on the device (the transport's ``heap_bases``).
    * ``CHECK_POINTERS``: ``tl.constexpr(bool)``: translation checks its pointers
      (:func:`translate`); the context's ``debug`` (``IRIS_FW_DEBUG=1``), always under the
      interpreter. Compiled out when false.
    * ``NVSHMEM_CALLS``: ``tl.constexpr(int)``: the device-backend seam
      (:mod:`iris_fw.nvshmem_device`): 0 compiles every primitive as load/store and atomics on
      translated pointers; 1 reaches peers whose heap base is 0 (not mapped: another node)
      through NVSHMEM device calls; 2 reaches every peer through them. The transport's
      ``call_mode`` (non-zero only for ``nvshmem``).

    A bare int64 pointer is accepted wherever a ``DeviceHeaps`` is (kernels written against
    plain heap-base tensors, Iris-style programs): pointer checks on under the interpreter only,
    no NVSHMEM calls. Build one with :func:`device_heaps`.
    """

    bases: Any
    CHECK_POINTERS: Any
    NVSHMEM_CALLS: Any


def device_heaps(bases, check_pointers: bool, nvshmem_calls: int = 0) -> DeviceHeaps:
    """The :class:`DeviceHeaps` of the int64 heap-base tensor ``bases``. Host-side."""
    if nvshmem_calls not in (0, 1, 2):
        raise ValueError(f"NVSHMEM call mode must be 0, 1 or 2, got {nvshmem_calls!r}")
    return DeviceHeaps(bases, tl.constexpr(bool(check_pointers)), tl.constexpr(int(nvshmem_calls)))


@triton.constexpr_function
def _switch(heap_bases, index, name, bare):
    # Compiled, a DeviceHeaps argument is a tl.tuple (whose field names Triton 3.6 drops for a
    # kernel's parameter: fields are read by position); interpreted, the NamedTuple itself. A
    # bare pointer has no such field: ``bare`` is its value.
    if not isinstance(heap_bases, (tuple, tl.tuple)):
        return bare
    value = heap_bases[index]
    value = getattr(value, "value", value)
    if not isinstance(value, (bool, int)):
        raise TypeError(
            f"heap_bases.{name} is a run-time value here, not a constexpr: Triton turns the constexprs of a "
            f"tuple assigned to a variable (3.6: or returned from a jit function) into run-time values. Pass "
            f"heap_bases, or the named tuple holding it (a pattern's args), on as an argument, built where it "
            f"is passed (iris_fw.engine.skeletons' docstring, \"args\")")
    return value


@triton.constexpr_function
def is_device_heaps(heap_bases):
    """Whether ``heap_bases`` is a :class:`DeviceHeaps` (else a bare pointer)."""
    return isinstance(heap_bases, (tuple, tl.tuple))


@triton.constexpr_function
def check_pointers(heap_bases):
    """``heap_bases.CHECK_POINTERS``; for a bare pointer, whether kernels run under Triton's
    interpreter (where pointer checks are always on)."""
    return bool(_switch(heap_bases, 1, "CHECK_POINTERS", triton.knobs.runtime.interpret))


@triton.constexpr_function
def nvshmem_calls(heap_bases):
    """``heap_bases.NVSHMEM_CALLS``; 0 for a bare pointer."""
    return int(_switch(heap_bases, 2, "NVSHMEM_CALLS", 0))


@triton.jit
def bases(heap_bases):
    """The int64 pointer to every rank's heap base, from a :class:`DeviceHeaps` or a bare one."""
    if is_device_heaps(heap_bases):
        out = heap_bases[0]  # by position: see _switch
    else:
        out = heap_bases
    return out


# String defaults of constexpr parameters are tl.constexpr objects: Triton 3.6 does not wrap a
# plain-str default when a jit function calls another.
_ACQ_REL = tl.constexpr("acq_rel")
_ACQUIRE = tl.constexpr("acquire")
_RELEASE = tl.constexpr("release")
_SYS = tl.constexpr("sys")
_SET = tl.constexpr("set")
_NO_MODIFIER = tl.constexpr("")


@triton.jit
def translate(ptr, rank, peer, heap_bases, mask=None):
    """The address in ``peer``'s heap at the offset ``ptr`` has in ``rank``'s heap.

    ``ptr``: a pointer or block of pointers into the caller's heap; ``mask``: the lanes that
    will be accessed (as in ``tl.load``; ``None``: all). Costs the two base loads and one scalar
    subtraction; the block's contiguity and alignment are preserved.

    With ``heap_bases.CHECK_POINTERS`` (:class:`DeviceHeaps`: always on CPU ranks, on GPUs in a
    debug context, ``IRIS_FW_DEBUG=1``) it also
    checks that every accessed lane lies inside the caller's heap and that ``peer`` is a rank
    of the world; a lane that fails is redirected to a scratch slot of the caller's header
    (memory outside the heaps is never touched) and the failure is recorded there
    (:func:`record_bad_pointer`), which the host raises as :class:`iris_fw.NotOnHeapError`.
    """
    ELEM: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    here = tl.load(bases(heap_bases) + rank)
    if check_pointers(heap_bases):
        # Few operations on the block and no nested call unless a lane fails: under the
        # interpreter an operation costs tens of microseconds whatever the block's size, a call
        # (tl.max included) a millisecond. Unsigned compares: a negative peer or offset is a
        # large one. A peer outside the world, or outside the group (whose heap_bases lists its
        # members, then zeros up to the world size), leaves no offset in bounds.
        hdr = here.to(tl.pointer_type(tl.uint64))
        if nvshmem_calls(heap_bases):  # a peer whose base is 0 is not mapped here: NVSHMEM calls reach it
            peer_ok = tl.cast(peer, tl.uint64) < tl.load(hdr + HDR_WORLD_SIZE)
            there = tl.load(bases(heap_bases) + peer, mask=peer_ok, other=0)
            bound = (tl.load(hdr + HDR_HEAP_SIZE) - (ELEM - 1)) * peer_ok
        else:
            there = tl.load(bases(heap_bases) + peer, mask=tl.cast(peer, tl.uint64) < tl.load(hdr + HDR_WORLD_SIZE), other=0)
            bound = (tl.load(hdr + HDR_HEAP_SIZE) - (ELEM - 1)) * (there != 0)
        offset = ptr.to(tl.uint64) - here.to(tl.uint64)
        if mask is None:
            bad = offset >= bound
        else:
            bad = mask & (offset >= bound)
        # any failing lane raises the header's "seen" flag; then (only then) look at the lanes
        tl.store(tl.broadcast_to(hdr + HDR_PTR_SEEN, offset.shape), 1, mask=bad)
        if tl.load(hdr + HDR_PTR_SEEN) != 0:
            record_bad_pointer(offset.to(tl.int64), bad, rank, peer, here.to(tl.pointer_type(tl.int64)))
        # failing lanes go to a scratch slot of the caller's header: no memory outside the heaps is
        # touched (selected here, not in the branch above: AMD's compiler takes no pointer out of one)
        out = tl.where(bad, (hdr + HDR_SCRATCH + 4).to(ptr.dtype, bitcast=True), ptr + (there - here) // ELEM)
    else:
        there = tl.load(bases(heap_bases) + peer)
        delta = ((there - here) // (ELEM * _DELTA_ALIGN_ELEMS)) * _DELTA_ALIGN_ELEMS
        out = ptr + delta
    return out


@triton.jit
def record_bad_pointer(offset, bad, rank, peer, hdr):
    """Record the lanes ``bad`` of a pointer check in the header at ``hdr`` (the caller's):
    the first failing lane of the job claims the record (rank, peer, byte ``offset``, program
    id), every failing lane is counted, and the abort word is set."""
    zero = offset * 0
    old = tl.atomic_add(hdr + HDR_PTR_COUNT + zero, 1 + zero, mask=bad, sem="relaxed", scope="sys")
    first = bad & (old == 0)
    tl.store(hdr + HDR_PTR_RANK + zero, rank + zero, mask=first)
    tl.store(hdr + HDR_PTR_PEER + zero, peer + zero, mask=first)
    tl.store(hdr + HDR_PTR_OFFSET + zero, offset, mask=first)
    tl.store(hdr + HDR_PTR_PROGRAM + zero, tl.program_id(0) + zero, mask=first)
    tl.atomic_xchg(hdr + HDR_PTR_FLAG + zero, 1 + zero, mask=first, sem="release", scope="sys")
    tl.atomic_xchg(hdr + HDR_ABORT + zero, zero + ABORT_BY_DEVICE, mask=bad, sem="relaxed", scope="sys")


@triton.jit
def heap_header(rank, heap_bases):
    """An int64 pointer to the header of ``rank``'s heap."""
    return tl.load(bases(heap_bases) + rank).to(tl.pointer_type(tl.int64))


@triton.jit
def _sink(rank, heap_bases):
    """The caller's header slot that masked-off lanes of NVSHMEM calls read and write."""
    return heap_header(rank, heap_bases) + HDR_SINK


@triton.jit
def hinted(ptr, heap_bases, hint: tl.constexpr = None):
    """``ptr`` with the vectorization ``hint`` applied (``tl.multiple_of`` and
    ``tl.max_contiguous``, an int or a tuple per dimension); ``ptr`` itself for ``None`` — and
    with pointer checks (:func:`check_pointers`), whose translation may send lanes to a scratch slot: the block
    is no longer contiguous there."""
    if hint is not None and not check_pointers(heap_bases):
        ptr = tl.max_contiguous(tl.multiple_of(ptr, hint), hint)
    return ptr


@triton.jit
def _load(ptrs, mask, other, cache_modifier: tl.constexpr, volatile: tl.constexpr):
    """``tl.load``; a volatile load carries no cache modifier (see the module docstring)."""
    if volatile:
        value = tl.load(ptrs, mask=mask, other=other, volatile=True)
    else:
        value = tl.load(ptrs, mask=mask, other=other, cache_modifier=cache_modifier)
    return value


@triton.jit
def load(ptr, rank, peer, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = _NO_MODIFIER,
         volatile: tl.constexpr = False, hint: tl.constexpr = None):
    """Load from ``peer``'s heap at ``ptr``'s offset; ``mask``/``other``/``cache_modifier``/
    ``volatile`` as in ``tl.load``."""
    if nvshmem_calls(heap_bases):
        return _nvd.load(ptr, hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint), rank, peer,
                         bases(heap_bases), _sink(rank, heap_bases), mask, other, cache_modifier, volatile,
                         nvshmem_calls(heap_bases), _load)
    return _load(hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint), mask, other, cache_modifier, volatile)


@triton.jit
def store(ptr, value, rank, peer, heap_bases, mask=None, cache_modifier: tl.constexpr = _NO_MODIFIER,
          hint: tl.constexpr = None):
    """Store ``value`` into ``peer``'s heap at ``ptr``'s offset; ``mask`` as in ``tl.store``."""
    if nvshmem_calls(heap_bases):
        _nvd.store(ptr, value, hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint), rank, peer,
                   bases(heap_bases), _sink(rank, heap_bases), mask, cache_modifier, nvshmem_calls(heap_bases))
        return
    tl.store(hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint), value, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def get(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = _NO_MODIFIER, store_cache_modifier: tl.constexpr = _NO_MODIFIER,
        hint: tl.constexpr = None):
    """Copy ``peer``'s data at ``src_ptr``'s offset into the caller's memory at ``dst_ptr``.

    ``dst_ptr`` may be any local pointer (it need not be on the heap).
    """
    if nvshmem_calls(heap_bases):
        value = load(src_ptr, rank, peer, heap_bases, mask=mask, other=other, cache_modifier=load_cache_modifier,
                     hint=hint)
    else:
        value = tl.load(hinted(translate(src_ptr, rank, peer, heap_bases, mask), heap_bases, hint), mask=mask, other=other,
                        cache_modifier=load_cache_modifier)
    tl.store(dst_ptr, value, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = _NO_MODIFIER, store_cache_modifier: tl.constexpr = _NO_MODIFIER,
        hint: tl.constexpr = None):
    """Copy the caller's data at ``src_ptr`` into ``peer``'s heap at ``dst_ptr``'s offset.

    ``src_ptr`` may be any local pointer (it need not be on the heap).
    """
    value = tl.load(src_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    if nvshmem_calls(heap_bases):
        store(dst_ptr, value, rank, peer, heap_bases, mask=mask, cache_modifier=store_cache_modifier, hint=hint)
    else:
        tl.store(hinted(translate(dst_ptr, rank, peer, heap_bases, mask), heap_bases, hint), value, mask=mask,
                 cache_modifier=store_cache_modifier)


@triton.jit
def copy(src_ptr, dst_ptr, rank, src_rank, dst_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = _NO_MODIFIER, store_cache_modifier: tl.constexpr = _NO_MODIFIER,
         hint: tl.constexpr = None):
    """Copy from ``src_rank``'s heap at ``src_ptr``'s offset to ``dst_rank``'s heap at
    ``dst_ptr``'s offset; the caller (``rank``) may be either of them or a third rank."""
    if nvshmem_calls(heap_bases):
        value = load(src_ptr, rank, src_rank, heap_bases, mask=mask, other=other, cache_modifier=load_cache_modifier,
                     hint=hint)
        store(dst_ptr, value, rank, dst_rank, heap_bases, mask=mask, cache_modifier=store_cache_modifier, hint=hint)
        return
    value = tl.load(hinted(translate(src_ptr, rank, src_rank, heap_bases, mask), heap_bases, hint), mask=mask, other=other,
                    cache_modifier=load_cache_modifier)
    tl.store(hinted(translate(dst_ptr, rank, dst_rank, heap_bases, mask), heap_bases, hint), value, mask=mask,
             cache_modifier=store_cache_modifier)


# ---- atomics ------------------------------------------------------------------------------


@triton.jit
def _xchg(target, val, mask, sem: tl.constexpr, scope: tl.constexpr):
    """``tl.atomic_xchg``; 32/64-bit floats are exchanged as integers of the same width (an
    exchange only moves bits, and Triton's interpreter has no float exchange)."""
    ELEM: tl.constexpr = target.dtype.element_ty
    if ELEM.is_floating():
        if ELEM.primitive_bitwidth == 64:
            bits = tl.atomic_xchg(target.to(tl.pointer_type(tl.int64), bitcast=True),
                                  tl.cast(val, ELEM).to(tl.int64, bitcast=True), mask=mask, sem=sem, scope=scope)
        else:
            bits = tl.atomic_xchg(target.to(tl.pointer_type(tl.int32), bitcast=True),
                                  tl.cast(val, ELEM).to(tl.int32, bitcast=True), mask=mask, sem=sem, scope=scope)
        old = bits.to(ELEM, bitcast=True)
    else:
        old = tl.atomic_xchg(target, val, mask=mask, sem=sem, scope=scope)
    return old


@triton.jit
def _local_atomic(OP: tl.constexpr, target, val, cmp, mask, sem: tl.constexpr, scope: tl.constexpr):
    """Triton's atomic ``OP`` (add, cas, xchg, and, or, xor, min, max; ``fetch``: a flag poll)
    on the translated ``target``; returns the old value."""
    if OP == "fetch":
        old = tl.atomic_add(target, 0, sem=sem, scope=scope)
    elif OP == "add":
        old = tl.atomic_add(target, val, mask=mask, sem=sem, scope=scope)
    elif OP == "cas":
        old = tl.atomic_cas(target, cmp, val, sem=sem, scope=scope)
    elif OP == "xchg":
        old = _xchg(target, val, mask, sem, scope)
    elif OP == "and":
        old = tl.atomic_and(target, val, mask=mask, sem=sem, scope=scope)
    elif OP == "or":
        old = tl.atomic_or(target, val, mask=mask, sem=sem, scope=scope)
    elif OP == "xor":
        old = tl.atomic_xor(target, val, mask=mask, sem=sem, scope=scope)
    elif OP == "min":
        old = tl.atomic_min(target, val, mask=mask, sem=sem, scope=scope)
    else:
        tl.static_assert(OP == "max", "unknown atomic operation")
        old = tl.atomic_max(target, val, mask=mask, sem=sem, scope=scope)
    return old


@triton.jit
def _atomic(OP: tl.constexpr, ptr, target, val, cmp, rank, peer, heap_bases, mask, sem: tl.constexpr,
            scope: tl.constexpr):
    """The one implementation of every atomic of this module (and of the flag polls and
    signals): ``target`` is ``ptr`` translated into ``peer``'s heap. With NVSHMEM calls on
    (:func:`nvshmem_calls`), the NVSHMEM seam (:func:`iris_fw.nvshmem_device.atomic`) reaches the peers it serves by call
    and the others through :func:`_local_atomic`; otherwise Triton's atomic on ``target``."""
    if nvshmem_calls(heap_bases):
        old = _nvd.atomic(OP, ptr, val, cmp, target, rank, peer, bases(heap_bases), mask, sem, scope,
                          nvshmem_calls(heap_bases), _local_atomic)
    else:
        old = _local_atomic(OP, target, val, cmp, mask, sem, scope)
    return old


@triton.jit
def atomic_add(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomically add ``val`` at ``ptr``'s offset in ``peer``'s heap; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("add", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_sub(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomically subtract ``val``; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("add", ptr, target, -val, -val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_cas(ptr, cmp, val, rank, peer, heap_bases, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomically store ``val`` where the value equals ``cmp``; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases), heap_bases, hint)
    return _atomic("cas", ptr, target, val, cmp, rank, peer, heap_bases, None, sem, scope)


@triton.jit
def atomic_xchg(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomically exchange with ``val``; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("xchg", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_and(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomic bitwise and; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("and", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_or(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
              hint: tl.constexpr = None):
    """Atomic bitwise or; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("or", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_xor(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomic bitwise xor; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("xor", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_min(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomic minimum; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("min", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_max(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = _ACQ_REL, scope: tl.constexpr = _SYS,
               hint: tl.constexpr = None):
    """Atomic maximum; returns the old value."""
    target = hinted(translate(ptr, rank, peer, heap_bases, mask), heap_bases, hint)
    return _atomic("max", ptr, target, val, val, rank, peer, heap_bases, mask, sem, scope)


# ---- signalling ---------------------------------------------------------------------------


@triton.jit
def signal(flag_ptr, value, rank, peer, heap_bases, op: tl.constexpr = _SET, sem: tl.constexpr = _RELEASE, scope: tl.constexpr = _SYS):
    """Set (``op="set"``) or add to (``op="add"``) a scalar flag in ``peer``'s heap with release
    order: every store the calling program made before is visible to whoever acquires the
    flag. Returns the flag's old value."""
    tl.static_assert(op == "set" or op == "add", "signal: op must be 'set' or 'add'")
    # All threads of the program reach this point before one of them releases.
    tl.debug_barrier()
    target = translate(flag_ptr, rank, peer, heap_bases)
    OP: tl.constexpr = "xchg" if op == "set" else "add"
    return _atomic(OP, flag_ptr, target, value, value, rank, peer, heap_bases, None, sem, scope)


@triton.jit
def _compare(seen, value, cmp: tl.constexpr):
    if cmp == "==":
        res = seen == value
    elif cmp == "!=":
        res = seen != value
    elif cmp == ">=":
        res = seen >= value
    elif cmp == ">":
        res = seen > value
    elif cmp == "<=":
        res = seen <= value
    else:
        res = seen < value
    return res.to(tl.int32)


@triton.jit
def _cmp_code(cmp: tl.constexpr):
    if cmp == "==":
        code: tl.constexpr = 0
    elif cmp == "!=":
        code: tl.constexpr = 1
    elif cmp == ">=":
        code: tl.constexpr = 2
    elif cmp == ">":
        code: tl.constexpr = 3
    elif cmp == "<=":
        code: tl.constexpr = 4
    else:
        code: tl.constexpr = 5
    return code


@triton.jit
def record_timeout(flag_ptr, cmp: tl.constexpr, value, seen, spins, rank, peer, heap_bases):
    """Write what a timed-out wait waited for into the caller's header (first writer wins):
    the flag at ``flag_ptr`` (an address in ``rank``'s heap; ``peer``'s copy was polled) did not
    satisfy ``cmp value`` after ``spins`` polls, its last value ``seen``; then set the abort
    word, so every other wait of this rank gives up at once (the host's watchdog passes it on to
    every peer). For waits written outside this module (e.g. :func:`iris_fw.tilecomm.lamport_wait`)."""
    hdr = heap_header(rank, heap_bases)
    tl.atomic_add(hdr + HDR_ERR_COUNT, 1, sem="relaxed", scope="sys")
    claimed = tl.atomic_cas(hdr + HDR_ERR_FLAG, tl.cast(0, tl.int64), tl.cast(-1, tl.int64), sem="acq_rel", scope="sys")
    if claimed == 0:
        offset = flag_ptr.to(tl.int64) - tl.load(bases(heap_bases) + rank)
        tl.store(hdr + HDR_ERR_RANK, rank)
        tl.store(hdr + HDR_ERR_PEER, peer)
        tl.store(hdr + HDR_ERR_OFFSET, offset)
        tl.store(hdr + HDR_ERR_EXPECTED, value)
        tl.store(hdr + HDR_ERR_SEEN, seen)
        tl.store(hdr + HDR_ERR_CMP, _cmp_code(cmp))
        tl.store(hdr + HDR_ERR_SPINS, spins)
        tl.atomic_xchg(hdr + HDR_ERR_FLAG, 1, sem="release", scope="sys")
    tl.atomic_xchg(hdr + HDR_ABORT, ABORT_BY_DEVICE, sem="relaxed", scope="sys")


@triton.jit
def aborted(rank, heap_bases):
    """1 if the abort word of ``rank``'s header is set (a wait timed out or a pointer failed its
    check on some rank, a rank was lost, or a host failed inside a call), else 0. Long loops
    that wait by other means than :func:`wait_until` poll it to give up with the others."""
    return (tl.load(heap_header(rank, heap_bases) + HDR_ABORT, volatile=True) != 0).to(tl.int32)


@triton.jit
def gave_up(rank, heap_bases):
    """Count a wait of ``rank`` that gave up because the abort word was set (the host then
    raises the first cause)."""
    tl.atomic_add(heap_header(rank, heap_bases) + HDR_GAVE_UP, 1, sem="relaxed", scope="sys")


@triton.jit
def _poll(flag_ptr, target, rank, peer, heap_bases, sem: tl.constexpr, scope: tl.constexpr):
    """One read of the flag a wait polls (``target``: ``flag_ptr`` translated into ``peer``'s heap)."""
    return _atomic("fetch", flag_ptr, target, 0, 0, rank, peer, heap_bases, None, sem, scope)


@triton.jit
def wait_until(flag_ptr, cmp: tl.constexpr, value, rank, peer, heap_bases, sem: tl.constexpr = _ACQUIRE, scope: tl.constexpr = _SYS):
    """Poll the scalar flag at ``flag_ptr``'s offset in ``peer``'s heap until ``flag cmp value``
    holds (``cmp`` one of ``==, !=, >=, >, <=, <``), with acquire order.

    The wait is bounded: after the header's ``HDR_WAIT_BOUND`` polls it records rank, peer,
    flag offset, expected and last seen value in the caller's header, sets the abort word and
    gives up; the host raises :class:`iris_fw.WaitTimeout` from that on every rank. It also
    gives up, without a record of its own, as soon as it sees the abort word set (read every
    :data:`ABORT_POLL_EVERY` polls while it spins): one lost peer costs one wait bound per job,
    not one per wait. Returns 1 if the condition held, else 0.
    """
    tl.static_assert(
        cmp == "==" or cmp == "!=" or cmp == ">=" or cmp == ">" or cmp == "<=" or cmp == "<",
        "wait_until: cmp must be one of ==, !=, >=, >, <=, <",
    )
    target = translate(flag_ptr, rank, peer, heap_bases)
    hdr = heap_header(rank, heap_bases)
    bound = tl.load(hdr + HDR_WAIT_BOUND)
    seen = _poll(flag_ptr, target, rank, peer, heap_bases, sem, scope)
    done = _compare(seen, value, cmp)
    spins = bound * 0
    stop = done * 0
    while (done == 0) & (spins < bound) & (stop == 0):
        if spins % ABORT_POLL_EVERY == 0:
            stop = (tl.load(hdr + HDR_ABORT, volatile=True) != 0).to(tl.int32)
        seen = _poll(flag_ptr, target, rank, peer, heap_bases, sem, scope)
        done = _compare(seen, value, cmp)
        spins += 1
    if done == 0:
        if stop == 0:
            record_timeout(flag_ptr, cmp, value, seen, spins, rank, peer, heap_bases)
        else:
            gave_up(rank, heap_bases)
    # The rest of the program reads only after the acquiring thread saw the flag.
    tl.debug_barrier()
    return done


@triton.jit
def barrier(rank, world_size, heap_bases):
    """Cross-rank barrier. Call it from exactly one program per rank (a grid of one, or
    under ``if tl.program_id(0) == 0`` after the kernel's other programs are done).

    Each call advances this rank's epoch (kept in its heap header, so the barrier needs no
    host arguments and can be captured in a CUDA graph), writes it into its slot in every
    peer's header with release order, and waits, bounded, until every peer's slot in its own
    header has reached it. Returns 1 if every peer arrived, else 0.
    """
    hdr = heap_header(rank, heap_bases)
    epoch = tl.load(hdr + HDR_BARRIER_EPOCH) + 1
    tl.debug_barrier()  # every warp has read the epoch before one thread advances it
    tl.store(hdr + HDR_BARRIER_EPOCH, epoch)
    my_slot = hdr + HDR_BARRIER_SLOTS + rank
    for peer in range(0, world_size):
        signal(my_slot, epoch, rank, peer, heap_bases, op="set")
    arrived = 1
    for peer in range(0, world_size):
        arrived = arrived & wait_until(hdr + HDR_BARRIER_SLOTS + peer, ">=", epoch, rank, rank, heap_bases)
    return arrived
