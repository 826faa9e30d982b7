"""Iris conformance, device side: Iris's device functions (``iris.load`` … ``iris.atomic_max``) and
``iris.DeviceContext`` called the way Iris's own tests call them — ``get(ptr, out, cur_rank,
peer)`` reads ``peer`` —, with every dtype and block size Iris's tests use, ``other=`` for
masked-off lanes, every cache modifier Iris's tests pass, ``volatile`` and ``hint``; every
atomic under contention from all ranks with Iris's ``sem``/``scope`` values. Worlds 1-4 (on CPU
ranks 1 and 3 by default, all with ``-m extended``).

The default run covers each operation, dtype, block size and modifier at least once (modifiers
rotate over the cases); ``pytest -m extended`` runs the full products. Each case checks every
lane bitwise against the value it must hold, masked-off lanes included (poisoned first).
"""

import itertools

import pytest
import torch
import triton
import triton.language as tl

import iris_fw.compat.iris as iris
from helpers import compile_in_child, fresh_seed, on_worlds, poison_value, random_data, same

#: Dtypes and block sizes of Iris's load/store/get/put/copy tests (test_load.py … test_copy.py).
RMA_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
              torch.float64]
BLOCKS = [1, 8, 16, 32]
#: Cache modifiers Iris's *_cache_modifiers tests pass (None and "" both mean none).
LOAD_MODIFIERS = [None, "", ".ca", ".cg", ".cv"]
STORE_MODIFIERS = [None, "", ".wb", ".cg", ".cs", ".wt"]
RMA_OPS = ["load", "get", "store", "put", "copy_pull", "copy_push"]
#: Atomics with the dtypes Iris's tests use (test_atomic_*.py), sems and scopes.
ATOMIC_DTYPES = {
    "add": [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32],
    "sub": [torch.int32, torch.int64, torch.float32],
    "xchg": [torch.int32, torch.int64, torch.float32],
    "cas": [torch.int32, torch.int64],
    "and": [torch.int32, torch.int64], "or": [torch.int32, torch.int64], "xor": [torch.int32, torch.int64],
    "min": [torch.int32, torch.int64], "max": [torch.int32, torch.int64],
}
SEMS = ["acquire", "release", "acq_rel", None]
SCOPES = ["cta", "gpu", "sys", None]


def _float_or_int(dtype, x):
    return float(x) if dtype.is_floating_point else int(x)


# ---- load / store / get / put / copy ------------------------------------------------------------


