"""Iris's device functions (``iris.load``, ``iris.store``, ``iris.get``, ``iris.put``,
``iris.copy``, ``iris.atomic_*``) with Iris's argument orders, mapped onto
:mod:`iris_fw.device`.

Which rank is which follows Iris's code (its docstrings say otherwise for ``get``):

* ``load(pointer, to_rank, from_rank, …)`` — the caller is ``to_rank``; reads ``from_rank``.
* ``store(pointer, value, from_rank, to_rank, …)`` — the caller is ``from_rank``.
* ``get(from_ptr, to_ptr, from_rank, to_rank, …)`` — ``from_ptr`` is translated from
  ``from_rank``'s address space into ``to_rank``'s and read *there*; the value is stored at the
  local ``to_ptr``. The caller is ``from_rank``: ``get(ptr, out, cur_rank, peer)`` reads ``peer``
  (as Iris's own tests call it).
* ``put(from_ptr, to_ptr, from_rank, to_rank, …)`` — the caller is ``from_rank``.
* ``copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, …)`` — pointers are ``cur_rank``'s
  addresses; reads ``from_rank``, writes ``to_rank`` (any caller, as in Iris's code).
* ``atomic_*(pointer, val, from_rank, to_rank, …)`` — the caller is ``from_rank``.

``sem=None``/``scope=None`` are Triton's defaults (``acq_rel``, ``gpu``), passed through
unchanged: a flag read by another GPU needs ``scope="sys"``. The SDMA copy-engine options of
Iris's ``put``/``atomic_add``/``atomic_cas`` (``use_copy_engine=True``) drive AMD's DMA engines
and are refused at compile time.
"""

import triton
import triton.language as tl

from iris_fw import device as _dv

_NO_COPY_ENGINE = "use_copy_engine=True drives AMD's SDMA copy engines, which iris-fw does not provide"


@triton.jit
def load(pointer, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = None,
         volatile: tl.constexpr = False, hint: tl.constexpr = None):
    """Read ``from_rank``'s data at ``pointer``'s offset; the caller is ``to_rank``."""
    return _dv.load(pointer, to_rank, from_rank, heap_bases, mask=mask, other=other,
                    cache_modifier=cache_modifier, volatile=volatile, hint=hint)


@triton.jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None, hint: tl.constexpr = None,
          cache_modifier: tl.constexpr = None):
    """Write ``value`` into ``to_rank``'s heap at ``pointer``'s offset; the caller is ``from_rank``."""
    _dv.store(pointer, value, from_rank, to_rank, heap_bases, mask=mask, cache_modifier=cache_modifier, hint=hint)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
        hint: tl.constexpr = None):
    """Read ``to_rank``'s data at ``from_ptr``'s offset (``from_ptr`` in ``from_rank``'s, the
    caller's, space) into the local ``to_ptr``."""
    _dv.get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=mask, other=other,
            load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier, hint=hint)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
        hint: tl.constexpr = None, copy_engine_ctx=None, from_row_stride: tl.constexpr = 0,
        to_row_stride: tl.constexpr = 0, use_copy_engine: tl.constexpr = False,
        contiguous_copy: tl.constexpr = False, from_base_ptr=None, to_base_ptr=None):
    """Copy the caller's (``from_rank``) data at ``from_ptr`` into ``to_rank``'s heap at
    ``to_ptr``'s offset."""
    tl.static_assert(not use_copy_engine, _NO_COPY_ENGINE)
    _dv.put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=mask, other=other,
            load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier, hint=hint)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
         hint: tl.constexpr = None):
    """Copy from ``from_rank``'s heap to ``to_rank``'s; pointers are ``cur_rank``'s addresses."""
    _dv.copy(src_ptr, dst_ptr, cur_rank, from_rank, to_rank, heap_bases, mask=mask, other=other,
             load_cache_modifier=load_cache_modifier, store_cache_modifier=store_cache_modifier,
             hint=hint)


@triton.jit
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None, copy_engine_ctx=None,
               use_copy_engine: tl.constexpr = False):
    tl.static_assert(not use_copy_engine, _NO_COPY_ENGINE)
    return _dv.atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None, copy_engine_ctx=None,
               use_copy_engine: tl.constexpr = False):
    tl.static_assert(not use_copy_engine, _NO_COPY_ENGINE)
    return _dv.atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
                scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
              scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)


@triton.jit
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _dv.atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope, hint=hint)
