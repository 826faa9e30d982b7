"""A third-party iris-fw plugin package: one of each kind of plugin, installed and loaded
exactly as any other package's would be. Copy this folder to start your own.

``pyproject.toml`` publishes this module under the ``iris_fw`` entry-point group; iris-fw calls
its hooks (one per kind, :mod:`iris_fw.hookspecs`) whenever it loads its registries
(``iris_fw.init()``, ``iris-fw plugins``, ``iris-fw bench``). It registers:

* a transport, ``private_shm`` (:mod:`.transport`),
* a bootstrap, ``filestore`` (:mod:`.bootstrap`),
* a scheduler, ``reverse_fused`` (:mod:`.scheduler`), which runs the built-in patterns,
* a pattern, ``scale_all_gather`` (:mod:`.pattern`), which runs under the built-in schedulers,
* a collective algorithm, ``broadcast.pull`` (:mod:`.algorithm`),
* a benchmark, ``example_broadcast`` (:mod:`.benchmark`).

A name another plugin already registered raises ``DuplicateNameError`` naming both.
"""

from iris_fw.hookspecs import hookimpl

from .algorithm import PullBroadcast
from .benchmark import BroadcastBenchmark
from .bootstrap import FileStoreBootstrap
from .pattern import ScaleAllGather
from .scheduler import ReverseFused
from .transport import PrivateShmTransport


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(PrivateShmTransport)


@hookimpl
def iris_fw_register_bootstraps(registry):
    registry.register(FileStoreBootstrap)


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(ReverseFused())


@hookimpl
def iris_fw_register_patterns(registry):
    registry.register(ScaleAllGather())


@hookimpl
def iris_fw_register_algorithms(registry):
    algo = PullBroadcast()
    registry.register(algo, algo.key)  # "broadcast.pull"; callers pass algorithm="pull"


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(BroadcastBenchmark())
