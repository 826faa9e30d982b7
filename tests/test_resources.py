"""Resources at init (the heap must fit /dev/shm or free GPU memory), tensors outliving their
context (never a crash), and segments of ranks that died during set-up."""

import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import needs_host_shm
import torch
import triton
import triton.language as tl

import iris_fw
import iris_fw.testing
from iris_fw import device as dv
from iris_fw.errors import ContextClosed, HeapTooLarge
from iris_fw.transports import host_shm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the heap must fit -----------------------------------------------------------------------


@pytest.mark.parametrize("heap_size", [1 << 40, 1 << 62])
def test_heap_larger_than_the_host_is_refused(heap_size):
    with pytest.raises(HeapTooLarge) as info:
        iris_fw.init(heap_size=heap_size, bootstrap="single")
    msg = str(info.value)
    assert isinstance(info.value, MemoryError) and f"heap_size={heap_size}" in msg
    assert "free" in msg and "smaller heap_size" in msg, msg


def _too_large_on_every_rank(ctx):
    with pytest.raises(HeapTooLarge, match=r"heap_size=1099511627776 \(1\.0 TiB\) does not fit"):
        iris_fw.init(heap_size=1 << 40, transport=ctx.transport.name)
    ctx.barrier()  # every rank got here: nobody hangs in the transport's set-up


def test_heap_too_large_raises_on_every_rank(iris_pool):
    iris_pool(2).run(_too_large_on_every_rank, timeout=120)


_SMALL_SHM_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    import iris_fw
    from iris_fw.errors import HeapTooLarge
    st = os.statvfs("/dev/shm")
    assert st.f_blocks * st.f_frsize == 64 << 20, "not the private 64 MiB /dev/shm"
    try:
        iris_fw.init(heap_size=1 << 30, bootstrap="single")   # the default size: SIGBUS before the check
    except HeapTooLarge as exc:
        print("refused:", exc)
    else:
        sys.exit("a 1 GiB heap was accepted on a 64 MiB /dev/shm")
    with iris_fw.init(heap_size=48 << 20, bootstrap="single") as ctx:  # fits: every page usable
        x = ctx.ones(40 << 20, dtype=torch.uint8)
        assert int(x.sum()) == 40 << 20
        print("fits: ok")
