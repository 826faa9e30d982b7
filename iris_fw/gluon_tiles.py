"""Gluon tile helpers for warp-specialized kernels (``schedulers/warp_specialized.py``).

Gluon (``triton.experimental.gluon``) is the only stock-Triton way to give one program's warps
different code: ``gl.warp_specialize`` forks a *default partition* (the kernel's ``num_warps``)
and worker partitions (warps of their own) that run at the same time. Code inside a Gluon
kernel is built with Gluon's semantics: every block needs an explicit layout, so the patterns'
``@triton.jit`` tile pieces (``tl.arange``, ``tl.dot``) do not compile there — Triton 3.9 stops
at ``GluonSemantic.arange() missing 1 required positional argument: 'layout'`` — while scalar
code (epochs, flags, barriers: :mod:`iris_fw.engine.skeletons`) and the remote loads and stores
of :mod:`iris_fw.device` on blocks whose layout is given do. This module has the blocks: the
GEMM tile and the layouts the pieces build their index blocks with. The tile has three paths:
exact FMA for fp32; for 16-bit inputs register operands and ``mma_v2`` (``MMA="mma_v2"``:
Ampere's instructions, which sm_90 and sm_100 also run) — what :func:`mma_path` picks, measured —
or, on Hopper only (``MMA="wgmma"``, ``IRIS_FW_GLUON_MMA=wgmma``), the operands staged in shared
memory (NVMMA layout, two buffers) and multiplied by asynchronous ``warpgroup_mma`` (wgmma), the
next K step's loads in flight meanwhile (right on an H100, and 2.2-2.4x slower than mma_v2: run 34).

NVIDIA only: Triton 3.9 lowers ``warp_specialize`` on AMD for gfx1250 alone ("Warp
specialization is only supported on gfx1250, got gfx942"). ``AVAILABLE`` is False where this
Triton has no Gluon (``WHY`` says what is missing); nothing here is defined then.
"""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                                   warpgroup_mma_init, warpgroup_mma_wait)

    AVAILABLE, WHY = hasattr(gl, "warp_specialize"), "triton.experimental.gluon.language has no warp_specialize"
except ImportError as exc:  # a Triton without Gluon
    AVAILABLE, WHY = False, f"this Triton has no Gluon ({exc})"

#: Threads of an NVIDIA warp (the only target of these layouts).
WARP = 32
#: Warps of a Hopper warpgroup: one ``wgmma`` is issued by 4 warps together, 16 rows each.
WARPGROUP = 4
#: Rows of one warp's share of an MMA instruction (``mma_v2`` and ``wgmma``).
MMA_ROWS = 16
#: Bits of the K extent of one ``wgmma`` instruction (16 elements of a 16-bit type).
WGMMA_K_BITS = 256
#: Widest N of one ``wgmma`` instruction, and the step its N takes.
WGMMA_MAX_N, WGMMA_N_STEP = 256, 8
#: The GEMM tile's tensor-core paths (the ``MMA`` constexpr of :func:`matmul_tile`).
MMA_PATHS = ("wgmma", "mma_v2")


#: Architectures where ``"wgmma"`` can compile (sm_90a's instructions; Blackwell's are tcgen05).
WGMMA_ARCHS = ("sm_90",)


