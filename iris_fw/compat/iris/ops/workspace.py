"""Iris's ``iris.ops.FusedWorkspace``: what a fused op's preamble prepared. iris-fw keeps an op's
buffers with the op (``iris_fw.ops``' cache, or the collective's group), so the workspace
records the call (operation, shape ``(M, N, K)``, dtype, world size, variant) and holds no
buffers of its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FusedWorkspace:
    operation: str = ""
    shape: tuple = ()
    dtype: torch.dtype | None = None
    world_size: int = 1
    variant: str = ""
    config: object | None = None
    aux_buffer: torch.Tensor | None = None
    locks: torch.Tensor | None = None
    prepared: bool = False

    def matches(self, operation: str, shape: tuple, dtype: torch.dtype, world_size: int, variant: str = "") -> bool:
        """Whether this workspace was prepared for exactly this call."""
        return (self.operation == operation and self.shape == tuple(shape) and self.dtype == dtype
                and self.world_size == world_size and self.variant == variant and self.prepared)

    def reset(self) -> None:
        self.prepared = False

    def clear(self) -> None:
        self.aux_buffer = None
        self.locks = None
        self.config = None
        self.prepared = False
