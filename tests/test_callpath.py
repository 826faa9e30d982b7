"""The one call path (iris_fw/callpath.py): a host failure on one rank inside any op or collective
— an exception while planning, after the ranks agreed, or a bad argument on one rank at a
repeated call — makes every peer fail at once (within 2 s beyond the call's own work, not after
its wait bound) with an iris-fw error naming the failed rank; ``out=`` of the functional ops; the
call cache."""

import pytest
import torch

from helpers import assert_peers_fail_at_once, boom, cpu_extended, peer_fails
import iris_fw
from iris_fw import callpath, ccl, ops
from iris_fw import flash_decode as fd_module
from iris_fw.ccl import api as ccl_api

#: The calls, each ``(name, make(ctx) -> (call(bad) -> result, reference(result)))``.
CALLS = ("ccl.all_reduce", "ops.gemm_all_scatter", "ops.gemm_all_reduce", "ops.flash_decode")


def _make(ctx, name):
    """``(call, inject)``: ``call(bad)`` makes the call (``bad``: with a bad argument on this
    rank); ``inject(monkeypatch)`` makes the next planning of the call raise on this rank."""
    dev, w = ctx.device, ctx.world_size
    gen = torch.Generator().manual_seed(1234 + ctx.rank)
    if name == "ccl.all_reduce":
        x = ctx.zeros(96, dtype=torch.float32)

        def call(bad):
            x.copy_(torch.randn(96, generator=gen))
            ccl.all_reduce(x, op="bogus" if bad else "sum")
            return x

        def inject(mp):
            mp.setattr(iris_fw.ccl.algorithm, "choose", boom)
        return call, inject
    if name == "ops.flash_decode":
        q = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(7)).to(dev)  # the same on every rank
        k, v = torch.randn(1, 8 + ctx.rank, 2, 16, generator=gen).to(dev), torch.randn(1, 8 + ctx.rank, 2, 16).to(dev)

        def call(bad):
            out = torch.empty(1, 4, 16 + bad, device=dev)
            return ops.flash_decode(q, k, v, out=out)

        def inject(mp):
            mp.setattr(fd_module, "FlashDecode", boom)
        return call, inject
    pattern = name.split(".")[1]
    a = torch.randn(16, 8, generator=gen).to(dev, torch.bfloat16)
    b = torch.randn(8, 8, generator=gen).to(dev, torch.bfloat16)
    kw = {"scheduler": "fused_sequential"} if pattern == "gemm_all_scatter" else {}
    n_out = 8 * w if pattern == "gemm_all_scatter" else 8

    def call(bad):
        out = torch.empty(16, n_out + bad, device=dev, dtype=torch.bfloat16)
        return getattr(ops, pattern)(a, b, out=out, **kw)

    def inject(mp):
        # the last step of planning, after every buffer was allocated (the heap stays symmetric)
        mp.setattr(iris_fw.engine.op.Op, "_track_counters", boom)
    return call, inject


def _peer_fails(ctx, name, where):
    """Rank W-1 fails on its host inside ``name`` (``where``: ``"plan"`` while planning its first
    call, ``"argument"`` at a repeated call); every other rank raises an iris-fw error naming it
    at once (:func:`helpers.peer_fails`)."""
    return peer_fails(ctx, *_make(ctx, name), where)


@pytest.mark.parametrize("where", ["plan", "argument"])
@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])  # (CPU ranks: 3, two peers of the failed rank; 2 extended)
def test_a_host_failure_on_one_rank_fails_every_peer_at_once(iris_pool, world_size, name, where):
    assert_peers_fail_at_once(iris_pool(world_size).run(_peer_fails, name, where))


