"""Ranks in different calls learn it at once (iris_fw.call_identity): a skipped collective, another
collective, a shape or dtype changed on one rank on a later call (the others repeat a validated
call: no host exchange), an op's fields named, a rank busy on its host named after the bound.
One job of two ranks (CPU ranks, or GPUs — one shared GPU with IRIS_FW_SHARE_GPUS=1) runs the
cases of tests/scripts/call_identity.py one after another."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "call_identity.py")
CASES = ["skip_first", "other_collective", "shape_later", "dtype_later", "op_shape_later", "op_fields", "host_stuck"]
#: every rank fails within this many seconds of the case's start (the wait timeout is 3 s)
LIMIT_S = 10


@pytest.fixture(scope="module")
def results():
    import iris_fw.testing

    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_FW_")}
    env.update(IRIS_FW_WAIT_TIMEOUT="3", IRIS_FW_LIVENESS_TIMEOUT="3")
    gpus = iris_fw.testing.gpu_count()
    if not gpus:
        env["IRIS_FW_TRANSPORT"] = "host_shm"
    elif gpus < 2:
        env["IRIS_FW_SHARE_GPUS"] = "1"  # both ranks on one GPU (each its own process and context)
    res = subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", "2", SCRIPT, *CASES], capture_output=True,
                         text=True, timeout=600, env=env, cwd=ROOT)
    out: dict = {}
    for case, rank, seconds, kind, text in re.findall(r"RESULT (\w+) (\d) ([\d.]+) (\S+) ?(.*)", res.stdout):
        out.setdefault(case, {})[int(rank)] = (float(seconds), kind, text)
    assert set(out) == set(CASES) and all(len(v) == 2 for v in out.values()), res.stdout + res.stderr
    return out


def _check(results, case, kinds, *needles):
    rows = results[case]
    for rank, (seconds, kind, text) in rows.items():
        assert kind == kinds[rank], (case, rank, kind, text)
        assert seconds < LIMIT_S, (case, rank, seconds, text)
        missing = [n for n in needles if n not in text]
        assert not missing, (case, rank, missing, text)
        assert "IndexError" not in text and "ValueError" not in text and "unpack" not in text, text


def test_skipped_first_collective_names_both_calls(results):
    _check(results, "skip_first", ["CallMismatch"] * 2, "ranks are in different calls",
           "rank 0: iris_fw.ccl.all_reduce",
           "rank 1: Context.barrier")


def test_different_collectives_are_named(results):
    _check(results, "other_collective", ["CallMismatch"] * 2, "different collectives",
           "rank 0: iris_fw.ccl.all_reduce(dtype=float32, numel=64",
           "rank 1: iris_fw.ccl.broadcast(dtype=float32, numel=64")


def test_shape_changed_on_a_later_call(results):
    """Rank 1 validates its new call; rank 0 repeats its validated one and waits on the device:
    rank 1 sees rank 0's epoch counters ahead, and both fail naming both calls."""
    _check(results, "shape_later", ["PeerFailure", "CallMismatch"], "rank 0 launched a call this rank did not make",
           "iris_fw.ccl.all_reduce(dtype=float32, numel=100",
           "rank 1 is in iris_fw.ccl.all_reduce(dtype=float32, numel=200")


def test_dtype_changed_on_a_later_call(results):
    _check(results, "dtype_later", ["PeerFailure", "CallMismatch"], "all_gather_into_tensor(dtype=float32",
           "all_gather_into_tensor(dtype=float16")


def test_op_shape_changed_on_a_later_call(results):
    _check(results, "op_shape_later", ["PeerFailure", "CallMismatch"], "gemm_all_scatter(M=16, N/W=8, K=32",
           "M=24, N/W=8, K=32")


def test_op_mismatch_names_the_field(results):
    _check(results, "op_fields", ["CollectiveMismatch"] * 2, "argument 'M' differs", "ranks 0: 16", "ranks 1: 24")


def test_busy_rank_is_named_after_the_bound(results):
    """Rank 1 stays on its host for 9 s: rank 0 gives up after the host bound (wait timeout 3 s +
    liveness bound 3 s) naming it; rank 1, arriving late, raises rank 0's report at once."""
    (t0, k0, m0), (t1, k1, m1) = results["host_stuck"][0], results["host_stuck"][1]
    assert k0 == "WaitTimeout" and "Context.barrier" in m0 and "rank 1" in m0 and 5.5 < t0 < LIMIT_S, m0
    assert k1 == "WaitTimeout" and "rank 0 failed" in m1 and 9 <= t1 < 9 + 2, m1


