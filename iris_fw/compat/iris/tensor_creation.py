"""Iris's ``iris.tensor_creation``: the factory helpers Iris's host object delegates to, each
taking the heap object (``shmem.heap``) and the heap's device. Here the host object's own
factories (:class:`iris.Iris`, which follow torch's conventions) do the work; these functions
add Iris's module-level checks and signatures."""

from __future__ import annotations

import math

import torch


def _shmem(heap):
    """The host object behind ``heap`` (``shmem.heap``)."""
    owner = getattr(heap, "_shmem", None)
    if owner is None:
        raise TypeError(f"heap must be an Iris host object's heap (shmem.heap), got {type(heap).__name__}")
    return owner


def allocate(heap, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat uninitialized tensor ``[num_elements]`` on ``heap``."""
    return heap.allocate(num_elements, dtype)


def parse_size(size):
    """``(size, number of elements)`` of a factory's ``*size``: ``(2, 3)``, ``((2, 3),)``,
    ``([2, 3],)`` or nested once more; ``((),)`` is the 0-d size ``()`` of one element."""
    while len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    return size, math.prod(size)


def is_valid_device(device, iris_device) -> bool:
    """Whether a requested ``device`` (``None``, a string or a ``torch.device``) names the
    heap's device ``iris_device``: ``None`` always does; otherwise the same device type and,
    if the request has an index, the same index. (Iris accepts only CUDA devices; iris-fw's
    CPU ranks have their heap on ``cpu``.)"""
    if device is None:
        return True
    try:
        wanted = torch.device(device) if isinstance(device, (str, int)) else device
    except (RuntimeError, TypeError):
        return False
    if not isinstance(wanted, torch.device):
        return False
    iris_device = torch.device(iris_device)
    return wanted.type == iris_device.type and (wanted.index is None or wanted.index == iris_device.index)


def throw_if_invalid_device(device, iris_device) -> None:
    """``RuntimeError`` unless :func:`is_valid_device`."""
    if not is_valid_device(device, iris_device):
        raise RuntimeError(f"Device mismatch: requested device {device} but Iris instance is on device {iris_device}; "
                           f"tensors can only be made on the heap's device")


def throw_if_invalid_output_tensor(heap, tensor: torch.Tensor, num_elements: int, dtype: torch.dtype) -> None:
    """``RuntimeError`` if ``tensor`` cannot be an ``out=`` tensor: element count, dtype, then
    heap membership (Iris's order and messages)."""
    if tensor.numel() != num_elements:
        raise RuntimeError(f"The output tensor has {tensor.numel()} elements, but {num_elements} are required")
    if tensor.dtype != dtype:
        raise RuntimeError(f"The output tensor has dtype {tensor.dtype}, but {dtype} is required")
    if not heap.is_symmetric(tensor):
        raise RuntimeError("The output tensor is not on the symmetric heap")


def apply_layout(tensor: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    """``tensor`` for ``torch.strided``; any other layout raises ``ValueError``."""
    if layout == torch.strided:
        return tensor
    raise ValueError(f"Layout {layout} not supported: symmetric tensors are torch.strided")


def zeros(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).zeros(*_as_args(size), out=out, dtype=dtype, layout=layout, device=device,
                              requires_grad=requires_grad)


def ones(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).ones(*_as_args(size), out=out, dtype=dtype, layout=layout, device=device,
                             requires_grad=requires_grad)


def empty(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
          memory_format=torch.contiguous_format):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).empty(*_as_args(size), out=out, dtype=dtype, layout=layout, device=device,
                              requires_grad=requires_grad, memory_format=memory_format)


def full(heap, iris_device, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
         requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    shape, _ = parse_size(tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,))
    return _shmem(heap).full(tuple(shape), fill_value, out=out, dtype=dtype, layout=layout, device=device,
                             requires_grad=requires_grad)


def zeros_like(heap, iris_device, input, *, dtype=None, layout=None, device=None, requires_grad=False,
               memory_format=torch.preserve_format):
    throw_if_invalid_device(device if device is not None else input.device, iris_device)
    return _shmem(heap).zeros_like(input, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad,
                                   memory_format=memory_format)


def uniform(heap, iris_device, size, low=0.0, high=1.0, dtype=torch.float):
    return _shmem(heap).uniform(size, low, high, dtype)


def randn(heap, iris_device, size, *, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
          requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).randn(*_as_args(size), generator=generator, out=out, dtype=dtype, layout=layout,
                              device=device, requires_grad=requires_grad)


def rand(heap, iris_device, size, *, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
         requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).rand(*_as_args(size), generator=generator, out=out, dtype=dtype, layout=layout,
                             device=device, requires_grad=requires_grad)


def randint(heap, iris_device, low, high, size, *, generator=None, out=None, dtype=None, layout=torch.strided,
            device=None, requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).randint(low, high, size, generator=generator, out=out, dtype=dtype, layout=layout,
                                device=device, requires_grad=requires_grad)


def arange(heap, iris_device, start, end, step, *, out=None, dtype=None, layout=torch.strided, device=None,
           requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).arange(start, end, step, out=out, dtype=dtype, layout=layout, device=device,
                               requires_grad=requires_grad)


def linspace(heap, iris_device, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False):
    throw_if_invalid_device(device, iris_device)
    return _shmem(heap).linspace(start, end, steps, out=out, dtype=dtype, layout=layout, device=device,
                                 requires_grad=requires_grad)


def _as_args(size) -> tuple:
    """A module-level ``size`` (a tuple, list, ``torch.Size`` or int) as the host factories' ``*size``."""
    return (tuple(size),) if isinstance(size, (tuple, list, torch.Size)) else (size,)
