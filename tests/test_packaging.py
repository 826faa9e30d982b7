"""The package list in pyproject.toml names every package of the source tree: a wheel or a
non-editable install (which CI's editable install does not exercise) would otherwise lose one."""

import os

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_is_listed():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = {"iris_fw": "iris_fw", **{k: v for k, v in tool["package-dir"].items()}}
    found = set()
    for package, folder in dirs.items():
        for here, subdirs, files in os.walk(os.path.join(ROOT, folder)):
            subdirs[:] = [d for d in subdirs if d not in ("__pycache__", "_shim")]  # _shim: package data
            if "__init__.py" in files:
                rel = os.path.relpath(here, os.path.join(ROOT, folder))
                found.add(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