""")


def test_heap_larger_than_a_small_dev_shm_is_refused(tmp_path):
    """Docker's default 64 MiB /dev/shm, reproduced in a private mount namespace (host_shm's
    heaps live there; GPU heaps do not)."""
    needs_host_shm()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) on this machine: cannot mount a private /dev/shm")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine does not allow a private mount namespace (unshare -rm): {probe.stderr.strip()}")
    script = tmp_path / "small_shm.py"
    script.write_text(_SMALL_SHM_SCRIPT)
    res = subprocess.run(["unshare", "-rm", "sh", "-c",
                          f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script}"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused: heap_size=1073741824 (1.0 GiB) does not fit" in res.stdout and "/dev/shm" in res.stdout
    assert "--shm-size" in res.stdout and "fits: ok" in res.stdout, res.stdout


def test_resource_message_names_size_space_and_remedy(monkeypatch):
    class _Stat:
        f_bavail, f_frsize, f_blocks = 16384, 4096, 16384  # 64 MiB free

    class _Boot:
        local_world_size = 2

    monkeypatch.setattr(host_shm.os, "statvfs", lambda path: _Stat)
    problem = host_shm.HostShmTransport.check_resources(_Boot, 1 << 30)
    assert isinstance(problem, HeapTooLarge)
    text = str(problem)
    assert "2 rank(s) need 2.0 GiB of /dev/shm, which has 64.0 MiB free" in text
    assert "at most 30198988 bytes" in text and "--shm-size" in text
    assert host_shm.HostShmTransport.check_resources(_Boot, 16 << 20) is None


# ---- tensors outliving their context -----------------------------------------------------------


@triton.jit
def _read_peer_kernel(src, out, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, dv.load(src + offs, rank, peer, heap_bases, mask=offs < n), mask=offs < n)


def _mapped_segments(prefix):
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/dev/shm/" + prefix in line)


def _use_after_close(ctx):
    """A heap tensor, a view, a peer view and a kernel's input used after close: the values are
    still there (the mappings live while a tensor does), context methods raise ContextClosed,
    and the mappings go with the last tensor."""
    from iris_fw import env

    prefix = env.get("IRIS_FW_SHM_PREFIX")
    mapped_before = _mapped_segments(prefix)
    sub = iris_fw.init(heap_size=1 << 20, transport=ctx.transport.name)
    n = 100
    mine = sub.arange(n, dtype=torch.float32) + 1000 * sub.rank
    x = sub.zeros(n, dtype=torch.float32)
    x.copy_(mine)
    view = x[10:20]
    peer = (sub.rank + 1) % sub.world_size
    sub.barrier()
    pv = sub.peer_view(x, peer)
    want_peer = torch.arange(n, dtype=torch.float32, device=ctx.device) + 1000 * peer
    assert torch.equal(pv, want_peer)
    heap_bases = sub.heap_bases
    sub.close()
    assert sub.closed
    # data written before close is still readable
    assert torch.equal(x, mine) and torch.equal(view, mine[10:20])
    if ctx.device.type == "cpu":
        assert torch.equal(pv, want_peer)  # the peer's mapping lives too (host_shm)
        out = torch.zeros(n, dtype=torch.float32)
        _read_peer_kernel[(1,)](x, out, n, sub.rank, peer, heap_bases, BLOCK=128)
        assert torch.equal(out, want_peer)  # a kernel given the old heap_bases reaches mapped memory
        assert _mapped_segments(prefix) > mapped_before
    ctx.barrier()  # every rank read the peers' data: now write
    x.add_(1)
    assert float(x.sum()) == float(mine.sum()) + n
    for call in (lambda: sub.zeros(3), lambda: sub.barrier(), lambda: sub.synchronize(), lambda: sub.offset_of(x),
                 lambda: sub.broadcast(1), lambda: sub.peer_view(x, peer), lambda: sub.device_barrier(),
                 lambda: sub.check_symmetry(), lambda: setattr(sub, "wait_timeout", 5.0),
                 lambda: sub.as_symmetric(torch.ones(2))):
        with pytest.raises(ContextClosed, match="is closed: create a new one"):
            call()
    from iris_fw import ccl

    with pytest.raises(ContextClosed):
        ccl.all_reduce(torch.ones(4, device=ctx.device), ctx=sub)
    sub.close()  # idempotent
    del x, view, pv, mine
    gc.collect()
    if ctx.device.type == "cpu":
        assert _mapped_segments(prefix) == mapped_before, "the last tensor's death must unmap the heaps"
    ctx.barrier()


def test_tensors_outlive_their_context(iris_pool):
    iris_pool(2).run(_use_after_close, timeout=300)


_README_AFTER_WITH = textwrap.dedent("""
    import iris_fw, torch
    with iris_fw.init(heap_size=1 << 20, bootstrap="single") as ctx:
        dst = ctx.zeros(4096)
        dst += 2
        rows = dst.view(64, 64)
    print("after:", float(dst.sum()), float(rows[3].sum()))
    dst[0] = 7                   # writes work too (the memory is no longer shared)
    print("ok", float(dst[0]))
""")


@pytest.mark.extended
def test_result_used_after_the_with_block_does_not_crash(tmp_path):
    """The README's example, used after its ``with`` block (the rank-pool test above is the quick variant)."""
    script = tmp_path / "after.py"
    script.write_text(_README_AFTER_WITH)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}{res.stderr}"
    assert "after: 8192.0 128.0" in res.stdout and "ok 7.0" in res.stdout


