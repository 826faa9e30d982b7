"""iris_fw.flash_decode: distributed decode attention against a float64 reference.

Every rank draws the whole problem from a seed agreed per call (so each rank can build the
float64 reference of the full sequence itself): ``q`` shared, each rank's K/V slice of its own
length — uneven, one rank with an empty slice —, ``kv_lens`` with zeros (and, at batch >= 3, a
sequence with no token on any rank: zeros out). Several calls run back to back with fresh
inputs and no host synchronization, the first into a NaN-poisoned ``out``; every call's output
is checked against float64 and is bitwise the same on every rank. The slices grow from call
to call (a decode loop): later calls reuse the validated plan; half the cases read K/V through
views of a larger (NaN-filled) cache; some runs read a paged cache (pages in random order
among NaN-filled spares, through a block table). GQA ratios 1, 4, 8; head dims
16, 24, 64, 128 with ``Dv != D``; fp16, bf16, fp32; both schedulers; worlds 1-4. Mismatched
arguments raise on every rank. On GPUs the sizes grow and a CUDA graph is replayed with fresh
inputs.
"""

import math

import pytest
import torch
import triton
import triton.language as tl

import iris_fw
from helpers import COMPILE_TARGETS, capture_graph, compile_in_child, compile_kernel, fresh_seed, on_worlds
from iris_fw import callpath, ccl
from iris_fw.errors import ArgumentError
from iris_fw.flash_decode import (DecodeAlgorithm, FlashDecode, combine_partials, flash_decode, flash_decode_reference,
                                  plan, schedulers)
from iris_fw.hookspecs import hookimpl
from iris_fw.registry import load_registries, plugin_manager
from iris_fw.engine.contract import CollectiveMismatch
from iris_fw.flash_decode_kernels import _LOG2E, _SLOT_GROUP, LOG2E, _combine_partials

EPS = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10}
SCHEDULERS = ("fused", "bulk_sync")

#: (B, Hq, Hkv, D, Dv, dtype, kv_lens given): GQA 4 / 8 / 1 / 4, odd head dims, Dv != D.
CASES = [
    (2, 8, 2, 16, 16, torch.float16, False),
    (1, 8, 1, 24, 40, torch.bfloat16, True),
    (3, 2, 2, 64, 32, torch.float32, True),
    (1, 4, 1, 128, 128, torch.bfloat16, False),
]


def _slices(ctx, case_index: int, call: int) -> list[int]:
    """Every rank's S_r: uneven, rank 1 empty for even cases; on GPUs thousands of tokens.
    Grows by one token per call (a decode loop)."""
    w = ctx.world_size
    base = [45, 0, 29, 13] if case_index % 2 == 0 else [20, 33, 7, 50]
    if ctx.device.type != "cpu":
        base = [4093, 0, 2500, 1031] if case_index % 2 == 0 else [1500, 3001, 257, 4096]
    return [base[r % 4] + call for r in range(w)]


def _draw(ctx, case, case_index, seed, calls, gpu_scale=True):
    """``calls`` dicts of the whole problem, on the CPU: q, every rank's k, v and kv_lens."""
    batch, hq, hkv, d, dv, dtype, lens = case
    if ctx.device.type != "cpu" and gpu_scale:
        batch = batch + 2
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(calls):
        slices = _slices(ctx, case_index, i)
        q = torch.randn(batch, hq, d, generator=g).to(dtype)
        ks = [torch.randn(batch, s, hkv, d, generator=g).to(dtype) for s in slices]
        vs = [(2 * torch.randn(batch, s, hkv, dv, generator=g)).to(dtype) for s in slices]
        kv_lens = None
        if lens:
            kv_lens = []
            for s in slices:
                n = torch.randint(0, s + 1, (batch,), generator=g)
                n[torch.rand(batch, generator=g) < 0.25] = 0
                if batch >= 3:
                    n[1] = 0  # a sequence without a token anywhere
                kv_lens.append(n.to(torch.int32))
        out.append({"q": q, "ks": ks, "vs": vs, "kv_lens": kv_lens})
    return out


def check(ctx, got, data, sm_scale, what):
    """``got`` against the float64 reference. Bound: the output's rounding to its dtype, and
    for 16-bit inputs the probabilities' rounding before the P·V product (as every flash
    attention): a few ulps of the dtype times the largest |v|. A float32 output also carries
    the float32 computation's own error (the GPU's approximate ``exp2``, sums over up to S
    tokens in the kernel's order), which 2 ulps did not cover on an H100 (one element of 320 off
    by 4.3e-6, run 41): 32 ulps there. Every rank's result bitwise equal."""
    from iris_fw.flash_decode import flash_decode_reference

    want = flash_decode_reference(data["q"], data["ks"], data["vs"], data["kv_lens"], sm_scale)
    vmax = max([float(v.abs().max()) for v in data["vs"] if v.numel()] or [0.0])
    eps = EPS[got.dtype]
    err = (got.cpu().double() - want).abs()
    tol = (32 if got.dtype == torch.float32 else 2) * eps * (want.abs() + vmax) + 1e-6
    bad = ~(err <= tol)
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {bad.numel()} wrong, max error "
                                 f"{float(err.nan_to_num(float('inf')).max()):.3g}, e.g. at {bad.nonzero()[0].tolist()}")
    gathered = ctx.bootstrap.all_gather(got.cpu().contiguous().view(torch.uint8).clone())
    assert all(torch.equal(x, gathered[0]) for x in gathered), f"{what}: ranks' outputs differ"


def _strided(t, idx):
    """Cases 1-3 read K/V through a view of a larger cache (tokens and heads around it): odd ones
    a token-major cache (``[B, S, Hkv, D]``), case 2 (two kv heads) a head-major one (``[B, Hkv,
    S, D]``, SDPA's layout, viewed as ``[B, S, Hkv, D]``: a head's stride is the cache's S·D)."""
    if idx % 4 == 0:
        return t
    b, s, h, d = t.shape
    if idx % 4 == 2:
        big = torch.full((b, h + 1, s + 3, d), float("nan"), dtype=t.dtype, device=t.device)
        big[:, 1:, 2:2 + s].copy_(t.transpose(1, 2))
        return big[:, 1:, 2:2 + s].transpose(1, 2)
    big = torch.full((b, s + 3, h + 1, d), float("nan"), dtype=t.dtype, device=t.device)
    big[:, 2:2 + s, 1:].copy_(t)
    return big[:, 2:2 + s, 1:]


