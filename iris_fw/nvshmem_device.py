"""NVSHMEM device calls behind the primitives of :mod:`iris_fw.device` (the device-backend seam).

A leaf module: it imports Triton and nothing from iris-fw. :mod:`iris_fw.device` calls these
functions only where the call mode (``heap_bases.NVSHMEM_CALLS``, a constexpr field of
:class:`iris_fw.device.DeviceHeaps`) is non-zero, so kernels compiled without NVSHMEM (the
default, and the ``nvshmem`` transport within one node) are unchanged. It receives the mode as
``MODE`` and the bare int64 heap-base pointer as ``heap_bases``:

* ``NVSHMEM_CALLS == 1`` (``REMOTE``): a peer whose heap base is 0 (``nvshmem_ptr`` gave no
  mapping: another node) is reached through NVSHMEM calls, every other peer by load/store
  (a run-time branch per access);
* ``NVSHMEM_CALLS == 2`` (``ALL``): every peer through NVSHMEM calls, the caller itself included
  (exercises the call path on one node).

The calls come from NVSHMEM's device bitcode (``libnvshmem_device*.bc``), linked into kernels and
initialised per loaded module by :mod:`iris_fw.transports.nvshmem.library`; the symbols are the standard typed RMA
and AMO entry points (``nvshmem_uint32_g``, ``nvshmem_uint64_atomic_fetch_add``, …). Every pointer
passed is the caller's own symmetric address: NVSHMEM translates it for the target PE itself
(the PE is the rank).

How Triton's execution model is mapped onto thread-level NVSHMEM calls:

* **Loads and stores** (``g``/``p``) run element-wise in every thread that holds an element. Where
  Triton replicates a block across threads, replicas read or write the same value twice,
  which is harmless. Masked-off lanes of a store write into a sink slot of the *caller's* heap
  header (an NVSHMEM call has no mask); masked-off lanes of a load read it and take ``other``.
* **Atomics and signals** must happen once per element, and Triton may replicate an element
  across threads. So thread 0 of the program performs them, one element at a time, and its
  result is shared with every thread through a reduction (:func:`_from_thread0`). A block of
  ``N`` elements costs ``N`` serial remote atomics: meant for flags and counters, not bulk data.
* **Ordering.** ``sem`` with release: every thread completes its outstanding NVSHMEM operations
  (``nvshmem_quiet``) and the program meets at a barrier before the atomic. With acquire: the
  acting thread fences (``fence.acq_rel.sys``) after it, and the result is shared through
  the reduction's barrier. ``scope`` does not apply (NVSHMEM operations are system-wide).
* Atomics need 32- or 64-bit elements; ``min``/``max`` and float ``add`` are compare-and-swap
  loops (NVSHMEM has no such atomics); everything else maps to one NVSHMEM atomic.
"""

import triton
import triton.language as tl
from triton.language import core

#: Values of ``iris_fw.device.DeviceHeaps.NVSHMEM_CALLS``.
OFF = tl.constexpr(0)
REMOTE = tl.constexpr(1)
ALL = tl.constexpr(2)

#: Elements of the block through which thread 0's value reaches every thread: at least the
#: threads of the largest program (32 warps), so no element is replicated across threads.
_SHARE_LANES = tl.constexpr(1024)

_RELEASING = ("release", "acq_rel")
_ACQUIRING = ("acquire", "acq_rel")


# ---- the NVSHMEM entry points (element-wise extern calls) ----------------------------------------
# Addresses travel as int64 and PEs as int32; values as unsigned integers of their width (the
# typed RMA/AMO calls only move bits). One builtin per entry point whose argument types do not
# tell the width apart.


def _call(name, args, types, ret, _semantic):
    return core.extern_elementwise("", "", args, {types: (name, ret)}, is_pure=False, _semantic=_semantic)


_UINT = {8: core.uint8, 16: core.uint16, 32: core.uint32, 64: core.uint64}


@core.extern
def _g(BITS, addr, pe, _semantic=None):
    """``nvshmem_uint<BITS>_g(addr, pe)``: ``pe``'s value at the symmetric ``addr``."""
    bits = core._unwrap_if_constexpr(BITS)
    return _call(f"nvshmem_uint{bits}_g", [addr, pe], (core.int64, core.int32), _UINT[bits], _semantic)


@core.extern
def _fetch(BITS, addr, pe, _semantic=None):
    """``nvshmem_uint<BITS>_atomic_fetch(addr, pe)`` (32 or 64 bits)."""
    bits = core._unwrap_if_constexpr(BITS)
    return _call(f"nvshmem_uint{bits}_atomic_fetch", [addr, pe], (core.int64, core.int32), _UINT[bits], _semantic)


