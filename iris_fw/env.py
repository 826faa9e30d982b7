"""Every ``IRIS_FW_*`` environment variable iris-fw reads, declared once — name, type, default,
meaning — and parsed strictly. Nothing else in iris-fw reads ``IRIS_FW_*`` variables; it asks
:func:`get`.

A variable that is unset or set to the empty string has its default. A value that does not
parse raises :class:`~iris_fw.errors.EnvironmentVariableError` naming the variable, the value and
what is accepted — a typo is never read as some other setting. Booleans accept exactly
:data:`TRUE_SPELLINGS` and :data:`FALSE_SPELLINGS` (any letter case).

``iris-fw env --markdown`` prints the table of :data:`VARIABLES` (docs/environment.md holds it,
checked by the tests); ``iris-fw env`` the variables in effect (:func:`in_effect`) and unknown
``IRIS_FW_*`` names (:func:`unknown`, likely typos).

This module imports nothing but the standard library and :mod:`iris_fw.errors`, so it is safe
to use while ``import iris_fw`` runs.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import EnvironmentVariableError

TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")
#: Byte-size suffixes (powers of 1024) accepted by ``bytes`` variables, e.g. ``256M``.
_BYTE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in TRUE_SPELLINGS:
        return True
    if low in FALSE_SPELLINGS:
        return False
    raise ValueError(f"one of {'/'.join(TRUE_SPELLINGS)} (on) or {'/'.join(FALSE_SPELLINGS)} (off)")


def _positive_int(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise ValueError("a whole number >= 1") from None
    if value < 1:
        raise ValueError("a whole number >= 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("a finite number of seconds > 0") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError("a finite number of seconds > 0")
    return value


def _bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not match or int(match.group(1)) < 1:
        raise ValueError("a byte count >= 1, optionally with a K, M, G or T suffix (powers of 1024), e.g. 268435456 or 256M")
    return int(match.group(1)) * _BYTE_SUFFIXES[match.group(2).lower()]


def _name(text: str) -> str:
    value = text.strip()
    if not _NAME.fullmatch(value):
        raise ValueError("'auto' or a registered plugin name (letters, digits, '_', '.', '-')")
    return value


def _prefix(text: str) -> str:
    if not _PREFIX.fullmatch(text):
        raise ValueError("1 to 64 characters from letters, digits, '_', '.', '-', not starting with '.' or '-' "
                         "(a file-name prefix in /dev/shm: no path separators)")
    return text


def _text(text: str) -> str:
    return text


def _one_of(*choices: str) -> tuple[Callable[[str], str], str]:
    """A kind that accepts exactly ``choices`` (any letter case): its parser and its table text."""
    accepted = "one of " + ", ".join(f"`{c}`" for c in choices)

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return value

    return parse, accepted


#: what each kind accepts, for the table
_KINDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "bool": (_bool, "boolean: " + "/".join(TRUE_SPELLINGS) + " or " + "/".join(FALSE_SPELLINGS)),
    "count": (_positive_int, "integer >= 1"),
    "seconds": (_seconds, "seconds, finite, > 0"),
    "bytes": (_bytes, "bytes >= 1; K/M/G/T suffixes (1024-based) allowed"),
    "name": (_name, "a plugin name or `auto`"),
    "prefix": (_prefix, "file-name prefix: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}`"),
    "path": (_text, "a path"),
    "text": (_text, "text"),
    "nvshmem_calls": _one_of("auto", "all"),
    "nvshmem_bootstrap": _one_of("uid", "mpi"),
    "gluon_mma": _one_of("auto", "wgmma", "mma_v2"),
}


@dataclass(frozen=True)
class Variable:
    """One environment variable: ``name``, ``kind`` (a key of the kinds table: what it accepts),
    ``default`` (the value when unset or empty; ``None``: not set), ``doc`` (what it does) and
    ``internal`` (set by iris-fw itself for its child processes)."""

    name: str
    kind: str
    default: Any
    doc: str
    internal: bool = False

    def parse(self, text: str) -> Any:
        parse, accepted = _KINDS[self.kind]
        try:
            return parse(text)
        except ValueError as exc:
            raise EnvironmentVariableError(
                f"environment variable {self.name}={text!r} is not valid: expected {exc or accepted}; "
                f"unset it for the default ({self.default_text})"
            ) from None

    @property
    def accepts(self) -> str:
        return _KINDS[self.kind][1]

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return str(self.default)


VARIABLES: tuple[Variable, ...] = (
    Variable("IRIS_FW_TRANSPORT", "name", "auto",
             "Transport of `iris_fw.init()` when its `transport` argument is not given: `gpu_ipc`, `host_shm` "
             "or a plugin's; `auto` picks `host_shm` under Triton's interpreter, else `gpu_ipc` when GPUs are "
             "present. `host_shm` also switches Triton's interpreter on at `import iris_fw`."),
    Variable("IRIS_FW_BOOTSTRAP", "name", "auto",
             "Bootstrap of `iris_fw.init()` when its `bootstrap` argument is not given: `mpi`, `torch`, "
             "`single` or a plugin's; `auto` chooses from the launcher's variables. `iris-fw launch` refuses "
             "values that contradict it (e.g. `single` with `-n 2`)."),
    Variable("IRIS_FW_WAIT_TIMEOUT", "seconds", 30.0,
             "Seconds a device-side wait polls before it gives up and the host raises `WaitTimeout` "
             "(`init(wait_timeout=...)` overrides)."),
    Variable("IRIS_FW_DEBUG", "bool", False,
             "Check every heap allocation's offset across ranks as it happens (`init(debug=...)` overrides); "
             "on GPUs also compile the device pointer checks into the context's kernels (always on under the "
             "interpreter; read by `iris_fw.init`, carried by `ctx.heap_bases`)."),
    Variable("IRIS_FW_LIVENESS_TIMEOUT", "seconds", 10.0,
             "Seconds after which the other ranks report a rank lost that is stopped (SIGSTOP, a debugger), or "
             "whose heartbeat stood still where its process cannot be seen (`init(liveness_timeout=...)` "
             "overrides; a rank that dies or exits is noticed at once)."),
    Variable("IRIS_FW_ARRIVAL_TIMEOUT", "seconds", None,
             "Seconds the ranks wait at `iris_fw.init()` for the others to arrive before naming those that did "
             "not (unset: the liveness bound); raise it where ranks start slowly or staggered."),
    Variable("IRIS_FW_LAUNCHER_SIGNALS", "bool", False,
             "Set by `iris-fw launch` for its ranks: a rank's watchdog turns the launcher's SIGTERM (a peer died) "
             "into a `PeerFailure` naming that peer. Unset, the library installs no signal handler."),
    Variable("IRIS_FW_SHM_PREFIX", "prefix", "iris_fw_",
             "Name prefix of `host_shm` segments in /dev/shm (launchers set one per job, so their clean-up "
             "finds the job's segments)."),
    Variable("IRIS_FW_SHARE_GPUS", "bool", False,
             "Let ranks beyond the GPU count share GPUs round-robin (rank r on GPU r mod count), for "
             "correctness tests on fewer GPUs than ranks; timings taken so mean nothing."),
    Variable("IRIS_FW_CCL_WORKSPACE", "bytes", None,
             "Workspace of an `iris_fw.ccl` group when `new_group(workspace_bytes=...)` is not given "
             "(unset: a quarter of the heap, at most 256 MiB)."),
    Variable("IRIS_FW_GRAPH_REPLAY", "bool", True,
             "Replay a repeated call as a CUDA graph: an `iris_fw.ops` call, a collective or a flash-decode "
             "call that comes back with every tensor at the same address (a call without `out=` has its new "
             "result made first: its address repeats when torch's allocator hands the block back) captures "
             "itself on its third such call and is one graph launch after (iris_fw/callpath.py; read when a "
             "context starts; GPUs only; off under `IRIS_FW_DEBUG`)."),
    Variable("IRIS_FW_OP_CACHE_SIZE", "count", 32,
             "Ops an `iris_fw.ops` op cache keeps per context (least recently used dropped)."),
    Variable("IRIS_FW_SLOW_LAUNCH", "bool", False,
             "Launch every engine kernel through `kernel[grid]` instead of the cached fast path."),
    Variable("IRIS_FW_TRACE", "path", None,
             "Trace every context's whole life (`init` to `close`) into this path, as `with ctx.trace(path):` "
             "does: per-rank Chrome-trace / Perfetto JSON files and a merged one (docs/tracing.md)."),
    Variable("IRIS_FW_MPIRUN", "path", None,
             "The `mpirun` the tests use (unset: the one beside the Python interpreter, else on PATH)."),
    Variable("IRIS_FW_TEST_TIMEOUT", "seconds", 300.0,
             "Seconds one function may run on a test rank pool (`iris_fw.testing`) before the pool is killed."),
    Variable("IRIS_FW_BENCH_TUNE", "bool", False,
             "`iris-fw bench flash_decode` also sweeps the local kernel's launch configurations (the rows of "
             "`iris_fw/tuning/flash_decode.json`)."),
    Variable("IRIS_FW_BENCH_LAYERS", "count", 4,
             "`iris-fw bench model`: decoder layers of the Llama-3-8B-shaped stack (GPUs)."),
    Variable("IRIS_FW_NVSHMEM_HOME", "path", None,
             "The NVSHMEM installation (the folder holding `lib/`: host library and device bitcode) the "
             "`nvshmem` transport loads (unset: the `nvidia/nvshmem` folder of an installed "
             "`nvidia-nvshmem-cu13`/`-cu12` wheel). See docs/nvshmem.md."),
    Variable("IRIS_FW_GLUON_MMA", "gluon_mma", "auto",
             "`warp_specialized` scheduler: the Gluon GEMM tile's tensor-core path — `auto` the measured one "
             "(`mma_v2`), or `wgmma` (Hopper only) / `mma_v2` to compare them "
             "(scripts/probe_warp_specialized.py); read once per op (its first launch)."),
    Variable("IRIS_FW_NVSHMEM_CALLS", "nvshmem_calls", "auto",
             "`nvshmem` transport: `auto` reaches peers NVSHMEM does not map (other nodes) through NVSHMEM "
             "device calls and every other peer by load/store; `all` reaches every peer through calls (the "
             "call path on one node)."),
    Variable("IRIS_FW_NVSHMEM_BOOTSTRAP", "nvshmem_bootstrap", "uid",
             "`nvshmem` transport: `uid` initialises NVSHMEM with a unique id broadcast through iris-fw's "
             "bootstrap; `mpi` uses NVSHMEM's MPI bootstrap on the `mpi` bootstrap's communicator (Open MPI "
             "only)."),
    Variable("IRIS_FW_BENCH_COMMAND", "text", None,
             "The command line `iris-fw bench` records in its results; set by `iris-fw bench` for its ranks.",
             internal=True),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def variable(name: str) -> Variable:
    """The declaration of ``name``; a KeyError for a name not declared here."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not an iris-fw environment variable (declared: {', '.join(_BY_NAME)})") from None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``name`` in ``environ`` (default ``os.environ``), or its default when
    unset or empty. Raises :class:`~iris_fw.errors.EnvironmentVariableError` for a bad value."""
    var = variable(name)
    text = (os.environ if environ is None else environ).get(name, "")
    if text == "":
        return var.default
    return var.parse(text)


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` is set to a non-empty value."""
    variable(name)
    return (os.environ if environ is None else environ).get(name, "") != ""


def in_effect(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The declared variables set in ``environ``, name → parsed value (raises for a bad one)."""
    environ = os.environ if environ is None else environ
    return {v.name: get(v.name, environ) for v in VARIABLES if environ.get(v.name, "") != ""}


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """``IRIS_FW_*`` names set in ``environ`` that iris-fw does not know (likely typos)."""
    environ = os.environ if environ is None else environ
    return sorted(k for k in environ if k.startswith("IRIS_FW_") and k not in _BY_NAME)


def markdown_table() -> str:
    """The table of every variable, as docs/environment.md holds it."""
    rows = ["| variable | accepts | default | meaning |", "|---|---|---|---|"]
    for v in VARIABLES:
        doc = v.doc + (" *(internal)*" if v.internal else "")
        rows.append(f"| `{v.name}` | {v.accepts} | `{v.default_text}` | {doc} |")
    return "\n".join(rows) + "\n"

