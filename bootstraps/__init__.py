"""The built-in bootstraps, one module each, registered by this package's hook (entry point
``bootstraps`` in pyproject.toml, group ``iris_fw``) through the registry like a third-party
bootstrap; the contract is :class:`iris_fw.bootstrap_base.Bootstrap`.

* ``mpi`` (:mod:`.mpi`) – mpi4py, for programs run under ``mpirun -n N python …``.
* ``torch`` (:mod:`.torch_distributed`) – torch.distributed, for programs run under
  ``torchrun``; reuses an initialized default process group or creates one.
* ``single`` (:mod:`.single`) – one rank, no communication.
"""

from iris_fw.hookspecs import hookimpl

from .mpi import MpiBootstrap
from .single import SingleBootstrap
from .torch_distributed import TorchBootstrap

__all__ = ["MpiBootstrap", "SingleBootstrap", "TorchBootstrap"]


@hookimpl
def iris_fw_register_bootstraps(registry):
    for cls in (SingleBootstrap, TorchBootstrap, MpiBootstrap):
        registry.register(cls)