@triton.jit
def _rma_kernel(data, results, other, heap_bases, cur_rank: tl.constexpr, num_ranks: tl.constexpr, n_valid,
                OP: tl.constexpr, LCM: tl.constexpr, SCM: tl.constexpr, VOLATILE: tl.constexpr,
                BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n_valid
    for peer in range(num_ranks):
        row = results + peer * BLOCK + offs  # row `peer` of results [num_ranks, BLOCK]
        if OP == "load":  # read peer's data; masked lanes read `other`
            tl.store(row, iris.load(data + offs, cur_rank, peer, heap_bases, mask=mask, other=other,
                                    cache_modifier=LCM, volatile=VOLATILE, hint=BLOCK))
        elif OP == "get":  # Iris's tests: get(ptr, out, cur_rank, peer) reads peer
            iris.get(data + offs, row, cur_rank, peer, heap_bases, mask=mask, other=other,
                     load_cache_modifier=LCM, store_cache_modifier=SCM, hint=BLOCK)
        elif OP == "store":  # write my data into row `cur_rank` of peer's results
            iris.store(results + cur_rank * BLOCK + offs, tl.load(data + offs), cur_rank, peer, heap_bases,
                       mask=mask, hint=BLOCK, cache_modifier=SCM)
        elif OP == "put":
            iris.put(data + offs, results + cur_rank * BLOCK + offs, cur_rank, peer, heap_bases, mask=mask,
                     other=other, load_cache_modifier=LCM, store_cache_modifier=SCM, hint=BLOCK)
        elif OP == "copy_pull":  # from peer to me, issued by me
            iris.copy(data + offs, row, peer, cur_rank, cur_rank, heap_bases, mask=mask, other=other,
                      load_cache_modifier=LCM, store_cache_modifier=SCM)
        else:  # copy_push: from me to peer, issued by me
            iris.copy(data + offs, results + cur_rank * BLOCK + offs, cur_rank, peer, cur_rank, heap_bases,
                      mask=mask, other=other, load_cache_modifier=LCM, store_cache_modifier=SCM, hint=BLOCK)


def _rma_cases(full: bool):
    """(op, dtype, block, load modifier, store modifier, volatile). Default: every op × dtype,
    block sizes and modifiers rotating so each appears. ``full``: every op × dtype × block size
    (modifiers rotating), every op × every load/store modifier pair, volatile loads of every
    dtype."""
    cases, rotation = [], itertools.count()
    for op, dt, block in itertools.product(RMA_OPS, RMA_DTYPES, BLOCKS if full else [None]):
        i = next(rotation)
        cases.append((op, dt, BLOCKS[i % len(BLOCKS)] if block is None else block,
                      LOAD_MODIFIERS[i % len(LOAD_MODIFIERS)], STORE_MODIFIERS[i % len(STORE_MODIFIERS)],
                      op == "load" and i % 3 == 0 and not full))
    if full:
        cases += [(op, torch.float32, 16, lcm, scm, False) for op in RMA_OPS
                  for lcm, scm in itertools.product(LOAD_MODIFIERS, STORE_MODIFIERS)]
        cases += [("load", dt, 8, lcm, None, True) for dt in RMA_DTYPES for lcm in (None, ".cv")]
    return cases


def _in_batches(shmem, cases, batch, stage, launch, check):
    """Runs ``cases`` in batches: ``stage`` every case of a batch (allocate and fill), one
    barrier, ``launch`` each, one barrier, ``check`` each (barriers dominate on CPU ranks)."""
    for first in range(0, len(cases), batch):
        staged = [stage(case) for case in cases[first:first + batch]]
        shmem.barrier()
        for case in staged:
            launch(*case)
        shmem.barrier()
        for case in staged:
            check(*case)
        del staged
    shmem.barrier()


def _rma(ctx, full, batch=24):
    shmem = iris.Iris(context=ctx)  # the pool's context
    me, world, hb = ctx.rank, ctx.world_size, shmem.get_heap_bases()
    seed = fresh_seed(ctx)

    def stage(numbered):
        case_no, (op, dtype, block, lcm, scm, vol) = numbered
        values = [random_data(block, dtype, ctx.device, seed + 97 * case_no + r) for r in range(world)]
        poison = poison_value(dtype)
        n_valid = block - 1 if block > 1 else 1  # a masked-off last lane where there is one
        return (op, dtype, block, lcm, scm, vol, n_valid, values, shmem.as_symmetric(values[me]),
                shmem.full((world, block), poison, dtype=dtype), poison)

    def launch(op, dtype, block, lcm, scm, vol, n_valid, values, data, results, poison):
        _rma_kernel[(1,)](data, results, _float_or_int(dtype, 3), hb, me, world, n_valid, OP=op, LCM=lcm,
                          SCM=scm, VOLATILE=vol, BLOCK=block)

    def check(op, dtype, block, lcm, scm, vol, n_valid, values, data, results, poison):
        other = _float_or_int(dtype, 3)
        what = f"{op} {dtype} block {block} lcm={lcm!r} scm={scm!r} volatile={vol} (rank {me})"
        for r in range(world):  # row r: rank r's data (pulled from r, or pushed by r)
            got, want = results[r], values[r]
            assert same(got[:n_valid], want[:n_valid]), f"{what}: row {r} wrong"
            tail = got[n_valid:]
            if op == "load":
                assert same(tail, torch.full_like(tail, other)), f"{what}: masked lanes must read other={other}"
            else:
                assert same(tail, torch.full_like(tail, poison)), f"{what}: masked lanes were written"

    _in_batches(shmem, list(enumerate(_rma_cases(full))), batch, stage, launch, check)


@on_worlds(1, 3)
def test_rma(world):
    """Every RMA function × dtype, block sizes and cache modifiers rotating, other=, volatile."""
    world.run(_rma, False)


@pytest.mark.extended
def test_rma_full_matrix(world):
    """Every RMA function × every dtype × every block size, × every load/store modifier pair."""
    world.run(_rma, True, timeout=3000)


# ---- atomics --------------------------------------------------------------------------------------


@triton.jit
def _atomic_kernel(results, olds, heap_bases, cur_rank: tl.constexpr, num_ranks: tl.constexpr, OP: tl.constexpr,
                   SEM: tl.constexpr, SCOPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < BLOCK
    dt = results.dtype.element_ty
    one = tl.full([BLOCK], 1, dt)
    for i in range(num_ranks):
        target = (cur_rank + i) % num_ranks
        p = results + offs
        if OP == "add":
            old = iris.atomic_add(p, one, cur_rank, target, heap_bases, mask, sem=SEM, scope=SCOPE)
        elif OP == "sub":
            old = iris.atomic_sub(p, one, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xchg":
            old = iris.atomic_xchg(p, one * num_ranks, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "cas":  # exactly one rank wins each slot: 0 -> rank + 1
            old = iris.atomic_cas(p, one * 0, one * (cur_rank + 1), cur_rank, target, heap_bases, sem=SEM, scope=SCOPE)
        elif OP == "or":
            old = iris.atomic_or(p, one << cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xor":
            old = iris.atomic_xor(p, one << cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "and":
            old = iris.atomic_and(p, ~(one << cur_rank), cur_rank, target, heap_bases, mask=mask, sem=SEM,
                                  scope=SCOPE)
        elif OP == "min":
            old = iris.atomic_min(p, one * cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        else:
            old = iris.atomic_max(p, one * cur_rank, cur_rank, target, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        tl.store(olds + target * BLOCK + offs, old)


_ATOMIC_INIT = {"and": -1, "min": 1 << 20, "max": -1}


def _atomic_want(op, world):
    return {"add": world, "sub": -world, "xchg": world, "or": (1 << world) - 1, "xor": (1 << world) - 1,
            "and": ~((1 << world) - 1), "min": 0, "max": world - 1}.get(op)


def _atomic_cases(full: bool):
    """(op, dtype, block, sem, scope). Default: every op × its dtypes, blocks/sem/scope rotating.
    ``full``: every op × dtype × block × sem, scopes rotating, and every sem × scope once per op."""
    cases, rotation = [], itertools.count()
    for op, dtypes in ATOMIC_DTYPES.items():
        blocks = [1] if op in ("xchg", "cas") else BLOCKS
        for dtype in dtypes:
            for block, sem in itertools.product(blocks, SEMS) if full else [(None, None)]:
                i = next(rotation)
                cases.append((op, dtype, blocks[i % len(blocks)] if block is None else block,
                              SEMS[i % len(SEMS)] if not full else sem, SCOPES[i % len(SCOPES)]))
        if full:
            cases += [(op, dtypes[0], blocks[-1], sem, scope) for sem in SEMS for scope in SCOPES]
    return cases


def _atomics(ctx, full, batch=32):
    shmem = iris.Iris(context=ctx)
    me, world, hb = ctx.rank, ctx.world_size, shmem.get_heap_bases()
    cases = [c for c in _atomic_cases(full)
             # Triton's interpreter has no bf16 atomic add ("Unsupported data type"); GPUs run it
             if not (c[1] == torch.bfloat16 and ctx.device.type == "cpu")]

    def stage(case):
        op, dtype, block, sem, scope = case
        return (*case, shmem.full((block,), _ATOMIC_INIT.get(op, 0), dtype=dtype),
                torch.zeros(world, block, dtype=dtype, device=ctx.device))

    def launch(op, dtype, block, sem, scope, results, olds):
        _atomic_kernel[(1,)](results, olds, hb, me, world, OP=op, SEM=sem, SCOPE=scope, BLOCK=block)

    def check(op, dtype, block, sem, scope, results, olds):
        what = f"atomic_{op} {dtype} block {block} sem={sem} scope={scope} (rank {me})"
        if op == "cas":  # one winner per slot; the winner saw 0
            winner = int(results[0].item())
            assert 1 <= winner <= world and torch.all(results == winner), f"{what}: {results.tolist()}"
            if winner == me + 1:
                assert torch.all(olds[me] == 0), f"{what}: the winner must have seen 0"
        else:
            want = _atomic_want(op, world)
            assert torch.all(results == want), f"{what}: {results.tolist()} != {want}"
        if op in ("add", "sub") and world == 1:
            assert torch.all(olds == 0), f"{what}: returned {olds.tolist()}, the old value was 0"

    _in_batches(shmem, cases, batch, stage, launch, check)


@on_worlds(1, 3)
def test_atomics(world):
    """Every atomic × its Iris dtypes, blocks/sem/scope rotating, all ranks contending."""
    world.run(_atomics, False)


@pytest.mark.extended
def test_atomics_full_matrix(world):
    world.run(_atomics, True, timeout=3000)


# ---- DeviceContext --------------------------------------------------------------------------------


@triton.jit
def _device_context_kernel(data, results, counter, ctx_t, cur_rank: tl.constexpr, world_size: tl.constexpr,
                           BLOCK: tl.constexpr):
    ctx = iris.DeviceContext.initialize(ctx_t, cur_rank, world_size)
    offs = tl.arange(0, BLOCK)
    mask = offs < BLOCK - 1
    for peer in range(world_size):
        # results: [6, world, BLOCK] — load, get, put (pushed into peer row cur_rank), copy pull, copy push, store
        base = results + peer * BLOCK + offs
        tl.store(base, ctx.load(data + offs, from_rank=peer, mask=mask, other=-1.0, cache_modifier=".cg"))
        ctx.get(data + offs, base + world_size * BLOCK, from_rank=peer, mask=mask, other=-1.0,
                load_cache_modifier=".cv", store_cache_modifier=".wt")
        ctx.put(data + offs, results + 2 * world_size * BLOCK + cur_rank * BLOCK + offs, to_rank=peer, mask=mask,
                store_cache_modifier=".cs", hint=BLOCK)
        ctx.copy(data + offs, base + 3 * world_size * BLOCK, from_rank=peer, to_rank=cur_rank, mask=mask)
        ctx.copy(data + offs, results + 4 * world_size * BLOCK + cur_rank * BLOCK + offs, from_rank=cur_rank,
                 to_rank=peer, mask=mask)
        ctx.store(results + 5 * world_size * BLOCK + cur_rank * BLOCK + offs, tl.load(data + offs), to_rank=peer,
                  mask=mask, cache_modifier=".wt")
        one = tl.full((), 1, tl.int32)
        ctx.atomic_add(counter, one, to_rank=peer, sem="acq_rel", scope="sys")
        ctx.atomic_sub(counter + 1, one, to_rank=peer)
        ctx.atomic_max(counter + 2, one * cur_rank, to_rank=peer)
        ctx.atomic_min(counter + 3, one * cur_rank, to_rank=peer)
        ctx.atomic_or(counter + 4, one << cur_rank, to_rank=peer)
        ctx.atomic_xor(counter + 5, one << cur_rank, to_rank=peer)
        ctx.atomic_and(counter + 6, ~(one << cur_rank), to_rank=peer)
        ctx.atomic_cas(counter + 7, one * 0, one * (cur_rank + 1), to_rank=peer, sem="acq_rel", scope="sys")
        ctx.atomic_xchg(counter + 8, one * 7, to_rank=peer)


def _device_context(ctx):
    shmem = iris.Iris(context=ctx)
    me, world, block = ctx.rank, ctx.world_size, 16
    seed = fresh_seed(ctx)
    values = [random_data(block, torch.float32, ctx.device, seed + r) for r in range(world)]
    data = shmem.as_symmetric(values[me])
    results = shmem.full((6, world, block), float("nan"))
    counter = shmem.zeros(9, dtype=torch.int32)
    counter[3], counter[6] = 1 << 20, -1
    context = shmem.get_device_context()
    assert context.dtype == torch.int64 and context.device == ctx.device
    assert context[:2].tolist() == [me, world] and context[2:2 + world].tolist() == ctx.heap_bases.bases.tolist()
    assert context.numel() == 3 + world and int(context[-1]) == 0  # the trace buffer handle (tracing off)
    shmem.barrier()
    _device_context_kernel[(1,)](data, results, counter, context, me, world, BLOCK=block)
    shmem.barrier()
    for kind, name in enumerate(["load", "get", "put", "copy pull", "copy push", "store"]):
        for r in range(world):
            assert same(results[kind, r, :-1], values[r][:-1]), f"DeviceContext.{name}: row {r} (rank {me})"
        tail = results[kind, :, -1]
        want = -1.0 if name == "load" else float("nan")
        assert same(tail, torch.full_like(tail, want)), f"DeviceContext.{name}: masked lane (rank {me})"
    assert counter.tolist()[:7] == [world, -world, world - 1, 0, (1 << world) - 1, (1 << world) - 1,
                                    ~((1 << world) - 1)], counter.tolist()
    assert 1 <= counter[7].item() <= world and counter[8].item() == 7


@on_worlds(1, 3)
def test_device_context(world):
    """``iris.DeviceContext.initialize(ctx_tensor, rank, world_size)`` and every method."""
    world.run(_device_context)


# DeviceContext.initialize(…, tracing=True) and ctx.tracing: tests/test_iris_conformance_api.py::test_tracing


# ---- compiled for GPUs -------------------------------------------------------------------------------


def _compile_jobs(target):
    """Compile the kernels above for ``target`` (child process, TRITON_INTERPRET=0)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from helpers import COMPILE_TARGETS

    tgt = GPUTarget(*COMPILE_TARGETS[target])
    for op in RMA_OPS:
        for lcm, scm, vol in [(".cv", ".wt", False), (None, ".cs", True)]:
            sig = {"data": "*bf16", "results": "*bf16", "other": "fp32", "heap_bases": "*i64", "n_valid": "i32"}
            ce = {"cur_rank": 1, "num_ranks": 2, "OP": op, "LCM": lcm, "SCM": scm, "VOLATILE": vol, "BLOCK": 32}
            triton.compile(ASTSource(_rma_kernel, {**sig, **{k: "constexpr" for k in ce}}, constexprs=ce), target=tgt)
            print("compiled rma", op, flush=True)
    for op in ATOMIC_DTYPES:
        sig = {"results": "*i32", "olds": "*i32", "heap_bases": "*i64"}
        ce = {"cur_rank": 0, "num_ranks": 2, "OP": op, "SEM": "acq_rel", "SCOPE": "sys", "BLOCK": 16}
        triton.compile(ASTSource(_atomic_kernel, {**sig, **{k: "constexpr" for k in ce}}, constexprs=ce), target=tgt)
        print("compiled atomic", op, flush=True)
    sig = {"data": "*fp32", "results": "*fp32", "counter": "*i32", "ctx_t": "*i64"}
    ce = {"cur_rank": 0, "world_size": 2, "BLOCK": 16}
    triton.compile(ASTSource(_device_context_kernel, {**sig, **{k: "constexpr" for k in ce}}, constexprs=ce),
                   target=tgt)
    print("compiled device context", flush=True)


@pytest.mark.extended
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_kernels_compile(tmp_path, target):
    """The interpreter accepts code compilers reject: compile every kernel here for GPUs."""
    compile_in_child(tmp_path, "test_iris_conformance", "_compile_jobs", target,
                     2 * len(RMA_OPS) + len(ATOMIC_DTYPES) + 1)
