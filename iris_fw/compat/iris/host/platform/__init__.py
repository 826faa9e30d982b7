"""Iris's ``iris.host.platform``: device queries (``hip``, the same module as ``iris.hip``) and
host utilities (``utils``: ``do_bench``, ``is_simulation_env``)."""

from ... import hip  # noqa: F401  (iris.host.platform.hip is iris.hip)
from . import utils  # noqa: F401

__all__ = ["hip", "utils"]
