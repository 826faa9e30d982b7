"""The layer contracts (pyproject.toml, ``[tool.importlinter]``) hold: device primitives ->
heap/transport/bootstrap -> context -> engine and ccl -> ops -> compat/bench/cli, plugins only
through the registry, and no import cycle; and importing makes no per-process state.

The plugin folders (``transports/``, ``schedulers/``, ``plugins/``, ``collectives/``) install as
``iris_fw.<folder>`` through ``package-dir``; import-linter reads the package from the file
system, so the test checks a view of ``iris_fw`` in a temporary directory (symbolic links) that
holds them where an installed wheel has them."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytest.importorskip("importlinter", reason="the test extra installs import-linter")


def _package_dirs() -> dict[str, pathlib.Path]:
    """``iris_fw.<name>`` -> its folder, from pyproject.toml's ``package-dir``."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"]["package-dir"]
    return {name.split(".", 1)[1]: ROOT / folder for name, folder in mapped.items()}


def _view(tmp_path: pathlib.Path) -> pathlib.Path:
    package = tmp_path / "iris_fw"
    package.mkdir()
    for entry in (ROOT / "iris_fw").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in _package_dirs().items():
        assert not (package / name).exists(), f"iris_fw/{name} and the plugin folder {folder.name}/ collide"
        (package / name).symlink_to(folder)
    return tmp_path


def _lint(view: pathlib.Path) -> subprocess.CompletedProcess:
    """``lint-imports`` (its Python entry point) on ``view``, in a process of its own."""
    env = dict(os.environ, PYTHONPATH=str(view))
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=view, env=env, capture_output=True, text=True,
                          timeout=300)


def test_layer_contracts(tmp_path):
    run = _lint(_view(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 2 kept, 0 broken." in run.stdout, run.stdout


def test_contracts_can_fail(tmp_path):
    """A core module importing a plugin breaks the contract (the check is not vacuous)."""
    view = _view(tmp_path)
    (view / "iris_fw" / "device.py").unlink()
    (view / "iris_fw" / "device.py").write_text((ROOT / "iris_fw" / "device.py").read_text()
                                                + "\nfrom iris_fw.transports import host_shm  # noqa\n")
    run = _lint(view)
    assert run.returncode != 0
    assert "iris_fw.device is not allowed to import iris_fw.transports" in run.stdout, run.stdout


def test_nothing_is_made_at_import():
    """Importing the package, the GEMM and the Iris compat layer makes none of the per-process
    state objects (iris_fw.lifecycle.process, iris_fw.compat.state.state: made on first use) and
    loads no plugin registry."""
    code = ("import iris_fw, iris_fw.gemm, iris_fw.compat.iris\n"
            "from iris_fw import lifecycle\n"
            "from iris_fw.compat import state\n"
            "assert lifecycle.process.cache_info().currsize == 0, 'lifecycle.process() made at import'\n"
            "assert state.state.cache_info().currsize == 0, 'compat state made at import'\n"
            "assert state.state()._registries is None, 'compat registries loaded before the first iris.iris()'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
