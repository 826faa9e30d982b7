"""Tracing (iris_fw.trace, iris_fw.trace_session, iris-fw trace): device events of user kernels, ops and
collectives — order, content, peers, bytes, waits and their flags —, overflow counting, tracing
off (same results, no trace buffer), clock alignment of the merged file, the CLI, IRIS_FW_TRACE,
and the traced kernels compiled for NVIDIA and AMD targets."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import iris_fw
from iris_fw import callpath, ccl, ops, trace_session
from iris_fw import device as dv
from iris_fw import trace as tr

from helpers import COMPILE_TARGETS, compile_in_child

MY_WORK = tr.USER.value + 1  # a user event kind


@triton.jit
def _user_kernel(data, flag, n, rank, world_size, heap_bases, trace, TRACE: tl.constexpr):
    """Per program: compute (item = program), send its value to the next rank (communicate, peer
    and bytes), then a wait on a flag this rank set before the launch."""
    pid = tl.program_id(0)
    t = tr.record_start(trace, TRACE)
    tl.store(data + pid, pid * 10 + rank)
    tr.record_end(trace, TRACE, t, tr.USER + 1, tr.COMPUTE, item=pid)
    peer = (rank + 1) % world_size
    t = tr.record_start(trace, TRACE)
    dv.store(data + n + rank * n + pid, tl.load(data + pid), rank, peer, heap_bases)
    tr.record_end(trace, TRACE, t, tr.PUSH, tr.COMMUNICATE, item=pid, peer=peer, nbytes=8)
    t = tr.record_start(trace, TRACE)
    dv.wait_until(flag, ">=", 1, rank, rank, heap_bases)
    tr.record_wait(trace, TRACE, t, tr.ACQUIRE, flag, rank, heap_bases, item=pid)


@triton.jit
def _plain_kernel(data, flag, n, rank, world_size, heap_bases):
    """:func:`_user_kernel` without its record calls: its untraced variant must compile to this."""
    pid = tl.program_id(0)
    tl.store(data + pid, pid * 10 + rank)
    peer = (rank + 1) % world_size
    dv.store(data + n + rank * n + pid, tl.load(data + pid), rank, peer, heap_bases)
    dv.wait_until(flag, ">=", 1, rank, rank, heap_bases)


@triton.jit
def _many_events_kernel(count, trace, TRACE: tl.constexpr):
    for i in range(count):
        t = tr.record_start(trace, TRACE)
        tr.record_end(trace, TRACE, t, tr.USER, tr.COMPUTE, item=i)


def _x_events(trace, pid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)]


# ---- user kernels: content and order ----------------------------------------------------------------


def _user_rank(ctx, path):
    programs = 3
    data = ctx.zeros((1 + ctx.world_size) * programs, dtype=torch.int64)
    flag = ctx.ones(1, dtype=torch.int64)
    ctx.barrier()
    with ctx.trace(path, kinds={MY_WORK: "my_work"}) as session:
        ctx.tracer.name(flag, "my flag")
        trace, TRACE = trace_session.kernel_args(ctx, "user", programs)
        assert TRACE == tr.CLOCKS.index(iris_fw.devinfo.trace_clock(ctx.device)) + 1 and trace is not None
        _user_kernel[(programs,)](data, flag, programs, ctx.rank, ctx.world_size, ctx.heap_bases, trace, TRACE=TRACE)
    # outside a session: no buffer, TRACE 0, the same kernel runs untraced
    assert trace_session.kernel_args(ctx, "user", programs) == (None, 0) and ctx.tracer is None
    _user_kernel[(programs,)](data, flag, programs, ctx.rank, ctx.world_size, ctx.heap_bases, None, TRACE=0)
    ctx.barrier()
    left = (ctx.rank - 1) % ctx.world_size
    expect = [p * 10 + left for p in range(programs)]
    assert data[programs + left * programs:programs + (left + 1) * programs].tolist() == expect
    return session.trace, session.files


def test_user_kernel_events(iris_pool, tmp_path):
    """Every program of a user kernel records its three events in order, with kind, role, item,
    peer, bytes, rank, program and the named flag of its wait; per-rank files and the merged one
    are written."""
    pool = iris_pool(2)
    path = str(tmp_path / "user.json")
    results = pool.run(_user_rank, path)
    for rank, (trace, files) in enumerate(results):
        assert files == [str(tmp_path / f"user.rank{rank}.json")] + ([path] if rank == 0 else [])
        assert trace["otherData"]["rank"] == rank and trace["otherData"]["lost_events"] == {str(rank): 0}
        events = _x_events(trace)
        assert len(events) == 3 * 3
        by_program = {}
        for e in events:
            assert e["pid"] == rank and e["args"]["kernel"] == "user"
            by_program.setdefault(e["args"]["program"], []).append(e)
        assert sorted(by_program) == [0, 1, 2]
        for program, evs in by_program.items():
            evs.sort(key=lambda e: e["ts"])
            assert [(e["name"], e["cat"]) for e in evs] == [("my_work", "compute"), ("push", "communicate"),
                                                            ("acquire", "wait")]
            assert all(e["args"]["item"] == program for e in evs)
            assert evs[1]["args"]["peer"] == (rank + 1) % 2 and evs[1]["args"]["bytes"] == 8
            assert evs[2]["args"]["flag"] == "my flag" and evs[2]["args"]["peer"] == rank
            for a, b in zip(evs, evs[1:]):
                assert a["dur"] >= 0 and a["ts"] + a["dur"] <= b["ts"] + 1e-3
    merged = json.load(open(path))
    assert {e["pid"] for e in _x_events(merged)} == {0, 1}
    assert len(_x_events(merged)) == 18


# ---- overflow ---------------------------------------------------------------------------------------------


def _overflow_rank(ctx):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ctx.trace(None, events_per_program=4) as session:
            trace, TRACE = trace_session.kernel_args(ctx, "many", 2)
            _many_events_kernel[(2,)](10, trace, TRACE=TRACE)
            # a launch with more programs than the buffer has rings: the extra program's events
            # are counted, not written anywhere
            _many_events_kernel[(3,)](5, trace, TRACE=TRACE)
    return session.trace, session.lost, [str(w.message) for w in caught]


def test_overflow_counted(iris_pool):
    """A full ring keeps the newest records in order and counts the overwritten ones; programs
    beyond the buffer's rings are counted too; the loss is reported (file, warning)."""
    for rank, (trace, lost, messages) in enumerate(iris_pool(2).run(_overflow_rank)):
        _check_overflow(rank, trace, lost, messages)


