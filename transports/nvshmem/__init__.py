"""``nvshmem``: the heap is NVSHMEM's symmetric heap; peers on other nodes are reached through
NVSHMEM device calls.

Set-up, collective: rank ``r`` uses GPU ``local_rank``; NVSHMEM is initialised through iris-fw's
bootstrap (rank 0's unique id broadcast to every rank: under ``iris-fw launch``, torchrun and
mpirun) or, with ``IRIS_FW_NVSHMEM_BOOTSTRAP=mpi``, through NVSHMEM's MPI bootstrap on the
``mpi`` bootstrap's communicator; PE numbers are ranks. The heap is one ``nvshmem_align``
allocation (``NVSHMEM_SYMMETRIC_SIZE`` is set to hold it when unset). ``bases[p]`` is
``nvshmem_ptr(heap, p)``: the peer's heap mapped here (NVLink / PCIe peer access within a node),
so every kernel runs unchanged on such peers, or 0 where NVSHMEM maps nothing (another node).
Then the device primitives must reach that peer through NVSHMEM calls: the transport's
``call_mode`` (1: for unmapped peers; 2 with ``IRIS_FW_NVSHMEM_CALLS=all``: for every peer, to run
the call path on one node) is what the context compiles into its kernels
(``ctx.heap_bases.NVSHMEM_CALLS``, :class:`iris_fw.device.DeviceHeaps`), and the transport attaches NVSHMEM's device library to Triton
(:mod:`iris_fw.transports.nvshmem.library`). With every peer mapped and ``auto`` nothing is attached and kernels are
exactly those of ``gpu_ipc``.

Closing, collective: device work done, barrier, ``nvshmem_free``, ``nvshmemx_hostlib_finalize``,
the Triton hooks removed. Multicast (NVLS) is never used: set-up exports
``NVSHMEM_DISABLE_NVLS=1`` unless the variable is set; a job on one host also gets
``NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo`` and ``NVSHMEM_REMOTE_TRANSPORT=none`` unless set.
"""

from __future__ import annotations

import os

import torch

from iris_fw import device as dv
from iris_fw import devinfo, env, interpreting
from . import library as nv
from iris_fw.errors import EnvironmentVariableError, IrisError
from iris_fw.hookspecs import hookimpl
from iris_fw.transports.gpu_ipc import DeviceHeapTransport, GpuIpcTransport, HeaderIO, _DeviceBlock, _Runtime

#: Bytes of the symmetric heap NVSHMEM keeps for itself (teams, collectives' work arrays) on top
#: of iris-fw's heap, when iris-fw sizes it (``NVSHMEM_SYMMETRIC_SIZE`` unset).
_NVSHMEM_RESERVE = 256 << 20
_GRANULE = 2 << 20


def _mpi_library() -> str | None:
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return None
    from mpi4py import MPI

    return MPI.Get_library_version()


