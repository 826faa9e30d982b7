"""iris-fw launch: every rank watched, failures stop the job within a second, signals forwarded,
children reaped, contradictory settings refused, the rendezvous on loopback only, rank-tagged
output, ``-m module``."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import iris_fw.testing
from iris_fw import launch as launch_mod
from iris_fw.errors import ArgumentError, EnvironmentVariableError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "scripts", "launch_probe.py")
LAUNCH = [sys.executable, "-m", "iris_fw", "launch"]


def _env(**changes):
    """The environment without iris-fw's variables, except GPU sharing (a one-GPU machine runs
    these 2- and 3-rank jobs with its ranks sharing the GPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_FW_") or k == "IRIS_FW_SHARE_GPUS"}
    env.update(changes)
    return env


def _run(args, timeout=300, **changes):
    return subprocess.run(LAUNCH + args, capture_output=True, text=True, timeout=timeout, env=_env(**changes), cwd=ROOT)


def _gone(pid):
    """Process ``pid`` neither runs nor lingers as a zombie (it was reaped)."""
    return not os.path.exists(f"/proc/{pid}")


def _pids(text):
    return [int(p) for p in re.findall(r"pid (\d+)", text)]


@pytest.mark.parametrize("failing, n", [(1, 2), pytest.param(2, 3, marks=pytest.mark.extended),
                                        pytest.param(0, 3, marks=pytest.mark.extended)])
def test_a_failing_rank_stops_the_others_within_a_second(tmp_path, failing, n):
    """Rank ``failing`` exits with 3 once the others run (the old launcher only looked at the
    first running rank, so a failure of rank 1 while rank 0 ran went unnoticed)."""
    res = _run(["-n", str(n), PROBE, "fail", str(failing), "3", str(tmp_path)], timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    assert f"iris-fw launch: rank {failing} failed (exit code 3); stopping rank(s)" in res.stderr, res.stderr
    failed_at = float(re.search(rf"\[rank {failing}\] rank {failing}: exiting with 3 at ([\d.]+)", res.stdout).group(1))
    stopped = {int(r): float(t) for r, t in re.findall(r"\[rank (\d+)\] rank \d+: stopped at ([\d.]+)", res.stdout)}
    assert sorted(stopped) == [r for r in range(n) if r != failing], res.stdout
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == n - 1 and all(_gone(p) for p in pids), f"ranks left running or unreaped: {pids}"
    # from the failing rank's last line to the others' SIGTERM: its exit, the launcher's poll, the signal
    latency = max(stopped.values()) - failed_at
    print(f"rank {failing} of {n} failed: the others got SIGTERM {latency:.2f}s later")
    assert latency < 2, f"the other ranks were stopped {latency:.1f}s after rank {failing} failed"


# (SIGINT by default: SIGHUP and SIGTERM take the launcher's same handler, _FORWARDED, under -m extended)
@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGHUP, marks=pytest.mark.extended),
                                    pytest.param(signal.SIGTERM, marks=pytest.mark.extended)])