def _out(ctx):
    """``out=``: the result written into ``out`` (returned), the same values as without it; a new
    tensor otherwise, never the op's workspace (gemm_all_reduce under ``auto`` = ``library``
    here: all-reduced into it; under ``bulk_sync``: summed into it by the kernels;
    gemm_reduce_scatter: written there by its last step); flash_decode's ``out`` likewise."""
    w = ctx.world_size
    gen = torch.Generator().manual_seed(99 + ctx.rank)
    a = torch.randn(16, 8, generator=gen).to(ctx.device, torch.bfloat16)
    b = torch.randn(8, 8, generator=gen).to(ctx.device, torch.bfloat16)
    plain = ops.gemm_all_reduce(a, b)
    out = torch.full((16, 8), float("nan"), device=ctx.device, dtype=torch.bfloat16)
    got = ops.gemm_all_reduce(a, b, out=out)
    again = ops.gemm_all_reduce(a, b)
    ctx.synchronize()
    assert got is out and torch.equal(out, plain) and torch.equal(again, plain)
    assert plain.data_ptr() != again.data_ptr() and not ctx.is_symmetric(plain)
    parts = [torch.zeros(16, 8, dtype=torch.float64) for _ in range(w)]
    mine = (a.double() @ b.double()).cpu()
    for r in range(w):
        parts[r] = ctx.broadcast(mine.clone(), src=r)
    torch.testing.assert_close(out.double().cpu(), sum(parts), atol=0.1, rtol=0.02)
    entries = callpath.state(ctx).ops.values()
    assert [type(e).__name__ for e in entries] == ["method"], entries
    op = entries[0].__self__  # W = 2: the library form all-reduces into the tensor
    assert op.scheduler.name == "library" and op.delivers_into
    assert op.buffers["out"].data_ptr() not in (plain.data_ptr(), again.data_ptr())
    # a kernel schedule's one-shot sum is this rank's own step: its kernels launched with the
    # output replaced write it straight into out= or the new tensor (Plan.result_arg)
    fused = ops.gemm_all_reduce(a, b, scheduler="bulk_sync")
    into = torch.full((16, 8), float("nan"), device=ctx.device, dtype=torch.bfloat16)
    got = ops.gemm_all_reduce(a, b, scheduler="bulk_sync", out=into)
    ctx.synchronize()
    assert got is into and torch.equal(into, fused)
    torch.testing.assert_close(fused.double().cpu(), sum(parts), atol=0.1, rtol=0.02)
    op = callpath.state(ctx).ops.values()[-1].__self__
    assert op.scheduler.name == "bulk_sync" and op.delivers_into
    assert op.buffers["out"].data_ptr() not in (fused.data_ptr(), into.data_ptr())
    # gemm_reduce_scatter's last step is this rank's reduction: it writes straight into out (when
    # contiguous) or a new tensor, never the op's own output buffer
    a2 = torch.randn(8 * w, 8, generator=gen).to(ctx.device, torch.bfloat16)
    plain = ops.gemm_reduce_scatter(a2, b)
    out = torch.full((8, 8), float("nan"), device=ctx.device, dtype=torch.bfloat16)
    got = ops.gemm_reduce_scatter(a2, b, out=out)
    strided = torch.full((8, 16), float("nan"), device=ctx.device, dtype=torch.bfloat16)[:, ::2]  # copied into
    got_strided = ops.gemm_reduce_scatter(a2, b, out=strided)
    again = ops.gemm_reduce_scatter(a2, b)
    ctx.synchronize()
    assert got is out and got_strided is strided and plain.data_ptr() != again.data_ptr()
    assert torch.equal(out, plain) and torch.equal(strided, plain) and torch.equal(again, plain)
    op = callpath.state(ctx).ops.values()[-1].__self__
    assert op.pattern.name == "gemm_reduce_scatter" and op.delivers_into
    assert op.buffers["out"].data_ptr() not in (plain.data_ptr(), again.data_ptr())
    ctx.barrier()


def test_out_of_functional_ops(iris_pool):
    iris_pool(2).run(_out)


def test_call_cache_is_bounded_and_keeps_the_most_recent():
    cache = callpath.CallCache(2)
    for k in "abc":
        cache.put(k, k.upper())
    assert list(cache) == ["b", "c"] and cache.get("b") == "B" and list(cache) == ["c", "b"]
    assert cache.get(None) is None and cache.get([1]) is None and cache.put([1], 5) == 5 and len(cache) == 2
    with pytest.raises(ValueError, match="capacity"):
        callpath.CallCache(0)
    # hits through the call path keep the order (a hit on the last entry again reorders nothing)
    ctx = type("Ctx", (), {"_closed": False})()
    cache = callpath.CallCache(3)
    for k in "abcb":
        callpath.call(ctx, cache, k, lambda _, k=k: (lambda: k.upper()), None, "test")
    assert list(cache) == ["a", "c", "b"]
    for k in "bba":
        assert callpath.call(ctx, cache, k, None, None, "test") == k.upper()
    assert list(cache) == ["c", "b", "a"]
    cache.put("d", lambda: "D")  # the least recently used (c) goes
    assert list(cache) == ["b", "a", "d"] and cache.get("a")() == "A" and list(cache) == ["b", "d", "a"]
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None


