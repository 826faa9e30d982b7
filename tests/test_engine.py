"""The op engine: graph-safe replays with fresh inputs for every scheduler x pattern, one
cross-rank validation (mismatches raise on every rank within seconds), the op cache (loops
allocate nothing, small heaps do not run out), named kernel arguments."""

import contextlib
import time

import pytest
import torch

import iris_fw
from helpers import cpu_extended, fresh_seed, on_worlds
from iris_fw import callpath, ops
from iris_fw.engine.contract import CollectiveMismatch
from test_taxonomy import PATTERNS, SCHEDULERS, _check, _inputs, _poison

ALL_SCHEDULERS = SCHEDULERS + ["copy_engine"]
#: Replays with fresh inputs per captured call: on GPUs 4; on CPU ranks 2 (the second replay is
#: the one a host-side epoch got wrong).
REPLAYS = {"cuda": 4, "cpu": 2}


#: The replay sweep's cases the default CPU run keeps: every pattern and every scheduler at least
#: once, and fused_sequential (the one-rank path) with every pattern; the rest run under
#: ``-m extended`` on CPU ranks (every case on GPUs; tests/test_taxonomy.py runs every pair once).
_CPU_REPLAYS = {("gemm_all_scatter", "producer_consumer"), ("all_gather_gemm", "wg_specialized"),
                ("all_gather_gemm", "copy_engine"), ("gemm_reduce_scatter", "bulk_sync")}


def _pairs():
    for pattern in PATTERNS:
        for scheduler in ALL_SCHEDULERS:
            if scheduler == "copy_engine" and pattern != "all_gather_gemm":
                continue
            keep = scheduler == "fused_sequential" or (pattern, scheduler) in _CPU_REPLAYS
            yield (pattern, scheduler) if keep else cpu_extended(pattern, scheduler, id=f"{pattern}-{scheduler}")


def _host_args(plan):
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in plan.args)


class _Replay:
    """One captured call of ``op`` on static inputs, replayed: a CUDA graph on GPUs; on the CPU the
    call issued again, checking that every host argument of its launches is the same as the
    first call's (what a graph replay repeats)."""

    def __init__(self, ctx, op, static):
        self.ctx, self.op, self.static = ctx, op, static
        if ctx.device.type == "cuda":
            stream = torch.cuda.Stream(device=ctx.device)
            stream.wait_stream(torch.cuda.current_stream(ctx.device))
            with torch.cuda.stream(stream):
                op(*static)  # warm-up outside the graph: compiles, creates side streams
            torch.cuda.current_stream(ctx.device).wait_stream(stream)
            ctx.barrier()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = op(*static)
        else:
            op(*static)
            self.args = _host_args(op.pattern.bind(ctx, op.buffers, *static))
            self.launchers = len(op.workspace.launchers)
            self.out = op.buffers["out"]

    def __call__(self):
        if self.ctx.device.type == "cuda":
            self.graph.replay()
        else:
            out = self.op(*self.static)
            assert out is self.out and _host_args(self.op.pattern.bind(self.ctx, self.op.buffers, *self.static)) == self.args
            assert len(self.op.workspace.launchers) == self.launchers, "a call bound new kernels"
        return self.out


def _replays(ctx, pattern, scheduler):
    dtype = torch.bfloat16
    # CPU ranks: world size 3 replays the ragged shapes only (world size 2 runs both)
    kinds = ("ragged",) if ctx.device.type == "cpu" and ctx.world_size == 3 else ("ragged", "aligned")
    for kind in kinds:
        inputs = _inputs(ctx, pattern, kind, dtype, fresh_seed(ctx))
        static = tuple(t.clone() for t in inputs[ctx.rank])
        op = ops.plan(pattern, *static, ctx=ctx, scheduler=scheduler)
        replay = _Replay(ctx, op, static)
        for call in range(REPLAYS[ctx.device.type]):
            inputs = _inputs(ctx, pattern, kind, dtype, fresh_seed(ctx))
            for dst, src in zip(static, inputs[ctx.rank]):
                dst.copy_(src)
            _poison(op)
            out = replay()
            ctx.synchronize()
            want = op.pattern.reference(ctx.rank, ctx.world_size, inputs)
            _check(out, want, dtype, f"{pattern}/{scheduler} {kind} replay {call} rank {ctx.rank}")
            ctx.barrier()  # every rank checked before the next replay overwrites outputs
        del op, replay, out
        ctx.barrier()


