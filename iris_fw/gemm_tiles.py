"""Device-side tile helpers shared by the GEMM-based patterns: tile ordering, block loads
that take either a TMA tensor descriptor or a pointer, and the K loop of one output tile.

A leaf module like :mod:`iris_fw.device` (Triton only), so plugins import it freely.

Operands are passed as ``src`` plus a constexpr ``DESC``: with ``DESC`` true, ``src`` is a
:class:`triton.tools.tensor_descriptor.TensorDescriptor` (TMA on Hopper; out-of-bounds rows and
columns read as zero); otherwise ``src`` is a pointer to a row-major matrix with the given
strides and loads are masked. Hosts choose descriptors where the strides allow them (16-byte
aligned rows) and pointers elsewhere (ragged K, remote rows).
"""

import triton
import triton.language as tl


@triton.constexpr_function
def _widen_bf16():
    """Whether :func:`dot` widens bfloat16 operands to fp32: under Triton's interpreter (3.6 and
    3.9), whose ``tl.dot`` multiplies bf16 operands wrongly (results off by ~1e10; float16 and
    float32 are right). Decided when a kernel is compiled or interpreted, not at import: Triton's
    own reading of ``TRITON_INTERPRET`` (the one switch, :mod:`iris_fw.interpreter`), as
    :func:`iris_fw.device.check_pointers` asks it; compiled kernels see false, so their code has
    no widening. (A constexpr function may reference only Triton and jit functions, hence
    ``triton.knobs`` rather than :func:`~iris_fw.interpreter.interpreting`.)"""
    return triton.knobs.runtime.interpret


@triton.jit
def dot(x, y, acc, EXACT: tl.constexpr):
    """``tl.dot(x, y, acc)``; ``EXACT``: fp32 inputs multiplied exactly ("ieee"), else with
    tf32 (16-bit inputs are exact either way). Interpreted, bf16 inputs are widened to fp32
    first (:func:`_widen_bf16`). A flag rather than the precision string: Triton 3.6 does not
    pass a string taken from a constexpr tuple on to a nested call."""
    if _widen_bf16() and x.dtype == tl.bfloat16:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    if EXACT:
        out = tl.dot(x, y, acc, input_precision="ieee")
    else:
        out = tl.dot(x, y, acc)
    return out


@triton.jit
def xcd_program(pid, programs, XCDS: tl.constexpr):
    """Program ``pid`` of ``programs`` renumbered chiplet by chiplet: a GPU that deals
    consecutive programs out round-robin to ``XCDS`` chiplets, each with its own L2 (AMD
    Instinct MI300X / MI355X: 8 XCDs), runs program ``pid`` on chiplet ``pid % XCDS``; here
    chiplet ``c``'s programs get consecutive numbers, after those of chiplets ``0 … c-1``, so
    consecutive logical numbers share one L2. A bijection of ``[0, programs)`` for every
    ``programs`` (when ``programs % XCDS`` is not 0, the first ``programs % XCDS`` chiplets hold
    one program more); ``XCDS`` 1: ``pid`` itself."""
    out = pid
    if XCDS > 1:
        xcd = pid % XCDS
        per = programs // XCDS
        out = xcd * per + tl.minimum(xcd, programs % XCDS) + pid // XCDS
    return out


@triton.jit
def xcd_item(item, items, PROGRAMS: tl.constexpr, XCDS: tl.constexpr):
    """Item ``item`` of a persistent loop over ``items`` items by ``PROGRAMS`` programs (item
    ``i`` runs on program ``i % PROGRAMS``, in wave ``i // PROGRAMS``) renumbered by
    :func:`xcd_program` within its wave (the last wave: over the programs it has), so that in
    every wave the items one chiplet runs are consecutive. A bijection of ``[0, items)``: a
    pure function of the item, so every kernel of a pattern maps a tile alike whatever its
    own program count (a different count costs locality, never correctness). ``XCDS`` 1:
    ``item`` itself."""
    out = item
    if XCDS > 1:
        first = item // PROGRAMS * PROGRAMS
        out = first + xcd_program(item - first, tl.minimum(items - first, PROGRAMS), XCDS)
    return out


@triton.jit
def grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr, XCDS: tl.constexpr = 1, PROGRAMS: tl.constexpr = 1):
    """``(pm, pn)`` of linear ``tile`` in a ``tiles_m x tiles_n`` grid visited in groups of
    ``GROUP_M`` tile rows (consecutive tiles share ``B`` columns and ``A`` rows in L2). With
    ``XCDS`` > 1 the tile number is first renumbered chiplet by chiplet (:func:`xcd_item` over
    waves of ``PROGRAMS`` programs), so the tiles each chiplet runs at once are consecutive in
    that order and share the chiplet's L2; ``XCDS`` 1 (the default): no renumbering."""
    tile = xcd_item(tile, tiles_m * tiles_n, PROGRAMS, XCDS)
    width = GROUP_M * tiles_n
    group = tile // width
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (tile % width) % size_m
    pn = (tile % width) // size_m
    return pm, pn


@triton.jit
def rotated_tile(tile, tiles_m, tiles_n, shift, GROUP_M: tl.constexpr, XCDS: tl.constexpr = 1,
                 PROGRAMS: tl.constexpr = 1):
    """Like :func:`grouped_tile`, with tile rows rotated by ``shift``: returns
    ``(row sequence number, pm, pn)`` where row ``seq`` of the visit order is tile row
    ``(seq + shift) % tiles_m`` (patterns start each rank on a different row block)."""
    seq, pn = grouped_tile(tile, tiles_m, tiles_n, GROUP_M, XCDS, PROGRAMS)
    return seq, (seq + shift) % tiles_m, pn


