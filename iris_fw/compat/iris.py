"""AMD Iris's public API over iris-fw: ``import iris_fw.compat.iris as iris``.

Every name is a thin mapping onto iris-fw's own context (:class:`iris_fw.Context`) and device
primitives (:mod:`iris_fw.device`), with Iris's argument orders and defaults. See
``docs/iris-compat.md`` for the table of names and the few places behaviour differs.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
import triton
import triton.language as tl

import iris_fw
from iris_fw import device as _dv
from iris_fw import devinfo as _devinfo

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR

logger = logging.getLogger("iris")


def set_logger_level(level: int) -> None:
    """Set the level of Iris's logger (``iris.DEBUG``, ``iris.INFO``, …)."""
    logger.setLevel(level)


class Iris:
    """Iris's host object over an :class:`iris_fw.Context` (``ctx``): a new one, or
    ``context=`` an existing one (an iris-fw program can hand its context to Iris code)."""

    def __init__(self, heap_size: int = 1 << 30, *, context: iris_fw.Context | None = None):
        self.ctx = context if context is not None else iris_fw.init(heap_size=heap_size)
        self.cur_rank = self.ctx.rank
        self.num_ranks = self.ctx.world_size
        self.heap_size = self.ctx.heap_size
        self.heap_bases = self.ctx.heap_bases
        self.gpu_id = self.ctx.device.index if self.ctx.device.index is not None else 0
        self.device = str(self.ctx.device)

    # ---- queries -------------------------------------------------------------------------------
    def get_rank(self) -> int:
        return self.cur_rank

    def get_num_ranks(self) -> int:
        return self.num_ranks

    def get_heap_bases(self) -> torch.Tensor:
        return self.ctx.heap_bases

    def get_device(self) -> torch.device:
        return self.ctx.device

    def get_cu_count(self) -> int:
        """Compute units (SMs) of this rank's GPU; CPU cores under the host transport."""
        if self.ctx.device.type == "cuda":
            return _devinfo.num_sms(self.ctx.device)
        return os.cpu_count() or 1

    # ---- synchronization -------------------------------------------------------------------------
    def barrier(self) -> None:
        self.ctx.barrier()

    def device_barrier(self) -> None:
        self.ctx.device_barrier()

    def broadcast(self, value, source_rank: int = 0, *, src: int | None = None):
        """``source_rank``'s value on every rank. As in Iris, tensors and arrays come back as
        numpy arrays; scalars and other objects as themselves."""
        root = source_rank if src is None else src
        self.ctx.check_rank(root, "source_rank")
        payload = value
        if self.cur_rank == root and isinstance(value, torch.Tensor):
            payload = value.detach().cpu().numpy()
        return self.ctx.bootstrap.broadcast(payload, root)

    # ---- logging ---------------------------------------------------------------------------------
    def _log(self, level: int, message: str) -> None:
        logger.log(level, "[Iris] [%d/%d] %s", self.cur_rank, self.num_ranks, message)

    def debug(self, message: str) -> None:
        self._log(DEBUG, message)

    def info(self, message: str) -> None:
        self._log(INFO, message)

    def warning(self, message: str) -> None:
        self._log(WARNING, message)

    def error(self, message: str) -> None:
        self._log(ERROR, message)

    # ---- tensors -----------------------------------------------------------------------------------
    @staticmethod
    def _check_layout(layout) -> None:
        if layout not in (None, torch.strided):
            raise ValueError(f"layout must be torch.strided (symmetric tensors are strided), got {layout}")

    def _finish(self, t: torch.Tensor, out, requires_grad: bool) -> torch.Tensor:
        if out is not None:
            self.ctx.check_symmetric(out, "out")
            if out.numel() != t.numel() or out.dtype != t.dtype:
                raise ValueError(f"out must have {t.numel()} elements of {t.dtype}, got {out.numel()} of {out.dtype}")
            t = out.copy_(t.reshape(out.shape)).view(t.shape)
        return t.requires_grad_() if requires_grad else t

    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
              pin_memory=False, memory_format=torch.contiguous_format):
        self._check_layout(layout)
        if out is None:
            return self.ctx.empty(*size, dtype=dtype, device=device, requires_grad=requires_grad)
        shape = iris_fw.Context._size(size)
        self.ctx.check_symmetric(out, "out")
        if out.numel() != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"out must have {int(np.prod(shape))} elements, got {out.numel()}")
        return out.view(shape).requires_grad_(requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        return self._finish(self.ctx.zeros(*size, dtype=dtype, device=device), out, requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        return self._finish(self.ctx.ones(*size, dtype=dtype, device=device), out, requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        return self._finish(self.ctx.full(size, fill_value, dtype=dtype, device=device), out, requires_grad)

    def zeros_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        self._check_layout(layout)
        return self.ctx.zeros_like(input, dtype=dtype, device=device, requires_grad=requires_grad)

    def arange(self, start=0, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False):
        self._check_layout(layout)
        return self._finish(self.ctx.arange(start, end, step, dtype=dtype, device=device), out, requires_grad)

    def linspace(self, start, end, steps, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        self._check_layout(layout)
        return self._finish(self.ctx.linspace(start, end, steps, dtype=dtype, device=device), out, requires_grad)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False):
        self._check_layout(layout)
        return self._finish(self.ctx.randn(*size, generator=generator, dtype=dtype, device=device), out, requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False):
        self._check_layout(layout)
        return self._finish(self.ctx.rand(*size, generator=generator, dtype=dtype, device=device), out, requires_grad)

    def randint(self, *args, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
                requires_grad=False):
        self._check_layout(layout)
        t = self.ctx.randint(*args, generator=generator, dtype=dtype or torch.int64, device=device)
        return self._finish(t, out, requires_grad)

    def uniform(self, size, low=0.0, high=1.0, dtype=torch.float):
        t = self.ctx.empty(size, dtype=dtype)
        return t.uniform_(low, high)

    def as_symmetric(self, external_tensor: torch.Tensor) -> torch.Tensor:
        return self.ctx.as_symmetric(external_tensor)

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        return self.ctx.is_symmetric(tensor)


def iris(heap_size: int = 1 << 30) -> Iris:
    """Create the Iris host object (collective: every rank calls it)."""
    return Iris(heap_size)


# ---- device side: Iris's argument orders, mapped onto iris_fw.device ------------------------------
# Iris's sem/scope default to None, i.e. Triton's defaults (acq_rel, gpu); they are passed through.


@triton.jit
def load(pointer, to_rank, from_rank, heap_bases, mask=None):
    """Read ``from_rank``'s data at ``pointer``'s offset; the caller is ``to_rank``."""
    return _dv.load(pointer, to_rank, from_rank, heap_bases, mask=mask)


@triton.jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None):
    """Write ``value`` into ``to_rank``'s heap; the caller is ``from_rank``."""
    _dv.store(pointer, value, from_rank, to_rank, heap_bases, mask=mask)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None):
    """Copy ``from_rank``'s data at ``from_ptr``'s offset to the caller's (``to_rank``) ``to_ptr``."""
    _dv.get(from_ptr, to_ptr, to_rank, from_rank, heap_bases, mask=mask)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None):
    """Copy the caller's (``from_rank``) ``from_ptr`` data to ``to_rank``'s heap at ``to_ptr``'s offset."""
    _dv.put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=mask)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None):
    """Copy from ``from_rank``'s heap to ``to_rank``'s; pointers are ``cur_rank``'s addresses."""
    _dv.copy(src_ptr, dst_ptr, cur_rank, from_rank, to_rank, heap_bases, mask=mask)


@triton.jit
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem=sem, scope=scope)


@triton.jit
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None):
    return _dv.atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=mask, sem=sem, scope=scope)