@on_worlds(1, 2)
@pytest.mark.parametrize("pattern,scheduler", list(_pairs()))
def test_replays_with_fresh_inputs(world, pattern, scheduler):
    """Every scheduler x pattern replayed (CUDA graph on GPUs) with fresh inputs stays correct:
    epochs, queue positions and flags advance on the device. (CPU ranks: world size 3 under
    ``-m extended``; tests/test_taxonomy.py runs every scheduler x pattern at 3 by default.)"""
    if world.world_size == 1 and scheduler != "fused_sequential":
        pytest.skip("one rank: the fused schedule covers the single-rank path")
    world.run(_replays, pattern, scheduler)


# ---- validation across ranks --------------------------------------------------------------------


def _mismatch(ctx, case):
    dev, r = ctx.device, ctx.rank
    bf = torch.bfloat16
    if case == "shape":
        a, b = torch.randn(8 + r, 6, device=dev, dtype=bf), torch.randn(6, 4, device=dev, dtype=bf)
        call = lambda: ops.gemm_all_scatter(a, b)  # noqa: E731
    elif case == "dtype":
        dt = torch.float16 if r == ctx.world_size - 1 else bf
        a, b = torch.randn(8, 6, device=dev, dtype=dt), torch.randn(6, 4, device=dev, dtype=dt)
        call = lambda: ops.all_gather_gemm(a, b)  # noqa: E731
    elif case == "scheduler":
        a, b = torch.randn(8, 6, device=dev, dtype=bf), torch.randn(6, 4, device=dev, dtype=bf)
        sched = "bulk_sync" if r == 0 else "fused_sequential"
        call = lambda: ops.gemm_all_scatter(a, b, scheduler=sched)  # noqa: E731
    else:  # one rank's input is invalid locally: every rank must still raise
        a = torch.randn(8, 6, device=dev, dtype=bf)
        b = torch.randn(6 if r else 5, 4, device=dev, dtype=bf)
        call = lambda: ops.gemm_reduce_scatter(torch.randn(8 * ctx.world_size, 6, device=dev, dtype=bf), b)  # noqa: E731
    start = time.monotonic()
    with pytest.raises((CollectiveMismatch, ValueError)) as info:
        call()
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert elapsed < 10, f"took {elapsed:.1f}s to fail"
    if case == "invalid" and r == 0:
        assert "must agree on K/W" in text, text
    elif case == "invalid":
        assert "rank 0 rejected its arguments" in text and "must agree on K/W" in text, text
    else:
        assert "differs across ranks" in text and "ranks 0" in text, text
        # the field of the signature that differs, by name (not the unlabelled signature tuple)
        assert {"shape": "argument 'M' differs", "dtype": "argument 'dtype' differs",
                "scheduler": "argument 'scheduler' differs"}[case] in text, text
    ctx.barrier()
    return elapsed


@pytest.mark.parametrize("case", ["shape", "dtype", "scheduler", "invalid"])
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])  # (CPU ranks: 3, the mismatch seen by two peers; 2 extended)
def test_mismatch_raises_on_every_rank(iris_pool, world_size, case):
    times = iris_pool(world_size).run(_mismatch, case)
    assert max(times) < 10


# ---- op cache, heap reuse -----------------------------------------------------------------------