@triton.jit
def load_block(src, row0, col0, rows, cols, stride_r, stride_c, BR: tl.constexpr, BC: tl.constexpr, DESC: tl.constexpr):
    """The ``[BR, BC]`` block at ``(row0, col0)`` of a ``[rows, cols]`` matrix; zeros outside."""
    if DESC:
        block = src.load([row0, col0])
    else:
        r = row0 + tl.arange(0, BR)
        c = col0 + tl.arange(0, BC)
        block = tl.load(src + r[:, None] * stride_r + c[None, :] * stride_c,
                        mask=(r[:, None] < rows) & (c[None, :] < cols), other=0.0)
    return block


@triton.jit
def matmul_tile(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                A_DESC: tl.constexpr, B_DESC: tl.constexpr, EXACT: tl.constexpr):
    """The fp32 ``[BM, BN]`` tile at ``(off_m, off_n)`` of ``a[M, K] @ b[K, N]``."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        x = load_block(a, off_m, k * BK, M, K, stride_am, stride_ak, BM, BK, A_DESC)
        y = load_block(b, k * BK, off_n, K, N, stride_bk, stride_bn, BK, BN, B_DESC)
        acc = dot(x, y, acc, EXACT)
    return acc


@triton.jit
def matmul_tile_k(a, b, off_m, off_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, k_first, k_last,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  A_DESC: tl.constexpr, B_DESC: tl.constexpr, EXACT: tl.constexpr):
    """Like :func:`matmul_tile` over the ``BK`` steps ``k_first … k_last - 1`` of K only (a
    split-K range; an empty range gives zeros)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k_first, k_last):
        x = load_block(a, off_m, k * BK, M, K, stride_am, stride_ak, BM, BK, A_DESC)
        y = load_block(b, k * BK, off_n, K, N, stride_bk, stride_bn, BK, BN, B_DESC)
        acc = dot(x, y, acc, EXACT)
    return acc


@triton.jit
def matmul_tile_rows(a_rows, b, off_n, N, K, stride_ak, stride_bk, stride_bn, row_ok,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     B_DESC: tl.constexpr, EXACT: tl.constexpr):
    """Like :func:`matmul_tile`, but ``a_rows`` is a ``[BM, 1]`` block of row pointers (each row
    may live on another rank's heap) and ``row_ok`` a ``[BM, 1]`` mask of valid rows."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        c = k * BK + tl.arange(0, BK)
        x = tl.load(a_rows + c[None, :] * stride_ak, mask=row_ok & (c[None, :] < K), other=0.0)
        y = load_block(b, k * BK, off_n, K, N, stride_bk, stride_bn, BK, BN, B_DESC)
        acc = dot(x, y, acc, EXACT)
    return acc


@triton.jit
def store_block(dst, value, row0, col0, rows, cols, stride_r, stride_c, BR: tl.constexpr, BC: tl.constexpr):
    """Store the ``[BR, BC]`` ``value`` at ``(row0, col0)`` of a ``[rows, cols]`` matrix at
    ``dst`` (cast to its dtype), masked to the matrix."""
    r = row0 + tl.arange(0, BR)
    c = col0 + tl.arange(0, BC)
    tl.store(dst + r[:, None] * stride_r + c[None, :] * stride_c, value.to(dst.dtype.element_ty),
             mask=(r[:, None] < rows) & (c[None, :] < cols))


@triton.jit
def store_tile(dst, value, row0, col0, rows, cols, stride_r, stride_c, BR: tl.constexpr, BC: tl.constexpr,
               DESC: tl.constexpr, SUBTILE: tl.constexpr = 1):
    """Store the fp32 ``[BR, BC]`` ``value`` at ``(row0, col0)`` of a ``[rows, cols]`` matrix,
    cast to its dtype: ``DESC`` true, ``dst`` is a tensor descriptor of ``[BR, BC // SUBTILE]``
    blocks (a TMA store on Hopper: asynchronous, clipped to the matrix) and the tile goes out in
    ``SUBTILE`` (1, 2 or 4) column pieces, so the staging buffer in shared memory is a piece, not
    the tile; otherwise a masked pointer store (:func:`store_block`)."""
    if DESC:
        if SUBTILE == 1:
            dst.store([row0, col0], value.to(dst.dtype))
        else:
            halves = tl.permute(tl.reshape(value, (BR, 2, BC // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            if SUBTILE == 2:
                dst.store([row0, col0], left.to(dst.dtype))
                dst.store([row0, col0 + BC // 2], right.to(dst.dtype))
            else:
                q0, q1 = tl.split(tl.permute(tl.reshape(left, (BR, 2, BC // 4)), (0, 2, 1)))
                dst.store([row0, col0], q0.to(dst.dtype))
                dst.store([row0, col0 + BC // 4], q1.to(dst.dtype))
                q2, q3 = tl.split(tl.permute(tl.reshape(right, (BR, 2, BC // 4)), (0, 2, 1)))
                dst.store([row0, col0 + BC // 2], q2.to(dst.dtype))
                dst.store([row0, col0 + 3 * (BC // 4)], q3.to(dst.dtype))
    else:
        store_block(dst, value, row0, col0, rows, cols, stride_r, stride_c, BR, BC)