def paged(k, v, kv_lens, page_size, seed):
    """A paged copy of one rank's slices ``k [B, S, Hkv, D]``, ``v``: ``(k_cache [pages,
    page_size, Hkv, D], v_cache, block_table [B, cdiv(S, page_size)] int32, kv_lens)``, pages in
    random order among spare NaN-filled ones; ``kv_lens`` (default all S) marks the tail of the
    last page invalid."""
    b, s, h, _ = k.shape
    per = -(-s // page_size)
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(b * per + 3, generator=g)[:b * per].view(b, per).to(torch.int32)
    caches = []
    for t in (k, v):
        cache = torch.full((b * per + 3, page_size, h, t.shape[3]), float("nan"), dtype=t.dtype, device=t.device)
        for i in range(b):
            for j in range(per):
                n = min(page_size, s - j * page_size)
                cache[int(table[i, j]), :n] = t[i, j * page_size:j * page_size + n]
        caches.append(cache)
    if kv_lens is None:
        kv_lens = torch.full((b,), s, dtype=torch.int32)
    return caches[0], caches[1], table.to(k.device), kv_lens.to(k.device)


def _decode_rank(ctx, runs, calls=2, scales=(None, 0.3)):
    """``runs``: ``(scheduler, case index, paged)``, each ``calls`` calls back to back;
    ``scales``: the ``sm_scale`` of even and odd cases (part of the cached call's key)."""
    from iris_fw.flash_decode import flash_decode

    done = []
    for scheduler, idx, is_paged in runs:
        case = CASES[idx]
        data = _draw(ctx, case, idx, fresh_seed(ctx), calls)
        dev, r = ctx.device, ctx.rank
        sm_scale = scales[idx % 2]
        args = []
        for i, d in enumerate(data):
            k, v = d["ks"][r].to(dev), d["vs"][r].to(dev)
            kv_lens = None if d["kv_lens"] is None else d["kv_lens"][r].to(dev)
            if is_paged:
                k, v, table, kv_lens = paged(k, v, kv_lens, 8 if dev.type == "cpu" else 16, 1000 * idx + i)
                args.append((d["q"].to(dev), k, v, kv_lens, table))
            else:
                args.append((d["q"].to(dev), _strided(k, idx), _strided(v, idx), kv_lens, None))
        outs = []
        for i, (q, k, v, kv_lens, table) in enumerate(args):  # back to back: only the device orders them
            out = None
            if i == 0:
                out = torch.full((q.shape[0], q.shape[1], v.shape[3]), float("nan"), dtype=q.dtype, device=dev)
            got = flash_decode(q, k, v, kv_lens=kv_lens, sm_scale=sm_scale, out=out, scheduler=scheduler,
                               block_table=table)
            assert out is None or got is out
            outs.append(got)
            if i == 0:
                prepared = len(callpath.state(ctx).groups[None].calls)
        assert len(callpath.state(ctx).groups[None].calls) == prepared, "a growing S_r must not re-plan"
        ctx.synchronize()
        for i, got in enumerate(outs):
            check(ctx, got, data[i], sm_scale, f"{scheduler} case {idx} {case}{' paged' * is_paged} call {i}")
        done.append((scheduler, idx, is_paged))
    return done


#: CPU default run: (scheduler, case) pairs per world size — every case under both schedulers
#: somewhere, the interpreter's cost kept small; GPUs and ``-m extended`` run all of them.
_CPU_RUNS = {1: [("fused", 0, False), ("fused", 1, False), ("fused", 2, False), ("fused", 3, False),
                 ("bulk_sync", 1, False), ("fused", 2, True)],
             2: [("fused", 2, False), ("bulk_sync", 3, False), ("fused", 1, True)],
             3: [("fused", 1, False), ("bulk_sync", 2, False)],
             4: [("fused", 3, False), ("bulk_sync", 0, True)]}
_ALL_RUNS = [(s, i, p) for s in SCHEDULERS for i in range(len(CASES)) for p in (False, True)]


def test_flash_decode(world, on_gpu):
    """Two calls back to back per (scheduler, case, contiguous or paged KV): the first into a
    poisoned ``out``, the second on slices one token longer."""
    runs = _ALL_RUNS if on_gpu else _CPU_RUNS[world.world_size]
    assert world.run(_decode_rank, runs)[0] == runs


def _row_rank(ctx, runs, fields, scales):
    """:func:`_decode_rank` with every plan's row taking ``fields`` (the tuning table's row for
    the device, replaced), on ``scales`` no other test's call has (so its plans are made here,
    from the patched row)."""
    from dataclasses import replace

    from iris_fw import flash_decode as fd

    orig = fd.tuning
    # (the whole row: without the device row's by_units entries, which would override the fields)
    fd.tuning = lambda device, head_dim: replace(orig(device, head_dim), by_units=(), **fields)
    try:
        done = _decode_rank(ctx, runs, scales=scales)
        plans = [p for p in callpath.state(ctx).groups[None].calls.values() if isinstance(p, FlashDecode)]
    finally:
        fd.tuning = orig
    mine = [p for p in plans if p.call.sm_scale in scales]
    assert mine and all(getattr(p.tune, k) == v for p in mine for k, v in fields.items()), plans
    return done, sorted({p.n_split for p in mine})


#: (scheduler, case, paged) of the swapped products per world size: every case, both
#: schedulers, contiguous and paged KV across worlds 1-3 — and across 1-2 (W = 3 runs under
#: ``-m extended`` on CPU ranks: its cases are in theirs too).
_SWAPPED_RUNS = {1: [("fused", 0, False), ("bulk_sync", 1, True), ("fused", 2, False), ("fused", 3, False),
                     ("fused", 0, True)],
                 2: [("fused", 1, False), ("bulk_sync", 2, True), ("fused", 3, True), ("bulk_sync", 3, False)],
                 3: [("fused", 0, True), ("bulk_sync", 3, False)],
                 4: [("fused", 2, False)]}


@on_worlds(1, 2)
def test_flash_decode_swapped_products(world, on_gpu):
    """The tuning row's ``swap_ab`` (tokens on the MMA's M side) gives what the float64 reference
    gives: ragged slices (one empty), ``kv_lens`` with zeros, GQA 1/4/8, odd head dims with
    ``Dv != D``, fp16/bf16/fp32, paged and contiguous KV, both schedulers."""
    runs = list(dict.fromkeys(r for rs in _SWAPPED_RUNS.values() for r in rs)) if on_gpu else \
        _SWAPPED_RUNS[world.world_size]
    assert world.run(_row_rank, runs, {"swap_ab": True}, (0.21, 0.37))[0][0] == runs


#: One split per unit, per world size (both kernels' products, both schedulers, paged too).
_ONE_SPLIT_RUNS = {1: [("fused", 2, False), ("bulk_sync", 1, True)], 2: [("fused", 0, True), ("bulk_sync", 3, False)],
                   3: [("fused", 1, False)], 4: [("fused", 3, False)]}


@on_worlds(1, 2)  # (W = 3 under -m extended on CPU ranks)
@pytest.mark.parametrize("swap_ab", [False, True])
def test_flash_decode_one_split(world, on_gpu, swap_ab):
    """A row whose split cap is 1 (as large batches plan: one split per unit): the split's
    partial is the unit's, without the scratch, the counter and the splits' combine — right
    against float64 and bitwise the same on every rank."""
    runs = [r for rs in _ONE_SPLIT_RUNS.values() for r in rs] if on_gpu else _ONE_SPLIT_RUNS[world.world_size]
    scales = (0.23, 0.31) if swap_ab else (0.27, 0.33)  # (a plan of its own per row)
    done, splits = world.run(_row_rank, runs, {"max_splits": 1, "swap_ab": swap_ab}, scales)[0]
    assert done == runs and splits == [1]


def _layout_rank(ctx, scheduler):
    """A decode loop on one KV cache: ``k``/``v`` views of it one token longer per call, ``q``
    and ``kv_lens`` refilled in place, the output new (``out`` None) or given. Every call reuses
    the plan's one prepared launch for that operand layout (``seq`` and the output replaced),
    and every output is right."""
    from iris_fw.flash_decode import flash_decode, plan

    case = CASES[0]
    calls = 3
    data = _draw(ctx, case, 1, fresh_seed(ctx), calls)  # (slices of case 1: none empty)
    dev, r = ctx.device, ctx.rank
    last = data[-1]
    b, _, hkv, d = last["ks"][r].shape
    top = max(1, last["ks"][r].shape[1])
    k_cache = torch.full((b, top, hkv, d), float("nan"), dtype=case[5], device=dev)
    v_cache = torch.full((b, top, hkv, last["vs"][r].shape[3]), float("nan"), dtype=case[5], device=dev)
    q = torch.empty_like(last["q"], device=dev)
    outs, given = [], torch.empty(q.shape[0], q.shape[1], v_cache.shape[3], dtype=q.dtype, device=dev)
    for i, step in enumerate(data):
        n = step["ks"][r].shape[1]
        k_cache[:, :n].copy_(step["ks"][r])
        v_cache[:, :n].copy_(step["vs"][r])
        q.copy_(step["q"])
        got = flash_decode(q, k_cache[:, :n], v_cache[:, :n], scheduler=scheduler, out=given if i == 1 else None)
        ctx.synchronize()  # (the next step refills the cache and q in place)
        check(ctx, got, step, None, f"{scheduler} decode step {i}")
        outs.append(got)
    assert outs[1] is given and outs[0] is not outs[2]
    fd = plan(q, k_cache[:, :1], v_cache[:, :1], scheduler=scheduler)
    launches = fd._current()
    assert len(launches["prepared"]) == 1, launches["prepared"]
    return True


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_one_prepared_launch_per_operand_layout(iris_pool, scheduler):
    """A decode loop whose slices grow in one cache launches the plan's one prepared launch per
    call (``seq`` and the output given anew each call)."""
    assert all(iris_pool(2).run(_layout_rank, scheduler))


@pytest.mark.extended
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_flash_decode_all_cases(iris_pool, world_size):
    """Every case under both schedulers, contiguous and paged, at worlds 2-4, three calls each."""
    iris_pool(world_size).run(_decode_rank, _ALL_RUNS, calls=3)


def _many_heads_rank(ctx):
    """32 query heads on one kv head: more than a tile's rows (several head blocks per kv head);
    the auto scheduler; a subgroup of ranks; an empty batch."""
    from iris_fw import ccl
    from iris_fw.flash_decode import flash_decode

    case = (2, 32, 1, 16, 24, torch.float16, True)
    data = _draw(ctx, case, 0, fresh_seed(ctx), 1)[0]
    r, dev = ctx.rank, ctx.device
    got = flash_decode(data["q"].to(dev), data["ks"][r].to(dev), data["vs"][r].to(dev),
                       kv_lens=data["kv_lens"][r].to(dev))
    ctx.synchronize()
    check(ctx, got, data, None, "32 heads per kv head")
    # a group of ranks 0 and 2 of 3: the sequence is split over the group's members only
    group = ccl.new_group([0, 2])
    if r in (0, 2):
        part = {"q": data["q"], "ks": [data["ks"][0], data["ks"][2]], "vs": [data["vs"][0], data["vs"][2]],
                "kv_lens": [data["kv_lens"][0], data["kv_lens"][2]]}
        got = flash_decode(data["q"].to(dev), data["ks"][r].to(dev), data["vs"][r].to(dev),
                           kv_lens=data["kv_lens"][r].to(dev), group=group, scheduler="bulk_sync")
        ctx.synchronize()
        from iris_fw.flash_decode import flash_decode_reference

        want = flash_decode_reference(part["q"], part["ks"], part["vs"], part["kv_lens"])
        assert torch.allclose(got.cpu().double(), want, atol=4 * EPS[torch.float16] * 4, rtol=0), "subgroup"
    ccl.destroy_group(group)
    # an empty batch: nothing launched, on every rank alike
    for scheduler in SCHEDULERS:
        o = flash_decode(torch.zeros(0, 4, 16, device=dev), torch.zeros(0, 3, 2, 16, device=dev),
                         torch.zeros(0, 3, 2, 8, device=dev), scheduler=scheduler)
        assert o.shape == (0, 4, 8)


def test_many_heads_and_groups(iris_pool):
    iris_pool(3).run(_many_heads_rank)


# ---- bad input ------------------------------------------------------------------------------------


def _bad_rank(ctx, what):
    from iris_fw.flash_decode import flash_decode

    dev, r = ctx.device, ctx.rank
    b, hq, hkv, d = 2, 4, 2, 16
    dtype = torch.float16
    if what == "heads" and r == 1:
        hq = 8
    if what == "dtype" and r == 0:
        dtype = torch.bfloat16
    q = torch.randn(b, hq, d, device=dev).to(dtype)
    k = torch.randn(b, 5 + r, hkv, d, device=dev).to(dtype)
    v = torch.randn(b, 5 + r, hkv, d, device=dev).to(dtype)
    kwargs = {}
    if what == "scale":
        kwargs["sm_scale"] = 0.5 if r == 1 else None  # None: 1/sqrt(16) = 0.25
    if what == "scheduler":
        kwargs["scheduler"] = "bulk_sync" if r == 0 else "fused"
    if what == "unknown_scheduler":
        kwargs["scheduler"] = "fsued"
    if what == "lens" and r == 0:
        kwargs["kv_lens"] = torch.ones(b, dtype=torch.int32, device=dev)
    if what == "lens_dtype":
        kwargs["kv_lens"] = torch.ones(b, dtype=torch.int64, device=dev)
    if what == "head_dim" and r == 1:
        k = torch.randn(b, 5 + r, hkv, d + 1, device=dev).to(dtype)
    if what == "gqa":
        q = torch.randn(b, 3, d, device=dev).to(dtype)
    if what == "paged" and r == 0:
        kwargs["block_table"] = torch.zeros(b, 1, dtype=torch.int32, device=dev)
        kwargs["kv_lens"] = torch.ones(b, dtype=torch.int32, device=dev)
    if what == "paged" and r != 0:
        kwargs["kv_lens"] = torch.ones(b, dtype=torch.int32, device=dev)
    if what == "table_dtype":
        kwargs["block_table"] = torch.zeros(b, 1, dtype=torch.int64, device=dev)
    if what == "too_big":
        q, k, v = (torch.zeros(b, 2, 300, device=dev), torch.zeros(b, 1, 2, 300, device=dev),
                   torch.zeros(b, 1, 2, 300, device=dev))
    with pytest.raises((CollectiveMismatch, ValueError, TypeError)) as info:
        flash_decode(q, k, v, **kwargs)
    # the group still works afterwards
    q = torch.ones(1, 2, 16, device=dev)
    k = torch.ones(1, 3, 1, 16, device=dev)
    v = torch.full((1, 3, 1, 8), float(ctx.rank), device=dev)
    o = flash_decode(q, k, v)
    ctx.synchronize()
    want = sum(range(ctx.world_size)) / ctx.world_size
    assert torch.allclose(o.cpu(), torch.full((1, 2, 8), want)), o
    return str(info.value)


@pytest.mark.parametrize("what", ["heads", "dtype", "scale", "scheduler", "unknown_scheduler", "lens", "lens_dtype",
                                  "head_dim", "gqa", "too_big", "paged", "table_dtype"])
def test_bad_input_raises_everywhere(iris_pool, what):
    """A bad or mismatched argument on one rank (or all) raises on every rank, naming the ranks
    and the argument; no hang."""
    import time

    t0 = time.monotonic()
    msgs = iris_pool(2).run(_bad_rank, what)
    assert time.monotonic() - t0 < 60
    named = {"heads": "'query heads (q.shape[1])'", "dtype": "'dtype'", "scale": "'sm_scale'",
             "scheduler": "'scheduler'", "lens": "'kv_lens given'", "paged": "'page size (block_table given"}
    if what in named:
        assert all(named[what] in m and "ranks 0" in m and "ranks 1" in m for m in msgs), msgs
    if what == "lens_dtype":
        assert all("kv_lens must be an int32 tensor" in m for m in msgs), msgs
    if what == "head_dim":
        assert "k's head dim" in msgs[1] and "rank 1 rejected its arguments" in msgs[0], msgs
    if what == "gqa":
        assert all("multiple of the kv heads" in m for m in msgs), msgs
    if what == "too_big":
        assert all("head dim D must be in [1, 256]" in m for m in msgs), msgs
    if what == "table_dtype":
        assert all("block_table must be an int32 tensor" in m for m in msgs), msgs
    if what == "unknown_scheduler":  # the argument named, the registered flash-decode algorithms listed
        assert all("scheduler must be 'auto' or a registered flash-decode algorithm (" in m and "bulk_sync, fused" in m
                   and "'fsued'" in m for m in msgs), msgs


# ---- a third party's algorithm ----------------------------------------------------------------------

class _TorchCombine(DecodeAlgorithm):
    """A third party's flash-decode algorithm: the plan's local kernel, ccl's all-gather of the
    packed partials, the combine in torch."""

    name = "torch_combine"

    def setup(self, fd):
        fd.mine = torch.empty(fd.pack, dtype=torch.float32, device=fd.group.ctx.device)
        fd.gathered = torch.empty(fd.group.size * fd.pack, dtype=torch.float32, device=fd.group.ctx.device)

    def run(self, fd, launches, q, k, v, kv_lens, block_table, out):
        fd.launch(launches, "local", q, k, v, kv_lens, block_table, fd.mine)
        ccl.all_gather_into_tensor(fd.gathered, fd.mine, group=fd.group, ctx=fd.group.ctx)
        o, lse = fd.unpack(fd.gathered.view(fd.group.size, -1))
        out.copy_(combine_partials(o, lse))


class _DecodePlugin:
    """Registers :class:`_TorchCombine` through the hook a third party's entry point implements."""

    @hookimpl
    def iris_fw_register_algorithms(self, registry):
        registry.register(_TorchCombine(), "flash_decode.torch_combine")


def _plugin_rank(ctx):
    pm = plugin_manager()  # the installed plugins (the built-ins' entry points) and this one
    pm.register(_DecodePlugin(), name="my-decode-plugin")
    regs = load_registries(pm)
    assert regs.algorithm.entry("flash_decode.torch_combine").provider == "plugin 'my-decode-plugin'"
    with iris_fw.init(heap_size=16 << 20, registries=regs, transport="host_shm") as mine:
        w, r, dev = mine.world_size, mine.rank, mine.device
        assert {"fused", "bulk_sync", "torch_combine"} <= set(schedulers(mine)), schedulers(mine)
        g = torch.Generator().manual_seed(fresh_seed(mine))
        q = torch.randn(2, 4, 16, generator=g)
        ks = [torch.randn(2, 5 + p, 2, 16, generator=g) for p in range(w)]
        vs = [torch.randn(2, 5 + p, 2, 8, generator=g) for p in range(w)]
        want = flash_decode_reference(q, ks, vs)
        for call in range(2):  # planned, then the cached plan
            out = torch.full((2, 4, 8), float("nan"), device=dev)
            got = flash_decode(q.to(dev), ks[r].to(dev), vs[r].to(dev), scheduler="torch_combine", out=out, ctx=mine)
            mine.synchronize()
            assert got is out and torch.allclose(got.double().cpu(), want, atol=1e-5), (call, got, want)
        fd = plan(q.to(dev), ks[r].to(dev), vs[r].to(dev), scheduler="torch_combine", ctx=mine)
        assert isinstance(fd, FlashDecode) and isinstance(fd.algorithm, _TorchCombine), fd
        with pytest.raises(ArgumentError, match="bulk_sync, fused, torch_combine"):
            flash_decode(q.to(dev), ks[r].to(dev), vs[r].to(dev), scheduler="torch_combin", ctx=mine)
        mine.barrier()
    return True


def test_a_plugins_algorithm_runs_as_a_scheduler(iris_pool, on_gpu):
    """A flash-decode algorithm registered by a plugin (a :class:`DecodeAlgorithm` through the
    ``iris_fw_register_algorithms`` hook, as a third party's entry point would) is listed by
    ``schedulers()``, runs as ``scheduler=its name`` on 2 CPU ranks (right against float64, into
    a poisoned ``out``, its plan cached), and is named among the choices when a call names an
    unregistered one. (In the test pool's ranks: a context of its own made with the plugin's
    registries.)"""
    if on_gpu:
        pytest.skip("CPU ranks (the GPU runs cover the built-in algorithms)")
    assert iris_pool(2).run(_plugin_rank) == [True, True]


# ---- torch.compile ---------------------------------------------------------------------------------


def _decode_step_rank(ctx):
    """One attention-decode step of a model whose KV cache is split by sequence over the ranks:
    q projection (replicated) -> ``iris_fw::flash_decode`` -> o projection row-parallel over the
    heads (each rank its share) -> ``iris_fw::all_reduce`` + residual; compiled with
    ``fullgraph=True`` against a float64 reference of the unsplit model."""
    import iris_fw.torch_ops  # noqa: F401  (registers torch.ops.iris_fw.*)
    from iris_fw.flash_decode import flash_decode_reference

    torch._dynamo.reset()
    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    batch, hidden, hq, hkv, d = 3, 64, 4, 2, 16
    g = torch.Generator().manual_seed(fresh_seed(ctx))
    wq = torch.randn(hidden, hq * d, generator=g) / hidden ** 0.5
    wo = torch.randn(hq * d, hidden, generator=g) / (hq * d) ** 0.5
    x = torch.randn(batch, hidden, generator=g)
    ks = [torch.randn(batch, s, hkv, d, generator=g) for s in _slices(ctx, 0, 0)]
    vs = [torch.randn(batch, s, hkv, d, generator=g) for s in _slices(ctx, 0, 0)]
    lens = [torch.randint(0, s + 1, (batch,), generator=g).to(torch.int32) for s in _slices(ctx, 0, 0)]
    heads = hq // w if hq % w == 0 else hq
    mine = slice(r * heads, (r + 1) * heads) if heads < hq else slice(0, hq)
    wq_d, wo_d = wq.to(dev), wo[mine.start * d:mine.stop * d].contiguous().to(dev)
    k_d, v_d, lens_d = ks[r].to(dev), vs[r].to(dev), lens[r].to(dev)

    def step(x):
        q = (x @ wq_d).view(batch, hq, d)
        o = torch.ops.iris_fw.flash_decode(q, k_d, v_d, lens_d, None, "auto", None)
        part = o[:, mine].reshape(batch, -1) @ wo_d
        if heads < hq:
            return torch.ops.iris_fw.all_reduce(part, "sum", [], "auto") + x
        return part + x

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q64 = (x.double() @ wq.double()).view(batch, hq, d)
    o64 = flash_decode_reference(q64, ks, vs, lens)
    want = o64.reshape(batch, -1) @ wo.double() + x.double()
    for _ in range(2):  # the second call runs the cached compiled graph
        got = compiled(x.to(dev))
        ctx.synchronize()
        assert torch.allclose(got.cpu().double(), want, rtol=1e-4, atol=1e-4), (got.cpu().double() - want).abs().max()
    eager = step(x.to(dev))
    ctx.synchronize()
    assert torch.allclose(eager.cpu(), got.cpu(), rtol=1e-5, atol=1e-5)


def test_decode_step_compiles(iris_pool):
    iris_pool(2).run(_decode_step_rank)


def test_fake_shape():
    """The fake implementation gives the shape without communication."""
    import iris_fw.torch_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = torch.empty(3, 8, 24), torch.empty(3, 100, 2, 24), torch.empty(3, 100, 2, 40)
        assert torch.ops.iris_fw.flash_decode(q, k, v, None, None, "auto", None).shape == (3, 8, 40)


# ---- the benchmark ------------------------------------------------------------------------------


def _bench_rank(ctx):
    from iris_fw.bench import BenchOptions
    from iris_fw.bench.flash_decode import FlashDecodeBench

    opts = BenchOptions(sizes=[4096], iters=1, warmup=0, quick=True, rotate_bytes=1 << 16, log=lambda msg: None)
    return FlashDecodeBench().run(ctx, opts)


def test_bench_rows(iris_pool, on_gpu):
    """``iris-fw bench flash_decode``'s plugin on one CPU rank (the full run on 1 and 2 GPUs is
    scripts/gpu_flash_decode.sh): a checked, timed row per method, the baseline skipped with a
    reason."""
    if on_gpu:
        pytest.skip("the GPU run is scripts/gpu_flash_decode.sh")
    rows = iris_pool(1).run(_bench_rank)[0]
    timed = {r["method"]: r for r in rows if "eager_us" in r}
    assert set(timed) == {"fused", "bulk_sync", "local_kernel", "torch_sdpa_local"}, rows
    assert all(timed[m]["ok"] is True and timed[m]["max_err"] < 0.05 for m in ("fused", "bulk_sync")), rows
    assert timed["local_kernel"]["kv_TBps"] > 0 and timed["local_kernel"]["kv_bytes_per_rank"] > 0
    skipped = {r["method"]: r["skipped"] for r in rows if "skipped" in r}
    assert "NCCL" in skipped["bsp_nccl"], skipped


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------


def _cluster_rank(ctx, runs, scales):
    """:func:`_row_rank` with the unit's splits combined in a thread-block cluster (8 splits, one
    work item a program): the plans' cluster sizes beside the runs done."""
    from iris_fw.kernel_launcher import cluster_launch_supported

    fields = {"cluster_combine": True, "max_splits": 8, "programs_per_sm": 1, "items_per_program": 4}
    done, _ = _row_rank(ctx, runs, fields, scales)
    plans = [p for p in callpath.state(ctx).groups[None].calls.values()
             if isinstance(p, FlashDecode) and p.call.sm_scale in scales]
    return done, sorted({p.cluster for p in plans}), cluster_launch_supported(ctx.device)


@on_worlds(1, 2)
def test_flash_decode_cluster_combine(world, on_gpu):
    """The tuning row's ``cluster_combine``: on a GPU of compute capability 9.0+ the unit's 8
    splits run as one thread-block cluster and combine in distributed shared memory, right
    against float64 for every case, both schedulers, paged and contiguous KV, and bitwise the
    same on every rank; elsewhere (the CPU's interpreter) the plan keeps the counter combine and
    gives the same."""
    runs = list(dict.fromkeys(r for rs in _SWAPPED_RUNS.values() for r in rs)) if on_gpu else \
        _SWAPPED_RUNS[world.world_size]
    done, clusters, can = world.run(_cluster_rank, runs, (0.17, 0.29))[0]
    assert done == runs
    assert clusters == ([8] if can else [0]), (clusters, can)  # (every case: at most 6 units, 48 programs)


def _graph_rank(ctx, scheduler, is_paged, fields=None, sm_scale=None):
    """Captured once, replayed with fresh inputs; returns the (cluster size, programmatic
    dependent launch) of the plans made.
    ``fields``: the tuning row's fields replaced (e.g. the splits' combine in a thread-block
    cluster), on an ``sm_scale`` no other test's call has (so its plans are made here)."""
    if fields:
        from dataclasses import replace

        from iris_fw import flash_decode as fd

        orig = fd.tuning
        fd.tuning = lambda device, head_dim: replace(orig(device, head_dim), by_units=(), **fields)
        try:
            return _graph_rank(ctx, scheduler, is_paged, sm_scale=0.19 if is_paged else 0.13)
        finally:
            fd.tuning = orig
    from iris_fw.flash_decode import flash_decode

    case = (4, 32, 8, 128, 128, torch.bfloat16, True)
    dev, r = ctx.device, ctx.rank

    def inputs(data, seed):
        k, v = data["ks"][r].to(dev), data["vs"][r].to(dev)
        kv_lens = data["kv_lens"][r].to(dev)
        if is_paged:  # the same shapes every time: the same slices, pages shuffled anew
            return (data["q"].to(dev), *paged(k, v, kv_lens, 16, seed))
        return data["q"].to(dev), k, v, None, kv_lens

    q, k, v, table, kv_lens = inputs(_draw(ctx, case, 0, fresh_seed(ctx), 1, gpu_scale=False)[0], 0)
    reps = 3
    outs = [torch.empty(q.shape[0], q.shape[1], v.shape[3], dtype=q.dtype, device=dev) for _ in range(reps)]

    def step():
        for o in outs:
            flash_decode(q, k, v, kv_lens=kv_lens, out=o, scheduler=scheduler, block_table=table, sm_scale=sm_scale)

    graph = capture_graph(ctx, step)
    plans = [p for p in callpath.state(ctx).groups[None].calls.values() if isinstance(p, FlashDecode)]
    for rep in range(4):
        data = _draw(ctx, case, 0, fresh_seed(ctx), 1, gpu_scale=False)[0]
        for mine, new in zip((q, k, v, table, kv_lens), inputs(data, rep + 1)):
            if mine is not None:
                mine.copy_(new)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        ctx.synchronize()
        for i, o in enumerate(outs):
            check(ctx, o, data, sm_scale, f"graph {scheduler}{' paged' * is_paged} replay {rep} call {i}")
        ctx.barrier()
    scale = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else sm_scale
    return sorted({(p.cluster, p.constexprs["PDL"]) for p in plans
                   if p.call.scheduler == scheduler and p.call.sm_scale == scale})


#: The tuning row's fields of the cluster combine's graph replays: 2 splits a unit, one work item
#: a program (batch 4's 32 units: 64 programs in 32 clusters of 2, which an H100 or H200 holds).
_CLUSTER_ROW = {"cluster_combine": True, "max_splits": 2, "programs_per_sm": 1, "items_per_program": 4}


#: The tuning row's fields of the graph replays whose calls are programmatic dependent launches.
_PDL_ROW = {"pdl": True}


@pytest.mark.parametrize("scheduler,is_paged,row", [("fused", False, None), ("bulk_sync", False, None),
                                                    ("fused", True, None), ("fused", False, "cluster"),
                                                    ("bulk_sync", True, "cluster"), ("fused", False, "pdl"),
                                                    ("bulk_sync", True, "pdl"), ("bulk_sync", False, "pdl")])
def test_graph_replay(iris_pool, on_gpu, scheduler, is_paged, row):
    """Captured once (three calls), replayed with fresh q, k, v and kv_lens (and, paged, a new
    block table) in the same tensors: right every time (GPU only); ``row="cluster"``: with the
    unit's splits combined in a thread-block cluster (where the GPU holds the grid's clusters);
    ``"pdl"``: every call a programmatic dependent launch (where the GPU can), each starting
    while the call before it ends."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    from iris_fw.kernel_launcher import cluster_launch_supported, pdl_launch_supported

    fields = {"cluster": _CLUSTER_ROW, "pdl": _PDL_ROW, None: None}[row]
    got = iris_pool(2).run(_graph_rank, scheduler, is_paged, fields)
    dev = torch.device("cuda")
    clustered = row == "cluster" and cluster_launch_supported(dev)
    pdl = row == "pdl" and pdl_launch_supported(dev)
    assert all(g == [(2 if clustered else 0, pdl)] for g in got), got


# ---- the kernels compiled for NVIDIA and AMD targets (no GPU needed) -------------------------------

_COMPILE_JOBS = [  # (kernel, dtype, constexprs)
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 64, "MAX_SPLITS": 64, "HAS_LENS": True, "PAGE": 16,
                                      "FUSED": True, "EXACT": False}),
    ("_flash_decode_kernel", "fp32", {"HQ": 8, "HKV": 1, "D": 24, "DV": 40, "ROWS": 16, "BD": 32, "BDV": 64,
                                      "BLOCK_N": 32, "MAX_SPLITS": 4, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": False, "EXACT": True}),
    ("_combine_kernel", "bf16", {"HQ": 32, "HKV": 8, "DV": 128, "ROWS": 16, "BDV": 128}),
    # batch 1's row on the H100: the unit's 4 heads combined, all 16 splits' partials in one tile
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 64, "MAX_SPLITS": 16, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": False, "EXACT": False, "CROWS": 4, "COMBINE_UNROLL": 16}),
    # fused with the unit's 4 heads combined (the ranks' combine on 4 rows, a unit's one split's
    # tile on 16)
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 128, "MAX_SPLITS": 32, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": True, "EXACT": False, "CROWS": 4, "COMBINE_UNROLL": 32}),
    # the split's products swapped (tokens on the MMA's M side: wgmma on sm_90), fused and paged
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 64, "MAX_SPLITS": 64, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": True, "EXACT": False, "SWAP_AB": True}),
    ("_flash_decode_kernel", "fp16", {"HQ": 8, "HKV": 1, "D": 24, "DV": 40, "ROWS": 16, "BD": 32, "BDV": 64,
                                      "BLOCK_N": 32, "MAX_SPLITS": 4, "HAS_LENS": True, "PAGE": 16,
                                      "FUSED": False, "EXACT": False, "SWAP_AB": True}),
    ("_flash_decode_kernel", "fp32", {"HQ": 8, "HKV": 2, "D": 64, "DV": 32, "ROWS": 16, "BD": 64, "BDV": 32,
                                      "BLOCK_N": 64, "MAX_SPLITS": 8, "HAS_LENS": True, "PAGE": 0,
                                      "FUSED": True, "EXACT": True, "SWAP_AB": True}),
]


#: Jobs for NVIDIA targets only: the unit's splits combined in a thread-block cluster (inline PTX),
#: fused and local, the swapped products of the H200's batch-2 tile; a programmatic dependent
#: launch's grid-dependency calls.
_NVIDIA_JOBS = [
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 128, "MAX_SPLITS": 8, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": False, "EXACT": False, "SWAP_AB": True, "CROWS": 4, "CLUSTER": 8}),
    # a programmatic dependent launch (griddepcontrol), fused
    ("_flash_decode_kernel", "bf16", {"HQ": 32, "HKV": 8, "D": 128, "DV": 128, "ROWS": 16, "BD": 128, "BDV": 128,
                                      "BLOCK_N": 64, "MAX_SPLITS": 16, "HAS_LENS": False, "PAGE": 0,
                                      "FUSED": True, "EXACT": False, "SWAP_AB": True, "CROWS": 4, "PDL": True}),
    ("_flash_decode_kernel", "fp16", {"HQ": 8, "HKV": 1, "D": 24, "DV": 40, "ROWS": 16, "BD": 32, "BDV": 64,
                                      "BLOCK_N": 32, "MAX_SPLITS": 16, "HAS_LENS": True, "PAGE": 16,
                                      "FUSED": True, "EXACT": False, "CROWS": 8, "CLUSTER": 16}),
]


def _jobs(target_name):
    """The compile jobs of one target."""
    return _COMPILE_JOBS + (_NVIDIA_JOBS if COMPILE_TARGETS[target_name][0] == "cuda" else [])


def _compile_all(target_name):
    """Compile every job for one target; print a line per job (in a child process that set
    TRITON_INTERPRET=0 before importing Triton)."""
    from iris_fw import flash_decode_kernels as mod

    for name, elem, constexprs in _jobs(target_name):
        types = {"q": elem, "k": elem, "v": elem, "out": elem, "kv_lens": "i32", "partials": "fp32",
                 "partial_lse": "fp32", "mine": "fp32", "recv": "fp32", "gathered": "fp32", "unit_counters": "i64",
                 "slots": "i64", "epochs": "i64", "heap_bases": "i64"}
        types = {k: "*" + t for k, t in types.items()}
        types["block_table"] = "*i32"
        types["qk_scale"] = "fp32"
        compile_kernel(getattr(mod, name), target_name, constexprs, types, options={"num_warps": 4, "num_stages": 3})
        print("compiled", name, elem, flush=True)


@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.extended) if COMPILE_TARGETS[t][0] == "hip"
                                    else t for t in sorted(COMPILE_TARGETS)])
def test_kernels_compile(tmp_path, target):
    """Triton's interpreter accepts code the compilers reject: compile the kernels for sm_90 and
    (extended) gfx942 in a child process (Triton >= 3.9 builds AMD code without a GPU)."""
    compile_in_child(tmp_path, "test_flash_decode", "_compile_all", target, len(_jobs(target)))


def _by_units_rank(ctx):
    """A tuning row's ``by_units`` entry (more splits and another tile for few units; the
    products swapped and a register cap) changes the local kernel's split count, tile and
    variant, not its values; bad ``swap_ab`` / ``max_registers`` are refused."""
    from dataclasses import replace

    from iris_fw import flash_decode as fd

    g = torch.Generator().manual_seed(fresh_seed(ctx))
    dev = ctx.device
    q = torch.randn(1, 4, 16, generator=g).to(dev)
    k, v = (torch.randn(1, 77, 2, 16, generator=g).to(dev) for _ in range(2))  # 2 units
    plan = fd.plan(q, k, v, scheduler="bulk_sync", ctx=ctx)
    # (the device's row for this many units as the base, its products unswapped and uncapped)
    base = replace(plan.tune, swap_ab=False, max_registers=0)
    plan = fd.FlashDecode(plan.group, fd.DecodeCall(**plan.call.__dict__), base)
    tune = fd.Tuning(**{**base.__dict__, "by_units": [[plan.units, {"items_per_program": 4 * base.items_per_program,
                                                                    "max_splits": 4 * base.max_splits,
                                                                    "block_n": 2 * base.block_n}]]})
    more = fd.FlashDecode(plan.group, fd.DecodeCall(**plan.call.__dict__), tune)
    assert more.n_split > plan.n_split and more.tune.block_n == 2 * base.block_n, (more, plan)
    assert fd.FlashDecode(plan.group, fd.DecodeCall(**plan.call.__dict__),
                          fd.Tuning(**{**tune.__dict__, "by_units": [[plan.units - 1, {"block_n": 64}]]})
                          ).tune.block_n == base.block_n  # a bound that does not hold changes nothing
    # the lighter kernel as data: the products swapped and a register cap, for this many units
    light = fd.FlashDecode(plan.group, fd.DecodeCall(**plan.call.__dict__), fd.Tuning(
        **{**base.__dict__, "by_units": [[plan.units, {"swap_ab": True, "max_registers": 128}]]}))
    assert light.tune.swap_ab and light.constexprs["SWAP_AB"] and not plan.constexprs["SWAP_AB"]
    assert light.options.get("maxnreg") == (None if torch.version.hip else 128) and "maxnreg" not in plan.options
    o1, lse1 = (t.clone() for t in plan.unpack(plan.partial(q, k, v)))
    o2, lse2 = (t.clone() for t in plan.unpack(more.partial(q, k, v)))
    o3, lse3 = plan.unpack(light.partial(q, k, v))
    ctx.synchronize()
    for o, lse in ((o2, lse2), (o3, lse3)):
        assert torch.allclose(o1.cpu(), o.cpu(), atol=1e-5, rtol=1e-5)
        assert torch.allclose(lse1.cpu(), lse.cpu(), atol=1e-5)
    with pytest.raises(ValueError, match="by_units"):
        fd.Tuning(**{**base.__dict__, "by_units": [[4, {"max_rows": 32}]]})
    for bad in ({"swap_ab": 1}, {"max_registers": 8}, {"max_registers": 256}, {"max_registers": True},
                {"combine_unroll": 12}, {"combine_unroll": 0}, {"combine_unroll": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            fd.Tuning(**{**base.__dict__, **bad})
    return more.n_split


def test_tuning_by_units(iris_pool):
    iris_pool(1).run(_by_units_rank)


@triton.jit
def _combines_kernel(o_ptr, lse_ptr, out, out_lse, count, rows_valid, MAX_COUNT: tl.constexpr, GROUP: tl.constexpr,
                     DV: tl.constexpr, ROWS: tl.constexpr, BDV: tl.constexpr):
    """Two combines of ``count`` partials (``o [count, ROWS, DV]``, base-2 ``lse [count, ROWS]``)
    into ``out [2, ROWS, BDV]``, ``out_lse [2, ROWS]``: as a unit's splits (at most
    ``MAX_COUNT``, ``GROUP`` partials a tile), then as ranks' slots (unbounded, the kernels' slot
    group, natural-log ``lse`` after the base-2 ones)."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BDV)
    a, la = _combine_partials(o_ptr, lse_ptr, ROWS * DV, ROWS, count, rows_valid, 1.0, MAX_COUNT, GROUP, DV, ROWS,
                              BDV)
    b, lb = _combine_partials(o_ptr, lse_ptr + count * ROWS, ROWS * DV, ROWS, count, rows_valid, _LOG2E, 0,
                              _SLOT_GROUP, DV, ROWS, BDV)  # (a kernel reads globals only as constexprs)
    at = rows[:, None] * BDV + cols[None, :]
    tl.store(out + at, a)
    tl.store(out + ROWS * BDV + at, b)
    tl.store(out_lse + rows, la)
    tl.store(out_lse + ROWS + rows, lb)


