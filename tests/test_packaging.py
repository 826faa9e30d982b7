"""Packaging basics: the license file matches pyproject, iris_fw ships py.typed, and the public
API a user calls carries type hints."""

import inspect
import os
import re

import iris_fw
from iris_fw import ccl, ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_license_and_changelog():
    project = open(os.path.join(ROOT, "pyproject.toml")).read()  # (tomllib needs Python 3.11)
    assert re.search(r'^license = \{ text = "MIT" \}$', project, re.M)
    assert open(os.path.join(ROOT, "LICENSE")).readline().strip() == "MIT License"
    assert re.search(r'^"iris_fw" = \[.*"py.typed".*\]$', project, re.M)
    assert os.path.exists(os.path.join(os.path.dirname(iris_fw.__file__), "py.typed"))
    assert open(os.path.join(ROOT, "CHANGELOG.md")).readline().startswith("# Changelog")


def _unannotated(fn):
    sig = inspect.signature(fn)
    missing = [p.name for p in sig.parameters.values() if p.name not in ("self", "cls") and p.annotation is p.empty]
    if sig.return_annotation is sig.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


def test_public_api_is_annotated():
    functions = [iris_fw.init, ops.plan, *(getattr(ops, n) for n in ops.__all__ if n not in ("Op", "plan"))]
    functions += [getattr(ccl, n) for n in ccl.__all__ if inspect.isfunction(getattr(ccl, n))]
    functions += [getattr(iris_fw.Context, n) for n in ("empty", "zeros", "ones", "full", "arange", "linspace", "rand",
                                                        "randn", "randint", "empty_like", "zeros_like", "ones_like",
                                                        "full_like", "as_symmetric", "barrier", "device_barrier",
                                                        "synchronize", "broadcast", "close")]
    missing = {f.__qualname__: m for f in functions if (m := _unannotated(f))}
    assert not missing, missing
