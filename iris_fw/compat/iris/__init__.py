"""AMD Iris's public API over iris-fw: ``import iris_fw.compat.iris as iris`` — or run an
unchanged Iris program with ``iris-fw run --as-iris program.py`` (``iris`` and ``iris.*`` are
then this package; see :mod:`iris_fw.compat.run`).

The layout mirrors Iris's: ``iris.iris``/``iris.Iris`` (host object, factories, ``shmem.ccl``,
``shmem.ops``), the device functions (``iris.load`` … ``iris.atomic_max``), the object API
(``iris.DeviceContext``, ``iris.Tile``, ``iris.TileView``, ``iris.TensorView``,
``iris.make_tensor_view``), ``iris.ccl``, ``iris.ops``, ``iris.x``, ``iris.hip``,
``iris.logging`` and the logging names, ``iris.tensor_creation``, ``iris.TraceEvent`` /
``iris.tracing`` and Iris's ``iris.host.*`` package layout (``platform``, ``distributed``,
``logging``, ``memory``, ``tracing``). Every name maps onto iris-fw's own primitives
(:mod:`iris_fw.device`), collectives (:mod:`iris_fw.ccl`) and ops (:mod:`iris_fw.ops`);
``docs/iris-compat.md`` has the table of every Iris name and its status.

Importing this package configures the ``"iris"`` logger as Iris does (level ``INFO`` or
``IRIS_LOG_LEVEL``, one console handler).
"""

from . import ccl, hip, ops, x  # noqa: F401
from . import logging  # noqa: F401  (iris.logging, as in Iris)
from . import host, tensor_creation, tracing  # noqa: F401  (Iris's package layout)
from .host import Iris, get_device_id_for_rank, iris
from .host.tracing import TraceEvent
from .logging import DEBUG, ERROR, INFO, WARNING, logger, set_logger_level
from .rma import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xchg,
                  atomic_xor, copy, get, load, put, store)
from .tiles import AllReduceConfig, Context, DeviceContext, DeviceTracing, TensorView, Tile, TileView, make_tensor_view
from .timing import do_bench

__all__ = [
    "AllReduceConfig", "Context", "DEBUG", "DeviceContext", "DeviceTracing", "ERROR", "INFO", "Iris", "TensorView",
    "Tile", "TileView", "TraceEvent", "WARNING", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
    "atomic_sub", "atomic_xchg", "atomic_xor", "ccl", "copy", "do_bench", "get", "get_device_id_for_rank", "hip",
    "host", "iris", "load", "logger", "make_tensor_view", "ops", "put", "set_logger_level", "store",
    "tensor_creation", "tracing", "x",
]