def _combines_rank(ctx, count, rows_valid, rows, max_count, group):
    """:func:`_combine_partials` as a unit's splits and as the ranks' slots, on the same partials,
    against the float64 combine: the largest errors of each over the first ``rows_valid`` heads
    (heads without tokens checked exactly: ``o`` 0, ``lse`` -inf)."""
    dv = 24
    g = torch.Generator().manual_seed(count * 31 + rows_valid + fresh_seed(ctx))
    o = torch.randn(count, rows, dv, generator=g)
    lse = torch.randn(count, rows, generator=g) * 8
    lse[::3, 1] = float("-inf")  # splits without tokens
    lse[:, 2] = float("-inf")  # a head without any
    lse_both = torch.cat([lse, lse / LOG2E])  # base 2, then the same in natural-log units
    out = torch.full((2, rows, 32), float("nan"), device=ctx.device)
    out_lse = torch.full((2, rows), float("nan"), device=ctx.device)
    _combines_kernel[(1,)](o.to(ctx.device), lse_both.to(ctx.device), out, out_lse, count, rows_valid,
                           MAX_COUNT=max_count, GROUP=group, DV=dv, ROWS=rows, BDV=32)
    ctx.synchronize()
    out, out_lse = out.cpu()[:, :rows_valid].double(), out_lse.cpu()[:, :rows_valid].double()
    lse64 = lse[:, :rows_valid].double()
    empty = lse64.isinf().all(0)  # heads without tokens: o = 0, lse = -inf
    weights = torch.softmax(torch.where(empty, 0.0, lse64) * math.log(2), dim=0) * ~lse64.isinf()
    want = torch.einsum("sh,shd->hd", weights, o[:, :rows_valid].double())
    want_lse = torch.logsumexp(lse64 * math.log(2), dim=0) / math.log(2)  # base 2
    assert torch.equal(out[:, empty, :dv], torch.zeros_like(out[:, empty, :dv])), out[:, empty]
    assert bool((out_lse[:, empty] == float("-inf")).all()), out_lse[:, empty]
    full = ~empty
    return tuple(float((out[i, full, :dv] - want[full]).abs().max()) for i in (0, 1)) + tuple(
        float((out_lse[i, full] - want_lse[full]).abs().max()) for i in (0, 1))