class NvshmemTransport(DeviceHeapTransport):
    name = "nvshmem"

    @classmethod
    def available(cls):
        cuda = torch.cuda.is_available()
        hip = bool(torch.version.hip)
        capability = torch.cuda.get_device_capability(0) if cuda and not hip else None
        try:
            home, why = nv.find_home()
            choice = env.get(nv.ENV_BOOTSTRAP)
        except EnvironmentVariableError as exc:
            return False, str(exc)
        problem = nv.problem(cuda=cuda, hip=hip, capability=capability, interpreting=interpreting(), home=home,
                             home_why=why, bootstrap_choice=choice,
                             mpi_library=_mpi_library() if choice == "mpi" else None)
        if not problem:
            try:
                nv.HostApi(nv.host_library(home))
            except IrisError as exc:
                problem = str(exc)
        return (not problem), problem

    @classmethod
    def check_resources(cls, bootstrap, heap_size):
        """gpu_ipc's check: the heaps of the ranks on this rank's GPU fit its free memory, less a
        reserve (1 GiB, which also holds the part of NVSHMEM's heap iris-fw adds for NVSHMEM)."""
        return GpuIpcTransport.check_resources(bootstrap, heap_size)

    def __init__(self, bootstrap, heap_size: int):
        calls_choice = env.get(nv.ENV_CALLS)  # a bad value raises here, naming the variable
        env.get(nv.ENV_BOOTSTRAP)
        ok, why = self.available()
        if not ok:
            raise IrisError(f"transport 'nvshmem' is unavailable: {why}")
        # GPU local_rank (modulo the GPU count under IRIS_FW_SHARE_GPUS=1: several PEs on one GPU,
        # NVSHMEM's multiple-processes-per-GPU mode), chosen as gpu_ipc chooses it
        local, ranks_on_gpu = GpuIpcTransport._gpu_of(bootstrap)
        self.device = torch.device("cuda", local)
        self.ranks_on_device = ranks_on_gpu
        devinfo.warn_time_sliced(bootstrap.rank, ranks_on_gpu, self.device)
        torch.cuda.set_device(self.device)
        torch.zeros(1, device=self.device)  # the device's primary context is current: NVSHMEM uses it
        self._bootstrap = bootstrap
        self._heap_size = heap_size
        self._header_io = HeaderIO(_Runtime(), local)  # the heap is device memory: not host-readable
        self._own = 0
        self._attached = False
        self.bases: list[int] = []
        self.unmapped: list[int] = []
        home, _ = nv.find_home()
        self._api = api = nv.HostApi(nv.host_library(home))
        self.version = api.version()
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(-(-(heap_size + _NVSHMEM_RESERVE) // _GRANULE) * _GRANULE)
        if bootstrap.local_world_size == bootstrap.world_size:
            # one host: NVSHMEM's unique-id bootstrap over loopback, no inter-node transport to probe
            os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
            os.environ.setdefault("NVSHMEM_REMOTE_TRANSPORT", "none")
        try:
            self._init_nvshmem(api, bootstrap)
            self._set_up_heap(api, bootstrap, heap_size, home, calls_choice)
        except BaseException:
            self._release()
            raise

    # ---- set-up ----------------------------------------------------------------------------------
    @staticmethod
    def _init_nvshmem(api: nv.HostApi, bootstrap) -> None:
        if api.initialized():
            raise IrisError("nvshmem: NVSHMEM is already initialised in this process (one nvshmem context at a time)")
        if env.get(nv.ENV_BOOTSTRAP) == "mpi":
            if bootstrap.name != "mpi":
                raise IrisError(f"nvshmem: {nv.ENV_BOOTSTRAP}=mpi needs the 'mpi' bootstrap (run under mpirun), "
                                f"this job uses {bootstrap.name!r}")
            from mpi4py import MPI

            api.init_mpi(MPI._addressof(bootstrap.comm))
        else:
            nv.init_by_unique_id(api, bootstrap)
        if (api.my_pe(), api.n_pes()) != (bootstrap.rank, bootstrap.world_size):
            raise IrisError(f"nvshmem: NVSHMEM made rank {bootstrap.rank} of {bootstrap.world_size} PE "
                            f"{api.my_pe()} of {api.n_pes()}")

    def _set_up_heap(self, api, bootstrap, heap_size, home, calls_choice) -> None:
        self._own = api.align(dv.HEAP_BASE_ALIGN.value, heap_size)  # collective
        problem = None if self._own else (
            f"rank {bootstrap.rank}: nvshmem_align({heap_size}) returned NULL "
            f"(NVSHMEM_SYMMETRIC_SIZE={os.environ.get('NVSHMEM_SYMMETRIC_SIZE')} too small?)")
        self.bases = [api.ptr(self._own, pe) if self._own else 0 for pe in range(bootstrap.world_size)]
        unmapped = [pe for pe, base in enumerate(self.bases) if base == 0]
        if self._own and self.bases[bootstrap.rank] != self._own:
            problem = f"rank {bootstrap.rank}: nvshmem_ptr of its own heap is {self.bases[bootstrap.rank]:#x}, not {self._own:#x}"
        mode = nv.call_mode(calls_choice, unmapped)
        reports = bootstrap.all_gather((problem, calls_choice, mode))
        failed = [p for p, _, _ in reports if p]
        if failed:
            raise IrisError("nvshmem set-up failed: " + "; ".join(failed))
        if len({c for _, c, _ in reports}) > 1:
            raise IrisError(f"nvshmem: {nv.ENV_CALLS} differs across ranks: " +
                            ", ".join(f"rank {r}: {c}" for r, (_, c, _) in enumerate(reports)))
        self.call_mode = max(m for _, _, m in reports)
        self.unmapped = unmapped
        self._check_bases()
        if self.call_mode:
            self._attach_calls(home, bootstrap)
        self.heap = self.wrap(self._own, heap_size)[0]
        self.heap_bases = torch.tensor(self.bases, dtype=torch.int64, device=self.device)

    def _attach_calls(self, home, bootstrap) -> None:
        bitcode, why = nv.device_bitcode(home, torch.cuda.get_device_capability(self.device))
        reports = bootstrap.all_gather(why)
        if any(reports):
            raise IrisError("nvshmem: kernels need NVSHMEM device calls "
                            f"({'peers on other nodes' if self.call_mode == nv.CALLS_REMOTE else nv.ENV_CALLS + '=all'}) "
                            "but: " + "; ".join(f"rank {r}: {w}" for r, w in enumerate(reports) if w))
        nv.attach(bitcode, self._api)
        self._attached = True

    # ---- Transport API -------------------------------------------------------------------------------
    def wrap(self, address, nbytes):
        if not any(base and base <= address and address + nbytes <= base + self._heap_size for base in self.bases):
            raise IrisError(
                f"nvshmem: address {address:#x} (+{nbytes} bytes) is in no heap mapped in this process; the heaps of "
                f"ranks {self.unmapped} are on other nodes and reachable only from kernels (NVSHMEM calls)")
        owner = _DeviceBlock(address, nbytes)
        return torch.as_tensor(owner, device=self.device), owner

    def header_words(self, rank, slot, count):
        """As gpu_ipc's; a peer on another node (no host-visible mapping) reads as zeros: its
        liveness comes from the bootstrap, not from its heartbeat."""
        if not self.bases[rank]:
            return [0] * count
        return self._header_io.read(self.bases[rank] + 8 * slot, count)

    def set_header_words(self, rank, slot, values):
        """As gpu_ipc's; nothing is written to a peer on another node (see header_words)."""
        if self.bases[rank]:
            self._header_io.write(self.bases[rank] + 8 * slot, values)

    def _release(self):
        if self._attached:
            nv.detach()
            self._attached = False
        api = self._api
        if api.initialized():
            if self._own:
                api.free(self._own)  # collective
                self._own = 0
            api.finalize()  # collective


@hookimpl
def iris_fw_register_transports(registry):
    registry.register(NvshmemTransport)
