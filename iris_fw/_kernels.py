"""Kernels the host side of iris-fw launches itself."""

import triton

from . import device


@triton.jit
def _device_barrier_kernel(rank, world_size, heap_bases):
    device.barrier(rank, world_size, heap_bases)


@triton.jit
def _wait_probe_kernel(rank, heap_bases):
    # Waits for a flag nobody sets: runs exactly the header's wait bound of polls.
    hdr = device.heap_header(rank, heap_bases)
    device.wait_until(hdr + device.HDR_PROBE, "==", 1, rank, rank, heap_bases)