@pytest.mark.parametrize("count,rows_valid,rows,max_count,group", [
    (1, 16, 16, 1, 8), (3, 5, 16, 4, 2), (8, 16, 16, 8, 8), (11, 9, 16, 16, 8), (11, 4, 4, 16, 16), (16, 3, 4, 16, 4),
    (5, 3, 4, 0, 2)])
def test_combine_partials_against_float64(iris_pool, count, rows_valid, rows, max_count, group):
    """The combine of partials (a unit's splits, the ranks' slots) is within fp32 rounding of
    the float64 combine: one pass (a group holds ``max_count``), two passes with the maximum from
    one tile or (``max_count`` 0, unbounded: as the slots) in groups, a partial last group (the
    tuning row's ``combine_unroll``), tiles of the unit's heads only, heads past
    ``rows_valid``, natural-log slots, partials and heads without tokens (these exactly 0 and
    ``-inf``)."""
    errors = iris_pool(1).run(_combines_rank, count, rows_valid, rows, max_count, group)[0]
    assert max(errors[:2]) < 1e-5 and max(errors[2:]) < 1e-5, errors


def test_resident_programs_arithmetic():
    """The residency guard's arithmetic (:func:`iris_fw.devinfo.resident_programs`) on an H100's
    SM (64K registers, 228 KiB shared memory, 2048 threads): registers are allotted per warp in
    units of 256, shared memory per program plus the driver's reserved KiB."""
    from iris_fw import devinfo

    h100 = devinfo.SMLimits(registers=65536, register_unit=256, shared_bytes=233472, shared_reserved=1024,
                            threads=2048, warp_size=32, programs=32)
    fit = devinfo.resident_programs
    assert fit(h100, 255, 4, 0) == 2  # 255 registers -> 256 a thread: 32K a program of 4 warps
    assert fit(h100, 255, 8, 0) == 1
    assert fit(h100, 128, 8, 0) == 2 and fit(h100, 129, 8, 0) == 1  # 129 -> 136 a thread
    assert fit(h100, 32, 4, 96 * 1024) == 2  # 2 x (96 + 1) KiB of 228
    assert fit(h100, 32, 4, 113 * 1024) == 2 and fit(h100, 32, 4, 114 * 1024) == 1
    assert fit(h100, 32, 4, 192 * 1024) == 1
    assert fit(h100, 32, 4, 240 * 1024) == 0  # not even one
    assert fit(h100, 16, 1, 0) == 32  # the program slots
    assert fit(h100, 16, 16, 0) == 4  # the threads (2048 / 512)


