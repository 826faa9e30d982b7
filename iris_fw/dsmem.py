"""Device functions of a thread-block cluster (NVIDIA sm_90 and later): the cluster's barrier and
its distributed shared memory — a program storing into another program's shared memory and
loading its own — in inline PTX, for kernels a :class:`~iris_fw.kernel_launcher.KernelLauncher`
launches with ``cluster=n``.

Plain ``triton.language`` has no handle on either (``num_ctas`` makes a cluster *one*
program), so the exchange lives in a region of dynamic shared memory that Triton never
allocates: the last ``BYTES`` of what the launch gave the program (``cluster_shared`` beyond
Triton's own, :func:`region`). The usual sequence: :func:`arrive` (relaxed) early, :func:`wait`
before the first remote store (every program of the cluster has started: its shared memory
exists), :func:`store_remote` into a program's region, :func:`arrive` (release) and
:func:`wait` (acquire), then the owner's :func:`load_local`. A program whose region others store
into must not exit before that last wait. Every function here is executed by every thread of the
program (the barrier counts threads); their asm blocks have side effects, so the compiler keeps
them in program order. Compiled kernels on NVIDIA only: a kernel guards them by a constexpr
that the interpreter and AMD never set. The region is found from Triton's own shared memory
(``global_smem``), which Triton declares only for a kernel that uses shared memory (a ``tl.dot``, a
reduction across warps, a pipelined load): for one that does not, ``ptxas`` rejects the kernel
("Unknown symbol 'global_smem'") — it fails to compile, never runs wrong.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["arrive", "load_local", "region", "require_cluster", "store_remote", "wait"]


@triton.jit
def require_cluster(SIZE: tl.constexpr):
    """Trap (the launch fails with an error) unless this program's cluster has ``SIZE``
    programs (``%cluster_nctarank``): a kernel compiled for clusters but launched without them
    would pass the barrier alone and store into shared memory Triton uses."""
    tl.inline_asm_elementwise("{\n .reg .pred p;\n .reg .u32 n;\n mov.u32 n, %cluster_nctarank;\n"
                              " setp.ne.u32 p, n, $1;\n @p trap;\n mov.u32 $0, 0;\n}", "=r,r",
                              [tl.full([], SIZE, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive(RELAXED: tl.constexpr):
    """This thread's arrival on the cluster barrier's current phase: with release semantics
    (its stores before, remote ones included, seen by whoever waits for the phase), or
    ``RELAXED`` (no ordering: only "this program has started")."""
    if RELAXED:
        tl.inline_asm_elementwise("barrier.cluster.arrive.relaxed.aligned;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("barrier.cluster.arrive.aligned;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def wait():
    """Wait (acquire) until every thread of every program of the cluster has arrived on the
    phase this thread arrived on."""
    tl.inline_asm_elementwise("barrier.cluster.wait.aligned;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def region(BYTES: tl.constexpr):
    """The shared-memory address (32 bits, this program's window) of the last ``BYTES`` of its
    dynamic shared memory: ``global_smem`` (Triton's base of it) + ``%dynamic_smem_size`` -
    ``BYTES``."""
    end = tl.inline_asm_elementwise("{\n .reg .u32 t;\n mov.u32 $0, global_smem;\n mov.u32 t, %dynamic_smem_size;\n"
                                    " add.u32 $0, $0, t;\n}", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    return end - BYTES


@triton.jit
def store_remote(addr, value, rank, mask):
    """Store the 32-bit ``value`` (any 32-bit dtype; a tensor) at shared address ``addr`` (an
    address of the region, as :func:`region` gives it) of the cluster's program ``rank``, where
    ``mask``. Returns a dummy int32 tensor."""
    bits = value.to(tl.int32, bitcast=True) if value.dtype != tl.int32 else value
    return tl.inline_asm_elementwise(
        "{\n .reg .pred p;\n .reg .b32 a;\n setp.ne.b32 p, $3, 0;\n mapa.shared::cluster.u32 a, $1, $2;\n"
        " @p st.shared::cluster.b32 [a], $4;\n mov.u32 $0, 0;\n}",
        "=r,r,r,r,r", [addr, rank, mask.to(tl.int32), bits], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def load_local(addr, DTYPE: tl.constexpr):
    """The 32-bit values at this program's shared addresses ``addr`` (a tensor), as ``DTYPE``."""
    bits = tl.inline_asm_elementwise("ld.shared.b32 $0, [$1];", "=r,r", [addr], dtype=tl.int32, is_pure=False,
                                     pack=1)
    return bits.to(DTYPE, bitcast=True)
