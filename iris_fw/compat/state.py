"""The Iris compat layer's per-process state, in one object made on first use (:func:`state`):
importing the compat modules registers, loads and decides nothing of iris-fw's (the plugin
registries are loaded by the first ``iris.iris()``).

What it keeps is per process because Iris's API is: ``iris.iris()`` takes no handle to earlier
host objects, yet a host object dropped without closing (``del shmem``, how Iris programs and
tests end one) has its context closed by the next ``iris.iris()`` — collective, every rank in
program order (:func:`iris_fw.compat.iris.host.close_dropped`) — so the contexts those host
objects made, and which of them this rank dropped, outlive any one of them; and Iris's one-time
notes (an AMD-only option or field ignored here) are said once per process.

Two things the compat layer still does at import, as Iris does, are not state of iris-fw's: the
``"iris"`` logger is configured (:mod:`iris_fw.compat.iris.logging`; ``import iris`` does it in
Iris, and Iris programs rely on it), and ``iris.ops`` gets the module type that keeps its op
functions bound (:mod:`iris_fw.compat.iris.ops`).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any


class CompatState:
    """What the compat layer keeps per process (the module docstring says why)."""

    def __init__(self) -> None:
        #: the plugin registries every host object's context is made with (:meth:`registries`)
        self._registries: Any = None
        #: open contexts made by Iris host objects, by creation number (:meth:`add_context`)
        self.open: dict = {}
        #: the creation numbers of those whose host object this rank dropped (closed at the next
        #: ``iris.iris()``)
        self.dropped: set = set()
        self._numbers = itertools.count()
        #: keys of the one-time notes already said (:meth:`first_note`)
        self.noted: set = set()

    def registries(self):
        """The plugin registries for host objects' contexts, loaded by the first call (a load
        costs ~25 ms; Iris programs create a host object per test)."""
        if self._registries is None:
            from iris_fw.registry import load_registries

            self._registries = load_registries()
        return self._registries

    def add_context(self, ctx) -> int:
        """Keep ``ctx`` (made by a host object) open until it is dropped; its creation number."""
        number = next(self._numbers)
        self.open[number] = ctx
        return number

    def first_note(self, key) -> bool:
        """Whether the note ``key`` is said for the first time in this process (then it is
        remembered)."""
        if key in self.noted:
            return False
        self.noted.add(key)
        return True


@functools.cache
def state() -> CompatState:
    """This process's :class:`CompatState` (made on the first call)."""
    return CompatState()