class _FakeCompiled:
    """A compiled kernel's description as :func:`iris_fw.kernel_launcher.compiled_resources` reads it."""

    def __init__(self, n_regs, num_warps, shared):
        from types import SimpleNamespace

        self.n_regs, self.metadata = n_regs, SimpleNamespace(num_warps=num_warps, shared=shared)

    def _init_handles(self):
        pass


def _residency_rank(ctx, resources):
    """A fused plan whose row asks for 2 programs per SM keeps them where the compiled kernel
    fits twice and plans again with 1 (fewer splits, fewer programs) where it does not; the
    local-only algorithm keeps the row. The compiled kernel is faked (CPU: nothing compiles)."""
    from iris_fw import devinfo
    from iris_fw import flash_decode as fd
    from iris_fw import kernel_launcher as kl

    h100 = devinfo.SMLimits(registers=65536, register_unit=256, shared_bytes=233472, shared_reserved=1024,
                            threads=2048, warp_size=32, programs=32)
    seen = []

    def compile_(self, *args):
        seen.append(dict(zip(self.runtime_params, args)) | self.constexprs)
        return _FakeCompiled(*resources)

    q = torch.zeros(1, 4, 16, device=ctx.device)
    k = torch.zeros(1, 64, 2, 16, device=ctx.device)
    base = fd.plan(q, k, k, scheduler="fused", ctx=ctx)
    tune = fd.Tuning(**{**base.tune.__dict__, "programs_per_sm": 2, "items_per_program": 1, "max_splits": 64,
                        "by_units": ()})
    orig = (devinfo.sm_limits, kl.KernelLauncher.compile)
    devinfo.sm_limits, kl.KernelLauncher.compile = (lambda device: h100), compile_
    try:
        call = fd.DecodeCall(**base.call.__dict__)
        fused = fd.FlashDecode(base.group, call, tune)
        local = fd.FlashDecode(base.group, fd.DecodeCall(**{**call.__dict__, "scheduler": "bulk_sync"}), tune)
    finally:
        devinfo.sm_limits, kl.KernelLauncher.compile = orig
    sms = devinfo.num_sms(ctx.device)
    assert local.tune.programs_per_sm == 2 and local.nprog == min(local.units * local.n_split, 2 * sms)
    compiled = [c for c in seen if c["FUSED"]]
    assert compiled and all(c["mine"] is None and c["out"] == q.dtype
                            and c["n_split"] in (fused.n_split, 2 * fused.n_split) for c in compiled), seen
    assert sorted(bool(c.get("TRACE")) for c in compiled) == [False, True]  # the traced variant checked too
    assert [c["trace"] is None for c in compiled] == [not c.get("TRACE") for c in compiled]
    return fused.tune.programs_per_sm, fused.n_split, fused.nprog, fused.units, sms, len(compiled)


