"""What ``iris-fw info`` reports: versions, GPUs (or why none), the interpreter switch, the
bootstrap and transport :func:`iris_fw.init` would choose here and why, ``mpirun``, ``/dev/shm``
space, every plugin entry point (with its load error, if any) and every registered plugin's
availability, and the environment variables that steer iris-fw.

Each function returns plain data, so the command can print it as text or JSON (``--json``,
for bug reports).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from typing import Any

#: Variables outside the ``IRIS_FW_`` prefix that change what iris-fw does.
RELATED_VARIABLES = ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                     "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK")
SHM_DIR = "/dev/shm"


def find_mpirun() -> str | None:
    """``IRIS_FW_MPIRUN``, else the mpirun beside this Python (the ``mpich`` wheel's, also under
    pyenv, whose shims hide it from PATH), else the one on PATH."""
    from . import env

    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return env.get("IRIS_FW_MPIRUN") or (beside if os.path.exists(beside) else shutil.which("mpirun"))


def versions() -> dict[str, str]:
    """iris-fw, Python, torch (with its CUDA/HIP build), Triton, numpy, pluggy and mpi4py."""
    import iris_fw

    out = {"iris-fw": iris_fw.__version__, "python": f"{platform.python_version()} ({sys.executable})"}
    for dist in ("torch", "triton", "numpy", "pluggy", "mpi4py"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed" + (" (pip install 'iris-fw[mpi]')" if dist == "mpi4py" else "")
    import torch

    out["torch"] += f" (CUDA {torch.version.cuda})" if torch.version.cuda else (
        f" (HIP {torch.version.hip})" if torch.version.hip else " (CPU-only build)")
    return out


def gpus() -> tuple[list[str], str]:
    """The GPUs torch sees (``"cuda:0 NVIDIA H200"``, ...) and, when there are none, why."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())], ""
    if torch.version.cuda is None and torch.version.hip is None:
        return [], f"this torch ({torch.__version__}) is a CPU-only build"
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is not None and value.strip() in ("", "-1"):
            return [], f"{var}={value!r} hides every GPU"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"HIP {torch.version.hip}"
    return [], f"torch (built for {build}) found no GPU: no device or no driver here (nvidia-smi / rocm-smi says more)"


def mps(have_gpus: bool) -> str:
    """Whether ranks sharing a GPU here would run at once (CUDA MPS) or time-slice."""
    from . import devinfo

    active, why = devinfo.mps_status()
    if active:
        return f"active: {why} (ranks sharing a GPU run at the same time)"
    if not have_gpus:
        return f"inactive: {why}"
    return (f"inactive: {why}; ranks sharing a GPU (IRIS_FW_SHARE_GPUS=1) time-slice — start it with: "
            f"{devinfo.MPS_START}")


def interpreter() -> tuple[bool, str]:
    """Whether Triton kernels run under the CPU interpreter in this process, and why."""
    from .interpreter import interpreting

    names, no_gpu = gpus()
    from . import env

    forced = env.get("IRIS_FW_TRANSPORT") or "auto"
    if interpreting():
        if forced == "host_shm":
            return True, "IRIS_FW_TRANSPORT=host_shm asks for CPU ranks"
        if names:
            return True, "TRITON_INTERPRET=1 is set: kernels run on the CPU although GPUs are present"
        return True, f"no GPU is visible ({no_gpu}), so `import iris_fw` switches Triton's interpreter on"
    if names:
        return False, "GPUs are present: kernels compile for them"
    return False, ("TRITON_INTERPRET=0 is set but no GPU is visible: kernel launches will fail with "
                   "'0 active drivers' (unset it)")


def choices(registries) -> dict[str, str]:
    """The bootstrap and transport :func:`iris_fw.init` would choose in this environment, and why
    (or the error it would raise)."""
    from . import bootstrap_base as bootstrap
    from .context import transport_choice

    out = {}
    try:
        cls, why = bootstrap.choice(registries.bootstrap)
        out["bootstrap"] = f"{cls.name} ({why})"
    except Exception as exc:  # init() would raise this: say so instead of failing
        out["bootstrap"] = f"init() would fail: {type(exc).__name__}: {exc}"
    name, why = transport_choice(registries.transport)
    ok, problem = (registries.transport.entry(name).availability() if name in registries.transport
                   else (False, f"no transport named {name!r} is registered"))
    out["transport"] = f"{name} ({why})" if ok else f"{name} ({why}), but init() would fail: {problem}"
    return out


