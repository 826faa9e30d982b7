"""Fused collectives of :mod:`iris_fw.ccl`: an all-reduce and the elementwise op that follows it
in one kernel.

* ``all_reduce_rmsnorm(x, residual, weight, eps=1e-6, *, group=None, algorithm="auto",
  out=None, ctx=None) -> (out, residual)`` — a tensor-parallel layer's all-reduce, residual add
  and RMSNorm; algorithms ``"lamport"`` and ``"one_shot"`` (``iris_fw.collectives.all_reduce_rmsnorm``).
* ``all_reduce_rmsnorm_reference(...)`` — the same in torch (``torch.distributed`` or given
  per-rank inputs), for tests and as the unfused baseline.

Calls go through :mod:`iris_fw.ccl.api`'s path: a cheap key, the group's cache of prepared
calls, validation across the group's members on a miss, an algorithm chosen from the data
table, and one kernel launch per call on a hit (CUDA-graph capturable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ArgumentError, ArgumentTypeError
from . import algorithm as al
from .api import GroupLike, _call, _check_tensor, _ctx, _fast_ok, _prepare

if TYPE_CHECKING:
    from ..context import Context

COLLECTIVE = "all_reduce_rmsnorm"
#: dtypes of ``x`` / ``out``; ``residual`` has x's dtype or fp32, ``weight`` any of these.
NORM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class NormCall(al.Call):
    """An all-reduce + RMSNorm call: ``numel = T * hidden`` elements of ``[T, hidden]`` rows."""

    hidden: int = 0
    eps: float = 1e-6


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def _aliasing(x, residual, weight, out) -> tuple[bool, ...]:
    """Which arguments share memory: ``(out is x exactly, out overlaps x, residual overlaps x,
    residual overlaps out, weight overlaps residual or out)`` (part of the call's key)."""
    same = out.data_ptr() == x.data_ptr() and out.shape == x.shape and out.dtype == x.dtype
    return (same, _overlap(out, x), _overlap(residual, x), _overlap(residual, out),
            _overlap(weight, residual) or _overlap(weight, out))


def _check_norm_args(ctx, x, residual, weight, out, eps) -> tuple[int, int]:
    """Validate the arguments locally; returns ``(T, hidden)``."""
    for t, name in ((x, "x"), (residual, "residual"), (weight, "weight"), (out, "out")):
        _check_tensor(ctx, t, name)
    if x.dtype not in NORM_DTYPES:
        raise ArgumentTypeError(f"x has dtype {x.dtype}; all_reduce_rmsnorm supports {', '.join(map(str, NORM_DTYPES))}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ArgumentError(f"x must be [T, H] (or [..., H]) with H >= 1, got shape {list(x.shape)}")
    hidden = x.shape[-1]
    if tuple(residual.shape) != tuple(x.shape):
        raise ArgumentError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if residual.dtype not in (x.dtype, torch.float32):
        raise ArgumentTypeError(f"residual must have x's dtype {x.dtype} or torch.float32, got {residual.dtype}")
    if tuple(weight.shape) != (hidden,):
        raise ArgumentError(f"weight must have shape [H] = [{hidden}], got {list(weight.shape)}")
    if weight.dtype not in NORM_DTYPES:
        raise ArgumentTypeError(f"weight has dtype {weight.dtype}; supported: {', '.join(map(str, NORM_DTYPES))}")
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        raise ArgumentError(f"out must have x's shape {list(x.shape)} and dtype {x.dtype}, got "
                            f"{list(out.shape)} {out.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ArgumentError(f"eps must be a finite number >= 0, got {eps!r}")
    same, out_x, res_x, res_out, weight_alias = _aliasing(x, residual, weight, out)
    if res_x:
        raise ArgumentError("residual must not share memory with x")
    if res_out:
        raise ArgumentError("out must not share memory with residual")
    if out_x and not same:
        raise ArgumentError("out must be x itself or not share memory with it")
    if weight_alias:
        raise ArgumentError("weight must not share memory with residual or out")
    return x.numel() // hidden, hidden


def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                       group: GroupLike = None, algorithm: str = "auto", out: torch.Tensor | None = None,
                       ctx: Context | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused all-reduce + residual add + RMSNorm over the group, in one kernel per call. Returns
    the tuple ``(out, residual)`` (``residual`` is also updated in place)::

        h = all_reduce(x) + residual;  residual[:] = h
        out = h * rsqrt(mean(h ** 2, -1) + eps) * weight

    ``x``: ``[T, H]`` (or ``[..., H]``; rows are the leading dims) this rank's partial sums, fp32 /
    bf16 / fp16; ``residual``: like ``x`` (its dtype or fp32), updated in place to ``h``;
    ``weight``: ``[H]``; ``out``: like ``x`` (default a new tensor; may be ``x`` itself, else
    ``x`` is not modified). Sums and the norm are computed in fp32 and stored in the tensors'
    dtypes. Every rank gets bitwise the same ``out`` and ``residual`` when their ``residual``
    and ``weight`` are the same (as in tensor parallelism). ``algorithm``: ``"auto"``,
    ``"lamport"`` or ``"one_shot"``. Mismatched shapes, dtypes or
    ``eps`` across ranks, or a rank's bad argument, raise on every rank."""
    ctx = _ctx(ctx)
    if out is None and isinstance(x, torch.Tensor):
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    fast = _fast_ok(ctx, x, residual) and _fast_ok(ctx, weight, out)
    key = ((COLLECTIVE, x.dtype, x.shape, residual.dtype, weight.dtype, weight.shape, out.dtype, out.shape,
            residual.shape, _aliasing(x, residual, weight, out), eps, algorithm) if fast else None)

    def prepare(g):
        def check():
            tokens, hidden = _check_norm_args(ctx, x, residual, weight, out, eps)
            fields = {"dtype": x.dtype, "tokens": tokens, "hidden": hidden, "residual dtype": residual.dtype,
                      "weight dtype": weight.dtype, "eps": float(eps)}
            call = NormCall(COLLECTIVE, x.dtype, tokens * hidden, g.size, op="sum", hidden=hidden, eps=float(eps))
            return fields, call, None

        return _prepare(g, f"iris_fw.ccl.{COLLECTIVE}", check, algorithm)

    _call(ctx, group, key, prepare, (x, weight), (out, residual), False)
    return out, residual


def all_reduce_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                                 xs: list[torch.Tensor] | None = None, group: Any = None,
                                 dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`all_reduce_rmsnorm` computes, in torch: returns ``(out, h)`` in ``dtype``
    (default float64) and leaves the arguments alone. The all-reduce sums ``xs`` (every rank's
    ``x``, in rank order) when given, else runs ``torch.distributed.all_reduce`` over ``group``
    on a copy of ``x`` (the unfused baseline)."""
    if xs is not None:
        total = torch.stack([t.to(dtype) for t in xs]).sum(0)
    else:
        import torch.distributed as dist

        total = x.clone()
        dist.all_reduce(total, group=group)
        total = total.to(dtype)
    h = total + residual.to(dtype)
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h * rstd * weight.to(dtype), h