def _cluster_guard_rank(ctx, max_clusters, scheduler, pps):
    """A plan whose row asks for the cluster combine, on a faked sm_90 GPU of 132 SMs (the
    compiled kernel, the driver's cluster count and the launches faked: the CPU compiles
    nothing and launches no clusters): what ``_fit_clusters`` keeps. ``max_clusters``: what the
    driver says fits (an exception: the driver refused)."""
    from iris_fw import devinfo, driver
    from iris_fw import flash_decode as fd
    from iris_fw import kernel_launcher as kl
    from iris_fw.errors import IrisError

    h100 = devinfo.SMLimits(registers=65536, register_unit=256, shared_bytes=233472, shared_reserved=1024,
                            threads=2048, warp_size=32, programs=32)
    compiled, asked = [], []

    class Calls:
        def max_active_clusters(self, function, cluster, threads, shared):
            asked.append((function, cluster, threads, shared))
            if isinstance(max_clusters, Exception):
                raise max_clusters
            return max_clusters

    def compile_(self, *args):
        compiled.append(dict(self.constexprs))
        fake = _FakeCompiled(128, 4, 100 * 1024)
        fake.function = 77
        return fake

    q = torch.zeros(2, 8, 16, device=ctx.device)
    k = torch.zeros(2, 64, 2, 16, device=ctx.device)
    base = fd.plan(q, k, k, scheduler=scheduler, ctx=ctx)
    tune = fd.Tuning(**{**base.tune.__dict__, "cluster_combine": True, "max_splits": 8, "items_per_program": 4,
                        "programs_per_sm": pps, "by_units": ()})
    saved = (fd.cluster_launch_supported, driver.cluster_calls, devinfo.sm_limits, devinfo.num_sms,
             kl.KernelLauncher.compile, fd.FlashDecode._launches)
    fd.cluster_launch_supported, driver.cluster_calls = (lambda device: True), (lambda: Calls())
    devinfo.sm_limits, devinfo.num_sms = (lambda device: h100), (lambda device: 132)
    kl.KernelLauncher.compile, fd.FlashDecode._launches = compile_, (lambda self, tracer: {})
    try:
        p = fd.FlashDecode(base.group, fd.DecodeCall(**base.call.__dict__), tune)
    finally:
        (fd.cluster_launch_supported, driver.cluster_calls, devinfo.sm_limits, devinfo.num_sms,
         kl.KernelLauncher.compile, fd.FlashDecode._launches) = saved
    assert all(a == (77, 8, 128, 100 * 1024 + fd.cluster_region_bytes(8, 4, 16)) for a in asked), asked
    return p.cluster, p.n_split, p.nprog, p.constexprs["CLUSTER"], p.options, compiled


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_cluster_guard(iris_pool, scheduler):
    """(:meth:`FlashDecode._fit_clusters`) 4 units of 8 splits (32 programs in clusters of 8):
    kept where the GPU holds 4 such clusters — the launch options carry the cluster and its
    shared memory, ``fused`` checked its kernel and its traced variant — and planned again with
    the counter where it holds 3, or where the driver refuses; a row of 2 programs per SM that
    loses its clusters has its residency checked again (the counter's variant)."""
    from iris_fw.errors import IrisError

    pool = iris_pool(1)
    cluster, splits, nprog, cx, options, compiled = pool.run(_cluster_guard_rank, 4, scheduler, 1)[0]
    assert (cluster, splits, nprog, cx) == (8, 8, 32, 8)
    assert options["cluster"] == 8 and options["cluster_shared"] == 8 * 4 * (16 + 1) * 4
    assert [bool(c.get("TRACE")) for c in compiled] == ([False, True] if scheduler == "fused" else [False])
    assert all(c["CLUSTER"] == 8 for c in compiled)
    for fits in (3, IrisError("refused")):
        cluster, splits, nprog, cx, options, _ = pool.run(_cluster_guard_rank, fits, scheduler, 1)[0]
        assert (cluster, cx, splits, nprog) == (0, 0, 8, 32) and "cluster" not in options
    if scheduler == "fused":  # 2 programs per SM: the counter's variant checked after the fallback
        *_, compiled = pool.run(_cluster_guard_rank, 3, scheduler, 2)[0]
        assert [c["CLUSTER"] for c in compiled if c["FUSED"]][-2:] == [0, 0], compiled


