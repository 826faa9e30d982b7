"""Gluon tile helpers for warp-specialized kernels (``schedulers/warp_specialized.py``).

Gluon (``triton.experimental.gluon``) is the only stock-Triton way to give one program's warps
different code: ``gl.warp_specialize`` forks a *default partition* (the kernel's ``num_warps``)
and worker partitions (warps of their own) that run at the same time. Code inside a Gluon
kernel is built with Gluon's semantics: every block needs an explicit layout, so the patterns'
``@triton.jit`` tile pieces (``tl.arange``, ``tl.dot``) do not compile there — Triton 3.9 stops
at ``GluonSemantic.arange() missing 1 required positional argument: 'layout'`` — while scalar
code (epochs, flags, barriers: :mod:`iris_fw.engine.skeletons`) and the remote loads and stores
of :mod:`iris_fw.device` on blocks whose layout is given do. This module has the blocks: the
GEMM tile (``mma_v2`` tensor-core instructions for 16-bit inputs, exact FMA for fp32) and the
layouts the pieces build their index blocks with.

NVIDIA only: Triton 3.9 lowers ``warp_specialize`` on AMD for gfx1250 alone ("Warp
specialization is only supported on gfx1250, got gfx942"). ``AVAILABLE`` is False where this
Triton has no Gluon (``WHY`` says what is missing); nothing here is defined then.
"""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    AVAILABLE, WHY = hasattr(gl, "warp_specialize"), "triton.experimental.gluon.language has no warp_specialize"
except ImportError as exc:  # a Triton without Gluon
    AVAILABLE, WHY = False, f"this Triton has no Gluon ({exc})"

#: Threads of an NVIDIA warp (the only target of these layouts).
WARP = 32

if AVAILABLE:
    WHY = ""

    @gluon.constexpr_function
    def rows_layout(NW):
        """The blocked layout of ``[rows, cols]`` index and data blocks over ``NW`` warps
        (8 contiguous elements a thread along the columns). A constexpr function: Triton 3.6
        cannot return a layout from a ``@gluon.jit`` function ("cannot convert BlockedLayout
        ... to tensor")."""
        return gl.BlockedLayout([1, 8], [4, WARP // 4], [NW, 1], [1, 0])

    @gluon.jit
    def block_offsets(row0, col0, BR: gl.constexpr, BC: gl.constexpr, NW: gl.constexpr):
        """``(rows [BR, 1], cols [1, BC])`` index blocks from ``(row0, col0)`` in :func:`rows_layout`."""
        layout: gl.constexpr = rows_layout(NW)
        r = row0 + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
        c = col0 + gl.arange(0, BC, layout=gl.SliceLayout(0, layout))
        return gl.expand_dims(r, 1), gl.expand_dims(c, 0)

    @gluon.jit
    def matmul_tile(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NW: gl.constexpr):
        """``a[off_m:+BM, :K] @ b[:K, off_n:+BN]`` in fp32 (zeros outside ``[M, N]``), in
        :func:`rows_layout`; ``a``, ``b``: pointers. 16-bit inputs on the tensor cores
        (``mma_v2``), fp32 exactly (FMA)."""
        layout: gl.constexpr = rows_layout(NW)
        r, ck = block_offsets(off_m, 0, BM, BK, NW)
        rk, c = block_offsets(0, off_n, BK, BN, NW)
        if a.dtype.element_ty == gl.float32:
            acc = gl.zeros([BM, BN], gl.float32, layout=layout)
            for k0 in range(0, K, BK):
                x = gl.load(a + r * stride_am + (k0 + ck) * stride_ak, mask=(r < M) & (k0 + ck < K), other=0.0)
                y = gl.load(b + (k0 + rk) * stride_bk + c * stride_bn, mask=(k0 + rk < K) & (c < N), other=0.0)
                acc = gl.dot_fma(gl.convert_layout(x, gl.DotOperandLayout(0, layout, 0)),
                                 gl.convert_layout(y, gl.DotOperandLayout(1, layout, 0)), acc)
            out = acc
        else:
            WM: gl.constexpr = NW if BM >= 16 * NW else BM // 16
            mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WM, NW // WM],
                                                          instr_shape=[16, 8])
            acc = gl.zeros([BM, BN], gl.float32, layout=mma)
            for k0 in range(0, K, BK):
                x = gl.load(a + r * stride_am + (k0 + ck) * stride_ak, mask=(r < M) & (k0 + ck < K), other=0.0)
                y = gl.load(b + (k0 + rk) * stride_bk + c * stride_bn, mask=(k0 + rk < K) & (c < N), other=0.0)
                acc = mma_v2(gl.convert_layout(x, gl.DotOperandLayout(0, mma, 2)),
                             gl.convert_layout(y, gl.DotOperandLayout(1, mma, 2)), acc)
            out = gl.convert_layout(acc, layout)
        return out
