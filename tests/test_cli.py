"""The command line: ``--version``, ``info`` (text and JSON; a broken plugin is reported, not
fatal), the benchmark list in ``bench --help``, and the ``iris_fw`` logger's INFO line.

``python -m iris_fw`` runs as a user runs it (a process of its own) for ``--version``, ``info``
and a broken plugin's ``info``; ``info --json`` and ``bench --help`` run the same
:func:`iris_fw.cli.main` in this process (each process costs ~3 s of imports on CI's CPUs)."""

import json
import logging
import os
import re
import subprocess
import sys

import iris_fw
from iris_fw.info import interpreter, report


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "iris_fw", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _cli_here(capsys, *args) -> tuple[int, str]:
    """``iris-fw *args`` in this process: (exit code, stdout)."""
    from iris_fw.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    return code, capsys.readouterr().out


def test_version():
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"iris-fw {iris_fw.__version__}", res.stdout + res.stderr


def test_info_text_and_json(capsys):
    res = _cli("info")
    assert res.returncode == 0, res.stderr
    for line in ("versions:", "iris-fw", "torch", "triton", "numpy", "gpus:", "interpreter:", "init() would choose:",
                 "bootstrap  single (no MPI or torchrun variables", "mpirun:", "/dev/shm:", "entry points:",
                 "host_shm = iris_fw.transports.host_shm [iris-fw]", "environment:"):
        assert line in res.stdout, (line, res.stdout)
    on, _ = interpreter()
    usable = "transport  host_shm (Triton's interpreter is on" if on else "transport  gpu_ipc (GPUs are present"
    assert usable in res.stdout, res.stdout
    code, out = _cli_here(capsys, "info", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["versions"]["iris-fw"] == iris_fw.__version__
    assert data["plugins"]["bootstrap"]["single"] == "available"
    assert set(data["init() would choose"]) == {"bootstrap", "transport"}


def test_info_reports_a_broken_plugin_and_the_variables(tmp_path):
    """A plugin whose module fails to import is listed with its error; everything else still loads."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[iris_fw]\nbroken = broken_plugin_mod\n")
    (tmp_path / "broken_plugin_mod.py").write_text("raise ImportError('this plugin needs a library that is missing')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
               IRIS_FW_WAIT_TIMEOUT="12", IRIS_FW_BOOTSTRAP="nosuch")
    res = _cli("info", env=env)
    assert res.returncode == 0, res.stderr
    assert re.search(r"broken = broken_plugin_mod \[broken-plugin\] +ImportError: this plugin needs a library "
                     r"that is missing", res.stdout), res.stdout
    assert re.search(r"gemm_all_scatter +available", res.stdout)  # the others still loaded
    assert re.search(r"IRIS_FW_WAIT_TIMEOUT +12", res.stdout) and "IRIS_FW_BOOTSTRAP" in res.stdout
    assert "bootstrap  init() would fail: UnknownNameError: no bootstrap named 'nosuch'" in res.stdout, res.stdout


def test_info_in_process_matches_the_environment(monkeypatch):
    monkeypatch.setenv("IRIS_FW_TRANSPORT", "host_shm")
    data = report()
    assert data["init() would choose"]["transport"].startswith("host_shm (IRIS_FW_TRANSPORT=host_shm)")
    assert data["environment"]["IRIS_FW_TRANSPORT"] == "host_shm"


def test_bench_help_lists_the_benchmarks(capsys):
    code, out = _cli_here(capsys, "bench", "--help")
    assert code == 0, out
    listing = out[out.index("benchmarks (iris-fw plugins lists their providers):"):]
    for name in ("primitives", "all_peers", "atomics", "latency", "taxonomy", "ccl", "engine", "gemm"):
        assert f"\n  {name} " in listing, listing


def test_init_logs_its_choices(caplog):
    with caplog.at_level(logging.INFO, logger="iris_fw"):
        with iris_fw.init(heap_size=1 << 22) as ctx:
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "iris_fw"]
    want = f"rank 0 of 1: bootstrap {ctx.bootstrap.name} ("
    assert any(line.startswith(want) and f"; transport {ctx.transport.name} (" in line for line in lines), lines
