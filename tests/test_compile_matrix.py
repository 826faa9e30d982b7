"""Every ``@triton.jit`` kernel of iris-fw compiles, without a GPU, for NVIDIA (sm_90, sm_100) and
AMD (gfx942, gfx950) targets with the installed Triton: the interpreter the CPU tests run on
accepts code the compilers reject. Kernels are discovered, their launches recorded from the
public calls, and every recorded variant compiled (tests/compile_matrix.py says how).

Default run: each kernel's first recorded variant for sm_90 and gfx942, the two targets compiled
in parallel child processes; ``-m extended``: every variant for all four, and the first variants
again with the debug-mode pointer checks compiled in (``IRIS_FW_DEBUG=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import triton

import compile_matrix as cm

HERE = os.path.dirname(os.path.abspath(__file__))
_NEEDS_39 = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)


def _child(args: list[str], interpret: str, debug: bool = False) -> subprocess.Popen:
    env = {**os.environ, "TRITON_INTERPRET": interpret, "IRIS_FW_BOOTSTRAP": "single",
           "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
           "IRIS_FW_DEBUG": "1" if debug else "0"}
    env.pop("RANK", None)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "compile_matrix.py"), *args], env=env, cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Every discovered kernel and its recorded variants (one CPU rank, interpreter on)."""
    from iris_fw.registry import load_registries

    ok, why = load_registries().transport.entry("host_shm").availability()
    if not ok:  # the GPU image's Triton 3.6 + numpy 2.5: CI's CPU machines run the matrix
        pytest.skip(f"the recording runs on CPU ranks under the interpreter: {why}")
    path = str(tmp_path_factory.mktemp("compile") / "recorded.json")
    proc = _child(["record", path], "1")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-6000:]
    with open(path) as f:
        return path, json.load(f)


def test_every_kernel_is_launched_by_the_recording(recorded):
    """A kernel no recorded call launches is not compiled: add a call to compile_matrix.record."""
    _, data = recorded
    missing = [k for k in data["kernels"] if not data["variants"].get(k)]
    assert len(data["kernels"]) >= 20, data["kernels"]
    # only the Iris compat layer's placeholders for what it does not provide may refuse an import
    assert all(m.startswith("iris_fw.compat.") for m in data["refused"]), data["refused"]
    assert not missing, f"kernels never launched by compile_matrix.record (add a call there): {missing}"


def _compile(recorded, targets, tmp_path, first_only: bool = False, debug: bool = False) -> list[dict]:
    path, data = recorded
    procs = []
    for target in targets:  # one child per target: they compile in parallel
        report = str(tmp_path / f"{target}.jsonl")
        procs.append((target, report, _child(["compile", path, target, report] + ["first"] * first_only, "0", debug)))
    rows = []
    for target, report, proc in procs:
        out, _ = proc.communicate(timeout=1500)
        assert proc.returncode == 0, f"{target}: {out[-6000:]}"
        with open(report) as f:
            rows += [json.loads(line) for line in f]
    expected = sum(1 if first_only else len(v) for v in data["variants"].values() if v) * len(targets)
    assert len(rows) == expected, f"{len(rows)} results for {expected} (kernel variants x targets)"
    failed = []
    for r in rows:
        table = {**cm.KNOWN_FAILURES, **cm.KNOWN_DEBUG_FAILURES} if debug else cm.KNOWN_FAILURES
        known = table.get((r["kernel"].split(":")[1], r["tag"], r["target"])) or \
            table.get((r["kernel"].split(":")[1], "", r["target"]))
        if not r["ok"] and not known:
            failed.append(f"{r['kernel']} variant {r['variant']} on {r['target']}: {r['error']}")
        if r["ok"] and known:
            failed.append(f"{r['kernel']} on {r['target']} compiles now: remove it from KNOWN_FAILURES ({known})")
    assert not failed, "\n".join(failed)
    counts = Counter(r["target"] for r in rows if r["ok"])
    kernels = {t: len({r["kernel"] for r in rows if r["ok"] and r["target"] == t}) for t in targets}
    report = os.environ.get("IRIS_FW_COMPILE_REPORT")
    if report:  # docs/reliability.md's table is made from this
        with open(report, "a") as f:
            for t in targets:
                f.write(f"{t}\t{kernels[t]}\t{counts[t]}\t{sum(1 for r in rows if r['target'] == t)}\n")
    return rows


@pytest.mark.skipif(_NEEDS_39, reason="AMD compilation without a GPU needs Triton >= 3.9")
def test_compile_matrix(recorded, tmp_path):
    """Every kernel (its first recorded variant) for sm_90 and gfx942."""
    _compile(recorded, cm.DEFAULT_TARGETS, tmp_path, first_only=True)


@pytest.mark.extended
@pytest.mark.skipif(_NEEDS_39, reason="AMD compilation without a GPU needs Triton >= 3.9")
def test_compile_matrix_all_targets(recorded, tmp_path):
    """Every recorded variant of every kernel for sm_90, sm_100, gfx942 and gfx950."""
    _compile(recorded, list(cm.TARGETS), tmp_path)


@pytest.mark.extended
@pytest.mark.skipif(_NEEDS_39, reason="AMD compilation without a GPU needs Triton >= 3.9")
def test_compile_matrix_debug(recorded, tmp_path):
    """Every kernel (its first variant) for sm_90 and gfx942 with IRIS_FW_DEBUG=1: the device
    pointer checks compiled in (docs/primitives.md, "Pointer checks")."""
    _compile(recorded, cm.DEFAULT_TARGETS, tmp_path, first_only=True, debug=True)
