"""A third-party iris-fw plugin, installed and loaded exactly as any other package's would be.

It registers a transport (``private_shm``: host shared memory under its own segment-name
prefix, built on the built-in ``host_shm``) and a pattern (``scale``: y = alpha * x on a
peer's heap, with a torch reference).
"""

import triton
import triton.language as tl

from iris_fw import device as dv
from iris_fw.hookspecs import hookimpl
from iris_fw.transports.host_shm import HostShmTransport

class PrivateShmTransport(HostShmTransport):
    """host_shm with segments named after this plugin."""

    name = "private_shm"
    shm_prefix = "iris_fw_example_"


@triton.jit
def _scale_kernel(x, y, alpha, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dv.store(y + offs, dv.load(x + offs, rank, rank, heap_bases, mask=mask) * alpha, rank, peer, heap_bases, mask=mask)


class ScalePattern:
    """y[peer] = alpha * x[rank]: ``x`` and ``y`` are ``[n]`` symmetric tensors."""

    name = "scale"

    @staticmethod
    def available():
        return True, ""

    @staticmethod
    def run(ctx, x, y, alpha, peer, block=128):
        ctx.check_symmetric(x, "x")
        ctx.check_symmetric(y, "y")
        ctx.check_rank(peer, "peer")
        grid = (triton.cdiv(x.numel(), block),)
        _scale_kernel[grid](x, y, alpha, x.numel(), ctx.rank, peer, ctx.heap_bases, BLOCK=block)

    @staticmethod
    def reference(x, alpha):
        return x * alpha


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(PrivateShmTransport)


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(ScalePattern)