def mma_path(arch: str) -> str:
    """The tensor-core path of :func:`matmul_tile` on a device of architecture ``arch``
    (:attr:`iris_fw.devinfo.DeviceInfo.arch`): ``"mma_v2"`` everywhere, measured. On one H100
    (run 34, docs/performance.md) the ``"wgmma"`` tile — register operands stored to shared
    memory each K step, no TMA or cp.async pipeline, 12 warps at 168 registers with spills — was
    right but took 2384-2430 µs at 4096³ against mma_v2's 1006-1102 µs; it stays selectable
    (``IRIS_FW_GLUON_MMA=wgmma``, sm_90 only: :data:`WGMMA_ARCHS`) until a pipelined version
    beats it."""
    return "mma_v2"


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

    @gluon.constexpr_function
    def wgmma_layout(BM, BN, NW, dtype):
        """The accumulator layout of :func:`matmul_tile`'s wgmma path: warpgroups of
        :data:`WARPGROUP` warps stacked along M while the block has rows for them (16 a warp),
        then side by side along N; each instruction as wide along N as the warps' share allows
        (at most :data:`WGMMA_MAX_N`, a multiple of :data:`WGMMA_N_STEP` dividing ``BN``)."""
        wm, wn = WARPGROUP, 1
        while wm * wn < NW:
            if BM > MMA_ROWS * wm:
                wm *= 2
            else:
                wn *= 2
        n = min(WGMMA_MAX_N, max(BN // wn, WGMMA_N_STEP))
        while BN % n:
            n -= WGMMA_N_STEP
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[wm, wn],
                                         instr_shape=[MMA_ROWS, n, WGMMA_K_BITS // dtype.primitive_bitwidth])

    @gluon.constexpr_function
    def wgmma_fits(BM, NW):
        """Whether a ``BM``-row block over ``NW`` warps can take the wgmma path: whole
        warpgroups, each with its 64 rows (smaller blocks take ``mma_v2``)."""
        return NW % WARPGROUP == 0 and BM % (WARPGROUP * MMA_ROWS) == 0

    @gluon.jit
    def _wgmma_tile(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NW: gl.constexpr):
        """:func:`matmul_tile`'s Hopper path (16-bit inputs): each K step's blocks stored into one
        of two NVMMA-swizzled shared buffers and multiplied by an asynchronous ``warpgroup_mma``;
        while it runs, the next step's blocks load into registers, and ``warpgroup_mma_wait(1)``
        at the top of each step retires the one two steps back (whose buffer that step stores).
        Register loads, not ``cp.async``, so any alignment and stride works (K = 1001 rows)."""
        layout: gl.constexpr = rows_layout(NW)
        dtype: gl.constexpr = a.dtype.element_ty
        acc_layout: gl.constexpr = wgmma_layout(BM, BN, NW, dtype)
        a_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], dtype)
        b_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, BN], dtype)
        a_smem = gl.allocate_shared_memory(dtype, [2, BM, BK], a_sl)
        b_smem = gl.allocate_shared_memory(dtype, [2, BK, BN], b_sl)
        r, ck = block_offsets(off_m, 0, BM, BK, NW)
        rk, c = block_offsets(0, off_n, BK, BN, NW)
        x = gl.load(a + r * stride_am + ck * stride_ak, mask=(r < M) & (ck < K), other=0.0)
        y = gl.load(b + rk * stride_bk + c * stride_bn, mask=(rk < K) & (c < N), other=0.0)
        acc = warpgroup_mma_init(gl.zeros([BM, BN], gl.float32, layout=acc_layout))
        buf = 0
        for k0 in range(0, K, BK):
            # retire the wgmma two steps back (its buffer is stored next), keep the last one in flight
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            a_smem.index(buf).store(x)
            b_smem.index(buf).store(y)
            fence_async_shared()  # the stores (generic proxy) before wgmma reads them (async proxy)
            k1 = k0 + BK  # the next step's blocks, in flight during this step's wgmma
            x = gl.load(a + r * stride_am + (k1 + ck) * stride_ak, mask=(r < M) & (k1 + ck < K), other=0.0)
            y = gl.load(b + (k1 + rk) * stride_bk + c * stride_bn, mask=(k1 + rk < K) & (c < N), other=0.0)
            acc = warpgroup_mma(a_smem.index(buf), b_smem.index(buf), acc, is_async=True)
            buf = 1 - buf
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        return gl.convert_layout(acc, layout)

    @gluon.jit
    def matmul_tile(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NW: gl.constexpr,
                    MMA: gl.constexpr = "mma_v2"):
        """``a[off_m:+BM, :K] @ b[:K, off_n:+BN]`` in fp32 (zeros outside ``[M, N]``), in
        :func:`rows_layout`; ``a``, ``b``: pointers. fp32 exactly (FMA); 16-bit inputs on the
        tensor cores: ``MMA="wgmma"`` (Hopper, ``IRIS_FW_GLUON_MMA=wgmma``) by :func:`_wgmma_tile` where
        the block fits (:func:`wgmma_fits`), else ``mma_v2``."""
        layout: gl.constexpr = rows_layout(NW)
        if a.dtype.element_ty == gl.float32:
            r, ck = block_offsets(off_m, 0, BM, BK, NW)
            rk, c = block_offsets(0, off_n, BK, BN, NW)
            acc = gl.zeros([BM, BN], gl.float32, layout=layout)
            for k0 in range(0, K, BK):
                x = gl.load(a + r * stride_am + (k0 + ck) * stride_ak, mask=(r < M) & (k0 + ck < K), other=0.0)
                y = gl.load(b + (k0 + rk) * stride_bk + c * stride_bn, mask=(k0 + rk < K) & (c < N), other=0.0)
                acc = gl.dot_fma(gl.convert_layout(x, gl.DotOperandLayout(0, layout, 0)),
                                 gl.convert_layout(y, gl.DotOperandLayout(1, layout, 0)), acc)
            out = acc
        elif MMA == "wgmma" and wgmma_fits(BM, NW):
            out = _wgmma_tile(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BM, BN, BK, NW)
        else:
            r, ck = block_offsets(off_m, 0, BM, BK, NW)
            rk, c = block_offsets(0, off_n, BK, BN, NW)
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