@core.extern
def _p(addr, bits, pe, _semantic=None):
    """``nvshmem_uintN_p(addr, bits, pe)``; returns a dummy int32 (the call returns nothing)."""
    table = {(core.int64, ty, core.int32): (f"nvshmem_uint{w}_p", core.int32) for w, ty in _UINT.items()}
    return core.extern_elementwise("", "", [addr, bits, pe], table, is_pure=False, _semantic=_semantic)


def _amo_table(name, n_values):
    table = {}
    for bits in (32, 64):
        table[(core.int64,) + (_UINT[bits],) * n_values + (core.int32,)] = (f"nvshmem_uint{bits}_atomic_{name}",
                                                                             _UINT[bits])
    return table


@core.extern
def _amo(OP, addr, bits, pe, _semantic=None):
    """``nvshmem_uintN_atomic_<OP>(addr, bits, pe)`` for OP in fetch_add, swap, fetch_and,
    fetch_or, fetch_xor; returns the old bits."""
    op = core._unwrap_if_constexpr(OP)
    return core.extern_elementwise("", "", [addr, bits, pe], _amo_table(op, 1), is_pure=False, _semantic=_semantic)


@core.extern
def _cswap(addr, cmp, bits, pe, _semantic=None):
    """``nvshmem_uintN_atomic_compare_swap(addr, cmp, bits, pe)``; returns the old bits."""
    return core.extern_elementwise("", "", [addr, cmp, bits, pe], _amo_table("compare_swap", 2), is_pure=False,
                                   _semantic=_semantic)


@core.extern
def _quiet(_semantic=None):
    """``nvshmem_quiet()`` in every thread: this thread's NVSHMEM operations are complete."""
    return _call("nvshmem_quiet", [], (), core.int32, _semantic)


@core.extern
def _thread_index(_semantic=None):
    return core.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=core.int32, is_pure=True, pack=1,
                                       _semantic=_semantic)


@core.extern
def _holder_index(lanes, _semantic=None):
    """For each element of the int32 block ``lanes``, the index of the thread holding it: a
    genuine block (the compiler cannot fold what follows into one scalar)."""
    return core.inline_asm_elementwise("mov.u32 $0, %tid.x; // $1", "=r,r", [lanes], dtype=core.int32, is_pure=True,
                                       pack=1, _semantic=_semantic)


@core.extern
def _fence_acquire(_semantic=None):
    return core.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=core.int32,
                                       is_pure=False, pack=1, _semantic=_semantic)


# ---- helpers ---------------------------------------------------------------------------------------


@triton.jit
def _as_int(x, SIGNED: tl.constexpr):
    """``x`` bit cast to the (signed or unsigned) integer type of its width."""
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    if BITS == 8:
        out = x.to(tl.int8 if SIGNED else tl.uint8, bitcast=True)
    elif BITS == 16:
        out = x.to(tl.int16 if SIGNED else tl.uint16, bitcast=True)
    elif BITS == 32:
        out = x.to(tl.int32 if SIGNED else tl.uint32, bitcast=True)
    else:
        out = x.to(tl.int64 if SIGNED else tl.uint64, bitcast=True)
    return out


@triton.jit
def _signed(x):
    return _as_int(x, True)


@triton.jit
def _unsigned(x):
    return _as_int(x, False)


@triton.jit
def _from_thread0(x):
    """The scalar ``x`` as thread 0 computed it, in every thread of the program.

    Thread 0 contributes ``x`` to a block of ``_SHARE_LANES`` elements, every other thread the
    smallest value of the type; the block's maximum is thread 0's value (a reduction combines
    elements across threads; with at least as many elements as threads none is replicated)."""
    bits = _signed(x)
    LOWEST: tl.constexpr = -(1 << (bits.dtype.primitive_bitwidth - 1))
    holder = _holder_index(tl.arange(0, _SHARE_LANES))
    lanes = tl.where(holder == 0, bits, tl.full([_SHARE_LANES], LOWEST, bits.dtype))
    return tl.max(lanes, axis=0).to(x.dtype, bitcast=True)


@triton.jit
def by_call(peer, heap_bases, MODE: tl.constexpr):
    """Whether an access to ``peer`` goes through NVSHMEM calls (1) or load/store (0): always
    under ``ALL``; under ``REMOTE`` where ``peer``'s heap base is 0 (not mapped here)."""
    if MODE == ALL:
        out = tl.full([], 1, tl.int1)
    else:
        out = tl.load(heap_bases + peer) == 0
    return out


# ---- RMA --------------------------------------------------------------------------------------------


