"""Registries of plugins, and the pluggy plugin manager that fills them.

A :class:`Registry` maps a name to an object (a transport class, a bootstrap class, a
scheduler, a pattern, a collective algorithm, a benchmark) and remembers which plugin provided it. Names are unique
within a registry: a second registration of a name raises :class:`DuplicateNameError`
naming both providers. Every entry can say whether it is usable here and, if not, why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pluggy

from . import hookspecs
from .errors import ArgumentError, ArgumentTypeError, IrisError

KINDS = ("transport", "bootstrap", "scheduler", "pattern", "algorithm", "benchmark")
_HOOKS = {
    "transport": "iris_fw_register_transports",
    "bootstrap": "iris_fw_register_bootstraps",
    "scheduler": "iris_fw_register_schedulers",
    "pattern": "iris_fw_register_patterns",
    "algorithm": "iris_fw_register_algorithms",
    "benchmark": "iris_fw_register_benchmarks",
}


class DuplicateNameError(IrisError):
    """Two plugins registered the same name in one registry."""


class UnknownNameError(IrisError, KeyError):
    """A name was asked for that no plugin registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


@dataclass(frozen=True)
class Entry:
    """One registered item: its ``name``, the object, and the ``provider`` that registered it."""

    name: str
    obj: Any
    provider: str

    def availability(self) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``. Transports and bootstraps
        have ``available`` from their base classes; for schedulers, patterns and benchmarks the
        hook specs make it optional (:mod:`iris_fw.hookspecs`), so an object without one is
        usable."""
        check = getattr(self.obj, "available", None)
        if check is None:
            return True, ""
        try:
            ok, reason = check()
        except Exception as exc:  # a broken check is itself a reason
            return False, f"availability check failed: {type(exc).__name__}: {exc}"
        return bool(ok), "" if ok else str(reason)


class Registry:
    """Name → object for one kind of plugin (``transport``, ``bootstrap``, …)."""

    def __init__(self, kind: str):
        if kind not in KINDS:
            raise ArgumentError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, obj: Any, name: str | None = None, *, provider: str = "<direct>") -> Any:
        """Add ``obj`` under ``name`` (default: ``obj.name``); return ``obj``.

        Raises :class:`DuplicateNameError` if the name is taken, naming both providers.
        """
        name = name if name is not None else getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise ArgumentTypeError(f"a {self.kind} needs a non-empty string name; {obj!r} has name={name!r}")
        if name in self._entries:
            first = self._entries[name].provider
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: first by {first}, again by {provider}"
            )
        self._entries[name] = Entry(name, obj, provider)
        return obj

    def scoped(self, provider: str) -> "_ScopedRegistry":
        """A view whose ``register`` records ``provider``; this is what a hook receives."""
        return _ScopedRegistry(self, provider)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownNameError(f"no {self.kind} named {name!r}; registered: {known}") from None

    def get(self, name: str) -> Any:
        """The object registered as ``name``; :class:`UnknownNameError` lists the known names."""
        return self.entry(name).obj

    def require_available(self, name: str) -> Any:
        """Like :meth:`get`, but raises if the entry says it cannot be used here, with its reason."""
        entry = self.entry(name)
        ok, reason = entry.availability()
        if not ok:
            raise IrisError(f"{self.kind} {name!r} (from {entry.provider}) is not available here: {reason}")
        return entry.obj


class _ScopedRegistry:
    """The registry as one plugin sees it: registrations are attributed to that plugin."""

    def __init__(self, registry: Registry, provider: str):
        self._registry = registry
        self.provider = provider
        self.kind = registry.kind

    def register(self, obj: Any, name: str | None = None) -> Any:
        return self._registry.register(obj, name, provider=self.provider)

    def __contains__(self, name: str) -> bool:
        return name in self._registry


@dataclass
class Registries:
    """All registries, filled by one pass over the plugins."""

    transport: Registry
    bootstrap: Registry
    scheduler: Registry
    pattern: Registry
    algorithm: Registry
    benchmark: Registry

    def __iter__(self) -> Iterator[Registry]:
        return iter((self.transport, self.bootstrap, self.scheduler, self.pattern, self.algorithm, self.benchmark))


def plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh plugin manager for ``iris_fw`` with the hook specs added and, unless told
    otherwise, every plugin published under the ``iris_fw`` entry-point group loaded."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
    return pm


def _provider_names(pm: pluggy.PluginManager) -> dict[int, str]:
    names = {}
    for plugin, dist in pm.list_plugin_distinfo():
        names[id(plugin)] = f"{dist.project_name} (entry point {pm.get_name(plugin)!r})"
    return names


def load_registries(pm: pluggy.PluginManager | None = None) -> Registries:
    """Run every plugin's register hooks and return the filled registries."""
    pm = pm if pm is not None else plugin_manager()
    regs = Registries(*(Registry(kind) for kind in KINDS))
    dist_names = _provider_names(pm)
    for registry in regs:
        hook = _HOOKS[registry.kind]
        impls = getattr(pm.hook, hook).get_hookimpls()
        plugins = [impl.plugin for impl in impls]
        # Each plugin's hook is called through pluggy (a caller of that plugin alone) with its own
        # scoped view, so every registration knows its provider; in the order the plugins were
        # registered.
        for impl in impls:
            provider = dist_names.get(id(impl.plugin), f"plugin {impl.plugin_name!r}")
            only = pm.subset_hook_caller(hook, remove_plugins=[p for p in plugins if p is not impl.plugin])
            only(registry=registry.scoped(provider))
    return regs