def _check_overflow(rank, trace, lost, messages):
    region = trace["otherData"]["regions"][str(rank)][0]
    # programs 0 and 1: 10 + 5 events in 4-record rings; program 2 of the second launch: 5 beyond
    assert region["overflow_by_program"] == {"0": 11, "1": 11} and region["beyond_rings"] == 5
    assert lost == region["lost"] == 27 and trace["otherData"]["lost_events"] == {str(rank): 27}
    assert any(f"rank {rank} lost 27 events" in m for m in messages), messages
    for program in (0, 1):
        kept = sorted((e for e in _x_events(trace) if e["args"]["program"] == program), key=lambda e: e["ts"])
        assert [e["args"]["item"] for e in kept] == [1, 2, 3, 4]  # the last four of the second launch


# ---- ops ----------------------------------------------------------------------------------------------------


def _op_rank(ctx, cases):
    torch.manual_seed(100 + ctx.rank)
    out = []
    for pattern, scheduler, shapes in cases:
        a = torch.randn(*shapes[0], device=ctx.device)
        b = torch.randn(*shapes[1], device=ctx.device)
        op = ops.plan(pattern, a, b, scheduler=scheduler)
        plain = op(a, b).clone()
        memo = _untraced_launches(ctx, op)
        with ctx.trace(None, label=f"{pattern}/{scheduler}") as session:
            traced = op(a, b).clone()
        again = op(a, b).clone()  # back to the untraced variant
        assert torch.equal(plain, traced) and torch.equal(plain, again), f"{pattern}/{scheduler}: results differ"
        assert any(tracer is not None for _, _, tracer in memo())  # the session's prepared launches
        out.append(session.trace)
    x = torch.arange(100, dtype=torch.float32, device=ctx.device) * (ctx.rank + 1)
    ccl.all_reduce(x)
    group_calls = [k for g in callpath.state(ctx).groups.values() for k in g.calls]
    assert group_calls and not any("traced" in str(k) for k in group_calls)
    with ctx.trace(None):
        y = torch.arange(100, dtype=torch.float32, device=ctx.device) * (ctx.rank + 1)
        ccl.all_reduce(y)
    assert torch.equal(x, y)
    return out


def _untraced_launches(ctx, op):
    """Check that an op run outside a session passed no trace buffer and launched TRACE=0
    variants; return a function listing its prepared launches."""
    assert ctx.tracer is None

    def memo():
        return [v for p in op.buffers["plans"]._plans.values() for v in p.memo.values()]

    assert memo() and all(tracer is None and prepared.args[-1] is None for _, prepared, tracer in memo())
    assert op.workspace.launchers and all(k[2] == 0 for k in op.workspace.launchers)  # the TRACE constexpr
    return memo


