"""NVSHMEM for iris-fw, host side: finding the library, its host API through ctypes, and the
one place that attaches NVSHMEM's device bitcode to Triton kernels.

* :func:`find_home` / :func:`host_library` / :func:`device_bitcode`: the NVSHMEM installation
  (``IRIS_FW_NVSHMEM_HOME``, else the ``nvidia/nvshmem`` folder of the ``nvidia-nvshmem-cu13`` /
  ``-cu12`` wheel on ``sys.path``), its ``libnvshmem_host.so`` and the device bitcode for a GPU
  architecture (``libnvshmem_device.bc`` up to NVSHMEM 3.4, ``libnvshmem_device_sm_<arch>.bc``
  from 3.5 on).
* :class:`HostApi`: the host calls the ``nvshmem`` transport needs (unique id, init by unique id
  or MPI communicator, ``nvshmem_align``/``free``/``ptr``, ``nvshmemx_cumodule_init``, finalize).
  The host-library entry points (``nvshmemx_hostlib_init_attr`` / ``nvshmemx_hostlib_finalize``)
  are used: the usual ``nvshmemx_init_attr`` is an inline function of the C headers.
* :func:`init_by_unique_id`: rank 0 creates a unique id, the bootstrap broadcasts it, every rank
  initialises NVSHMEM with it (works under ``iris-fw launch``, torchrun and mpirun).
* :class:`DeviceLink`: while kernels use NVSHMEM calls (the transport's ``call_mode`` non-zero),
  a Triton stages hook adds the bitcode to every compilation's ``extern_libs`` (Triton links a
  library only into kernels that call into it) and a kernel-load hook runs
  ``nvshmemx_cumodule_init`` on every loaded module that holds NVSHMEM's device state. Nothing
  else in iris-fw knows about either. Without NVSHMEM calls nothing is attached and kernels
  compile exactly as they do on ``gpu_ipc``.

Environment: ``IRIS_FW_NVSHMEM_HOME`` (the installation), ``IRIS_FW_NVSHMEM_CALLS`` (``auto``:
calls only where a peer is not mapped, i.e. on another node; ``all``: every peer through
NVSHMEM calls, to exercise that path on one node), ``IRIS_FW_NVSHMEM_BOOTSTRAP`` (``uid``, the
default: a unique id through iris-fw's bootstrap; ``mpi``: NVSHMEM's own MPI bootstrap over the
``mpi`` bootstrap's communicator, Open MPI only). NVSHMEM's own variables (``NVSHMEM_*``) apply.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
import sys
from typing import Any, Callable

from iris_fw import env
from iris_fw.errors import IrisError

ENV_HOME = "IRIS_FW_NVSHMEM_HOME"
ENV_CALLS = "IRIS_FW_NVSHMEM_CALLS"
ENV_BOOTSTRAP = "IRIS_FW_NVSHMEM_BOOTSTRAP"

#: ``call_mode`` values (``iris_fw.device.DeviceHeaps.NVSHMEM_CALLS``).
CALLS_OFF, CALLS_REMOTE, CALLS_ALL = 0, 1, 2

#: Oldest GPU NVSHMEM supports (Volta).
MIN_CAPABILITY = (7, 0)
UNIQUE_ID_BYTES = 128
_INIT_WITH_MPI_COMM = 1 << 1
_INIT_WITH_UNIQUEID = 1 << 3
#: NVSHMEM's status once ``hostlib_init_attr`` returned (NVSHMEM_STATUS_IS_INITIALIZED).
_STATUS_INITIALIZED = 2
#: The symbol of NVSHMEM's device state in a module that links the device library.
DEVICE_STATE_SYMBOL = b"nvshmemi_device_state_d"
_WHEEL_DIR = os.path.join("nvidia", "nvshmem")


# ---- finding the installation ---------------------------------------------------------------------


def find_home(environ=None) -> tuple[str | None, str]:
    """The NVSHMEM installation folder (holding ``lib/``) and where it was found, or ``(None,
    why not)``; ``environ`` (default ``os.environ``) gives ``IRIS_FW_NVSHMEM_HOME``."""
    forced = env.get(ENV_HOME, environ)
    if forced:
        if os.path.isdir(os.path.join(forced, "lib")):
            return forced, f"{ENV_HOME}={forced}"
        return None, f"{ENV_HOME}={forced} has no lib/ folder"
    for entry in sys.path:
        home = os.path.join(entry or ".", _WHEEL_DIR)
        if glob.glob(os.path.join(home, "lib", "libnvshmem_host.so*")):
            return home, f"the nvidia-nvshmem wheel in {entry}"
    return None, ("NVSHMEM is not installed: pip install nvidia-nvshmem-cu13 (CUDA 13; -cu12 for CUDA 12), "
                  f"or point {ENV_HOME} at an installation")


def host_library(home: str) -> str:
    """Path of ``libnvshmem_host.so`` under ``home`` (raises :class:`IrisError` if missing)."""
    found = sorted(glob.glob(os.path.join(home, "lib", "libnvshmem_host.so*")))
    if not found:
        raise IrisError(f"no libnvshmem_host.so under {os.path.join(home, 'lib')}")
    return found[0]


def device_bitcode(home: str, capability: tuple[int, int]) -> tuple[str | None, str]:
    """NVSHMEM's device bitcode for a GPU of compute ``capability``: the newest
    ``libnvshmem_device_sm_<NN>.bc`` with the GPU's major version and ``NN`` at most its own,
    else ``libnvshmem_device.bc``; ``(None, why)`` when there is none."""
    lib = os.path.join(home, "lib")
    arch = capability[0] * 10 + capability[1]
    per_arch = []
    for path in glob.glob(os.path.join(lib, "libnvshmem_device_sm_*.bc")):
        digits = os.path.basename(path)[len("libnvshmem_device_sm_"):-len(".bc")]
        if digits.isdigit():
            per_arch.append((int(digits), path))
    fitting = [(nn, path) for nn, path in per_arch if nn // 10 == capability[0] and nn <= arch]
    if fitting:
        return max(fitting)[1], ""
    generic = os.path.join(lib, "libnvshmem_device.bc")
    if os.path.exists(generic):
        return generic, ""
    shipped = ", ".join(f"sm_{nn}" for nn, _ in sorted(per_arch)) or "none"
    return None, f"NVSHMEM at {home} has no device bitcode for sm_{arch} (shipped: {shipped})"


def problem(*, cuda: bool, hip: bool, capability: tuple[int, int] | None, interpreting: bool,
            home: str | None, home_why: str, bootstrap_choice: str = "uid", mpi_library: str | None = None) -> str:
    """Why the ``nvshmem`` transport cannot run here, or ``""``: the facts are arguments so the
    reasons can be tested anywhere. ``mpi_library``: mpi4py's MPI library version string, or None
    when mpi4py is missing (only asked for with ``bootstrap_choice="mpi"``)."""
    if interpreting:
        return "TRITON_INTERPRET=1 is set: kernels would run on the CPU interpreter (NVSHMEM needs compiled kernels)"
    if hip:
        return "NVSHMEM is NVIDIA-only; this torch is a ROCm build"
    if not cuda:
        return "no CUDA GPU visible to torch (torch.cuda.is_available() is False)"
    if capability is not None and tuple(capability) < MIN_CAPABILITY:
        return (f"unsupported GPU: compute capability {capability[0]}.{capability[1]}; NVSHMEM needs "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (Volta) or newer")
    if home is None:
        return home_why
    if bootstrap_choice == "mpi":
        if mpi_library is None:
            return f"{ENV_BOOTSTRAP}=mpi needs mpi4py (pip install 'iris-fw[mpi]') and Open MPI"
        if "Open MPI" not in mpi_library:
            return (f"{ENV_BOOTSTRAP}=mpi: NVSHMEM's MPI bootstrap plugin is built for Open MPI "
                    f"(libmpi.so.40); mpi4py uses {mpi_library.splitlines()[0].strip()!r}. Use the default "
                    f"{ENV_BOOTSTRAP}=uid, which works with any MPI")
    return ""


def call_mode(choice: str, unmapped_peers: list[int]) -> int:
    """The transport's ``call_mode`` for ``IRIS_FW_NVSHMEM_CALLS=choice`` on a rank whose
    peers ``unmapped_peers`` have no load/store mapping (``choice`` as :mod:`iris_fw.env` parsed it)."""
    if choice == "all":
        return CALLS_ALL
    return CALLS_REMOTE if unmapped_peers else CALLS_OFF


# ---- the host API -------------------------------------------------------------------------------------


class _UniqueIdArgs(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("id", ctypes.c_void_p), ("myrank", ctypes.c_int),
                ("nranks", ctypes.c_int)]


class _InitArgs(ctypes.Structure):  # nvshmemx_init_args_v1 (NVSHMEM 3.4 and 3.8 accept it)
    _fields_ = [("version", ctypes.c_int), ("uid_args", _UniqueIdArgs), ("content", ctypes.c_char * 96)]


class InitAttr(ctypes.Structure):
    """``nvshmemx_init_attr_t``, version 1 (144 bytes)."""

    _fields_ = [("version", ctypes.c_int), ("mpi_comm", ctypes.c_void_p), ("args", _InitArgs)]

    def __init__(self):
        super().__init__()
        self.version = (1 << 16) + ctypes.sizeof(InitAttr)
        self.args.version = (1 << 16) + ctypes.sizeof(_InitArgs)
        self.args.uid_args.version = (1 << 16) + ctypes.sizeof(_UniqueIdArgs)
        self.args.uid_args.myrank = -1
        self.args.uid_args.nranks = -1


assert ctypes.sizeof(_UniqueIdArgs) == 24 and ctypes.sizeof(_InitArgs) == 128 and ctypes.sizeof(InitAttr) == 144


class HostApi:
    """The NVSHMEM host calls iris-fw uses, on ``libnvshmem_host.so`` through ctypes."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.lib = lib = ctypes.CDLL(path)  # RTLD_LOCAL: another NVSHMEM in the process keeps its symbols
        except OSError as exc:
            raise IrisError(f"cannot load NVSHMEM's host library {path}: {exc}") from None
        vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        for name, res, args in (
            ("nvshmemx_get_uniqueid", i, [vp]),
            ("nvshmemx_set_attr_uniqueid_args", i, [i, i, vp, vp]),
            ("nvshmemx_set_attr_mpi_comm_args", i, [vp, vp]),
            ("nvshmemx_hostlib_init_attr", i, [ctypes.c_uint, vp]),
            ("nvshmemx_hostlib_finalize", None, []),
            ("nvshmemx_init_status", i, []),
            ("nvshmem_my_pe", i, []),
            ("nvshmem_n_pes", i, []),
            ("nvshmem_align", vp, [sz, sz]),
            ("nvshmem_free", None, [vp]),
            ("nvshmem_ptr", vp, [vp, i]),
            ("nvshmem_barrier_all", None, []),
            ("nvshmemx_cumodule_init", i, [vp]),
            ("nvshmemx_vendor_get_version_info", None, [vp, vp, vp]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args

    def version(self) -> tuple[int, int, int]:
        parts = [ctypes.c_int() for _ in range(3)]
        self.lib.nvshmemx_vendor_get_version_info(*(ctypes.byref(p) for p in parts))
        return tuple(p.value for p in parts)

    def unique_id(self) -> bytes:
        """A new unique id (``nvshmemx_get_uniqueid``): 128 bytes for the other ranks."""
        uid = (ctypes.c_char * UNIQUE_ID_BYTES)()
        self._check("nvshmemx_get_uniqueid", self.lib.nvshmemx_get_uniqueid(uid))
        return bytes(uid)

    def unique_id_attr(self, uid: bytes, rank: int, world_size: int):
        """``(attr, keep)``: init attributes for ``rank`` of ``world_size`` with ``uid``; ``keep``
        must live until init (the attributes point at it)."""
        if len(uid) != UNIQUE_ID_BYTES:
            raise IrisError(f"an NVSHMEM unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        keep = (ctypes.c_char * UNIQUE_ID_BYTES).from_buffer_copy(uid)
        attr = InitAttr()
        self._check("nvshmemx_set_attr_uniqueid_args",
                    self.lib.nvshmemx_set_attr_uniqueid_args(rank, world_size, keep, ctypes.byref(attr)))
        return attr, keep

    def init_unique_id(self, uid: bytes, rank: int, world_size: int) -> None:
        attr, keep = self.unique_id_attr(uid, rank, world_size)
        self._check("nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID)",
                    self.lib.nvshmemx_hostlib_init_attr(_INIT_WITH_UNIQUEID, ctypes.byref(attr)))
        del keep

    def init_mpi(self, comm_address: int) -> None:
        """Init through NVSHMEM's MPI bootstrap; ``comm_address``: the address of an ``MPI_Comm``
        (mpi4py: ``MPI._addressof(comm)``)."""
        attr = InitAttr()
        self._check("nvshmemx_set_attr_mpi_comm_args",
                    self.lib.nvshmemx_set_attr_mpi_comm_args(ctypes.c_void_p(comm_address), ctypes.byref(attr)))
        self._check("nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_MPI_COMM)",
                    self.lib.nvshmemx_hostlib_init_attr(_INIT_WITH_MPI_COMM, ctypes.byref(attr)))

    def initialized(self) -> bool:
        return self.lib.nvshmemx_init_status() >= _STATUS_INITIALIZED

    def my_pe(self) -> int:
        return self.lib.nvshmem_my_pe()

    def n_pes(self) -> int:
        return self.lib.nvshmem_n_pes()

    def align(self, alignment: int, nbytes: int) -> int:
        """``nvshmem_align``: collective; 0 when the symmetric heap is too small."""
        return self.lib.nvshmem_align(alignment, nbytes) or 0

    def free(self, address: int) -> None:
        self.lib.nvshmem_free(ctypes.c_void_p(address))  # collective

    def ptr(self, address: int, pe: int) -> int:
        """``nvshmem_ptr``: ``pe``'s copy of the symmetric ``address`` mapped here, or 0."""
        return self.lib.nvshmem_ptr(ctypes.c_void_p(address), pe) or 0

    def barrier_all(self) -> None:
        self.lib.nvshmem_barrier_all()

    def cumodule_init(self, module: int) -> None:
        self._check("nvshmemx_cumodule_init", self.lib.nvshmemx_cumodule_init(ctypes.c_void_p(module)))

    def finalize(self) -> None:
        self.lib.nvshmemx_hostlib_finalize()

    @staticmethod
    def _check(call: str, rc: int) -> None:
        if rc != 0:
            raise IrisError(f"{call} failed with status {rc} (NVSHMEM_DEBUG=INFO says why)")


def init_by_unique_id(api, bootstrap) -> None:
    """Initialise NVSHMEM on every rank of ``bootstrap``: rank 0 creates the unique id, the
    bootstrap broadcasts it, each rank joins as PE ``bootstrap.rank`` of ``bootstrap.world_size``.
    Collective. ``api`` is a :class:`HostApi` (or anything with ``unique_id`` and
    ``init_unique_id``)."""
    uid = api.unique_id() if bootstrap.rank == 0 else None
    uid = bootstrap.broadcast(uid, 0)
    if not isinstance(uid, bytes) or len(uid) != UNIQUE_ID_BYTES:
        raise IrisError(f"rank {bootstrap.rank} received a malformed NVSHMEM unique id from rank 0: {uid!r:.60}")
    api.init_unique_id(uid, bootstrap.rank, bootstrap.world_size)


# ---- NVSHMEM calls in Triton kernels ----------------------------------------------------------------


def _cuda_module_has(symbol: bytes) -> Callable[[int], bool]:
    """A test whether a loaded CUDA module defines the global ``symbol`` (``cuModuleGetGlobal``)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    get = cuda.cuModuleGetGlobal_v2
    get.restype = ctypes.c_int
    get.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_char_p]

    def has(module: int) -> bool:
        dptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        return get(ctypes.byref(dptr), ctypes.byref(size), ctypes.c_void_p(module), symbol) == 0

    return has


class DeviceLink:
    """Attaches NVSHMEM's device library to Triton while installed (see the module docstring).

    ``init_module(module)`` initialises a loaded module (``nvshmemx_cumodule_init``);
    ``has_state(module)`` says whether a module holds NVSHMEM's device state (default: asks the
    CUDA driver). Both are injectable so the hooks can be tested without a GPU."""

    def __init__(self, bitcode: str, init_module: Callable[[int], None],
                 has_state: Callable[[int], bool] | None = None):
        self.bitcode = bitcode
        self._init_module = init_module
        self._has_state = has_state
        self.modules: list[int] = []  # modules initialised, in load order
        self._installed = False
        self._previous_stages = None

    # the stages hook: add the bitcode to the options the LLVM-IR stage links with
    def stages_hook(self, backend=None, stages=None, options=None, language=None, capability=None):
        previous = self._previous_stages
        if backend is None:  # Triton >= 3.9 asks for a cache key first
            key, digest = f"iris_fw.transports.nvshmem.library:{self.bitcode}", _file_digest(self.bitcode)
            if previous is not None:
                pkey, pdigest = previous()
                key, digest = f"{pkey}{key}", f"{pdigest}-{digest}"
            return key, digest
        if previous is not None:
            previous(backend, stages, options, language, capability)
        libs = getattr(options, "extern_libs", None)
        if libs is None or "llir" not in stages or not hasattr(backend, "make_llir"):
            return  # not a CUDA compilation
        linked = dataclasses.replace(options, extern_libs=tuple(dict(libs, libnvshmem_device=self.bitcode).items()))
        bitcode = self.bitcode

        def make_llir(src, metadata):
            try:
                return backend.make_llir(src, metadata, linked, capability)
            except ValueError as exc:
                if bitcode in str(exc):
                    import triton

                    raise IrisError(
                        f"Triton {triton.__version__} cannot read NVSHMEM's device bitcode {bitcode} ({exc}). "
                        "Triton links it with its own LLVM, which must be at least as new as the one that wrote "
                        "it: NVSHMEM 3.8's bitcode needs Triton >= 3.9; Triton 3.6 reads NVSHMEM 3.4's "
                        f"(pip install nvidia-nvshmem-cu13==3.4.5 and point {ENV_HOME} at its nvidia/nvshmem)"
                    ) from exc
                raise

        stages["llir"] = make_llir

    # the kernel-load hook: initialise NVSHMEM's device state in every module that has it
    def load_hook(self, module, function=None, name=None, metadata_group=None, hash=None):
        if module is None:
            return
        has_state = self._has_state or _cuda_module_has(DEVICE_STATE_SYMBOL)
        self._has_state = has_state
        if has_state(module):
            self._init_module(module)
            if module not in self.modules:
                self.modules.append(module)

    def unload_hook(self, module, function=None, name=None, metadata_group=None, hash=None):
        if module in self.modules:
            self.modules.remove(module)

    def install(self, knobs=None) -> None:
        """Set the hooks on Triton's runtime knobs (chaining a stages hook already there) and
        initialise modules loaded under an earlier installation again (NVSHMEM re-initialised)."""
        runtime = (knobs or _triton_knobs()).runtime
        if self._installed:
            return
        self._previous_stages = runtime.add_stages_inspection_hook
        runtime.add_stages_inspection_hook = self.stages_hook
        runtime.kernel_load_end_hook.add(self.load_hook)
        if hasattr(runtime, "kernel_unload_hook"):
            runtime.kernel_unload_hook.add(self.unload_hook)
        self._installed = True
        for module in list(self.modules):
            try:
                self._init_module(module)
            except IrisError:
                self.modules.remove(module)

    def uninstall(self, knobs=None) -> None:
        runtime = (knobs or _triton_knobs()).runtime
        if not self._installed:
            return
        if runtime.add_stages_inspection_hook == self.stages_hook:
            runtime.add_stages_inspection_hook = self._previous_stages
        runtime.kernel_load_end_hook.remove(self.load_hook)
        if hasattr(runtime, "kernel_unload_hook"):
            runtime.kernel_unload_hook.remove(self.unload_hook)
        self._previous_stages = None
        self._installed = False


def _triton_knobs():
    import triton

    return triton.knobs


def _file_digest(path: str) -> str:
    import hashlib

    stat = os.stat(path)
    return hashlib.sha256(f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


#: The process's device link while an NVSHMEM context uses calls (NVSHMEM is one per process).
_link: DeviceLink | None = None


def attach(bitcode: str, api: HostApi) -> DeviceLink:
    """Install the process's :class:`DeviceLink` for ``bitcode`` (reusing the modules an earlier
    one initialised). Called by the ``nvshmem`` transport when kernels use NVSHMEM calls."""
    global _link
    if _link is not None and _link.bitcode != bitcode:
        raise IrisError(f"NVSHMEM device bitcode changed within this process ({_link.bitcode} -> {bitcode})")
    if _link is None:
        _link = DeviceLink(bitcode, api.cumodule_init)
    _link._init_module = api.cumodule_init
    _link.install()
    return _link


def detach() -> None:
    """Remove the hooks :func:`attach` installed (the transport's close)."""
    if _link is not None:
        _link.uninstall()


def describe(environ=None) -> dict[str, Any]:
    """What ``iris-fw info`` and the GPU script print: the installation, its version, the device
    bitcode per shipped architecture."""
    home, why = find_home(environ)
    out: dict[str, Any] = {"home": home, "found": why}
    if home is None:
        return out
    try:
        out["host_library"] = host_library(home)
        out["version"] = ".".join(map(str, HostApi(out["host_library"]).version()))
    except IrisError as exc:
        out["error"] = str(exc)
    out["bitcode"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(home, "lib", "libnvshmem_device*.bc")))
    return out