@triton.jit
def _route(ptr, rank, peer, sink, mask):
    """The int64 addresses and PEs of an element-wise call on ``ptr`` for ``peer``: masked-off
    lanes go to ``sink`` on the caller (``rank``)."""
    BITS: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth
    tl.static_assert(BITS == 8 or BITS == 16 or BITS == 32 or BITS == 64,
                     "NVSHMEM calls move 8-, 16-, 32- or 64-bit elements")
    addr = ptr.to(tl.int64)
    pe = tl.cast(peer, tl.int32)  # (rank and peer may be constexpr ints)
    if mask is not None:
        addr = tl.where(mask, addr, sink.to(tl.int64))
        pe = tl.where(mask, pe, tl.cast(rank, tl.int32))
    return addr, pe


@triton.jit
def get_value(ptr, rank, peer, sink, mask, other):
    """``peer``'s element(s) at the caller's symmetric address ``ptr`` (``nvshmem_uintN_g``).
    Masked-off lanes read ``sink`` (a symmetric int64 slot of the caller's heap) from the
    caller and become ``other`` (when given)."""
    ELEM: tl.constexpr = ptr.dtype.element_ty
    addr, pe = _route(ptr, rank, peer, sink, mask)
    value = _g(ELEM.primitive_bitwidth, addr, pe).to(ELEM, bitcast=True)
    if mask is not None:
        if other is not None:
            value = tl.where(mask, value, tl.cast(other, ELEM))
    return value


@triton.jit
def put_value(ptr, value, rank, peer, sink, mask):
    """Write ``value`` at the caller's symmetric address ``ptr`` on ``peer``
    (``nvshmem_uintN_p``); masked-off lanes write into ``sink`` on the caller."""
    ELEM: tl.constexpr = ptr.dtype.element_ty
    addr, pe = _route(ptr, rank, peer, sink, mask)
    bits = _unsigned(tl.cast(value, ELEM))
    if ptr.type.is_block():
        bits = tl.broadcast_to(bits, ptr.shape)
    _p(addr, bits, pe)


@triton.jit
def load(ptr, target, rank, peer, heap_bases, sink, mask, other, cache_modifier: tl.constexpr,
         volatile: tl.constexpr, MODE: tl.constexpr, LOAD: tl.constexpr):
    """:func:`iris_fw.device.load` when ``NVSHMEM_CALLS`` is on; ``target`` is ``ptr``
    translated into ``peer``'s heap, read by ``LOAD`` (:func:`iris_fw.device._load`) where the
    peer is reached by load/store. Cache modifiers, ``volatile`` and vectorization hints apply
    to that path only (an NVSHMEM ``g`` reads the peer's memory at every call)."""
    if MODE == ALL:
        value = get_value(ptr, rank, peer, sink, mask, other)
    else:
        if by_call(peer, heap_bases, MODE):
            value = get_value(ptr, rank, peer, sink, mask, other)
        else:
            value = LOAD(target, mask, other, cache_modifier, volatile)
    return value


@triton.jit
def store(ptr, value, target, rank, peer, heap_bases, sink, mask, cache_modifier: tl.constexpr,
          MODE: tl.constexpr):
    """:func:`iris_fw.device.store` when ``NVSHMEM_CALLS`` is on (see :func:`load`)."""
    if MODE == ALL:
        put_value(ptr, value, rank, peer, sink, mask)
    else:
        if by_call(peer, heap_bases, MODE):
            put_value(ptr, value, rank, peer, sink, mask)
        else:
            tl.store(target, value, mask=mask, cache_modifier=cache_modifier)


# ---- atomics ------------------------------------------------------------------------------------------


@triton.jit
def _apply(OP: tl.constexpr, cur, val, ELEM: tl.constexpr):
    """The new bits of a compare-and-swap loop: ``OP`` (add, min, max) of the element value in
    ``cur`` (bits) and ``val`` (bits), as bits."""
    a = cur.to(ELEM, bitcast=True)
    b = val.to(ELEM, bitcast=True)
    if OP == "add":
        c = a + b
    elif OP == "min":
        c = tl.minimum(a, b)
    else:
        c = tl.maximum(a, b)
    return c.to(cur.dtype, bitcast=True)


@triton.jit
def _atomic_bits(OP: tl.constexpr, addr, val, cmp, pe, ELEM: tl.constexpr):
    """One NVSHMEM atomic on unsigned bits ``val``/``cmp``; returns the old bits. Runs in one
    thread."""
    BITS: tl.constexpr = ELEM.primitive_bitwidth
    if OP == "fetch":
        old = _fetch(BITS, addr, pe)
    elif OP == "cas":
        old = _cswap(addr, cmp, val, pe)
    elif OP == "xchg":
        old = _amo("swap", addr, val, pe)
    elif OP == "and":
        old = _amo("fetch_and", addr, val, pe)
    elif OP == "or":
        old = _amo("fetch_or", addr, val, pe)
    elif OP == "xor":
        old = _amo("fetch_xor", addr, val, pe)
    elif OP == "add" and not ELEM.is_floating():
        old = _amo("fetch_add", addr, val, pe)
    else:  # min, max, float add: compare-and-swap until no other writer intervened
        cur = _fetch(BITS, addr, pe)
        seen = _cswap(addr, cur, _apply(OP, cur, val, ELEM), pe)
        while seen != cur:
            cur = seen
            seen = _cswap(addr, cur, _apply(OP, cur, val, ELEM), pe)
        old = cur
    return old