def _graph_out(ctx):
    """``ops.gemm_all_reduce(..., out=out)`` and ``ops.flash_decode(..., out=o)`` captured in one
    CUDA graph — and the fused schedule's ``gemm_all_reduce`` and ``all_gather_gemm``, whose
    kernels write ``out=`` themselves — replayed with fresh inputs written into the captured
    tensors: each replay's results match a reference computed from that replay's inputs."""
    from helpers import capture_graph, fresh_seed

    dev = ctx.device
    a = torch.empty(32, 64, device=dev, dtype=torch.bfloat16)
    b = torch.empty(64, 48, device=dev, dtype=torch.bfloat16)
    out = torch.empty(32, 48, device=dev, dtype=torch.bfloat16)
    q = torch.empty(2, 8, 64, device=dev, dtype=torch.bfloat16)
    k = torch.empty(2, 40 + 8 * ctx.rank, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    o = torch.empty(2, 8, 64, device=dev, dtype=torch.bfloat16)
    # the fused schedule's kernels writing out= themselves (Plan.result_arg replaced)
    fused = torch.empty_like(out)
    shard = torch.empty(16, 64, device=dev, dtype=torch.bfloat16)
    gathered = torch.empty(16 * ctx.world_size, 48, device=dev, dtype=torch.bfloat16)

    def fill(seed):
        gen = torch.Generator().manual_seed(seed + ctx.rank)
        for t in (a, b, k, v, shard):
            t.copy_(torch.randn(t.shape, generator=gen))
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)))  # the same on every rank

    fill(fresh_seed(ctx))

    def step():
        ops.gemm_all_reduce(a, b, out=out)
        ops.flash_decode(q, k, v, out=o)
        ops.gemm_all_reduce(a, b, out=fused, scheduler="fused_sequential")
        ops.all_gather_gemm(shard, b, out=gathered, scheduler="fused_sequential")

    graph = capture_graph(ctx, step)
    for _ in range(3):
        fill(fresh_seed(ctx))
        for t in (out, o, fused, gathered):
            t.fill_(float("nan"))
        ctx.barrier()
        graph.replay()
        ctx.synchronize()
        mine = (a.double() @ b.double()).cpu()
        want = sum(ctx.broadcast(mine.clone(), src=r) for r in range(ctx.world_size))
        torch.testing.assert_close(out.double().cpu(), want, atol=0.25, rtol=0.02)
        torch.testing.assert_close(fused.double().cpu(), want, atol=0.25, rtol=0.02)
        shards = torch.cat([ctx.broadcast(shard.cpu().clone(), src=r) for r in range(ctx.world_size)])
        torch.testing.assert_close(gathered.double().cpu(), shards.double() @ b.double().cpu(), atol=0.25, rtol=0.02)
        ks = [ctx.broadcast(k.cpu().clone() if r == ctx.rank else torch.empty(2, 40 + 8 * r, 2, 64,
                                                                               dtype=torch.bfloat16), src=r)
              for r in range(ctx.world_size)]
        vs = [ctx.broadcast(v.cpu().clone() if r == ctx.rank else torch.empty(2, 40 + 8 * r, 2, 64,
                                                                               dtype=torch.bfloat16), src=r)
              for r in range(ctx.world_size)]
        ref = fd_module.flash_decode_reference(q.cpu(), ks, vs)
        torch.testing.assert_close(o.double().cpu(), ref, atol=0.03, rtol=0.03)
    del graph
    ctx.barrier()