# ---- segments of ranks that died during set-up -----------------------------------------------


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_segments_of_dead_owners_are_removed(tmp_path):
    prefix = "iris_fw_test_stale_"
    dead, alive = host_shm.segment_tag(_dead_pid()), host_shm.segment_tag(os.getpid())
    names = {
        "dead": f"{prefix}{dead}_{'a' * 32}",
        "alive": f"{prefix}{alive}_{'b' * 32}",
        "other_prefix": f"other_{dead}_{'c' * 32}",
        "not_ours": f"{prefix}{dead}_short",
        "other_namespace": f"{prefix}1-{os.getpid() + 999999}_{'d' * 32}",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    removed = host_shm.remove_stale_segments(prefix, str(tmp_path))
    assert removed == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")


def test_init_removes_a_dead_ranks_segment(monkeypatch):
    """What a rank SIGKILLed between creating and unlinking its segment leaves under mpirun or
    torchrun is removed by the next set-up on the host."""
    needs_host_shm()
    prefix = f"iris_fw_t{os.getpid()}_"
    monkeypatch.setenv("IRIS_FW_SHM_PREFIX", prefix)
    leftover = os.path.join("/dev/shm", f"{prefix}{host_shm.segment_tag(_dead_pid())}_{'e' * 32}")
    open(leftover, "w").close()
    with iris_fw.init(heap_size=1 << 20, bootstrap="single", transport="host_shm"):
        assert not os.path.exists(leftover)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.mark.parametrize("fails_at", ["names", "reports"])
def test_a_failed_setup_unlinks_its_segments_at_once(monkeypatch, fails_at):
    """A peer killed during set-up (under mpirun or torchrun: no launcher cleans up): the survivor's
    set-up fails, and its own segment, the peers' it learnt and the lost peer's are unlinked now,
    not at the next job's set-up. (The lost peer is a zombie: its pid still exists.)"""
    from iris_fw.errors import PeerFailure

    prefix = f"iris_fw_f{os.getpid()}_"
    monkeypatch.setenv("IRIS_FW_SHM_PREFIX", prefix)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while zombie.poll() is None:  # (poll reaps it: keep its pid through the watchdog's record instead)
            pass
        lost_segment = f"{prefix}{host_shm.segment_tag(zombie.pid)}_{'f' * 32}"
        open(os.path.join("/dev/shm", lost_segment), "w").close()
        other = f"{prefix}{host_shm.segment_tag(os.getpid())}_{'0' * 32}"

        class _Watchdog:
            lost = {1: "rank 1 died"}
            processes = [{"pid": os.getpid()}, {"pid": zombie.pid}]

        class _Boot:
            rank, world_size, local_world_size = 0, 2, 2
            liveness = _Watchdog()
            calls = 0

            def all_gather(self, obj):
                _Boot.calls += 1
                if fails_at == "names" or _Boot.calls == 2:
                    raise PeerFailure("rank 0: rank 1 died", 1)
                open(os.path.join("/dev/shm", other), "w").close()  # a segment rank 0 learnt the name of
                return [obj, other]

        with pytest.raises(PeerFailure):
            monkeypatch.setattr(host_shm.HostShmTransport, "_map_peer", staticmethod(lambda *a: None))
            host_shm.HostShmTransport(_Boot(), 1 << 20)
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    finally:
        for n in os.listdir("/dev/shm"):
            if n.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", n))


def _die_on_rank_one(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    ctx.barrier()


def _world_size(ctx):
    return ctx.world_size


def test_a_rank_lost_in_a_pool_is_named_and_the_pool_replaced(iris_pool):
    """A pool rank that dies in native code (SIGSEGV here) is reported with its signal, and the
    next test gets a fresh pool instead of a broken pipe to the dead rank."""
    pool = iris_pool(2)
    with pytest.raises(iris_fw.testing.RankFailure, match=r"rank 1 (exited|died) \(killed by SIGSEGV\)"):
        pool.run(_die_on_rank_one)
    assert pool.broken
    assert iris_pool(2).run(_world_size) == [2, 2]
