"""pytest plugin: ``pytest -p iris_fw.compat.pytest_iris …`` runs tests written for AMD's Iris on
iris-fw — importing this module maps ``iris`` and ``iris.*`` to :mod:`iris_fw.compat.iris` (see
:func:`iris_fw.compat.run.install`, which also lets kernels take Triton's AMD-only launch options
off AMD; that is its only effect, and the reason it exists)."""

from .run import install

install()