def test_out_in_a_cuda_graph_replays_fresh_inputs(iris_pool, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    iris_pool(2).run(_graph_out)


def _replayed_calls(ctx):
    """Calls that come back with every tensor at the same address (a decode loop on static
    buffers) are captured as CUDA graphs on their third such call and replayed after
    (callpath.Replay): ``gemm_all_reduce`` with ``out=`` (``auto`` and the fused schedule),
    ``flash_decode`` with ``out=``, ``all_reduce`` in place on a heap and a plain tensor —
    fresh inputs written into the same tensors and the outputs poisoned before every call, every
    call's values checked; one graph per cached call and address set; a new ``out`` runs
    eagerly until it repeats; a call without ``out=`` replays when its new result's address
    repeats (two in turn), the last result unchanged by the next call; results kept stay eager;
    calls inside a trace session never replay."""
    dev, w = ctx.device, ctx.world_size
    paths = callpath.state(ctx)
    assert paths.replay, "graph replay is on by default on GPUs"
    trials, callpath.REPLAY_TRIALS = callpath.REPLAY_TRIALS, 0  # keep every graph (not only the quicker ones)
    try:
        _replay_loop(ctx, paths, dev, w)
    finally:
        callpath.REPLAY_TRIALS = trials


def _replay_loop(ctx, paths, dev, w, only_steps=None):
    from helpers import fresh_seed

    a = torch.empty(32, 64, device=dev, dtype=torch.bfloat16)
    b = torch.empty(64, 48, device=dev, dtype=torch.bfloat16)
    out, fused, out2 = (torch.empty(32, 48, device=dev, dtype=torch.bfloat16) for _ in range(3))
    q = torch.empty(2, 8, 64, device=dev, dtype=torch.bfloat16)
    k = torch.empty(2, 40 + 8 * ctx.rank, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    o = torch.empty(2, 8, 64, device=dev, dtype=torch.bfloat16)
    x = ctx.zeros(3000, dtype=torch.float32)  # a heap tensor
    y = torch.empty(777, device=dev)  # a plain one
    part = torch.empty(50, device=dev)  # gathered into two outputs in turn: a graph each
    parts = [torch.empty(w * 50, device=dev) for _ in range(2)]

    def gathered(t):  # every rank's t (k, v: 40 + 8 r tokens on rank r)
        return [ctx.broadcast(t.cpu().clone() if r == ctx.rank else torch.empty(
            (t.shape[0], 40 + 8 * r, *t.shape[2:]) if t.dim() == 4 else t.shape, dtype=t.dtype), src=r)
            for r in range(w)]

    def fill(i):  # fresh inputs in the same tensors
        gen = torch.Generator().manual_seed(fresh_seed(ctx) + 7919 * i + ctx.rank)
        for t in (a, b, k, v, x, y, part):
            t.copy_(torch.randn(t.shape, generator=gen))
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(fresh_seed(ctx) + i)))

    def step(i, target=out):
        fill(i)
        xs, ys, whole = gathered(x), gathered(y), parts[i % 2]
        for t in (target, fused, o, whole):
            t.fill_(float("nan"))
        ctx.barrier()
        got = ops.gemm_all_reduce(a, b, out=target)
        assert got is target
        ops.gemm_all_reduce(a, b, out=fused, scheduler="fused_sequential")
        assert ops.flash_decode(q, k, v, out=o) is o
        ccl.all_reduce(x)
        ccl.all_reduce(y)
        ccl.all_gather_into_tensor(whole, part)
        ctx.synchronize()
        want = sum(gathered((a.double() @ b.double())))
        for t in (target, fused):
            torch.testing.assert_close(t.double().cpu(), want, atol=0.25, rtol=0.02, msg=f"call {i}")
        ref = fd_module.flash_decode_reference(q.cpu(), gathered(k), gathered(v))
        torch.testing.assert_close(o.double().cpu(), ref, atol=0.03, rtol=0.03, msg=f"call {i}")
        torch.testing.assert_close(x.cpu().double(), sum(t.double() for t in xs), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(y.cpu().double(), sum(t.double() for t in ys), atol=1e-4, rtol=1e-5)
        assert torch.equal(whole.cpu(), torch.cat(gathered(part))), f"call {i}"

    def graphs(cache):  # (the trace session's own keys: replays with no graph)
        return sorted(len(r.graphs) for r in cache._replays.values() if r.graphs)

    if only_steps is not None:  # (_trial_calls: the calls' values only)
        for i in range(only_steps):
            step(i)
        ctx.barrier()
        return
    for i in range(6):
        step(i)
    world = paths.groups[None].calls
    assert graphs(paths.ops) == [1, 1], graphs(paths.ops)  # gemm_all_reduce auto and fused, one address set each
    # flash_decode and the two all-reduces; the all-gather's two outputs (its key: the addresses)
    assert graphs(world) == [1, 1, 1, 2], graphs(world)
    assert not any(r.off for cache in (paths.ops, world) for r in cache._replays.values())
    for i in range(6, 10):  # another out: eager twice, then its own graph
        step(i, out2)
    assert graphs(paths.ops) == [1, 2], graphs(paths.ops)
    # without out= a call returns a new tensor, made before the call: the call replays whenever
    # torch's allocator hands an address back (a loop that drops its last result: two in turn);
    # the result kept from the last call must not change
    kept = None
    for i in range(12, 20):
        fill(i)
        new = ops.gemm_all_reduce(a, b)
        new_o = ops.flash_decode(q, k, v)
        ctx.synchronize()
        assert new.data_ptr() not in (out.data_ptr(), out2.data_ptr(), fused.data_ptr())
        # (no GPU allocations here but the calls': the host copies are made on the host)
        want = sum(gathered(a.cpu().double() @ b.cpu().double()))
        torch.testing.assert_close(new.cpu().double(), want, atol=0.25, rtol=0.02, msg=f"call {i}")
        ref = fd_module.flash_decode_reference(q.cpu(), gathered(k), gathered(v))
        torch.testing.assert_close(new_o.cpu().double(), ref, atol=0.03, rtol=0.03, msg=f"call {i}")
        if kept is not None:
            assert torch.equal(kept[0].cpu(), kept[1]) and torch.equal(kept[2].cpu(), kept[3]), f"call {i}"
        kept = (new, new.cpu(), new_o, new_o.cpu())
    # (graphs for the results' addresses: two where the allocator hands back two blocks in turn)
    assert graphs(paths.ops)[-1] > 2 and sum(graphs(world)) > 5, (graphs(paths.ops), graphs(world))
    made = graphs(paths.ops), graphs(world)
    held = [ops.gemm_all_reduce(a, b) for _ in range(4)]  # results kept: new addresses, eager
    ctx.synchronize()
    for t in held:
        torch.testing.assert_close(t.cpu().double(), want, atol=0.25, rtol=0.02)
    with ctx.trace(None, label="replay") as session:  # traced calls run their (traced) kernels
        step(10)
    names = {e["args"].get("kernel", "") for e in session.trace["traceEvents"] if e.get("ph") == "X"}
    assert any("flash_decode" in n for n in names) and any("all_reduce" in n for n in names), sorted(names)
    step(11)  # and replay again after the session
    assert (graphs(paths.ops), graphs(world)) == made
    ctx.barrier()


def _trial_calls(ctx):
    """The same calls with the replay's trial on (callpath.REPLAY_TRIALS, the default): after
    each capture the calls alternate between replays and eager calls, then go on as the trial
    decided — every call's values right (which calls keep replaying is the host's timing: not
    checked)."""
    assert callpath.REPLAY_TRIALS > 0
    _replay_loop(ctx, callpath.state(ctx), ctx.device, ctx.world_size,
                 only_steps=callpath.CAPTURE_AFTER + 1 + 2 * callpath.REPLAY_TRIALS + 2)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("calls", [_replayed_calls, _trial_calls], ids=["graphs", "trial"])
def test_repeated_calls_replay_as_cuda_graphs(iris_pool, on_gpu, world, calls):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    iris_pool(world).run(calls)


def test_triton_launch_hooks_make_calls_eager(monkeypatch):
    """What makes a call run eagerly rather than replay (kernel_launcher.triton_launch_hooked):
    none of Triton's launch switches by default; a launch hook, a stages-inspection hook, the
    runtime debug mode each."""
    from triton import knobs

    from iris_fw.kernel_launcher import triton_launch_hooked

    assert not triton_launch_hooked()
    for name, value in (("launch_enter_hook", lambda *a: None), ("launch_exit_hook", lambda *a: None),
                        ("add_stages_inspection_hook", lambda *a: None), ("debug", True)):
        with monkeypatch.context() as m:
            m.setattr(knobs.runtime, name, value)
            assert triton_launch_hooked(), name
    assert not triton_launch_hooked()


def test_address_key_and_replay_switch(iris_pool, monkeypatch):
    """What a captured call bakes in of its arguments (callpath.address_key): GPU tensors by
    address, shape, strides and dtype, plain values with their type, nothing else (None: never
    replayed: host tensors, other objects); ``IRIS_FW_GRAPH_REPLAY`` and the context's device
    decide ``state(ctx).replay``."""
    t = torch.zeros(4, 6)
    assert callpath.address_key((t,)) is None  # a host tensor: its values may be read on the host
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # (as GPU tensors)
    assert callpath.address_key((t, True)) != callpath.address_key((t, 1))
    key = callpath.address_key((t, None, 3, "sum", (t, 1.5)))
    assert key == callpath.address_key((t, None, 3, "sum", [t, 1.5]))
    assert key != callpath.address_key((t.t(), None, 3, "sum", (t, 1.5)))  # other strides
    assert key != callpath.address_key((t[1:], None, 3, "sum", (t, 1.5)))  # another address
    assert callpath.address_key((t, object())) is None and callpath.address_key(([t, {}],)) is None
    # a collective's: its src and dst tensors' addresses (its key names the rest), else the above
    assert ccl_api._addresses((t, t[1:])) == (t.data_ptr(), t[1:].data_ptr())
    assert ccl_api._addresses(((t, t), (t, None))) == callpath.address_key(((t, t), (t, None)))
    assert ccl_api._addresses((None, None)) == (None, None)
    # an op's (out, *inputs): the inputs' addresses and strides (its key names their shapes and
    # dtypes), the result's address, shape, strides and dtype
    o = torch.zeros(6, 4)
    key = ops._addresses((o, t, None, 2))
    assert key == ops._addresses((o, t, None, 2)) and key is not None
    assert key != ops._addresses((o, t.t(), None, 2)) and key != ops._addresses((o, t[1:], None, 2))
    assert key != ops._addresses((o.view(4, 6), t, None, 2)) and key != ops._addresses((o.t(), t, None, 2))
    assert ops._addresses((o, (t, t))) == callpath.address_key((o, (t, t)))  # (a tuple input: all of it)
    sq, other = torch.zeros(4, 4), torch.zeros(4, 4)  # out as the first or the second operand
    assert ops._addresses((sq, sq, other)) != ops._addresses((sq, other, sq))
    # flash-decode's (q, k, v, kv_lens, out, block_table): addresses, strides, the shapes its key
    # leaves out (K's, V's: S per rank), the result's shape and dtype
    q, k = torch.zeros(2, 4, 8), torch.zeros(2, 16, 2, 8)
    key = fd_module._addresses((q, k, k, None, o, None))
    assert key == fd_module._addresses((q, k, k, None, o, None))
    assert key != fd_module._addresses((q, k[:, :8], k, None, o, None))  # fewer tokens: another graph
    assert key != fd_module._addresses((q, k, k, torch.zeros(2, dtype=torch.int32), o, None))
    assert key != fd_module._addresses((q.transpose(0, 1), k, k, None, o, None))
    assert key != fd_module._addresses((q, k, k, None, o.view(torch.int32), None))  # (the same address)
    replay, device, debug = iris_pool(1).run(_replay_switch)[0]
    assert replay == (device == "cuda" and not debug), (replay, device, debug)


def _replay_switch(ctx):
    return callpath.state(ctx).replay, ctx.device.type, ctx.debug


class _FakeGraph:
    """Stands for ``torch.cuda.CUDAGraph`` in :func:`test_replay_decisions` (no GPU): records
    captures and replays."""

    made = []

    def __init__(self):
        self.captures, self.replays = 0, 0
        _FakeGraph.made.append(self)

    def capture_begin(self, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        self.captures += 1

    def capture_end(self):
        pass

    def replay(self):
        self.replays += 1

    def raw_cuda_graph_exec(self):
        return 4242


def test_driver_calls_name_the_call_that_failed():
    """iris_fw.driver.DriverCalls: a nonzero status of the driver's event record or stream wait
    raises naming the call; the graph launch returns its status, which launch_failed reports."""
    from iris_fw import driver

    calls = driver.DriverCalls(lambda e, s: 0, lambda s, e, f: 1, lambda g, s: 700,
                               ("cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch"))
    calls.record(1, 2)
    with pytest.raises(iris_fw.IrisError, match="cuStreamWaitEvent failed with error 1"):
        calls.wait(2, 1)
    assert calls.launch_graph_status(3, 2) == 700
    with pytest.raises(iris_fw.IrisError, match="cuGraphLaunch failed with error 700"):
        calls.launch_failed(700)


def test_a_cache_drops_an_entrys_replay_with_it():
    """A CallCache keeps each entry's Replay by the entry's id while the entry is kept: replacing
    the entry under its key, or dropping it beyond the capacity, drops its Replay too (the id
    of an entry gone could be another's)."""
    cache = callpath.CallCache(2)
    first, second, third, again = (lambda: 1), (lambda: 2), (lambda: 3), (lambda: 4)
    for key, entry in (("a", first), ("b", second)):
        cache.put(key, entry)
        cache._replays[id(entry)] = object()
    cache.put("a", again)  # replaced: the old entry's replay goes
    assert set(cache._replays) == {id(second)}
    cache._replays[id(again)] = object()
    cache.put("c", third)  # beyond the capacity: the least recently used ("b") goes with its replay
    assert "b" not in cache and set(cache._replays) == {id(again)}
    cache.clear()
    assert not cache._replays


def test_replay_decisions(monkeypatch):
    """callpath.Replay's decisions with the CUDA calls stood in for (the GPU test replays real
    graphs): eager for the first CAPTURE_AFTER calls at one set of addresses, captured at the
    next, then launched through the driver, returning the argument the call returned; a replay
    slower than the eager calls turns the call eager for good; so do a result that is not an
    argument and a failed capture (the call then runs eagerly and its own error, if any,
    raises); other addresses get their own graph up to MAX_GRAPHS; tracing runs eagerly."""
    import contextlib
    import time
    import types

    monkeypatch.setattr(callpath.torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(callpath.torch.cuda, "Stream", lambda *a, **k: types.SimpleNamespace(wait_stream=lambda s: 0))
    monkeypatch.setattr(callpath.torch.cuda, "current_stream", lambda *a: None)
    monkeypatch.setattr(callpath.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    launched = []

    def failed(rc):
        raise iris_fw.IrisError(f"graph launch failed with error {rc}")

    def paths(launch_s=0.0, status=0):
        def launch_graph(graph_exec, stream):  # (the driver's call: its status)
            time.sleep(launch_s)
            launched.append(graph_exec)
            return status
        cuda = types.SimpleNamespace(capturing=lambda: False, device=lambda: 0, tf32=lambda: False, stream=lambda i: 7)
        return types.SimpleNamespace(replay=True, torch=cuda, driver=types.SimpleNamespace(launch_failed=failed),
                                     launch_graph=launch_graph, side=None, capturing=0, replayed=0)

    ctx = types.SimpleNamespace(tracer=None)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # (the key takes GPU tensors only)
    out, x = torch.zeros(4), torch.zeros(3)
    calls = []

    def slow_call(o, t):  # an eager call slower than a replay
        calls.append(o)
        time.sleep(0.002)
        return o

    r = callpath.Replay(slow_call, paths())
    for _ in range(callpath.CAPTURE_AFTER):
        assert r.run(ctx, (out, x)) is out
    assert len(calls) == callpath.CAPTURE_AFTER and not r.graphs
    assert r.run(ctx, (out, x)) is out  # captured (the call ran once more, under capture) and replayed
    graph = _FakeGraph.made[-1]
    assert graph.captures == 1 and graph.replays == 1 and len(calls) == callpath.CAPTURE_AFTER + 1
    trials = 2 * callpath.REPLAY_TRIALS  # replays and eager calls in turn, each timed
    for i in range(trials):
        assert r.run(ctx, (out, x)) is out
        assert len(launched) == i // 2 + 1 and len(calls) == callpath.CAPTURE_AFTER + 1 + (i + 1) // 2
    assert not r.off  # the replays were quicker: from now on the call's Python runs no more
    for _ in range(3):
        assert r.run(ctx, (out, x)) is out
    assert launched == [4242] * (callpath.REPLAY_TRIALS + 3)
    assert len(calls) == callpath.CAPTURE_AFTER + 1 + callpath.REPLAY_TRIALS
    for i in range(callpath.MAX_GRAPHS + 1):  # other outputs: a graph each, up to MAX_GRAPHS
        other = torch.zeros(4)
        for _ in range(callpath.CAPTURE_AFTER + 1):
            assert r.run(ctx, (other, x)) is other
    assert len(r.graphs) == callpath.MAX_GRAPHS
    traced = types.SimpleNamespace(tracer=object())
    n = len(calls)
    assert r.run(traced, (out, x)) is out and len(calls) == n + 1  # a trace session: eager

    quick = callpath.Replay(lambda o, t: o, paths(launch_s=0.002))  # a replay slower than the call
    for _ in range(callpath.CAPTURE_AFTER + 2 * callpath.REPLAY_TRIALS):
        assert quick.run(ctx, (out, x)) is out
    assert not quick.off  # (the last timed call is still to come)
    assert quick.run(ctx, (out, x)) is out
    assert quick.off and not quick.graphs

    bad = callpath.Replay(lambda o, t: o, paths(status=700))  # a launch the driver refuses raises
    for _ in range(callpath.CAPTURE_AFTER + 1):
        bad.run(ctx, (out, x))
    with pytest.raises(iris_fw.IrisError, match="error 700"):
        bad.run(ctx, (out, x))

    fresh = callpath.Replay(lambda o, t: torch.zeros(4), paths())  # a new tensor each call: never kept
    for _ in range(callpath.CAPTURE_AFTER + 2):
        assert fresh.run(ctx, (out, x)) is not out
    assert fresh.off and not fresh.graphs

    # a call without out (its result slot None) gets its new tensor made first and writes it:
    # replayed once the allocator hands an address back (two addresses in turn: a loop that drops
    # its last result), each replay returning the tensor made for it
    pool = [torch.zeros(4), torch.zeros(4)]
    made = []

    def make(fn, args):
        made.append(pool[len(made) % 2])
        return made[-1]

    writes = []

    def writer(o, t):  # (slower than a replay)
        writes.append(o)
        time.sleep(0.002)
        return o

    news = callpath.Replay(writer, paths(), fresh=(0, make))
    n_launched = len(launched)
    for i in range(2 * (callpath.CAPTURE_AFTER + 1 + trials) + 4):
        assert news.run(ctx, (None, x)) is pool[i % 2]
    assert len(news.graphs) == 2 and not news.off
    # eager, captured and timed eager calls wrote the made tensors
    assert writes == pool * (callpath.CAPTURE_AFTER + 1 + callpath.REPLAY_TRIALS)
    assert len(launched) - n_launched == 2 * callpath.REPLAY_TRIALS + 4  # then replays only
    nothing = callpath.Replay(lambda o, t: "as it was" if o is None else o, paths(), fresh=(0, lambda fn, a: None))
    for _ in range(callpath.CAPTURE_AFTER + 2):  # nothing to make: the call runs as it is, never captured
        assert nothing.run(ctx, (None, x)) == "as it was"
    assert not nothing.graphs and not nothing.seen

    def failing(o, t):
        if o.sum() > 0:
            raise ValueError("the call's own error")
        return None

    broken = callpath.Replay(failing, paths())
    for _ in range(callpath.CAPTURE_AFTER):
        assert broken.run(ctx, (out, x)) is None
    out.fill_(1)
    with pytest.raises(ValueError, match="own error"):  # failed under capture: eager, which raises
        broken.run(ctx, (out, x))
    assert broken.off and not broken.graphs and not broken.paths.replay  # the context captures no more
    assert broken.paths.capturing == 0

    # a call nested in one being captured that fails aborts nothing (the capturing call runs again
    # eagerly, and a failure there aborts the peers as usual)
    aborted = []
    monkeypatch.setattr(callpath, "fail", lambda ctx, label, exc: aborted.append(label))
    nested = types.SimpleNamespace(_closed=False, extensions={callpath.EXTENSION: types.SimpleNamespace(capturing=1)})
    cache = callpath.CallCache(4)
    cache.put("k", failing)
    with pytest.raises(ValueError):
        callpath.call(nested, cache, "k", None, None, "nested", out, x)
    assert aborted == []
    nested.extensions[callpath.EXTENSION].capturing = 0
    with pytest.raises(ValueError):
        callpath.call(nested, cache, "k", None, None, "outer", out, x)
    assert aborted == ["outer"]