#: calls of each op in the default run: the loop asserts that no call allocates heap memory (the old
#: per-call planning did, and ran out at call 123 on a 1 MiB heap); the 1000-call loop is extended
#: Calls of each op in the small-heap loop (CPU ranks: fewer — three already reuse a cached op's
#: buffers twice over, where a per-call allocation shows; the 1000-call test is extended).
LOOP_CALLS = 3 if iris_fw.interpreting() else 25


def _loop(ctx, calls):
    transport = "host_shm" if ctx.device.type == "cpu" else None
    dev, bf = ctx.device, torch.bfloat16
    with iris_fw.init(heap_size=1 << 20, transport=transport) as small:
        w = small.world_size
        g = torch.Generator().manual_seed(fresh_seed(ctx))  # every rank: the same a and b
        a, b = torch.randn(16, 16, generator=g).to(dev, bf), torch.randn(16, 8, generator=g).to(dev, bf)
        want = {
            "gemm_all_scatter": lambda: torch.cat([a.double() @ b.double()] * w, dim=1),
            "all_gather_gemm": lambda: torch.cat([a.double()] * w) @ b.double(),
            "gemm_reduce_scatter": lambda: w * (a.double() @ b.double()),  # every rank: the same a, b
        }
        fns = {"gemm_all_scatter": (ops.gemm_all_scatter, (a, b)),
               "all_gather_gemm": (ops.all_gather_gemm, (a, b)),
               "gemm_reduce_scatter": (ops.gemm_reduce_scatter, (torch.cat([a] * w), b))}
        for name, (fn, args) in fns.items():
            first = fn(*args, ctx=small)
            used = small.heap.bytes_used
            for _ in range(calls):
                out = fn(*args, ctx=small)
            assert small.heap.bytes_used == used, f"{name}: the loop allocated heap memory"
            assert out.data_ptr() != first.data_ptr(), f"{name}: results alias each other"
            small.synchronize()
            ref = want[name]()
            _check(out, ref, bf, f"{name} after {calls} calls")
            _check(first, ref, bf, f"{name}'s first result after {calls} more calls")
        assert len(callpath.state(small).ops) == 3
        del first, out
    ctx.barrier()


def test_loop_of_ops_on_a_small_heap(iris_pool):
    iris_pool(2).run(_loop, LOOP_CALLS)


@pytest.mark.extended
def test_thousand_calls_of_each_op(iris_pool):
    """3000 calls on interpreted CPU ranks take ~10 minutes on two cores: a longer job bound."""
    iris_pool(2).run(_loop, 1000, timeout=1800)


def _cache_bound(ctx):
    """The op cache of the call path keeps at most its capacity of ops (least recently used
    dropped); a dropped op's arguments plan again."""
    from iris_fw.callpath import CallCache

    ops_cache = callpath.state(ctx).ops
    old, ops_cache.capacity = ops_cache.capacity, 2
    try:
        a = torch.randn(8, 8, device=ctx.device, dtype=torch.bfloat16)
        for n in (4, 8, 12, 4):
            ops.gemm_all_scatter(a, torch.randn(8, n, device=ctx.device, dtype=torch.bfloat16), ctx=ctx)
        assert len(ops_cache) == 2
        keys = [k[4][1][0] for k in ops_cache]  # b's shape, least recently used first
        assert keys == [torch.Size([8, 12]), torch.Size([8, 4])], keys
    finally:
        ops_cache.capacity = old
        ops_cache.clear()
    with pytest.raises(ValueError, match="capacity"):
        CallCache(0)
    ctx.barrier()


def test_op_cache_is_bounded(iris_pool):
    iris_pool(2).run(_cache_bound)