_OP_CASES = [  # (pattern, scheduler, (a shape, b shape)) at world size 2: rows of a scale with it
    ("gemm_all_scatter", "producer_consumer", ((40, 24), (24, 20))),
]
_ALL_OP_CASES = [(p, s, shapes) for p, shapes in (("gemm_all_scatter", ((40, 24), (24, 20))),
                                                  ("all_gather_gemm", ((20, 24), (24, 20))))
                 for s in ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")]
_ALL_OP_CASES.append(("all_gather_gemm", "copy_engine", ((20, 24), (24, 20))))


def test_op_events(iris_pool):
    """Every tile of an op (GEMM + all-scatter, producer-consumer: two kernels) has a compute
    event then a communicate event on its rank, each acquire names the flag of its tile,
    barriers theirs, peers and bytes add up to what the op moves. Tracing off is untouched:
    without a session, ops and collectives pass no trace buffer and launch TRACE=0 variants,
    and traced calls give bitwise the results of untraced ones, before and after the session.
    (Every scheduler of both patterns, on three ranks: extended.)"""
    _check_ops(iris_pool, 2, _OP_CASES)


@pytest.mark.extended
def test_op_events_every_scheduler(iris_pool):
    """As test_op_events, for every scheduler of both patterns, on three ranks."""
    _check_ops(iris_pool, 3, _ALL_OP_CASES)


def _check_ops(iris_pool, world, cases):
    results = iris_pool(world).run(_op_rank, cases)
    for rank, traces in enumerate(results):
        for (pattern, scheduler, shapes), trace in zip(cases, traces):
            events = _x_events(trace)
            label = f"{pattern}/{scheduler}"
            assert all(e["pid"] == rank and e["args"]["kernel"].startswith(label) for e in events)
            by = {}
            for e in events:
                by.setdefault(e["name"], []).append(e)
            elem = 4
            if pattern == "gemm_all_scatter":
                (M, K), (_, NL) = shapes
                produce, consume = by["produce"], by["consume"]
                tiles = sorted(e["args"]["item"] for e in produce)
                assert tiles == sorted(e["args"]["item"] for e in consume) == list(range(len(tiles)))
                assert {e["cat"] for e in produce} == {"compute"} and {e["cat"] for e in consume} == {"communicate"}
                first = {e["args"]["item"]: e for e in produce}
                for e in consume:
                    p = first[e["args"]["item"]]
                    assert p["ts"] + p["dur"] <= e["ts"] + 1e-3, "a tile is sent before it is computed"
                    assert e["args"]["peer"] == ((1 - rank) if world == 2 else -1)
                assert sum(e["args"]["bytes"] for e in consume) == M * NL * elem * (world - 1)
            else:
                (Ms, K), (_, NL) = shapes
                assert {e["cat"] for e in by["produce"]} == {"compute"}
                if scheduler == "fused_sequential":  # no fetch: produce reads the peers' rows itself
                    assert sum(e["args"]["bytes"] for e in by["produce"]) >= Ms * (world - 1) * K * elem
                elif scheduler != "copy_engine":  # (the copy engine's copies run on no SM)
                    fetch = by["fetch"]
                    assert sorted(e["args"]["item"] for e in fetch) == list(range(len(fetch)))
                    assert sum(e["args"]["bytes"] for e in fetch) == Ms * (world - 1) * K * elem
                    assert {e["cat"] for e in fetch if e["args"]["bytes"]} == {"communicate"}
                    assert all(0 <= e["args"]["peer"] < world and e["args"]["peer"] != rank
                               for e in fetch if e["args"]["bytes"] and e["args"]["peer"] != -1)
            waits = [e for e in events if e["cat"] == "wait"]
            assert all(e["args"]["flag"] and e["args"]["peer"] == rank for e in waits)
            if scheduler != "copy_engine":  # (its barriers are kernels of their own)
                assert {e["name"] for e in waits} >= {"entry_barrier", "exit_barrier"}
                for e in by["entry_barrier"] + by["exit_barrier"]:
                    assert "barrier slots" in e["args"]["flag"]
            if scheduler in ("producer_consumer", "wg_specialized", "copy_engine"):
                acquires = by["acquire"]
                for e in acquires:  # the flag of the item waited for
                    item = e["args"]["item"]
                    assert e["args"]["flag"] == f"{label} item flags" + (f"[{item}]" if item else "")
                assert len(acquires) == len(by["consume"])
            spans = by["program"]
            assert all(e["cat"] == "program" and e["args"]["item"] == 2 for e in spans)  # the op's second call
            assert {e["args"]["program"] for e in spans} == {e["args"]["program"] for e in events}
            for e in events:  # every event of a program lies within its span
                span = [s for s in spans if s["tid"] == e["tid"]][0]
                assert span["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-3


# ---- flash decode -------------------------------------------------------------------------------------------


def _decode_rank(ctx, schedulers):
    from iris_fw import flash_decode as fdm

    g = torch.Generator().manual_seed(21)  # q: the same on every rank
    q = torch.randn(1, 4, 16, generator=g).to(ctx.device)
    g.manual_seed(22 + ctx.rank)
    seq = 11 + 6 * ctx.rank
    k, v = torch.randn(1, seq, 2, 16, generator=g).to(ctx.device), torch.randn(1, seq, 2, 8, generator=g).to(ctx.device)
    out = {}
    for scheduler in schedulers:
        plain = fdm.flash_decode(q, k, v, scheduler=scheduler).clone()
        with ctx.trace(None, label=f"flash_decode {scheduler}") as session:
            traced = fdm.flash_decode(q, k, v, scheduler=scheduler).clone()
        assert torch.equal(plain, traced), scheduler
        fd = fdm.plan(q, k, v, scheduler=scheduler)
        out[scheduler] = (session.trace, fd.units, fd.n_split, fd.rows)
    return out


@pytest.mark.parametrize("scheduler", ["fused", pytest.param("bulk_sync", marks=pytest.mark.extended)])
def test_flash_decode_events(iris_pool, scheduler):
    """flash_decode records per work item its attention split, per unit the splits' combine and
    (fused) the push of the rank's partial, the wait for the peers' and their combine, with
    peers, bytes and the arrival flags; bulk-synchronous (extended): the local kernel, the
    all-gather and the combine kernel. Traced results equal untraced ones."""
    world = 2
    for rank, traces in enumerate(iris_pool(world).run(_decode_rank, [scheduler])):
        for scheduler, (trace, units, n_split, rows) in traces.items():
            events = _x_events(trace)
            by = {}
            for e in events:
                by.setdefault((e["args"]["kernel"], e["name"]), []).append(e)
            local = f"flash_decode.{scheduler}" if scheduler == "fused" else "flash_decode.bulk_sync local"
            attention = by[(local, "attention")]
            assert sorted(e["args"]["item"] for e in attention) == list(range(units * n_split))
            assert {e["cat"] for e in attention} == {"compute"}
            spans = by[(local, "program")]
            assert {e["args"]["item"] for e in spans} == ({2} if scheduler == "fused" else {-1})  # the second call
            reduces = sorted(e["args"]["item"] for e in by[(local, "reduce")])
            if scheduler == "fused":
                assert reduces == sorted(2 * list(range(units)))  # the splits' combine, then the ranks'
                pushes = by[(local, "push")]
                assert sorted(e["args"]["item"] for e in pushes) == list(range(units))
                for e in pushes:  # the unit's 2 query heads: o (Dv = 8) and lse, fp32
                    assert e["cat"] == "communicate" and e["args"]["peer"] == 1 - rank
                    assert e["args"]["bytes"] == 2 * (8 + 1) * 4 * (world - 1)
                waits = by[(local, "arrivals")]
                assert sorted(e["args"]["item"] for e in waits) == list(range(units))
                for e in waits:
                    u = e["args"]["item"]
                    assert e["args"]["flag"] == "flash_decode.fused arrival slots" + (f"[{u * world}]" if u else "")
            else:
                assert reduces == list(range(units))
                combine = by[("flash_decode.bulk_sync combine", "reduce")]
                assert sorted(e["args"]["item"] for e in combine) == list(range(units))
                assert any(k.startswith("ccl all_gather") for k, _ in by)
            for e in events:  # every event of a program of the local kernel lies within its span
                if e["args"]["kernel"] == local:
                    span, = [x for x in spans if x["tid"] == e["tid"]]
                    assert span["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-3


# ---- clock alignment and the merged file ----------------------------------------------------------------------


def _aligned_rank(ctx, path):
    torch.manual_seed(3 + ctx.rank)
    a, b = torch.randn(24, 16, device=ctx.device), torch.randn(16, 12, device=ctx.device)
    ops.gemm_all_scatter(a, b, scheduler="fused_sequential")
    with ctx.trace(path, label="aligned") as session:
        ops.gemm_all_scatter(a, b, scheduler="fused_sequential")
        x = torch.ones(64, device=ctx.device)
        ccl.all_reduce(x, algorithm="one_shot")
    return session.files


def test_merged_clock_alignment(iris_pool, tmp_path):
    """The merged file puts every rank on rank 0's clock: the estimated offsets lie within their
    stated error bound of the truth (CPU ranks share one clock: 0), and no rank leaves a
    cross-rank barrier before every rank entered it."""
    _check_alignment(iris_pool, tmp_path, 2)


@pytest.mark.extended
def test_merged_clock_alignment_three_ranks(iris_pool, tmp_path):
    """As test_merged_clock_alignment on three ranks (two peers aligned to rank 0)."""
    _check_alignment(iris_pool, tmp_path, 3)


def _check_alignment(iris_pool, tmp_path, world):
    path = str(tmp_path / "aligned.json")
    files = iris_pool(world).run(_aligned_rank, path)
    assert files[0][-1] == path and all(os.path.exists(f) for fs in files for f in fs)
    merged = json.load(open(path))
    align = merged["otherData"]["clock_alignment"]
    assert align["aligned"] and len(align["bounds_ns"]) == world and align["bounds_ns"][0] == 0
    granularity = 1000.0  # ns: generous for the host clock's resolution
    for offsets, bound in zip(align["offsets_ns"], align["bounds_ns"]):
        assert 0 <= bound < 60e9
        assert all(abs(o) <= bound + granularity for o in offsets), (offsets, bound)
    slack = 2 * max(align["bounds_ns"]) / 1e3 + 1.0  # us
    events = _x_events(merged)
    # A rank arrives at the op's entry barrier inside its entry_barrier event (by whichever
    # program starts first: no later than the earliest one), and at the all-reduce's inside its
    # push event (then waits in arrivals): no rank's wait may end before every rank started the
    # event it arrives in.
    for arrive, wait in (("entry_barrier", "entry_barrier"), ("push", "arrivals")):
        waits = [e for e in events if e["name"] == wait]
        assert {e["pid"] for e in waits} == set(range(world))
        entered = {r: min(e["ts"] for e in events if e["name"] == arrive and e["pid"] == r
                          and (arrive == "entry_barrier" or e["args"]["program"] == 0)) for r in range(world)}
        for e in waits:
            assert e["ts"] + e["dur"] >= max(entered.values()) - slack, (wait, e, entered)
    per_rank = [json.load(open(str(tmp_path / f"aligned.rank{r}.json"))) for r in range(world)]
    assert sum(len(_x_events(t)) for t in per_rank) == len(events)


def test_alignment_estimator():
    """The ping-pong estimate is within its bound for any split of the round trip, and drift
    between the start and end alignments is interpolated."""
    rng = np.random.default_rng(5)
    offset = 123_456.0
    sent = np.cumsum(rng.uniform(1e3, 2e3, 16))
    there = rng.uniform(50, 900, 16)  # one-way latencies, asymmetric
    back = rng.uniform(50, 900, 16)
    seen = sent + there + offset
    answered = sent + there + back
    est, bound, ref, peer_time = trace_session.estimate_offset(sent, seen, answered)
    assert abs(est - offset) <= bound and bound == pytest.approx((there + back).min() / 2)
    samples = [[np.zeros((2, 4, 3)), np.zeros((2, 4, 3))], [np.zeros((2, 4, 3)), np.zeros((2, 4, 3))]]
    for which, (t, drift) in enumerate(((0.0, 0.0), (1e9, 500.0))):
        samples[0][which][1, :, 0] = t + np.arange(4) * 100
        samples[0][which][1, :, 2] = t + np.arange(4) * 100 + 20
        samples[1][which][1, :, 1] = t + np.arange(4) * 100 + 10 + 7 + drift
    a = trace_session.alignments(2, samples)[1]
    assert a.offsets == (7.0, 507.0) and a.bound == 10.0
    assert np.allclose(a.to_reference(np.array([17.0, 17.0 + 0.5 * (1e9 + 500)])), [10.0, 10.0 + 0.5e9 + 250 - 250])


# ---- the command line ------------------------------------------------------------------------------------------


def _cli_rank(ctx, path):
    torch.manual_seed(11 + ctx.rank)
    a, b = torch.randn(24, 16, device=ctx.device), torch.randn(16, 12, device=ctx.device)
    with ctx.trace(path, label="cli"):
        ops.gemm_all_scatter(a, b, scheduler="producer_consumer")


def test_cli_summarize_and_plot(iris_pool, tmp_path, capsys):
    """``iris-fw trace summarize`` and ``plot`` (one trace, and --compare) on a recorded trace."""
    pytest.importorskip("matplotlib")
    from iris_fw.cli import main

    path = str(tmp_path / "cli.json")
    iris_pool(2).run(_cli_rank, path)
    assert main(["trace", "summarize", path, str(tmp_path / "cli.rank1.json")]) == 0
    text = capsys.readouterr().out
    for needle in ("rank 0:", "rank 1:", "compute", "communicate", "wait", "idle", "waits by flag",
                   "item flags", "lost events: none", "gemm_all_scatter/producer_consumer consumer"):
        assert needle in text, needle
    assert main(["trace", "summarize", path, "--call", "-1"]) == 0
    png = str(tmp_path / "one.png")
    assert main(["trace", "plot", path, "-o", png, "--rows", "program"]) == 0
    both = str(tmp_path / "both.png")
    assert main(["trace", "plot", path, str(tmp_path / "cli.rank0.json"), "--compare", "-o", both]) == 0
    for f in (png, both):
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no call 7"):
        main(["trace", "summarize", path, "--call", "7"])


# ---- sessions: errors, pausing, IRIS_FW_TRACE ---------------------------------------------------------------------


def _session_rank(ctx):
    with pytest.raises(TypeError, match="path"):
        ctx.trace(3)
    with pytest.raises(ValueError, match="events_per_program"):
        ctx.trace(None, events_per_program=0)
    with pytest.raises(ValueError, match="kinds"):
        ctx.trace(None, kinds={3: "low"})
    with ctx.trace(None) as session:
        with pytest.raises(iris_fw.IrisError, match="already open"):
            ctx.trace(None).__enter__()
        trace, TRACE = trace_session.kernel_args(ctx, "k", 1)
        _many_events_kernel[(1,)](2, trace, TRACE=TRACE)
        with session.paused():
            assert ctx.tracer is None and trace_session.kernel_args(ctx, "k", 1) == (None, 0)
            _many_events_kernel[(1,)](3, None, TRACE=0)
        _many_events_kernel[(1,)](1, trace, TRACE=TRACE)
    return len(_x_events(session.trace))


def test_session_checks_and_pause(iris_pool):
    """Bad arguments raise naming them, sessions do not nest, paused() runs untraced."""
    assert iris_pool(2).run(_session_rank) == [3, 3]


def _env_rank(ctx, path):
    os.environ["IRIS_FW_TRACE"] = path
    try:
        assert trace_session.env_trace_path() == path
        trace_session.start_env_trace(ctx)  # what init() calls
    finally:
        del os.environ["IRIS_FW_TRACE"]
    assert ctx.tracer is not None
    ccl.all_reduce(torch.ones(16, device=ctx.device))
    trace_session.end_env_trace(ctx)  # what close() calls
    assert ctx.tracer is None and trace_session.env_trace_path() is None
    trace_session.start_env_trace(ctx)  # unset: nothing
    assert ctx.tracer is None


def test_env_trace_session(iris_pool, tmp_path):
    """IRIS_FW_TRACE=path: init opens a session over the context's life, close writes it."""
    path = str(tmp_path / "env.json")
    iris_pool(2).run(_env_rank, path)
    merged = json.load(open(path))
    assert {e["pid"] for e in _x_events(merged)} == {0, 1}
    assert all(e["args"]["kernel"].startswith("ccl all_reduce") for e in _x_events(merged))


@pytest.mark.extended
def test_env_trace(tmp_path):
    """IRIS_FW_TRACE=path traces a context's whole life and writes at close (a process of its own)."""
    path = tmp_path / "env.json"
    code = ("import iris_fw, torch\nfrom iris_fw import ccl\n"
            "ctx = iris_fw.init(heap_size=1 << 24, bootstrap='single')\n"
            "assert ctx.tracer is not None\n"
            "x = torch.ones(16, device=ctx.device)\nccl.all_reduce(x)\nctx.close()\n")
    env = {**os.environ, "IRIS_FW_TRACE": str(path)}
    env.pop("IRIS_FW_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert path.exists() and (tmp_path / "env.rank0.json").exists()
    assert json.load(open(path))["otherData"]["format"] == trace_session.FORMAT


# ---- CUDA graphs (GPU) ----------------------------------------------------------------------------------------------


def _graph_rank(ctx):
    a, b = torch.randn(256, 128, device=ctx.device), torch.randn(128, 128, device=ctx.device)
    op = ops.plan("gemm_all_scatter", a, b, scheduler="fused_sequential")
    op(a, b)
    with ctx.trace(None) as session:
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(iris_fw.IrisError, match="CUDA-graph capture"):
            with torch.cuda.graph(graph):
                op(a, b)
        torch.cuda.synchronize()
        ctx.barrier()  # (the refusal aborted the job, as any host failure in a call does; this re-arms it)
        op = ops.plan("gemm_all_scatter", a, b, scheduler="fused_sequential")  # planned before: refused now
        op(a, b)  # the traced variant and its buffer exist now
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(a, b)
        for _ in range(3):
            a.copy_(torch.randn_like(a))
            graph.replay()
        ctx.barrier()
    spans = [e for e in _x_events(session.trace) if e["name"] == "program"]
    # item = the call's epoch: the re-planned op's eager call was 1, the three replays 2-4
    assert sorted({e["args"]["item"] for e in spans})[-3:] == [2, 3, 4]
    assert getattr(ctx, "_trace_keepalive", None)
    del graph, op  # the graph is gone: what it wrote into may go too (the pool checks for leaks)
    ctx._trace_keepalive.clear()


def test_traced_graph_replay(iris_pool, on_gpu):
    """A traced op captured in a CUDA graph records at every replay (its buffer is kept)."""
    if not on_gpu:
        pytest.skip("CUDA-graph capture needs a GPU")
    iris_pool(2).run(_graph_rank)


# ---- traced kernels compiled for GPUs (no GPU needed) -------------------------------------------------------------


class _FakeCtx:
    """What the patterns' host methods read, for compiling their kernels without a context."""

    rank, world_size, device = 0, 2, torch.device("cpu")
    heap_bases = torch.zeros(2, dtype=torch.int64)

    def empty(self, *shape, dtype=None):
        return torch.empty(*shape, dtype=dtype)

    def peer_view(self, t, peer):
        return t


def _compile(kernel, args, constexprs, target, num_warps=4, num_stages=3):
    """Compile ``kernel`` as Triton's launcher would for these arguments, for ``target``."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    bound, spec, options = binder(*args, **constexprs, **opts, debug=False)
    options, signature, cexprs, attrs = kernel._pack_args(backend, opts, bound, spec, options)
    return triton.compile(ASTSource(kernel, signature, cexprs, attrs), target=target, options=options.__dict__)


def _skeleton_jobs(full: bool):
    """(name, kernel, args, constexprs, warps, stages) of traced skeleton kernels for real plans."""
    from iris_fw.engine import skeletons as sk
    from iris_fw.engine.contract import split_args
    from iris_fw.engine.scheduler import Workspace, bind_kernel
    from iris_fw.plugins.all_gather_gemm import AllGatherGemm
    from iris_fw.plugins.gemm_all_reduce import GemmAllReduce
    from iris_fw.plugins.gemm_all_scatter import GemmAllScatter

    ctx = _FakeCtx()
    cases = [("fused", GemmAllScatter(), (256, 128), sk._fused_kernel, dict(ENTRY=True, EXIT=True, COMM_FIRST=False)),
             ("producer", AllGatherGemm(), (128, 128), sk._producer_kernel,
              dict(COMM_FIRST=True, SYNC=True, ENTRY=True, EXIT=True))]
    if full:
        cases += [("consumer", GemmAllScatter(), (256, 128), sk._consumer_kernel,
                   dict(COMM_FIRST=False, SYNC=True, QUEUE=False, FIXED=False, ENTRY=True, EXIT=True)),
                  ("specialized", AllGatherGemm(), (128, 128), sk._specialized_kernel,
                   dict(PRODUCERS=1, COMM_FIRST=True, ENTRY=True, EXIT=True)),
                  ("fused", GemmAllReduce(), (256, 64), sk._fused_kernel,
                   dict(ENTRY=True, EXIT=True, COMM_FIRST=False))]
    jobs = []
    for role, pattern, a_shape, kernel, extra in cases:
        a = torch.randn(*a_shape, dtype=torch.float16)
        b = torch.randn(a_shape[1], 128, dtype=torch.float16)
        sig = pattern.signature(ctx, a, b)
        buffers = pattern.setup(ctx, sig, pattern.default_config(ctx, sig), True)
        plan = pattern.bind(ctx, buffers, a, b)
        ws = Workspace(grids={role: 4}, state={role: torch.zeros(64, dtype=torch.int64)},
                       flags=torch.zeros(8, dtype=torch.int64))
        launcher = bind_kernel(ws, role, kernel, plan, dict(NPROG=4, **extra), 1)
        constexprs = {k: (tl.constexpr(v) if isinstance(v, type) else v) for k, v in launcher.constexprs.items()}
        tail = {"fused": (plan.num_tiles,), "producer": (plan.num_items,),
                "consumer": (plan.num_tiles, plan.num_items, 0), "specialized": (plan.num_tiles, plan.num_items)}[role]
        args = (*split_args(plan.args), ws.state[role], ws.flags, *tail, 0, 2, ctx.heap_bases, 1 << 40)
        jobs.append((f"{pattern.name} {kernel.fn.__name__}", kernel, args, constexprs, plan.num_warps, plan.num_stages))
    return jobs


def _ccl_jobs():
    from iris_fw._kernels import _clock_sync_kernel
    from iris_fw.collectives import all_reduce, gather_scatter

    f32 = torch.zeros(4096, dtype=torch.bfloat16)
    i64 = torch.zeros(64, dtype=torch.int64)
    bases = torch.zeros(2, dtype=torch.int64)
    common = dict(BLOCK=1024, CAP=4096)
    return [
        ("one_shot", all_reduce._one_shot_kernel, (f32, f32, f32, i64, i64, 4096, 0, 2, bases, 1 << 40),
         dict(OP="sum", AVG=False, **common)),
        ("two_shot", all_reduce._two_shot_kernel, (f32, f32, f32, f32, i64, i64, 4096, 0, 2, bases, 1 << 40),
         dict(OP="sum", AVG=False, **common)),
        ("all_gather_pull", gather_scatter._all_gather_pull_kernel,
         (f32, f32, f32, i64, i64, 4096, 4096, 0, 2, bases, 1 << 40), dict(STAGED=True, **common)),
        ("clock_sync", _clock_sync_kernel, (i64, i64, 0, 4, 0, 2, bases), {}),
    ]


def _user_jobs():
    data = torch.zeros(64, dtype=torch.int64)
    bases = torch.zeros(2, dtype=torch.int64)
    return [("user", _user_kernel, (data, data, 4, 0, 2, bases, 1 << 40), {})]


def _compile_traced(target_name):
    """Compile traced kernels for one target; print one line per kernel (child process with
    TRITON_INTERPRET=0: see the tests). ``IRIS_FW_TEST_FULL_COMPILE=1``: every skeleton, the
    collectives and flash decode, else the user kernel (the whole device API) and the clock
    alignment; on NVIDIA also the user kernel's untraced variant against its twin without
    record calls."""
    from triton.backends.compiler import GPUTarget

    _compile_for(GPUTarget(*COMPILE_TARGETS[target_name]))


def _compile_for(target):
    clock = 1 if target.backend == "cuda" else 2
    jobs = [(n, k, a, c, 4, 3) for n, k, a, c in _user_jobs() + _ccl_jobs()[-1:]]
    full = os.environ.get("IRIS_FW_TEST_FULL_COMPILE") == "1"
    if full:
        jobs = [(n, k, a, c, 4, 3) for n, k, a, c in _user_jobs() + _ccl_jobs()] + _skeleton_jobs(True)
    for name, kernel, args, constexprs, warps, stages in jobs:
        if "TRACE" in kernel.arg_names:
            constexprs = {**constexprs, "TRACE": clock}
        compiled = _compile(kernel, args, constexprs, target, warps, stages)
        asm = compiled.asm.get("ptx") or compiled.asm.get("amdgcn")
        timer = "globaltimer" if clock == 1 else "s_memrealtime"
        assert timer in asm, f"{name}: no {timer} in the code"
        print("compiled", name, flush=True)
    if full:
        _compile_flash_decode(target, clock)
    if target.backend == "cuda":  # compiled out: the untraced variant is the kernel without the calls
        (_, kernel, args, _), = _user_jobs()
        untraced = _compile(kernel, args[:-1] + (None,), {"TRACE": 0}, target).asm["ptx"]
        plain = _compile(_plain_kernel, args[:-1], {}, target).asm["ptx"]
        assert _instructions(untraced, "_user_kernel") == _instructions(plain, "_plain_kernel")
        print("compiled untraced user kernel = plain kernel", flush=True)


def _instructions(ptx: str, name: str) -> list:
    """The PTX's instruction lines: no debug sections, line info, comments or labels; the kernel's
    name replaced."""
    lines = []
    for line in ptx.split(".section\t.debug")[0].replace(name, "KERNEL").splitlines():
        line = line.strip()
        if line and not line.startswith((".loc", ".file", "//", "$L")) and not line.endswith(":"):
            lines.append(line)
    return lines


def _compile_flash_decode(target, clock):
    """The flash-decode kernels' traced variants (fused; the bulk-synchronous combine)."""
    from helpers import compile_kernel
    from iris_fw import flash_decode_kernels as fd

    name = "sm90" if target.backend == "cuda" else "gfx942"
    types = {k: "*" + t for k, t in dict(q="bf16", k="bf16", v="bf16", out="bf16", kv_lens="i32", block_table="i32",
                                          partials="fp32", partial_lse="fp32", mine="fp32", recv="fp32",
                                          gathered="fp32", unit_counters="i64", slots="i64", epochs="i64",
                                          heap_bases="i64").items()}
    types.update(qk_scale="fp32", trace="i64")
    fused = dict(HQ=32, HKV=8, D=128, DV=128, ROWS=16, BD=128, BDV=128, BLOCK_N=64, HAS_LENS=True, PAGE=0,
                 FUSED=True, EXACT=False, TRACE=clock)
    compile_kernel(fd._flash_decode_kernel, name, fused, types, options={"num_warps": 4, "num_stages": 3})
    print("compiled flash_decode fused", flush=True)
    combine = dict(HQ=32, HKV=8, DV=128, ROWS=16, BDV=128, TRACE=clock)
    compile_kernel(fd._combine_kernel, name, combine, types, options={"num_warps": 4})
    print("compiled flash_decode combine", flush=True)


@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.extended) if COMPILE_TARGETS[t][0] == "hip"
                                    else t for t in sorted(COMPILE_TARGETS)])
def test_traced_kernels_compile(tmp_path, target):
    """The interpreter runs the host-clock branch only: compile the device API (a user kernel
    recording compute, communicate and wait events) and the clock alignment kernel for sm_90
    (%globaltimer, %smid) and (extended) gfx942 (s_memrealtime, HW_ID); the user kernel's
    untraced variant gives the same sm_90 instructions as the kernel without its record calls."""
    compile_in_child(tmp_path, "test_trace", "_compile_traced", target, 2 + (COMPILE_TARGETS[target][0] == "cuda"))


@pytest.mark.extended
@pytest.mark.parametrize("target", sorted(COMPILE_TARGETS))
def test_traced_kernels_compile_all(tmp_path, target, monkeypatch):
    """Traced skeleton kernels (fused, producer, consumer, role-specialized, a multi-step
    pattern) for real plans and the traced collectives, compiled for sm_90 and gfx942."""
    monkeypatch.setenv("IRIS_FW_TEST_FULL_COMPILE", "1")
    cuda = COMPILE_TARGETS[target][0] == "cuda"
    compile_in_child(tmp_path, "test_trace", "_compile_traced", target, 1 + len(_ccl_jobs()) + 5 + 2 + cuda)