@triton.jit
def _atomic_once(OP: tl.constexpr, addr, val, cmp, pe, active, ELEM: tl.constexpr, ACQUIRE: tl.constexpr):
    """``OP`` on one element by thread 0 (when ``active``), its old bits in every thread."""
    old = tl.zeros([], dtype=val.dtype)
    if (_thread_index() == 0) & active:
        old = _atomic_bits(OP, addr, val, cmp, pe, ELEM)
        if ACQUIRE:
            _fence_acquire()
    return _from_thread0(old)


@triton.jit
def atomic_value(OP: tl.constexpr, ptr, val, cmp, rank, peer, mask, sem: tl.constexpr):
    """The atomic ``OP`` (add, xchg, cas, and, or, xor, min, max, fetch) at the caller's symmetric
    address(es) ``ptr`` on ``peer`` through NVSHMEM; returns the old value(s) like Triton's
    atomics. ``val``/``cmp`` are scalars or blocks of ``ptr``'s shape; ``mask`` is None, a
    scalar or a block. Elements are serialized (module docstring)."""
    ELEM: tl.constexpr = ptr.dtype.element_ty
    BITS: tl.constexpr = ELEM.primitive_bitwidth
    tl.static_assert(BITS == 32 or BITS == 64, "atomics through NVSHMEM calls need 32- or 64-bit elements")
    if sem == "release" or sem == "acq_rel":
        _quiet()
        tl.debug_barrier()
    ACQUIRE: tl.constexpr = sem == "acquire" or sem == "acq_rel"
    pe = tl.cast(peer, tl.int32)  # (rank and peer may be constexpr ints)
    vbits = _unsigned(tl.cast(val, ELEM))
    cbits = _unsigned(tl.cast(cmp, ELEM))
    if ptr.type.is_block():
        N: tl.constexpr = ptr.numel
        addrs = tl.reshape(ptr.to(tl.int64), [N])
        vals = tl.reshape(_signed(tl.broadcast_to(vbits, ptr.shape)), [N])
        cmps = tl.reshape(_signed(tl.broadcast_to(cbits, ptr.shape)), [N])
        if mask is None:
            acts = tl.full([N], 1, tl.int32)
        else:
            acts = tl.reshape(tl.broadcast_to(mask, ptr.shape).to(tl.int32), [N])
        idx = tl.arange(0, N)
        out = tl.zeros([N], dtype=vals.dtype)
        for i in range(0, N):
            # element i, read out of the block with reductions (correct in any layout)
            sel = idx == i
            a = tl.sum(tl.where(sel, addrs, 0))
            v = _unsigned(tl.sum(tl.where(sel, vals, 0)))
            c = _unsigned(tl.sum(tl.where(sel, cmps, 0)))
            act = tl.max(tl.where(sel, acts, 0)) != 0
            o = _signed(_atomic_once(OP, a, v, c, pe, act, ELEM, ACQUIRE))
            out = tl.where(sel, o, out)
        old = tl.reshape(out, ptr.shape).to(ELEM, bitcast=True)
    else:
        if mask is None:
            act = tl.full([], 1, tl.int1)
        else:
            act = mask != 0
        old = _atomic_once(OP, ptr.to(tl.int64), vbits, cbits, pe, act, ELEM, ACQUIRE).to(ELEM, bitcast=True)
    return old


@triton.jit
def atomic(OP: tl.constexpr, ptr, val, cmp, target, rank, peer, heap_bases, mask, sem: tl.constexpr,
           scope: tl.constexpr, MODE: tl.constexpr, LOCAL: tl.constexpr):
    """The NVSHMEM seam of :mod:`iris_fw.device`'s one atomic (``device._atomic``; its flag
    polls are ``OP="fetch"``) when ``NVSHMEM_CALLS`` is on: NVSHMEM calls for peers reached by
    call, ``LOCAL`` (``device._local_atomic``: Triton's atomic on the translated ``target``) for
    the others."""
    if MODE == ALL:
        old = atomic_value(OP, ptr, val, cmp, rank, peer, mask, sem)
    else:
        if by_call(peer, heap_bases, MODE):
            old = atomic_value(OP, ptr, val, cmp, rank, peer, mask, sem)
        else:
            old = LOCAL(OP, target, val, cmp, mask, sem, scope)
    return old