def test_signals_are_forwarded_and_children_reaped(signum):
    proc = subprocess.Popen(LAUNCH + ["-n", "2", PROBE, "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=ROOT)
    lines = []
    deadline = time.monotonic() + 120
    while sum("ready" in line for line in lines) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    assert sum("ready" in line for line in lines) == 2, "".join(lines)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    text = "".join(lines) + out
    assert proc.returncode == 128 + signum, (proc.returncode, text, err)
    name = signal.Signals(signum).name
    assert f"[rank 0] got {name}" in text and f"[rank 1] got {name}" in text, text
    assert f"got {name}; forwarding it to the ranks" in err, err
    assert took < 10, f"{took:.1f}s from the signal to the launcher's exit"
    assert all(_gone(p) for p in _pids(text))


@pytest.mark.parametrize("changes, message", [
    ({"IRIS_FW_BOOTSTRAP": "single"}, "IRIS_FW_BOOTSTRAP=single is set in this environment, but iris-fw launch -n 2"),
    ({"IRIS_FW_BOOTSTRAP": "mpi"}, "IRIS_FW_BOOTSTRAP=mpi is set in this environment"),
    ({"IRIS_FW_DEBUG": "maybe"}, "IRIS_FW_DEBUG='maybe' is not valid"),
    ({"IRIS_FW_SHM_PREFIX": "../../tmp/evil_"}, "IRIS_FW_SHM_PREFIX='../../tmp/evil_' is not valid"),
])
def test_contradictory_settings_are_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys, changes, message):
    from iris_fw.cli import main

    for name in [k for k in os.environ if k.startswith("IRIS_FW_")]:
        monkeypatch.delenv(name)
    for name, value in changes.items():
        monkeypatch.setenv(name, value)
    marker = tmp_path / "started"
    assert main(["launch", "-n", "2", PROBE, "marker", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iris-fw launch: ") and message in err, err
    assert not marker.exists()


# CPU ranks: under -m extended (GPUs: by default, as cpu_extended marks a parameter): the refusals
# above call the command's main() in this process — the same code, returning 2 with the message and
# nothing raised — and `python -m iris_fw` (test_cli) exits with what main() returns.
@(pytest.mark.extended if iris_fw.interpreting() else lambda f: f)
def test_refusal_from_the_command_line_has_no_traceback(tmp_path):
    marker = tmp_path / "started"
    res = _run(["-n", "2", PROBE, "marker", str(marker)], IRIS_FW_BOOTSTRAP="single")
    assert res.returncode == 2 and "IRIS_FW_BOOTSTRAP=single" in res.stderr, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and not marker.exists()


def test_job_settings():
    assert launch_mod.job_settings(1, {"IRIS_FW_BOOTSTRAP": "single", "TRITON_INTERPRET": "1"}) == {
        "IRIS_FW_BOOTSTRAP": "single", "IRIS_FW_TRANSPORT": "host_shm"}
    assert launch_mod.job_settings(3, {"TRITON_INTERPRET": "1"}) == {
        "IRIS_FW_BOOTSTRAP": "auto", "IRIS_FW_TRANSPORT": "host_shm"}
    assert launch_mod.job_settings(3, {"TRITON_INTERPRET": "1", "IRIS_FW_BOOTSTRAP": "torch"}) == {
        "IRIS_FW_BOOTSTRAP": "torch", "IRIS_FW_TRANSPORT": "host_shm"}
    with pytest.raises(EnvironmentVariableError, match="contradicts TRITON_INTERPRET=1"):
        launch_mod.job_settings(2, {"IRIS_FW_TRANSPORT": "gpu_ipc", "TRITON_INTERPRET": "1"})
    if not iris_fw.testing.gpu_count():
        with pytest.raises(EnvironmentVariableError, match="no GPU is visible"):
            launch_mod.job_settings(2, {"IRIS_FW_TRANSPORT": "gpu_ipc"})
    with pytest.raises(ArgumentError, match="nprocs must be >= 1, got 0"):
        launch_mod.launch(["x.py"], 0)
    with pytest.raises(TypeError, match="nprocs must be an int >= 1, got str"):
        launch_mod.launch(["x.py"], "2")
    with pytest.raises(ValueError, match="argv must name a program"):
        launch_mod.launch([], 2)


def test_bad_flags_give_a_message(capsys):
    from iris_fw.cli import main

    assert main(["launch", "-n", "0", PROBE, "sleep"]) == 2
    assert "iris-fw launch: nprocs must be >= 1, got 0" in capsys.readouterr().err
    assert main(["launch", "-n", "2", "-m"]) == 2
    assert "name a module" in capsys.readouterr().err


def _module(tmp_path):
    (tmp_path / "probe_pkg").mkdir()
    (tmp_path / "probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "probe_pkg" / "hello.py").write_text(
        "import os, sys\nprint('hello from', os.environ['RANK'], 'args', sys.argv[1:])\n"
        "print('to stderr', file=sys.stderr)\n")
    return {"PYTHONPATH": str(tmp_path)}


def test_module_mode_and_output_tags(tmp_path):
    res = _run(["-n", "2", "-m", "probe_pkg.hello", "a", "--b", "-n", "7"], **_module(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    for r in (0, 1):
        assert f"[rank {r}] hello from {r} args ['a', '--b', '-n', '7']" in res.stdout, res.stdout
        assert f"[rank {r}] to stderr" in res.stderr, res.stderr


@pytest.mark.extended
def test_output_tags_switched_off(tmp_path):
    env = _module(tmp_path)
    res = _run(["-n", "2", "--no-tag-output", "-m", "probe_pkg.hello"], **env)
    assert res.returncode == 0 and "[rank" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert sorted(line for line in res.stdout.splitlines() if line.startswith("hello")) == [
        "hello from 0 args []", "hello from 1 args []"]


@pytest.mark.slow
def test_ranks_agree_on_settings_and_nothing_listens_beyond_loopback():
    """Two contexts one after the other in a 2-rank job: one bootstrap and transport everywhere
    (the launcher leaves IRIS_FW_BOOTSTRAP on auto; every rank detects torch), the rendezvous
    store (hosted by the launcher) and gloo on 127.0.0.1 only."""
    gpus = iris_fw.testing.gpu_count()
    n = 2 if not gpus or iris_fw.testing.share_gpus() else min(gpus, 2)
    res = _run(["-n", str(n), PROBE, "job"], timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    transport = "gpu_ipc" if iris_fw.testing.gpu_count() else "host_shm"
    for r in range(n):
        for attempt in (0, 1):
            tag = f"[rank {r}] " if n > 1 else ""  # one rank's output is not tagged
            line = f"{tag}attempt {attempt}: bootstrap=torch transport={transport} env=auto,{transport} exposed=[]"
            assert line in res.stdout, res.stdout + res.stderr


_POOL_ORPHAN = """
import sys, time
sys.path.insert(0, {root!r})
import iris_fw
from iris_fw.testing import RankPool

def job(ctx):
    import os
    print(os.getpid(), flush=True)
    time.sleep(120)

if __name__ == "__main__":
    pool = RankPool(2, heap_size=1 << 20)
    for conn in pool._conns:
        conn.send((list(sys.path), __import__("pickle").dumps((job, (), {{}}))))
    print("ranks", *[p.pid for p in pool._procs], flush=True)
    time.sleep(120)
"""


def test_test_pool_ranks_exit_with_their_parent(tmp_path):
    """A test run killed (SIGKILL: no cleanup runs) while its ranks run a job: the ranks exit
    within seconds instead of running the job to its end."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "orphan.py"
    script.write_text(_POOL_ORPHAN.format(root=root))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = ""
        deadline = time.monotonic() + 240
        while line is not None and not line.startswith("ranks") and time.monotonic() < deadline:
            line = proc.stdout.readline() or None  # None: the script ended
        assert line and line.startswith("ranks"), "the pool did not start"
        ranks = [int(p) for p in line.split()[1:]]
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    alive = ranks
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in ranks if os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().split()[2]]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"rank processes {alive} outlived their killed parent by 15 s"
