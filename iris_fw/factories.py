"""The symmetric-heap tensor factories of a context, with torch's conventions: ``empty``,
``zeros``, ``ones``, ``full``, ``arange``, ``linspace``, ``rand``, ``randn``, ``randint``, the
``*_like`` variants and ``as_symmetric``.

:class:`HeapFactories` is a base class of :class:`iris_fw.Context` (``ctx.zeros(...)``): it
checks every factory argument and allocates from ``self.heap``. It needs of its subclass only
``heap`` (a :class:`~iris_fw.heap.SymmetricHeap`), ``heap_size``, ``device`` and
``_check_open()``, and imports nothing above the foundation layer, so the context imports it
downward (the layers: pyproject.toml's ``[tool.importlinter]``)."""

from __future__ import annotations

import operator
from typing import Any, Sequence, Union

import torch

from .errors import ArgumentError, ArgumentTypeError, HeapOutOfMemory, bad_type

__all__ = ["DeviceLike", "HeapFactories", "Number"]

#: What a factory's ``device=`` accepts (it must name this rank's device).
DeviceLike = Union[torch.device, str, int, None]
#: A Python scalar, as torch's factories take.
Number = Union[int, float, bool]


class HeapFactories:
    """Tensor factories over a symmetric heap (a base class of :class:`iris_fw.Context`). Every
    rank must call them with the same sizes and dtypes in the same order: the heap's offsets
    then agree across ranks without communication (see :mod:`iris_fw.heap`)."""

    # set by the subclass (iris_fw.Context)
    heap: Any
    heap_size: int
    device: torch.device

    def _check_open(self) -> None:
        """Raise if the heap is closed (the subclass's check)."""
        raise NotImplementedError

    def _check_device(self, device: Any) -> None:
        if device is None:
            return
        try:
            wanted = torch.device(device)
        except (RuntimeError, TypeError):
            raise ArgumentError(f"device must be {self.device} (this rank's heap lives there), got {device!r}") from None
        if wanted.type != self.device.type or (wanted.index is not None and wanted != self.device):
            raise ArgumentError(f"device must be {self.device} (this rank's heap lives there), got {device!r}")

    @staticmethod
    def _size(size: tuple) -> tuple[int, ...]:
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        for d in size:
            if isinstance(d, bool) or not hasattr(type(d), "__index__"):
                raise bad_type("size", "ints (or one tuple, list or torch.Size of ints)", tuple(size))
        size = tuple(operator.index(d) for d in size)
        if any(d < 0 for d in size):
            raise ArgumentError(f"size must be non-negative ints, got {size!r}")
        return size

    def _new(self, shape, dtype, device, requires_grad=False, generator=None) -> torch.Tensor:
        """A new heap tensor after checking every factory argument; ``requires_grad`` is only
        checked (factories set it after filling)."""
        self._check_open()
        self._check_device(device)
        if dtype is None:
            dtype = torch.get_default_dtype()
        elif not isinstance(dtype, torch.dtype):
            raise bad_type("dtype", "a torch.dtype (e.g. torch.float32) or None", dtype)
        if not isinstance(requires_grad, bool):
            raise bad_type("requires_grad", "a bool", requires_grad)
        if requires_grad and not (dtype.is_floating_point or dtype.is_complex):
            raise ArgumentError(f"requires_grad=True needs a floating or complex dtype, got {dtype}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise bad_type("generator", "a torch.Generator or None", generator)
        return self.heap.tensor(shape, dtype)

    def empty(self, *size: int | Sequence[int], dtype: torch.dtype | None = None, device: DeviceLike = None,
              requires_grad: bool = False) -> torch.Tensor:
        """Uninitialized symmetric tensor, like :func:`torch.empty`."""
        return self._new(self._size(size), dtype, device, requires_grad).requires_grad_(requires_grad)

    def zeros(self, *size: int | Sequence[int], dtype: torch.dtype | None = None, device: DeviceLike = None,
              requires_grad: bool = False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device, requires_grad)
        return t.zero_().requires_grad_(requires_grad)

    def ones(self, *size: int | Sequence[int], dtype: torch.dtype | None = None, device: DeviceLike = None,
             requires_grad: bool = False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device, requires_grad)
        return t.fill_(1).requires_grad_(requires_grad)

    def full(self, size: int | Sequence[int], fill_value: Number, *, dtype: torch.dtype | None = None,
             device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        """Like :func:`torch.full`: the dtype follows ``fill_value`` when not given."""
        if not (isinstance(fill_value, (bool, int, float, complex))
                or (isinstance(fill_value, torch.Tensor) and fill_value.dim() == 0)):
            raise bad_type("fill_value", "a number, a bool or a 0-dim tensor", fill_value)
        dtype = dtype if dtype is not None else torch.tensor(fill_value).dtype
        t = self._new(self._size((size,)), dtype, device, requires_grad)
        return t.fill_(fill_value).requires_grad_(requires_grad)

    def _from(self, ref: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        t = self._new(tuple(ref.shape), ref.dtype, None, requires_grad)
        return t.copy_(ref).requires_grad_(requires_grad)

    def _ranged(self, what: str, fn, args: dict, dtype, device, requires_grad) -> torch.Tensor:
        """``fn(*args, dtype=…, out=…)`` (torch.arange / torch.linspace) written straight into a
        heap tensor: the shape and dtype come from the same call on the ``meta`` device (no
        memory), so a huge range is refused by the heap, not allocated by torch first."""
        for name, value in args.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_complex:
                args[name] = value = value.item()  # as torch takes them
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad_type(name, "a number", value)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise bad_type("dtype", "a torch.dtype (e.g. torch.float32) or None", dtype)
        call = f"{what}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
        values = list(args.values())
        count = values[2] if what == "linspace" else (values[1] - values[0]) / values[2] if values[2] else 0
        if count > self.heap_size:  # more elements than the heap has bytes (torch's own message is obscure)
            raise HeapOutOfMemory(f"{call} has {count:.4g} elements: more than the symmetric heap's "
                                  f"{self.heap_size} bytes")
        try:
            shape = fn(*args.values(), dtype=dtype, device="meta")
        except (RuntimeError, ValueError, OverflowError) as exc:
            raise ArgumentError(f"{call}: {str(exc).splitlines()[0]}") from None
        t = self._new(tuple(shape.shape), shape.dtype, device, requires_grad)
        fn(*args.values(), dtype=shape.dtype, out=t)
        return t.requires_grad_(requires_grad)

    def arange(self, start: Number, end: Number | None = None, step: Number = 1, *, dtype: torch.dtype | None = None,
               device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        """Like :func:`torch.arange` (``arange(end)`` or ``arange(start, end, step)``)."""
        if end is None:
            start, end = 0, start
        return self._ranged("arange", torch.arange, {"start": start, "end": end, "step": step}, dtype, device,
                            requires_grad)

    def linspace(self, start: Number, end: Number, steps: int, *, dtype: torch.dtype | None = None,
                 device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        if isinstance(steps, bool) or not hasattr(type(steps), "__index__"):
            raise bad_type("steps", "an int >= 0", steps)
        return self._ranged("linspace", torch.linspace, {"start": start, "end": end, "steps": operator.index(steps)},
                            dtype, device, requires_grad)

    def rand(self, *size: int | Sequence[int], generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
             device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        """Uniform on [0, 1), like :func:`torch.rand`."""
        t = self._new(self._size(size), dtype, device, requires_grad, generator)
        return t.uniform_(0, 1, generator=generator).requires_grad_(requires_grad)

    def randn(self, *size: int | Sequence[int], generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
              device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        t = self._new(self._size(size), dtype, device, requires_grad, generator)
        return t.normal_(generator=generator).requires_grad_(requires_grad)

    @staticmethod
    def randint_args(args: tuple) -> tuple:
        """``(low, high, size)`` from ``randint``'s ``(high, size)`` or ``(low, high, size)``."""
        if len(args) == 2:
            low, (high, size) = 0, args
        elif len(args) == 3:
            low, high, size = args
        else:
            raise ArgumentTypeError(f"randint takes (high, size) or (low, high, size), got {len(args)} positional arguments")
        for name, value in (("low", low), ("high", high)):
            if isinstance(value, bool) or not hasattr(type(value), "__index__"):
                raise bad_type(name, "an int", value)
        if not high > low:
            raise ArgumentError(f"randint: high must be greater than low, got low={low}, high={high}")
        return low, high, size

    def randint(self, *args: int | Sequence[int], generator: torch.Generator | None = None,
                dtype: torch.dtype = torch.int64, device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        """Like :func:`torch.randint`: ``randint(high, size)`` or ``randint(low, high, size)``."""
        low, high, size = self.randint_args(args)
        t = self._new(self._size((size,)), dtype, device, requires_grad, generator)
        return t.random_(low, high, generator=generator).requires_grad_(requires_grad)

    @staticmethod
    def _like(t: Any, what: str) -> tuple:
        if not isinstance(t, torch.Tensor):
            raise bad_type("t", f"a torch.Tensor (the tensor {what} copies the shape of)", t)
        return tuple(t.shape)

    def empty_like(self, t: torch.Tensor, *, dtype: torch.dtype | None = None, device: DeviceLike = None,
                   requires_grad: bool = False) -> torch.Tensor:
        return self.empty(self._like(t, "empty_like"), dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def zeros_like(self, t: torch.Tensor, *, dtype: torch.dtype | None = None, device: DeviceLike = None,
                   requires_grad: bool = False) -> torch.Tensor:
        return self.zeros(self._like(t, "zeros_like"), dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def ones_like(self, t: torch.Tensor, *, dtype: torch.dtype | None = None, device: DeviceLike = None,
                  requires_grad: bool = False) -> torch.Tensor:
        return self.ones(self._like(t, "ones_like"), dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)

    def full_like(self, t: torch.Tensor, fill_value: Number, *, dtype: torch.dtype | None = None,
                  device: DeviceLike = None, requires_grad: bool = False) -> torch.Tensor:
        return self.full(self._like(t, "full_like"), fill_value, dtype=dtype or t.dtype, device=device,
                         requires_grad=requires_grad)

    def as_symmetric(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` (any device) on the symmetric heap, same shape and dtype."""
        if not isinstance(t, torch.Tensor):
            raise bad_type("t", "a torch.Tensor (as_symmetric copies it onto the heap)", t)
        if t.device.type == "meta":
            raise ArgumentError(f"t must hold data to copy onto the heap, got a meta tensor of shape {list(t.shape)}")
        return self._from(t.detach(), False)
