"""The hooks an iris-fw plugin may implement.

A plugin is any module or object that pluggy can scan, published under the ``iris_fw``
entry-point group (``[project.entry-points.iris_fw]`` in its ``pyproject.toml``). The
built-in transports and bootstraps load exactly that way.

Every hook receives a registry object and registers into it; none returns anything. Each
hook fires once per plugin, in :func:`iris_fw.registry.load_registries`, which runs when a
context is created (:func:`iris_fw.init`), when ``iris-fw plugins`` lists what is
installed, and wherever a caller asks for the registries explicitly. Registering a name
another plugin already registered raises :class:`iris_fw.registry.DuplicateNameError`
naming both providers.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "iris_fw"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def iris_fw_register_transports(registry):
    """Register transports: how a rank's symmetric heap is allocated and mapped by its peers.

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"transport"``; call
        ``registry.register(cls)`` with a :class:`~iris_fw.transport_base.Transport` subclass.
        The class's ``name`` is the key users select it by (``init(transport=name)``).
    :return: nothing.
    """


@hookspec
def iris_fw_register_bootstraps(registry):
    """Register bootstraps: how ranks find each other and exchange bytes at set-up time.

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"bootstrap"``; call
        ``registry.register(cls)`` with a :class:`~iris_fw.bootstrap_base.Bootstrap` subclass.
    :return: nothing.
    """


@hookspec
def iris_fw_register_schedulers(registry):
    """Register schedulers: kernel skeletons plus host orchestration that run any pattern.

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"scheduler"``; call
        ``registry.register(obj)`` with an object that has a ``name`` attribute and,
        optionally, an ``available()`` method returning ``(bool, reason)``. To run the
        built-in patterns it follows :class:`iris_fw.engine.scheduler.Scheduler` (``uses_stash``,
        ``grids``, ``launch``; docs/architecture.md).
    :return: nothing.
    """


@hookspec
def iris_fw_register_patterns(registry):
    """Register patterns: tile-level compute + communication pieces a scheduler runs.

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"pattern"``; call
        ``registry.register(obj)`` with an object that has a ``name`` attribute and,
        optionally, an ``available()`` method returning ``(bool, reason)``. To run under the
        schedulers it provides the pieces and host methods of :class:`iris_fw.engine.contract.Pattern`
        (``pieces``, ``Args``, ``Config``, ``comm_first``, ``signature``, ``tuning_key``,
        ``default_config``, ``setup``, ``bind``, ``reference``; docs/architecture.md).
    :return: nothing.
    """


@hookspec
def iris_fw_register_algorithms(registry):
    """Register collective algorithms: how one collective of :mod:`iris_fw.ccl` moves its data
    (e.g. all-reduce one-shot, two-shot, Lamport, ring; all-gather push or pull).

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"algorithm"``; call
        ``registry.register(obj)`` with an :class:`iris_fw.ccl.algorithm.Algorithm` instance.
        Its registry name is ``"<collective>.<name>"`` (e.g. ``"all_reduce.one_shot"``), the
        ``algorithm=`` a caller passes is ``name``; ``supports(call)`` says which calls it can
        run and ``plan(group, call)`` returns the launch (docs/architecture.md, "add a collective").
        Flash-decode algorithms register here too, as ``"flash_decode.<name>"``: an
        :class:`iris_fw.flash_decode.DecodeAlgorithm` instance, which ``flash_decode(...,
        scheduler=name)`` runs (docs/architecture.md, "a flash-decode algorithm").
    :return: nothing.
    """


@hookspec
def iris_fw_register_benchmarks(registry):
    """Register benchmarks that ``iris-fw bench`` can run.

    Fires: once per plugin when the registries are loaded.

    :param registry: a :class:`~iris_fw.registry.Registry` of kind ``"benchmark"``; call
        ``registry.register(obj)`` with an object that has a ``name`` attribute, a
        ``run(ctx, options)`` method and, optionally, ``available()``.
    :return: nothing.
    """