def shm_space(path: str = SHM_DIR) -> str:
    """Free and total bytes of ``/dev/shm`` (CPU ranks' heaps live there)."""
    if not os.path.isdir(path):
        return f"{path} does not exist (CPU ranks need it: host_shm)"
    usage = shutil.disk_usage(path)
    return f"{usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB"


def plugins() -> tuple[list[dict[str, Any]], Any]:
    """Every entry point of the ``iris_fw`` group, loaded one by one: ``{"name", "value",
    "package", "error"}`` each (``error`` is ``None`` when it loaded), and the registries filled
    by the plugins that did load."""
    from .hookspecs import PROJECT_NAME
    from .registry import load_registries, plugin_manager

    pm = plugin_manager(load_entry_points=False)
    report = []
    for ep in sorted(importlib.metadata.entry_points(group=PROJECT_NAME), key=lambda e: e.name):
        row = {"name": ep.name, "value": ep.value, "package": ep.dist.name if ep.dist else "?", "error": None}
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken plugin is reported, not fatal, here
            row["error"] = f"{type(exc).__name__}: {exc}"
        report.append(row)
    try:
        regs = load_registries(pm)
    except Exception as exc:  # e.g. a name registered twice
        return report, exc
    return report, regs


def variables() -> dict[str, str]:
    """``IRIS_FW_*`` variables set in this environment, then the related ones that are set."""
    found = {k: v for k, v in sorted(os.environ.items()) if k.startswith("IRIS_FW_")}
    found.update({k: os.environ[k] for k in RELATED_VARIABLES if k in os.environ})
    return found


def report() -> dict[str, Any]:
    """Everything ``iris-fw info`` prints, as one dictionary."""
    names, no_gpu = gpus()
    on, why = interpreter()
    entry_points, regs = plugins()
    out: dict[str, Any] = {
        "versions": versions(),
        "gpus": names or f"none: {no_gpu}",
        "cuda mps": mps(bool(names)),
        "interpreter": f"{'on' if on else 'off'}: {why}",
    }
    if isinstance(regs, Exception):
        out["init() would choose"] = f"the plugins do not load: {type(regs).__name__}: {regs}"
        out["plugins"] = {}
    else:
        out["init() would choose"] = choices(regs)
        packages = {f"plugin {r['name']!r}": r["package"] for r in entry_points}  # provider -> package

        def state(entry):
            ok, reason = entry.availability()
            package = packages.get(entry.provider, entry.provider)
            return ("available" if ok else f"unavailable: {reason}") + ("" if package == "iris-fw" else f"  [{package}]")

        out["plugins"] = {registry.kind: {e.name: state(e) for e in registry} for registry in regs}
    mpirun = find_mpirun()
    out["mpirun"] = mpirun or "not found (pip install 'iris-fw[mpi]' brings one; IRIS_FW_MPIRUN names another)"
    out["/dev/shm"] = shm_space()
    out["entry points"] = {f"{r['name']} = {r['value']} [{r['package']}]": r["error"] or "loaded" for r in entry_points}
    out["environment"] = variables() or "no IRIS_FW_* or related variables set (docs/environment.md lists them)"
    return out


def format_report(data: dict[str, Any]) -> str:
    """``report()`` as indented text."""
    lines = []

    def emit(key, value, indent):
        if isinstance(value, dict):
            lines.append(f"{' ' * indent}{key}:")
            if not value:
                lines.append(f"{' ' * (indent + 2)}(none)")
            width = max((len(str(k)) for k in value), default=0)
            for k, v in value.items():
                if isinstance(v, (dict, list)):
                    emit(k, v, indent + 2)
                else:
                    lines.append(f"{' ' * (indent + 2)}{str(k):<{width}}  {v}")
        elif isinstance(value, list):
            lines.append(f"{' ' * indent}{key}:")
            lines.extend(f"{' ' * (indent + 2)}{v}" for v in value)
        else:
            lines.append(f"{' ' * indent}{key}: {value}")

    for key, value in data.items():
        emit(key, value, 0)
    return "\n".join(lines)
