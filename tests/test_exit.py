"""How a job ends: a correct program without a `with` block (or close()) exits quietly with rc 0
whatever order its ranks finish in; the "exits after losing rank(s)" report only when a rank
failed."""

import os
import subprocess
import sys

import pytest
from helpers import needs_host_shm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "no_with.py")


def _launch(*args):
    needs_host_shm()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_FW_")}
    env["IRIS_FW_TRANSPORT"] = "host_shm"
    return subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", "2", SCRIPT, *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


@pytest.mark.parametrize("first", [0, pytest.param(1, marks=pytest.mark.extended)])
def test_a_correct_program_without_with_exits_quietly(first):
    res = _launch(str(first))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "ends after its peer" in res.stdout, out
    assert "exits after losing" not in out and "aborting" not in out and "PeerFailure" not in out, out


def test_a_rank_that_fails_is_still_reported():
    res = _launch("0", "raise")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "this rank's own bug" in out, out


def test_an_error_inside_an_interpreted_kernel_is_reported_once(monkeypatch, capsys):
    """A survivor's PeerFailure raised while an interpreted kernel runs (the watchdog's SIGTERM
    handler) reaches the top wrapped in one InterpreterError(repr(e)) per nested jit call: the
    uncaught-exception report shows the PeerFailure alone, naming the failed rank."""
    from triton.runtime.errors import InterpreterError

    from iris_fw import PeerFailure, lifecycle

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(lifecycle.process(), "uncaught", False)
    lifecycle.watch_uncaught()
    try:
        try:
            try:
                raise PeerFailure("rank 1 was sent SIGTERM: rank 0 (pid 7) died", 0)
            except PeerFailure as exc:
                raise InterpreterError(repr(exc)) from exc
        except InterpreterError as exc:
            raise InterpreterError(repr(exc)) from exc
    except InterpreterError as outer:
        sys.excepthook(type(outer), outer, outer.__traceback__)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last == "iris_fw.errors.PeerFailure: rank 1 was sent SIGTERM: rank 0 (pid 7) died", err
    assert "InterpreterError" not in err, err
    assert lifecycle.process().uncaught


def test_a_rank_gone_with_exit_code_0_under_mpirun_fails_the_job():
    """Under MPICH's mpirun (Hydra), a rank that leaves with os._exit(0) — no MPI_Finalize — makes
    Hydra SIGKILL the others and end the job with rc 0 and no word (it does so without iris-fw
    too). With ``-disable-auto-cleanup`` (docs/reliability.md) the survivor's watchdog reports the
    lost rank and the job fails."""
    import iris_fw.testing

    mpirun = iris_fw.testing.find_mpirun()
    if mpirun is None:
        pytest.skip("no mpirun (pip install 'iris-fw[mpi]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_FW_")}
    if "-disable-auto-cleanup" not in subprocess.run([mpirun, "-help", "all"], capture_output=True, text=True,
                                                     timeout=60).stdout:
        pytest.skip("this mpirun is not MPICH's Hydra (no -disable-auto-cleanup; Open MPI ends the job itself)")
    needs_host_shm()
    env.update(IRIS_FW_TRANSPORT="host_shm", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    script = os.path.join(ROOT, "tests", "scripts", "exit_early.py")
    before = set(os.listdir("/dev/shm"))
    res = subprocess.run([mpirun, "-disable-auto-cleanup", "-n", "2", sys.executable, script], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    _remove_unmapped(set(os.listdir("/dev/shm")) - before, "mpich_shm_")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "SURVIVOR failed" in out and "rank 1 (pid" in out, out
    assert "SURVIVOR completed" not in out, out


def _remove_unmapped(names, prefix):
    """Unlink the /dev/shm segments ``names`` (with ``prefix``) that no process maps: what MPICH
    leaves of a job one of whose ranks ended without MPI_Finalize (not iris-fw's to keep)."""
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                mapped.update(line.rsplit("/", 1)[-1].strip() for line in f if "/dev/shm/" in line)
        except OSError:
            pass
    for name in names:
        if name.startswith(prefix) and name not in mapped:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def test_a_rank_that_never_starts_mpi_ends_its_peers_set_up():
    """Under mpirun, a rank that never calls iris_fw.init used to hang its peer inside MPI_Init
    (C code, no bound): the peer now ends after the arrival bound with a message saying why."""
    import time

    import iris_fw.testing

    mpirun = iris_fw.testing.find_mpirun()
    if mpirun is None:
        pytest.skip("no mpirun (pip install 'iris-fw[mpi]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_FW_")}
    needs_host_shm()
    env.update(IRIS_FW_TRANSPORT="host_shm", IRIS_FW_ARRIVAL_TIMEOUT="3", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    before = set(os.listdir("/dev/shm"))
    start = time.monotonic()
    res = subprocess.run([mpirun, "-n", "2", sys.executable, os.path.join(ROOT, "tests", "scripts", "never_init.py")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    took = time.monotonic() - start
    _remove_unmapped(set(os.listdir("/dev/shm")) - before, "mpich_shm_")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "did not complete in 3 s" in out and "rank 0" in out, out
    assert took < 50, f"the job took {took:.0f} s (rank 1 idles 60 s: only the bound ends it)\n{out}"