@pytest.mark.parametrize("call", ["gemm_all_scatter", "gemm_all_reduce", "flash_decode", "plan", "ccl.all_reduce",
                                  "ccl.new_group", "moe_dispatch", "moe.plan"])
def test_ctx_of_the_wrong_type_is_named(call):
    """``ctx='x'`` raises an ArgumentTypeError naming ``ctx`` (no context needed to see it)."""
    import torch

    from iris_fw import ccl, moe, ops
    from iris_fw.errors import ArgumentTypeError

    a = torch.ones(4, 4)
    idx = torch.zeros(4, 1, dtype=torch.int64)
    calls = {"gemm_all_scatter": lambda: ops.gemm_all_scatter(a, a, ctx="x"),
             "gemm_all_reduce": lambda: ops.gemm_all_reduce(a, a, ctx="x"),
             "flash_decode": lambda: ops.flash_decode(a, a, a, ctx="x"),
             "plan": lambda: ops.plan("gemm_all_scatter", a, a, ctx="x"),
             "ccl.all_reduce": lambda: ccl.all_reduce(a, ctx="x"),
             "ccl.new_group": lambda: ccl.new_group([0], ctx="x"),
             "moe_dispatch": lambda: ops.moe_dispatch(a, idx, a[:, :1], 2, max_tokens_per_rank=4, ctx="x"),
             "moe.plan": lambda: moe.plan(a, idx, a[:, :1], 2, max_tokens_per_rank=4, ctx="x")}
    with pytest.raises(ArgumentTypeError, match=r"ctx must be an iris_fw.Context .* got str 'x'"):
        calls[call]()


def _different_query(ctx):
    import torch

    import iris_fw
    from iris_fw import ops

    sub = iris_fw.init(heap_size=1 << 24, transport=ctx.transport.name, debug=True)
    try:
        g = torch.Generator().manual_seed(7)
        q = torch.randn(1, 2, 16, generator=g).to(sub.device)
        k, v = (torch.randn(1, 8, 1, 16, generator=g).to(sub.device) for _ in range(2))
        o = ops.flash_decode(q, k, v, ctx=sub)  # the same q everywhere: fine
        assert torch.isfinite(o).all()
        if ctx.rank == 1:
            q = q + 1
        with pytest.raises(iris_fw.CollectiveMismatch,
                           match=r"argument 'q \(digest of its values\)' differs across ranks"):
            ops.flash_decode(q, k, v, ctx=sub)
    finally:
        sub.close()


def test_flash_decode_with_another_query_is_caught_under_debug(iris_pool):
    """A rank whose q differs (the caller's promise broken: a wrong result on some rank) raises on
    every rank with IRIS_FW_DEBUG=1."""
    iris_pool(2).run(_different_query)


def test_counters_ahead_count_only_from_a_peer_outside_this_exchange():
    """A peer whose epoch counters are ahead while this rank waits in an exchange is a mismatch
    only if it has not joined that exchange. One that joined may have completed it (every post
    arrived after this rank's last poll) and launched its next kernel before this rank polls
    again: a correct program under load (a false ``CallMismatch`` seen once in a helper's run,
    2026-11-27). Host calls: the peer's board has reached this rank's host-call number; a
    group's exchange: the peer's post is there (``joined``)."""
    from types import SimpleNamespace

    from iris_fw.call_identity import IDLE, IN_HOST_CALL, Calls
    from iris_fw.errors import CallMismatch

    class Ctx:  # (weakly referenced by Calls)
        rank = 1
        watchdog = SimpleNamespace(aborted=False, host_failure=lambda: None)

    ctx = Ctx()
    calls = Calls(ctx, 0)
    calls.host_seq = 5
    calls.ahead = lambda peers: (0, "ccl.all_reduce epochs")
    calls.mismatch = lambda text: CallMismatch(text)

    for board_seq, state, raises in ((5, IN_HOST_CALL, False),  # in this host call, or done with it
                                     (5, IDLE, False),
                                     (4, IDLE, True)):  # repeated a validated call: never entered this one
        calls.board = lambda p, s=board_seq, st=state: (s, 0, st, "")
        if raises:
            with pytest.raises(CallMismatch, match="rank 0 launched a call this rank did not make"):
                calls.check("ccl.all_reduce", [0])
        else:
            calls.check("ccl.all_reduce", [0])
    calls.board = lambda p: (4, 0, IDLE, "")
    calls.check("ccl.all_reduce", [0], group=True, joined=lambda p: True)  # its post is there
    with pytest.raises(CallMismatch, match="did not make"):
        calls.check("ccl.all_reduce", [0], group=True, joined=lambda p: False)