def test_split_args_sends_bare_bases_where_triton_loses_nested_constexprs(monkeypatch):
    """Before Triton 3.9 a pattern's DeviceHeaps goes to the skeletons as its bare bases (3.6
    loses the constexprs of a tuple nested in ``rest`` inside their loops); from 3.9 as it is."""
    from typing import Any, NamedTuple

    from iris_fw.device import device_heaps
    from iris_fw.engine import contract

    class Args(NamedTuple):
        x: Any
        n: int
        heap_bases: Any
        TOP = 1

    bases = torch.zeros(2, dtype=torch.int64)
    args = Args(torch.zeros(3), 5, device_heaps(bases, True))
    for loses, want in ((False, args.heap_bases), (True, bases)):
        monkeypatch.setattr(contract, "_loses_nested_constexprs", lambda loses=loses: loses)
        top0, top1, rest = contract.split_args(args)
        assert top0 is args.x and top1 is None and rest[0] == 5 and rest[1] is want


def _late_workspace(ctx):
    """Rank 1 makes its op's workspace 1.5 s after rank 0 (a busy stream, or a slow host): rank
    0's kernel must not announce itself into rank 1's state region before rank 1 zeroed it (the
    fill would wipe the announcement and both ranks wait for each other until the bound)."""
    from unittest import mock

    from iris_fw.engine.scheduler import Scheduler

    transport = "host_shm" if ctx.device.type == "cpu" else None
    made = Scheduler.workspace

    def late(self, *args, **kwargs):
        time.sleep(1.5)
        return made(self, *args, **kwargs)

    with iris_fw.init(heap_size=1 << 20, transport=transport, wait_timeout=10.0) as small:
        g = torch.Generator().manual_seed(fresh_seed(ctx))  # every rank: every rank's operands
        parts = [(torch.randn(16, 8, generator=g).double(), torch.randn(8, 8, generator=g).double())
                 for _ in range(small.world_size)]
        a, b = (t.to(ctx.device, torch.float32) for t in parts[small.rank])
        with mock.patch.object(Scheduler, "workspace", late) if small.rank == 1 else contextlib.nullcontext():
            got = ops.gemm_all_reduce(a, b, scheduler="fused_sequential", ctx=small)
        small.synchronize()
        want = sum(x @ y for x, y in parts)
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-4)
        del got
    ctx.barrier()


def test_a_late_workspace_is_zeroed_before_peers_announce_into_it(iris_pool):
    iris_pool(2).run(_late_workspace)


def test_result_replaced_only_where_every_kernel_can_take_it():
    """A plan's ``result_arg`` is delivered into a given tensor by a scheduler whose kernels all
    launch through ``fire`` (``replaces_result``), never by one that launches otherwise (its
    kernels would write the op's buffer and leave the tensor unwritten) or for a plan with a
    host ``finish``; the replacement is the field's place in ``(top0, top1, rest)``, and none
    where the tensor shares memory with any other argument, inside a tuple too."""
    from typing import NamedTuple

    from iris_fw.engine.contract import Plan
    from iris_fw.engine.scheduler import Scheduler, result_change

    class Args(NamedTuple):
        a: object
        pair: object
        c: object
        n: int
        TOP = 1

    a, inner, c = torch.zeros(8), torch.zeros(8), torch.zeros(8)
    plan = Plan(pattern="p", pieces=None, args=Args(a, (inner, 3), c, 8), cfg=None, num_tiles=1, num_warps=4,
                num_stages=1, comm_bytes=0, flops=0, result=c, result_arg="c")

    class Own(Scheduler):  # launches its kernels itself
        pass

    class Helpers(Scheduler):
        replaces_result = True

    assert not Own().delivers_into(plan) and Helpers().delivers_into(plan)
    fresh = torch.empty(8)
    assert result_change(plan, fresh) == (((2, 1), fresh),)  # c: rest[1] (a is the one top field)
    for alias in (a[2:], inner.view(2, 4), c):  # an input, one inside a tuple, the result buffer itself
        expected = None if alias.untyped_storage().data_ptr() != c.untyped_storage().data_ptr() else (((2, 1), alias),)
        assert result_change(plan, alias) == expected
    plan.finish = lambda: None
    assert not Helpers().delivers_into(plan)