@pytest.mark.parametrize("regs,fits", [(255, True), (200, False)])
def test_residency_guard_caps_programs_per_sm(iris_pool, on_gpu, regs, fits):
    """(:meth:`FlashDecode._fit_residency`) 4 warps at 255 registers (32K a program) fit twice
    per SM: the row's 2 stand; 8 warps at 200 (51.2K) once: capped at 1, planned again (fewer
    splits and programs; one program per SM needs no check: the fused kernel and its traced
    variant compiled once each)."""
    warps = 4 if fits else 8
    pps, splits, nprog, units, sms, compiles = iris_pool(1).run(_residency_rank, (regs, warps, 1024))[0]
    # the grid fills the slots the units and the split cap allow: every slot on CPU ranks; on a
    # GPU (132 SMs) the 2 units' 64 splits leave some free
    if fits:
        assert (pps, nprog, compiles) == (2, min(units * splits, 2 * sms), 2), (pps, splits, nprog)
    else:  # capped at 1: planned again
        assert (pps, nprog, compiles) == (1, min(units * splits, sms), 2), (pps, splits, nprog)
    if not on_gpu:
        assert nprog == pps * sms


def _gpu_residency_rank(ctx):
    """On the GPU: fused plans asking for 2 programs per SM of 4 warps and 4 of 8 warps keep
    what the compiled kernel fits (8 warps x 4 do not: <= 64 registers a thread), and run right."""
    from iris_fw import devinfo
    from iris_fw import flash_decode as fd

    g = torch.Generator().manual_seed(fresh_seed(ctx))
    q = torch.randn(1, 32, 128, generator=g).to(ctx.device, torch.bfloat16)
    k, v = (torch.randn(1, 4096, 8, 128, generator=g).to(ctx.device, torch.bfloat16) for _ in range(2))
    want = fd.flash_decode_reference(q.cpu(), [k.cpu()], [v.cpu()])
    base = fd.plan(q, k, v, scheduler="fused", ctx=ctx)
    sms, kept = devinfo.num_sms(ctx.device), []
    for warps, pps in ((4, 2), (8, 4)):
        tune = fd.Tuning(**{**base.tune.__dict__, "block_n": 64, "num_warps": warps, "num_stages": 2,
                            "programs_per_sm": pps, "items_per_program": 4, "max_splits": 32, "by_units": ()})
        p = fd.FlashDecode(base.group, fd.DecodeCall(**base.call.__dict__), tune)
        got = p.tune.programs_per_sm
        assert got == 1 or p.programs_fitting({"FUSED": True}) >= got, (warps, pps, got)
        assert p.nprog <= sms * got
        out = p(q, k, v)
        ctx.synchronize()
        assert torch.allclose(out.cpu().double(), want, atol=2e-2, rtol=2e-2), (warps, pps, got)
        kept.append(got)
    assert kept[1] < 4, kept
    return kept


def test_residency_guard_on_gpu(iris_pool, on_gpu):
    """The residency guard against a compiled kernel (GPU only; the arithmetic: above)."""
    if not on_gpu:
        pytest.skip("compiled kernels need a GPU")
    iris_pool(1).run(_gpu_residency_rank)


@pytest.mark.extended
def test_tune_script_smoke(tmp_path):
    """scripts/tune_flash_decode.py (the GPU sweep behind the by_units rows) runs end to end on
    one CPU rank and writes a row the table accepts."""
    import json
    import os
    import subprocess
    import sys

    from iris_fw import flash_decode as fd

    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "tune_flash_decode.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = json.loads((tmp_path / "flash_decode_tuning_row.json").read_text())["row"]
    bound, cfg = row
    assert bound == 128 and fd.Tuning(**cfg)
    assert (tmp_path / "flash_decode_tune.jsonl").read_text().strip()
