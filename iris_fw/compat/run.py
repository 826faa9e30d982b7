"""Run a program (or a test suite) written for AMD's Iris on iris-fw, unchanged::

    python -m iris_fw.compat.run program.py [args…]        # or: iris-fw run --as-iris program.py
    python -m iris_fw.compat.run -m pytest tests/unittests    # Iris's own tests
    torchrun --nproc-per-node 2 -m iris_fw.compat.run program.py
    iris-fw run --as-iris -n 4 program.py                     # 4 ranks on this host (CPU ranks without GPUs)
    pytest -p iris_fw.compat.pytest_iris tests/                # the same mapping as a pytest plugin

:func:`install` maps ``iris`` and every ``iris.<name>`` module to :mod:`iris_fw.compat.iris` and
its submodules (one module object per name: ``iris is iris_fw.compat.iris``) with a finder at
the front of ``sys.meta_path``, and puts a small ``iris`` shim package first on ``PYTHONPATH``
so that processes the program starts (torch.multiprocessing, subprocess) get the same mapping.
An installed Iris is shadowed, not imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import runpy
import sys

import iris_fw  # noqa: F401  (first: decides interpreter vs. GPU before any kernel is defined)
from iris_fw.compat.state import state

#: The package the name ``iris`` stands for.
TARGET = "iris_fw.compat.iris"
#: Directory holding the ``iris`` shim package (put on PYTHONPATH for child processes).
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")


def _target(fullname: str) -> str | None:
    if fullname == "iris" or fullname.startswith("iris."):
        return TARGET + fullname[len("iris"):]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads ``iris.<x>`` as the already-importable ``iris_fw.compat.iris.<x>`` module itself."""

    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec  # the import system set the alias's spec; keep the module's own


class IrisFinder(importlib.abc.MetaPathFinder):
    """Resolves ``iris`` and ``iris.*`` to :data:`TARGET` and its submodules."""

    def find_spec(self, fullname, path, target=None):
        name = _target(fullname)
        if name is None:
            return None
        if name in sys.modules:
            real = sys.modules[name].__spec__
        else:
            real = importlib.util.find_spec(name)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(name),
                                               is_package=real.submodule_search_locations is not None)


#: Triton launch options of AMD's backend only (MFMA instruction shape, occupancy, K packing):
#: Iris programs pass them to their kernels; other backends reject them (compiled) or drop them
#: (the interpreter).
AMD_LAUNCH_OPTIONS = ("matrix_instr_nonkdim", "waves_per_eu", "kpack")


def _drop_amd_options(kwargs: dict) -> None:
    for name in AMD_LAUNCH_OPTIONS:
        if name in kwargs:
            value = kwargs.pop(name)
            if state().first_note(f"launch option {name}"):  # once per process
                from iris_fw.compat.iris.logging import logger

                logger.info(f"Triton launch option {name}={value!r} is AMD-only (HIP backend); ignored here")


def accept_amd_launch_options() -> None:
    """Let kernels launched in this process take Triton's AMD-only launch options
    (:data:`AMD_LAUNCH_OPTIONS`) on a non-AMD backend: they are dropped, with a one-time note on
    the ``iris`` logger (Triton's CUDA backend would raise ``KeyError``; its interpreter drops
    them silently). On AMD (``torch.version.hip``) nothing changes. Idempotent."""
    import torch
    from triton.runtime import interpreter, jit

    if torch.version.hip:
        return
    for cls in (jit.JITFunction, interpreter.InterpretedFunction):
        run = cls.run
        if getattr(run, "_iris_drops_amd_options", False):
            continue

        def patched(self, *args, _run=run, **kwargs):
            if kwargs.keys() & _AMD_SET:
                _drop_amd_options(kwargs)
            return _run(self, *args, **kwargs)

        patched._iris_drops_amd_options = True
        patched.__doc__ = run.__doc__
        cls.run = patched


_AMD_SET = frozenset(AMD_LAUNCH_OPTIONS)


def install(environ=os.environ) -> None:
    """Map ``iris`` to the compat layer in this process and in the processes it starts, and
    accept Triton's AMD-only launch options (:func:`accept_amd_launch_options`). Raises if a
    different ``iris`` module is already imported here."""
    loaded = sys.modules.get("iris")
    shim = loaded is not None and str(getattr(loaded, "__file__", "")).startswith(SHIM_DIR)
    if loaded is not None and not shim and loaded is not sys.modules.get(TARGET):
        raise RuntimeError(f"a module named 'iris' ({getattr(loaded, '__file__', loaded)}) is already imported; "
                           f"install the mapping before anything imports iris")
    if not any(isinstance(f, IrisFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, IrisFinder())
    accept_amd_launch_options()
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SHIM_DIR not in paths:
        environ["PYTHONPATH"] = os.pathsep.join([SHIM_DIR, *paths])


def run_program(argv: list[str]) -> int:
    """Run ``program.py [args…]`` or ``-m module [args…]`` as ``__main__`` in this process."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``[-m module | program.py] [args…]``: run it as ``__main__`` with ``iris`` mapped."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    install()
    return run_program(argv)


if __name__ == "__main__":
    sys.exit(main())
