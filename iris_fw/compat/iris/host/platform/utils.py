"""Iris's ``iris.host.platform.utils``: ``do_bench`` (the same function as ``iris.do_bench``) and
``is_simulation_env``."""

from __future__ import annotations

import os

from ...timing import do_bench  # noqa: F401

_TRUE = ("1", "true", "yes", "on")


def is_simulation_env(environ=os.environ) -> bool:
    """False: iris-fw never runs in AMD's pre-silicon simulator. ``IRIS_SIMULATION`` set to a
    true value asks for it, which iris-fw does not provide: ``NotImplementedError``."""
    if environ.get("IRIS_SIMULATION", "").strip().lower() in _TRUE:
        raise NotImplementedError("IRIS_SIMULATION is not provided: AMD's pre-silicon simulator is an AMD-only "
                                  "environment; unset IRIS_SIMULATION")
    return False
