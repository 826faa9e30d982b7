"""The lean launch path: a ``@triton.jit`` kernel bound once to its grid, constexprs and launch
options, launched afterwards with fresh runtime arguments for a fraction of the host time.

``kernel[grid](...)`` pays, on every call, for Triton's binder, argument specialization, cache
key and launch metadata (on an H200 with Triton 3.6: 18 us for 5 arguments, 31 us for 20).
:class:`KernelLauncher` pays for that once per *specialization*: the first call with a new
specialization goes through ``kernel[grid](...)`` (the slow path), which compiles if needed,
launches, and returns the ``CompiledKernel``; that kernel is cached under a cheap key of the
runtime arguments (:func:`spec_key`, generated per launcher by :func:`make_key_fn`). Later
calls with the same key launch it the way ``JITFunction.run`` ends, in 3.6 and >= 3.9::

    kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
               launch_metadata, launch_enter_hook, launch_exit_hook, *bound_args.values())

(9.6 us and 16 us there). ``bound_args.values()`` are all of the kernel's parameters in
declaration order, *nested* (tuples stay tuples), *constexprs included*, defaults applied: the
driver's launcher, not ``JITFunction.run``, flattens tuples, drops constexprs and expands
``TensorDescriptor`` s (3.6: a generated C launcher, descriptors at top level only; 3.9:
``driver.c`` with argument annotations, descriptors at any depth). So the fast path passes that
same list (:meth:`KernelLauncher.bound_args`). Where the NVIDIA ``CudaLauncher.__call__`` of
3.6.x / 3.9.x only passes through (no scratch memory, no GSan), the fast path calls its
``launch`` with the same arguments directly (:func:`launch_entry`). Empty launch-hook chains
are passed as None, with None launch metadata, which is what they amount to. The stream is
Triton's own (``driver.active.get_current_stream(device)``: torch's current stream of the
current device), so launches inside ``torch.cuda.graph`` are captured.

The key refines Triton's specialization (``specialize_impl`` in ``specialize.cc``, the same in
3.6 and 3.9): tensors -> dtype and, unless the parameter is ``do_not_specialize`` /
``do_not_specialize_on_alignment``, 16-byte alignment of ``data_ptr()``; ints -> i32/i64/u64
range and (unless ``do_not_specialize``) ``== 1`` and divisibility by 16; bools, floats,
``None`` -> their type; tuples and NamedTuples -> their type and, recursively, their elements
(always specialized, as Triton does inside tuples); a ``tl.constexpr`` inside a tuple (the
switches of :class:`iris_fw.device.DeviceHeaps`) -> its value and the value's type (a bool, int,
float, str or None; any other value is not modelled); a ``DeviceHeaps`` as a context builds it
(a tensor, a bool and an int constexpr) -> one flat item (the bases' dtype and alignment, the
two values: every launch of a library kernel carries one); ``TensorDescriptor`` -> base dtype and
block shape (what Triton keys on), plus rank, padding, tf32 rounding and base alignment. The
key also holds the device and the values feeding Triton's compile options (the kernel's
``debug``, ``knobs.runtime.debug``, ``knobs.compilation.instrumentation_mode``, and from 3.9
``fpsan_homomorphic_casts``). Equal keys imply equal Triton cache keys, so the cached kernel
is the one Triton would launch.

**The seam.** What this module takes from Triton beyond its public ``kernel[grid](...)`` is
confined to :func:`fast_path_supported` (the releases read: :data:`KNOWN_TRITON_RELEASES`),
:func:`launch_entry` (the compiled kernel's launch entry), ``KernelLauncher._init_fast`` (the
knobs and driver calls the key reads), :func:`_expanded_tensordesc_launch` (3.6's descriptor
wrapper) and :func:`compiled_resources` (``CompiledKernel._init_handles`` and ``n_regs``). Any
Triton release not listed there — and the CPU interpreter, always — launches through
``kernel[grid](...)``, the fallback the tests force (tests/test_launcher.py).

The slow path is taken whenever equivalence is not proven: the interpreter, launch hooks set
(``knobs.runtime.launch_enter_hook``/``launch_exit_hook`` with any hook), a stages-inspection
hook, ``pre_run_hooks`` on the kernel, a changed global the kernel uses (Triton raises), an
argument type the key does not know (JIT functions, ``constexpr`` objects, Gluon descriptors,
numpy scalars, constexprs of other values, ...), a non-CUDA target (AMD specializes on more than the key covers), a Triton
release whose launch path was not read here (any but 3.6.x and 3.9.x), or ``IRIS_FW_SLOW_LAUNCH=1``.

**Clustered launches** (``cluster=n``: sm_90 and later, NVIDIA): the kernel, compiled as always
for one CTA a program, is launched as ``grid[0] / n`` thread-block clusters of ``n`` programs
(consecutive program ids), each program with ``cluster_shared`` bytes of dynamic shared memory
beyond what Triton compiled for (its own region at the end, which Triton never touches: a
cluster's programs exchange data there, e.g. :mod:`iris_fw.flash_decode_kernels`' split combine).
The generated launchers of 3.6 and 3.9 launch a kernel as clusters of its ``packed_metadata``'s
``num_ctas`` (gridDimX = grid × num_ctas) with its ``shared`` bytes: a clustered launch passes that
triple with ``n`` and the larger size (:func:`launch_entry`). ``kernel[grid](...)`` cannot, so a
clustered launcher never takes the slow path: a specialization's first call compiles (Triton's
``warmup``, not launched) and launches through the entry; launch hooks are not called for it.
:func:`cluster_launch_supported` says where it is possible.

Compiled kernels only: a NamedTuple *class* given as a constexpr is passed as
``tl.constexpr(cls)``, because ``JITFunction.run``'s cache key (3.6 and 3.9) iterates
anything ``is_namedtuple`` accepts, classes included, and raises on it.
"""

from __future__ import annotations

import inspect
import operator

import torch
from triton.language import constexpr as _Constexpr

from . import driver, env
from .device import DeviceHeaps as _DH
from .errors import ArgumentTypeError, IrisError
from .interpreter import interpreting

__all__ = ["BoundLaunch", "KernelLauncher", "PreparedLaunch", "bound_args_template", "cluster_launch_supported",
           "compiled_resources", "fast_path_supported", "launch_entry", "make_key_fn", "pdl_launch_supported",
           "resolved", "spec_key", "triton_launch_hooked"]

try:  # Triton's runtime switches (3.6 and >= 3.9 have them)
    from triton import knobs as _knobs
    from triton.knobs import HookChain as _HookChain
except ImportError:  # pragma: no cover
    _knobs = _HookChain = None

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
_Tensor = torch.Tensor


def _triton_version(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (2 - len(parts)))


#: The Triton releases (major, minor) whose launch code (``JITFunction.run``, the NVIDIA
#: ``CudaLauncher``, ``specialize_impl``) was read for the fast path. Any other release —
#: older, newer, or in between — launches through Triton's public ``kernel[grid](...)``.
KNOWN_TRITON_RELEASES = ((3, 6), (3, 9))


def fast_path_supported(version: str) -> bool:
    """Whether the fast path is checked against this Triton release's launch code
    (:data:`KNOWN_TRITON_RELEASES`); every other release takes the public ``kernel[grid]`` path."""
    return _triton_version(version) in KNOWN_TRITON_RELEASES


# ---------------------------------------------------------------------------------------------
# The specialization key
# ---------------------------------------------------------------------------------------------


class _Unsupported(Exception):
    """An argument the key does not model: the call takes the slow path."""


#: Value types of a ``tl.constexpr`` inside a tuple that the key models (hashable, and keyed with
#: their type: ``True`` and ``1`` are different constexprs to Triton).
_PLAIN = frozenset((bool, int, float, str, type(None)))


def _int_item(a: int, spec: bool, align: bool) -> str:
    # Triton: value 1 -> constexpr (when specialized); else i32 / i64 / u64 by range, "D" when
    # (specialized and aligned and) divisible by 16. Beyond u64 Triton raises OverflowError.
    if spec and a == 1:
        return "one"
    if _I32_MIN <= a <= _I32_MAX:
        r = "i32"
    elif _I64_MIN <= a <= _I64_MAX:
        r = "i64"
    elif 0 <= a <= _U64_MAX:
        r = "u64"
    else:
        raise _Unsupported
    return r + "D" if spec and align and not a & 15 else r


def _desc_item(a) -> tuple:
    base = a.base
    return (type(a), base.dtype, tuple(a.block_shape), len(a.shape), a.padding,
            getattr(a, "round_f32_to_tf32", False), not base.data_ptr() & 15)


def _tensor_descriptor_cls():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # pragma: no cover - every supported Triton has it
        return ()
    return TensorDescriptor


def _item(a, spec: bool, align: bool, desc_cls):
    """The key of one argument (used inside tuples and for the less common types)."""
    t = type(a)
    if t is _Tensor or isinstance(a, _Tensor):
        return (t, a.dtype, not a.data_ptr() & 15) if spec and align else (t, a.dtype)
    if t is int:
        return _int_item(a, spec, align)
    if t is float:
        return "fp32"
    if t is bool:
        return "u1"
    if a is None:
        return "none"
    if t is _DH:
        return _heaps_item(a, desc_cls)
    if isinstance(a, tuple):
        # Triton specializes tuple elements with specialize=True, align=True whatever the
        # parameter says; the (named)tuple type is part of the specialization.
        return (t,) + tuple(_item(x, True, True, desc_cls) for x in a)
    if desc_cls and isinstance(a, desc_cls):
        return _desc_item(a)
    if t is _Constexpr and type(a.value) in _PLAIN:
        return (_Constexpr, type(a.value), a.value)
    # Triton checks constexpr, TensorDescriptor, Gluon descriptors and JIT functions before
    # falling back to "has data_ptr": those (and anything else) are not modelled here.
    if type(a).__module__.startswith("triton") or not hasattr(a, "data_ptr"):
        raise _Unsupported
    return (t, a.dtype, not a.data_ptr() & 15) if spec and align else (t, a.dtype)


def _heaps_item(a, desc_cls):
    """The key of a :class:`iris_fw.device.DeviceHeaps` (a tuple: its elements specialized):
    flat for the usual one, else as any other tuple's."""
    bases, checks, calls = a
    if type(bases) is _Tensor and type(checks) is _Constexpr and type(calls) is _Constexpr and \
            type(checks.value) is bool and type(calls.value) is int:
        return (_DH, bases.dtype, not bases.data_ptr() & 15, checks.value, calls.value)
    return (_DH,) + tuple(_item(x, True, True, desc_cls) for x in a)


def spec_key(args, flags, desc_cls=None):
    """The specialization key of runtime arguments ``args`` as a tuple, or None when some
    argument is of a type the key does not model. ``flags[i]`` is ``(specialize, align)`` of
    the i-th runtime parameter: ``(not do_not_specialize, not do_not_specialize_on_alignment)``.
    Equal keys imply equal Triton specializations (the converse need not hold)."""
    if desc_cls is None:
        desc_cls = _tensor_descriptor_cls()
    out = []
    app = out.append
    try:
        for a, (spec, align) in zip(args, flags):
            t = type(a)
            if t is _Tensor:
                app(a.dtype)
                app(not a.data_ptr() & 15 if spec and align else None)
            elif t is int:
                app(_int_item(a, spec, align))
            elif t is float:
                app("fp32")
            elif t is bool:
                app("u1")
            elif a is None:
                app("none")
            else:
                app(_item(a, spec, align, desc_cls))
    except _Unsupported:
        return None
    return tuple(out)


def make_key_fn(flags, sample_args, desc_cls=None):
    """A key function ``key(args, device, opts)`` for one launcher, returning
    ``(device, opts) + spec_key(args, flags)`` (or None where that is None).

    Generated (like Triton's binder) for the argument types of ``sample_args``: while every
    argument (and tuple element) has the type it had in the sample, the key is one inlined
    tuple expression; any other call uses :func:`spec_key`, so both give the same key for the
    same arguments."""
    if desc_cls is None:
        desc_cls = _tensor_descriptor_cls()
    flags = tuple((bool(s), bool(a)) for s, a in flags)
    ns = {"_T": _Tensor, "_int_item": _int_item, "_item": _item, "_desc_item": _desc_item,
          "_spec_key": spec_key, "_Unsupported": _Unsupported, "_flags": flags, "_desc": desc_cls,
          "_CX": _Constexpr, "_DH": _DH, "_heaps_item": _heaps_item}
    guards, items = [], []

    def gen(e, a, spec, align, top):
        # Appends guards on e's type and the key item(s) of e, equal to what spec_key (top
        # level) or _item (inside tuples) returns for an e of a's type.
        t = type(a)
        if t is _Tensor:
            guards.append(f"type({e}) is _T")
            if top:
                items.extend([f"{e}.dtype", f"(not {e}.data_ptr() & 15)" if spec and align else "None"])
            else:
                items.append(f"(_T, {e}.dtype, not {e}.data_ptr() & 15)")
        elif t is int:
            guards.append(f"type({e}) is int")
            rng = f'("i32D" if not {e} & 15 else "i32")' if spec and align else '"i32"'
            one = f'"one" if {e} == 1 else ' if spec else ""
            items.append(f"({one}{rng} if {_I32_MIN} <= {e} <= {_I32_MAX} else _int_item({e}, {spec}, {align}))")
        elif t is float:
            guards.append(f"type({e}) is float")
            items.append('"fp32"')
        elif t is bool:
            guards.append(f"type({e}) is bool")
            items.append('"u1"')
        elif a is None:
            guards.append(f"{e} is None")
            items.append('"none"')
        elif t is _DH and len(a) == 3:
            guards.append(f"type({e}) is _DH")
            items.append(f"_heaps_item({e}, _desc)")
        elif isinstance(a, tuple):
            name = f"_TT{len(ns)}"
            ns[name] = t
            guards.append(f"type({e}) is {name} and len({e}) == {len(a)}")
            outer = items[:]
            items.clear()
            for j, x in enumerate(a):
                gen(f"{e}[{j}]", x, True, True, False)
            inner = ", ".join(items)
            items[:] = outer + [f"({name}, {inner})" if inner else f"({name},)"]
        elif desc_cls and t is desc_cls:
            guards.append(f"type({e}) is _desc")
            items.append(f"_desc_item({e})")
        elif t is _Constexpr and type(a.value) in _PLAIN:
            name = f"_CV{len(ns)}"
            ns[name] = type(a.value)
            guards.append(f"type({e}) is _CX and type({e}.value) is {name}")
            items.append(f"(_CX, {name}, {e}.value)")
        else:
            items.append(f"_item({e}, {spec}, {align}, _desc)")

    for i, ((spec, align), a) in enumerate(zip(flags, sample_args)):
        gen(f"a{i}", a, spec, align, True)
    n = len(flags)
    unpack = f"    {', '.join(f'a{i}' for i in range(n))}, = args\n" if n else ""
    src = (f"def key(args, device, opts):\n{unpack}"
           f"    if {' and '.join(guards) or 'True'}:\n"
           f"        try:\n"
           f"            return (device, opts, {', '.join(items)})\n"
           f"        except _Unsupported:\n"
           f"            return None\n"
           f"    k = _spec_key(args, _flags, _desc)\n"
           f"    return None if k is None else (device, opts) + k\n")
    exec(compile(src, f"<KernelLauncher key, {n} args>", "exec"), ns)
    fn = ns["key"]
    fn.source = src
    return fn


# ---------------------------------------------------------------------------------------------
# What the fast path calls
# ---------------------------------------------------------------------------------------------


def launch_entry(kernel, version, cluster: tuple[int, int] | None = None):
    """``(launch, head, as_tuple)`` for one compiled kernel: the fast path calls
    ``launch(grid_0, grid_1, grid_2, stream, *head, *kernel_args)`` (or ``..., kernel_args)``
    when ``as_tuple``), ``kernel_args`` being what JITFunction.run passes after the hooks.

    The default is ``kernel.run`` with ``head = (function, packed_metadata, launch_metadata=None,
    enter_hook=None, exit_hook=None)``: JITFunction.run's own call (3.6 and 3.9), None for the
    hooks and metadata being what an empty HookChain amounts to. Where the NVIDIA launcher's
    ``__call__`` was read (3.6.x, 3.9.x) and only passes through, because the kernel needs no
    global or profile scratch (and, 3.9, GSan is off), its ``launch`` is called directly:

    * 3.6: ``launch(gx, gy, gz, stream, function, cooperative, pdl, global_scratch=None,
      profile_scratch=None, packed_metadata, launch_metadata, enter, exit, *kernel_args)``; the
      generated C launcher parses the args nested (tuples as ``(...)`` groups, constexprs as
      ignored objects); ``launch`` wraps it to expand top-level TensorDescriptors.
    * 3.9: ``launch(gx, gy, gz, stream, function, cooperative, pdl, packed_metadata,
      launch_metadata, enter, exit, global_scratch=None, profile_scratch=None, arg_annotations,
      kernel_signature, kernel_args)``; ``driver.c`` flattens tuples and drops constexprs along
      the annotations; ``launch`` wraps it to expand TensorDescriptors at any depth.

    ``cluster=(n, extra)``: the entry of a clustered launch — ``packed_metadata``'s ``(num_warps,
    num_ctas, shared)`` as ``(num_warps, n, shared + extra)``, the function allowed that much
    dynamic shared memory — which must be a direct ``launch`` (raises otherwise: the default's
    scratch would be sized for one CTA a program of the cluster grid).
    """
    run = kernel.run
    packed = kernel.packed_metadata
    if cluster:
        size, extra = cluster
        if len(packed) != 3:
            raise IrisError(f"a clustered launch reads Triton's packed metadata as (num_warps, num_ctas, shared), "
                            f"got {packed!r}")
        calls = driver.cluster_calls()
        if calls is None:
            raise IrisError("a clustered launch needs the CUDA driver's cuFuncSetAttribute")
        packed = (packed[0], size, packed[2] + extra)
        calls.allow_cluster(kernel.function, size)
        calls.allow_shared(kernel.function, packed[2])
    default = (run, (kernel.function, packed, None, None, None), False)
    cls = type(run)
    need = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl")
    direct = (cls.__name__ == "CudaLauncher" and cls.__module__ == "triton.backends.nvidia.driver"
              and all(hasattr(run, a) for a in need) and not run.global_scratch_size and not run.profile_scratch_size)
    entry = default
    if direct:
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        if version[:2] == (3, 6):
            entry = (run.launch, (kernel.function, coop, pdl, None, None, packed, None, None, None), False)
        elif version[:2] == (3, 9) and not getattr(run, "gsan_enabled", True) and \
                hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
            entry = (run.launch, (kernel.function, coop, pdl, packed, None, None, None, None, None,
                                  run.arg_annotations, run.kernel_signature), True)
    if cluster and entry is default:
        raise IrisError(f"a clustered launch needs Triton's direct launch (3.6.x or 3.9.x on NVIDIA, no global or "
                        f"profile scratch, GSan off); {getattr(kernel, 'name', 'the kernel')} "
                        f"has none here")
    return entry


def pdl_launch_supported(device: torch.device) -> bool:
    """Whether a :class:`KernelLauncher` with ``launch_pdl=True`` can launch on ``device``: a
    compiled kernel on an NVIDIA GPU of compute capability 9.0 or later (a *programmatic
    dependent launch*: the launch may begin while the kernel before it in the stream runs, up
    to the kernel's ``gdc_wait``, once every program of that kernel has called
    ``gdc_launch_dependents`` or exited)."""
    return _compiled_on_hopper_or_later(device)


def _compiled_on_hopper_or_later(device: torch.device) -> bool:
    """A compiled kernel (not the interpreter) on an NVIDIA GPU of compute capability 9.0+."""
    if interpreting() or device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def cluster_launch_supported(device: torch.device) -> bool:
    """Whether a :class:`KernelLauncher` with ``cluster=`` can launch on ``device``: a compiled
    kernel (not the interpreter) on an NVIDIA GPU of compute capability 9.0 or later, a Triton
    release whose launch path was read (:func:`fast_path_supported`), ``IRIS_FW_SLOW_LAUNCH``
    unset, and the driver's cluster calls found."""
    import triton

    if not _compiled_on_hopper_or_later(device) or env.get("IRIS_FW_SLOW_LAUNCH"):
        return False
    if not fast_path_supported(triton.__version__):
        return False
    return driver.cluster_calls() is not None


# ---------------------------------------------------------------------------------------------
# Binding arguments
# ---------------------------------------------------------------------------------------------


def _is_namedtuple_class(v) -> bool:
    return isinstance(v, type) and issubclass(v, tuple) and hasattr(v, "_fields")


def _kernel_params(kernel):
    """KernelParam-like objects (name, is_constexpr, do_not_specialize, ...) of a kernel."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return list(params)
    from triton.runtime.jit import KernelParam

    sig = inspect.signature(kernel.fn)
    return [KernelParam(i, p, False, False) for i, p in enumerate(sig.parameters.values())]


def bound_args_template(params, constexprs: dict):
    """What ``JITFunction.run`` passes to the launcher, with holes for the runtime arguments.

    Returns ``(template, runtime_positions)``: ``template`` has one entry per kernel parameter
    in declaration order, the constexpr value (as given, or the parameter's default) where the
    parameter is bound, None where a runtime argument goes; ``runtime_positions`` are the
    indices of the holes. Raises TypeError for unknown or missing constexprs."""
    names = [p.name for p in params]
    unknown = [k for k in constexprs if k not in names]
    if unknown:
        raise ArgumentTypeError(f"not parameters of the kernel: {unknown} (parameters: {names})")
    template, runtime, missing = [], [], []
    for i, p in enumerate(params):
        if p.name in constexprs:
            if not p.is_constexpr:
                raise ArgumentTypeError(f"parameter {p.name!r} is not a tl.constexpr; pass it at each call")
            template.append(constexprs[p.name])
        elif p.is_constexpr:
            default = p.default
            if default is inspect.Parameter.empty:
                missing.append(p.name)
            template.append(default)
        else:
            template.append(None)
            runtime.append(i)
    if missing:
        raise ArgumentTypeError(f"constexpr parameters without a value: {missing}")
    return template, runtime


def triton_launch_hooked() -> bool:
    """Whether Triton's runtime would see or change a launch made now: a hook in its launch
    enter or exit chain, a stages-inspection hook, its runtime debug mode or an instrumentation
    mode (these compile other kernels). A prepared launch checks the same before each launch and
    takes Triton's path then; a CUDA graph's replay of launches would bypass them
    (:class:`iris_fw.callpath.Replay` runs the call eagerly instead). True where this Triton has
    no such switches to read."""
    if _knobs is None:  # pragma: no cover
        return True
    rt = _knobs.runtime
    hook = rt.launch_enter_hook  # (straight-line: it runs before every replayed call)
    if hook is not None and (type(hook) is not _HookChain or hook.calls):
        return True
    hook = rt.launch_exit_hook
    if hook is not None and (type(hook) is not _HookChain or hook.calls):
        return True
    return rt.add_stages_inspection_hook is not None or bool(rt.debug) or bool(
        getattr(_knobs.compilation, "instrumentation_mode", ""))


class KernelLauncher:
    """A @triton.jit kernel bound to its grid, constexprs and launch options; calling it launches.

    ``launcher(*args)`` takes the runtime (non-constexpr) arguments, positional, in the
    kernel's parameter order, and launches on the current stream of the current device.
    Attributes for inspection: ``runtime_params`` (names), ``slow_calls`` (calls that went
    through ``kernel[grid](...)``), :meth:`variants` (the cached compiled kernels)."""

    def __init__(self, kernel, grid: tuple[int, ...], *, constexprs: dict, num_warps: int | None = None,
                 num_stages: int | None = None, maxnreg: int | None = None, cluster: int = 0,
                 cluster_shared: int = 0, launch_pdl: bool = False):
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        self.interpreted = isinstance(kernel, InterpretedFunction) or interpreting()
        if not isinstance(kernel, (JITFunction, InterpretedFunction)):
            raise ArgumentTypeError(f"KernelLauncher needs a @triton.jit kernel, got {type(kernel).__name__}")
        try:
            grid = tuple(operator.index(g) for g in grid)
        except TypeError:
            raise ArgumentTypeError(f"grid must be a tuple of 1 to 3 ints, got {grid!r}") from None
        if not 1 <= len(grid) <= 3:
            raise ArgumentTypeError(f"grid must be a tuple of 1 to 3 ints, got {grid!r}")
        self.kernel = kernel
        self.name = kernel.fn.__name__
        self.grid = grid
        self.constexprs = dict(constexprs)
        self.options = {}
        if num_warps is not None:
            self.options["num_warps"] = num_warps
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        if maxnreg is not None:  # NVIDIA's register cap a thread (ptxas spills beyond it)
            self.options["maxnreg"] = maxnreg
        if launch_pdl:  # NVIDIA sm_90+: a programmatic dependent launch (see pdl_launch_supported)
            if self.interpreted:
                raise IrisError(f"{self.name}: no programmatic dependent launch under Triton's interpreter")
            self.options["launch_pdl"] = True

        params = _kernel_params(kernel)
        bound = self.constexprs
        if not self.interpreted:
            # JITFunction.run's cache key (compute_cache_key, 3.6 and 3.9) iterates anything
            # is_namedtuple() accepts, NamedTuple *classes* included, and fails on them; wrapped
            # in tl.constexpr the class keys by its repr and is called the same in the kernel.
            import triton.language as tl

            bound = {k: tl.constexpr(v) if _is_namedtuple_class(v) else v for k, v in bound.items()}
        template, runtime = bound_args_template(params, bound)
        self.runtime_params = tuple(params[i].name for i in runtime)
        self._n = len(runtime)
        self._template = template
        self._runtime_pos = tuple(runtime)
        # The usual layout (runtime parameters first, constexprs last) launches with
        # (*args, *tail); any other needs a fill-in.
        self._prefix = tuple(runtime) == tuple(range(len(runtime)))
        self._tail = tuple(template[len(runtime):])
        self._flags = tuple((not params[i].do_not_specialize, not params[i].do_not_specialize_on_alignment)
                            if hasattr(params[i], "do_not_specialize") else (True, True) for i in runtime)
        g = grid + (1, 1)
        self._g0, self._g1, self._g2 = g[0], g[1], g[2]
        #: programs a thread-block cluster (0: no clusters) and the dynamic shared memory each
        #: program has beyond Triton's (see the module's docstring)
        self.cluster, self.cluster_shared = cluster, cluster_shared
        if cluster:
            if self.interpreted:
                raise IrisError(f"{self.name}: no clustered launch under Triton's interpreter")
            if len(grid) != 1 or not 1 <= cluster <= driver.MAX_CLUSTER or grid[0] % cluster or cluster_shared < 0:
                raise ArgumentTypeError(f"{self.name}: a clustered launch takes a 1-D grid of whole clusters of 1 to "
                                        f"{driver.MAX_CLUSTER} programs, got grid {grid} with clusters of {cluster} "
                                        f"and {cluster_shared} B of shared memory")
            self._g0 = grid[0] // cluster  # (the launcher launches gridX x num_ctas programs)

        self.slow_calls = 0
        self._cache = {}
        self._state = None  # what the fast path needs; set by the first compiled launch
        self._globals_seen = None  # (fn.used_global_vals, its length, ((globals, itemgetter, objects), ...))
        self._desc_cls = _tensor_descriptor_cls()
        import triton

        self._version = _triton_version(triton.__version__)
        self._fast = (not self.interpreted and isinstance(kernel, JITFunction)
                      and fast_path_supported(triton.__version__)
                      and not env.get("IRIS_FW_SLOW_LAUNCH"))
        if cluster and not self._fast:
            raise IrisError(f"{self.name}: a clustered launch needs the fast launch path (Triton 3.6.x or 3.9.x, "
                            f"IRIS_FW_SLOW_LAUNCH unset): see cluster_launch_supported()")

    def __repr__(self):
        return (f"KernelLauncher({self.name}, grid={self.grid}, constexprs={self.constexprs}, "
                f"options={self.options}, {'interpreted' if self.interpreted else 'compiled'})")

    # -- arguments ------------------------------------------------------------------------

    def _arity_error(self, got: int) -> TypeError:
        return TypeError(f"{self.name}() takes {self._n} runtime argument(s) "
                         f"({', '.join(self.runtime_params)}), got {got}")

    def bound_args(self, args) -> tuple:
        """All kernel parameters in order, runtime ``args`` in their places: the list that
        ``JITFunction.run`` hands to ``CompiledKernel.run`` as ``*bound_args.values()``."""
        if len(args) != self._n:
            raise self._arity_error(len(args))
        if self._prefix:
            return tuple(args) + self._tail
        full = list(self._template)
        for i, a in zip(self._runtime_pos, args):
            full[i] = a
        return tuple(full)

    # -- launching --------------------------------------------------------------------------

    def __call__(self, *args) -> None:
        self._launch(args, None)

    def launch_on(self, stream, *args) -> None:
        """Launch on ``stream`` (a ``torch.cuda.Stream``; None: the current stream) without
        making it the current stream (no ``torch.cuda.stream`` context per call)."""
        self._launch(args, stream)

    def _globals_unchanged(self, fn) -> bool:
        """Whether every global the kernel reads (``fn.used_global_vals``: name -> the value it
        compiled with, a deep copy, and the globals dict) still has that value. Comparing them
        costs µs per global (``constexpr.__ne__`` builds constexprs; the recorded copies are
        never the objects themselves), so after one full comparison the objects found are kept,
        per globals dict, with an ``operator.itemgetter`` of their names, and later calls only
        fetch them (one C call per dict) and compare the tuple with the kept one — a tuple
        comparison tests its items by identity first, in C; a rebound global is compared in full
        again. (Triton kernels read ``tl.constexpr`` globals, which nothing mutates in place.)"""
        used = fn.used_global_vals
        seen = self._globals_seen
        if seen is not None and seen[0] is used and seen[1] == len(used):
            for globals_dict, fetch, objs in seen[2]:
                try:
                    now = fetch(globals_dict)
                except KeyError:  # a global deleted
                    break
                if now is not objs and now != objs:
                    break
            else:
                return True
        found = {}
        for (name, _), (val, globals_dict) in used.items():
            now = globals_dict.get(name, _NOT_PRESENT)
            if now is not val and now != val:
                self._globals_seen = None
                return False
            found.setdefault(id(globals_dict), (globals_dict, []))[1].append((name, now))
        groups = []
        for globals_dict, pairs in found.values():
            names = [n for n, _ in pairs]
            objs = tuple(o for _, o in pairs)
            groups.append((globals_dict, operator.itemgetter(*names), objs if len(names) > 1 else objs[0]))
        self._globals_seen = (used, len(used), tuple(groups))
        return True

    def _launch(self, args, stream) -> None:
        if len(args) != self._n:
            raise self._arity_error(len(args))
        state = self._state
        if state is None:  # interpreted, or no compiled launch yet
            return self._slow(args, stream=stream)
        rt, comp, fn, chain, fpsan, get_device, get_stream, key_fn, cache, g0, g1, g2, tail = state
        # Launch hooks, a stages-inspection hook, pre-run hooks: Triton's own path.
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        if (enter is not None and (type(enter) is not chain or enter.calls)) or \
                (leave is not None and (type(leave) is not chain or leave.calls)) or \
                rt.add_stages_inspection_hook is not None or fn.pre_run_hooks:
            return self._slow(args, stream=stream)
        # Triton raises when a global the kernel reads has changed since it compiled: let it.
        if not self._globals_unchanged(fn):
            return self._slow(args, stream=stream)
        device = get_device()
        # = self._opts_key(), inlined
        key = key_fn(args, device, (fn.debug, rt.debug, comp.instrumentation_mode,
                                    comp.fpsan_homomorphic_casts if fpsan else None))
        entry = cache.get(key) if key is not None else None
        if entry is None:
            return self._slow(args, key, stream)
        launch, head, as_tuple = entry[0], entry[1], entry[2]
        if tail is None:
            args, tail = self.bound_args(args), ()
        handle = get_stream(device) if stream is None else stream.cuda_stream
        if as_tuple:
            launch(g0, g1, g2, handle, *head, args + tail)
        else:
            launch(g0, g1, g2, handle, *head, *args, *tail)

    def prepare(self, *args) -> "PreparedLaunch":
        """A launch of these exact ``args`` (the same objects at every call: a plan's memoized
        arguments), which after its first call skips the specialization key and, on Triton
        3.6, re-encoding the TMA descriptors (:class:`PreparedLaunch`)."""
        if len(args) != self._n:
            raise self._arity_error(len(args))
        return PreparedLaunch(self, args)

    def compile(self, *args):
        """The compiled kernel these runtime ``args`` would launch (compiled now if need be; not
        launched): Triton's ``warmup`` of the kernel with the launcher's grid, constexprs and
        options. A pointer argument may be given as its torch dtype (Triton's ``MockTensor``:
        16-byte aligned). Inside Triton's ``AsyncCompileMode`` the compile is submitted to its
        executor and a future comes back (``.result()``: the kernel); a later launch of the
        same specialization finds the kernel compiled. Compiled kernels only (raises under the
        interpreter). Its resources: :func:`compiled_resources`."""
        if self.interpreted:
            raise ArgumentTypeError(f"{self.name}: nothing to compile under Triton's interpreter")
        return self.kernel.warmup(*self.bound_args(args), grid=self.grid, **self.options)

    def bind(self, **fixed) -> "BoundLaunch":
        """Named arguments: this launcher with the runtime arguments ``fixed`` given once, by name
        (a plan's buffers, sizes, rank); the :class:`BoundLaunch` takes the others by name at
        each call. Raises naming any name that is not a runtime parameter of the kernel."""
        return BoundLaunch(self, fixed)

    def _opts_key(self):
        """The compile options JITFunction.run takes from the kernel and from knobs (3.6: debug,
        instrumentation_mode; >= 3.9 also fpsan_homomorphic_casts)."""
        rt, comp, fn, _, fpsan = self._state[:5]
        return (fn.debug, rt.debug, comp.instrumentation_mode,
                comp.fpsan_homomorphic_casts if fpsan else None)

    def _slow(self, args, key=None, stream=None):
        """``kernel[grid](...)`` (on ``stream`` if given); caches the compiled kernel it returns
        under the key."""
        self.slow_calls += 1
        if self.cluster:
            return self._first_cluster_launch(args, key, stream)
        if stream is None:
            kernel = self.kernel[self.grid](*self.bound_args(args), **self.options)
        else:
            with torch.cuda.stream(stream):
                kernel = self.kernel[self.grid](*self.bound_args(args), **self.options)
        if not self._fast or kernel is None:
            return None
        if self._state is None and not self._init_fast(args):
            self._fast = False
            return None
        if key is None:
            key = self._state[7](args, self._state[5](), self._opts_key())
            if key is None:
                return None
        kernel = resolved(kernel)
        target = getattr(getattr(kernel, "metadata", None), "target", None)
        if getattr(target, "backend", None) != "cuda":
            self._fast = False  # e.g. AMD: specializes on pointer ranges the key does not see
            self._state = None
            return None
        self._cache[key] = launch_entry(kernel, self._version) + (kernel,)
        return None

    def _first_cluster_launch(self, args, key, stream) -> None:
        """A clustered launcher's call that found no entry (a new specialization, or hooks set):
        compiled (not launched) as ``kernel[grid]`` would, its clustered entry cached under the
        key, and launched through it (``kernel[grid](...)`` cannot launch clusters)."""
        kernel = resolved(self.compile(*args))
        entry = launch_entry(kernel, self._version, (self.cluster, self.cluster_shared)) + (kernel,)
        if self._state is None:
            self._init_fast(args)
        if key is None:
            key = self._state[7](args, self._state[5](), self._opts_key())
        if key is not None:
            self._cache[key] = entry
        launch, head, as_tuple = entry[0], entry[1], entry[2]
        full = self.bound_args(args)
        handle = self._state[6](self._state[5]()) if stream is None else stream.cuda_stream
        if as_tuple:
            launch(self._g0, self._g1, self._g2, handle, *head, full)
        else:
            launch(self._g0, self._g1, self._g2, handle, *head, *full)

    def _driver(self):
        import triton

        return triton.runtime.driver.active

    def _init_fast(self, sample_args):
        from triton import knobs

        try:
            from triton.knobs import HookChain
        except ImportError:  # pragma: no cover
            HookChain = type(None)
        drv = self._driver()
        rt, comp = knobs.runtime, knobs.compilation
        if not hasattr(rt, "add_stages_inspection_hook"):  # pragma: no cover - 3.6 and 3.9 have it
            return False
        fpsan = hasattr(type(comp), "fpsan_homomorphic_casts")
        key_fn = make_key_fn(self._flags, sample_args, self._desc_cls)
        get_device = drv.get_current_device
        if get_device is torch.cuda.current_device and torch.cuda.is_initialized():
            # what it returns once CUDA is initialized (it is: a kernel compiled for it), without
            # its lazy-initialization checks on every launch
            get_device = torch._C._cuda_getDevice
        self._state = (rt, comp, self.kernel, HookChain, fpsan, get_device, drv.get_current_stream,
                       key_fn, self._cache, self._g0, self._g1, self._g2, self._tail if self._prefix else None)
        return True

    def variants(self) -> dict:
        """The compiled kernels the fast path uses, by key."""
        return {k: v[3] for k, v in self._cache.items()}

    def fast_levels(self) -> dict:
        """How the fast path launches each variant: ``"launch"`` (the driver launcher's
        ``launch``, bypassing ``CudaLauncher.__call__``) or ``"run"`` (``CompiledKernel.run``)."""
        return {k: ("run" if v[0] is v[3].run else "launch") for k, v in self._cache.items()}


_NOT_PRESENT = object()


def resolved(kernel):
    """The compiled kernel of a :meth:`KernelLauncher.compile` (or ``kernel[grid]``) result: an
    async-compile future (Triton 3.9 returns one under ``AsyncCompileMode``; 3.6 resolves it)
    waited for, else the kernel itself."""
    return kernel.result() if hasattr(kernel, "result") else kernel


def compiled_resources(kernel) -> tuple[int, int, int]:
    """``(registers a thread, warps, shared memory bytes)`` of a compiled kernel
    (:meth:`KernelLauncher.compile`); loads its binary on the current device to learn the
    register count (what ``ptxas`` allotted). A future of one (async compile) is waited for."""
    kernel = resolved(kernel)
    kernel._init_handles()
    return int(kernel.n_regs), int(kernel.metadata.num_warps), int(kernel.metadata.shared)


class BoundLaunch:
    """:meth:`KernelLauncher.bind`: a kernel's launch with some runtime arguments fixed by name.
    ``bound(name=value, …)`` gives the others (:attr:`free`), by name, and launches on the
    current stream; ``bound.launch_on(stream, name=value, …)`` on ``stream``;
    ``bound.prepare(name=value, …)`` gives a :class:`PreparedLaunch` of every argument.

    The keyword call is a function generated once per binding (like Triton's binder): Python
    binds the names natively, then one tuple in the kernel's order is built — a missing or
    unexpected name raises ``TypeError`` naming the kernel and the argument."""

    __slots__ = ("launcher", "free", "args", "__call__", "_on")

    def __init__(self, launcher: KernelLauncher, fixed: dict):
        names = launcher.runtime_params
        unknown = [k for k in fixed if k not in names]
        if unknown:
            raise ArgumentTypeError(f"{launcher.name}: not runtime parameters of the kernel: {unknown} "
                                    f"(runtime parameters: {list(names)})")
        self.launcher = launcher
        self.free = tuple(n for n in names if n not in fixed)
        values = [fixed[n] for n in names if n in fixed]
        items, k = [], 0
        for n in names:
            if n in fixed:
                items.append(f"_fixed[{k}]")
                k += 1
            else:
                items.append(n)
        params = f"*, {', '.join(self.free)}" if self.free else ""
        row = f"({', '.join(items)},)" if items else "()"
        ns = {"_fixed": tuple(values), "_launch": launcher._launch}
        kernel = launcher.name
        src = (f"def {kernel}_args({params}):\n    return {row}\n"
               f"def {kernel}({params}):\n    _launch({row}, None)\n"
               f"def {kernel}_on(_stream, {params}):\n    _launch({row}, _stream)\n")
        exec(compile(src, f"<BoundLaunch {kernel}>", "exec"), ns)
        self.args = ns[f"{kernel}_args"]  # every runtime argument in the kernel's order
        # (``__call__`` is a slot: ``bound(...)`` finds this instance's generated function)
        self.__call__ = ns[kernel]
        self._on = ns[f"{kernel}_on"]

    def launch_on(self, stream, **named) -> None:
        self._on(stream, **named)

    def prepare(self, **named) -> "PreparedLaunch":
        return PreparedLaunch(self.launcher, self.args(**named))


def _expanded_tensordesc_launch(launch, version):
    """Triton 3.6's ``CudaLauncher.launch`` is ``wrap_handle_tensordesc``'s ``inner``, which
    encodes every TMA descriptor argument (``make_tensordesc_arg``) on each call before calling
    the generated C launcher. Returns ``(c_launch, expand)`` — ``expand(kernel_args)`` gives
    the arguments ``inner`` would pass on and where each argument went in them (None: a
    descriptor) — or None where the launch is not that wrapper."""
    if version[:2] != (3, 6) or getattr(launch, "__name__", "") != "inner" or launch.__closure__ is None:
        return None
    cells = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__)))
    if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        return None
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except ImportError:  # pragma: no cover
        return None
    indices, meta = cells["tensordesc_indices"], cells["tensordesc_meta"]

    def expand(kernel_args):
        out, positions, k = [], [], 0
        for i, arg in enumerate(kernel_args):
            if i in indices:
                positions.append(None)
                out.extend(make_tensordesc_arg(arg, meta[k]))
                k += 1
            else:
                positions.append(len(out))
                out.append(arg)
        return tuple(out), tuple(positions)

    return cells["launcher"], expand


def _replaced(args: tuple, changes) -> tuple:
    """``args`` with ``changes`` — ``((index, value), ...)``; an index ``(i, j)``: element ``j``
    of the tuple argument ``i`` — put in at their indices."""
    full = list(args)
    for i, value in changes:
        if type(i) is tuple:
            i, j = i
            _check_element(full[i], i, j)
            value = _with_element(full[i], j, value)
        full[i] = value
    return tuple(full)


def _check_element(t, i: int, j: int) -> None:
    """Raise unless ``t`` (runtime argument ``i``) is a tuple with an element ``j``."""
    if not isinstance(t, tuple) or not 0 <= j < len(t):
        raise IndexError(f"launch_with: argument {i} is not a tuple with an element {j}")


def _with_element(t: tuple, j: int, value) -> tuple:
    """Tuple ``t`` (of its own type: a named tuple stays one) with element ``j`` replaced."""
    items = list(t)
    items[j] = value
    return tuple(items) if type(t) is tuple else type(t)(*items)


def _pointers(args):
    """``args`` with every GPU tensor, at any tuple depth, replaced by its ``data_ptr()``: the
    driver's launcher (3.6's generated one, 3.9's ``driver.c``) takes an int as the pointer
    itself, where for a tensor it calls ``data_ptr()`` and asks the driver
    (``cuPointerGetAttribute``) whether the device can reach it — on every launch. A prepared
    launch holds its tensors, whose storage must stay where it is (the class's contract), so
    its launches pass the ints; a tensor elsewhere (a CPU tensor) stays one, for the driver's
    launcher to refuse. Tuples keep their type (a ``DeviceHeaps`` stays one); anything else is
    left as it is (a descriptor is encoded by the launch)."""
    out = []
    changed = False
    for a in args:
        if isinstance(a, _Tensor):
            if a.is_cuda:
                a, changed = a.data_ptr(), True
        elif isinstance(a, tuple) and a:
            b = _pointers(a)
            if b is not a:
                a, changed = (type(a)._make(b) if hasattr(a, "_fields") else b), True
        out.append(a)
    return tuple(out) if changed else args


class PreparedLaunch:
    """:meth:`KernelLauncher.prepare`: one kernel launch on fixed arguments.

    The first call goes through the launcher (compiling or finding the kernel); it then keeps
    what the launch resolved to — the compiled kernel's entry for these arguments' key, the
    device and compile options it was keyed under, and (Triton 3.6) the kernel arguments with
    their TMA descriptors already encoded — so a later call costs the launch alone. Each call
    still takes the launcher's full path when anything that could change the outcome has
    changed: launch hooks or pre-run hooks set, a global the kernel uses changed, the current
    device or the compile options (debug, instrumentation) changed. The arguments must not be
    mutated (a plan's memoized arguments are not), and their tensors' and descriptors' memory
    must stay where it was (a plan is keyed by its operands' ``data_ptr``): the resolved launch
    passes the GPU tensors' pointers (:func:`_pointers`), not the tensors.

    :meth:`with_args` makes a prepared launch of a few arguments replaced (sharing the resolved
    entry); :meth:`launch_with` launches with a few runtime arguments replaced for one call (a fresh
    output tensor, a length that grows): the resolved entry serves while each new value
    specializes as the prepared one did."""

    __slots__ = ("launcher", "args", "_ready", "_items")

    def __init__(self, launcher: KernelLauncher, args: tuple):
        self.launcher, self.args, self._ready = launcher, args, None
        self._items = None  # {change index (i or (i, j)): what _rebuilt keeps of it (_slot)}, made on use

    def __call__(self, stream=None) -> None:
        """Launch on ``stream`` (a ``torch.cuda.Stream``; None: the current stream)."""
        ready = self._ready
        if ready is None:
            self.launcher._launch(self.args, stream)
            self._resolve()
            return
        self._fire(ready, ready[2], self.args, stream)

    def launch_with(self, changes, stream=None) -> None:
        """Launch with ``changes`` — ``((runtime argument index, value), ...)`` — in place of
        the prepared arguments at those indices, for this call only (an index ``(i, j)``:
        element ``j`` of the tuple argument ``i``, e.g. a field of a pattern's ``rest``, which
        Triton specializes as a tuple element: aligned or not). The resolved entry is
        used when every new value has the specialization key item of the one it replaces (a
        tensor: its type, dtype and, where specialized, 16-byte alignment; an int: its range
        class, ``== 1`` and divisibility by 16 where specialized): the kernel Triton would
        launch for them is the same one. Otherwise, and before the first resolved launch, the
        launcher's full path on the replaced arguments."""
        ready = self._ready
        args = self.args
        if ready is None:
            self.launcher._launch(_replaced(args, changes), stream)
            self._resolve()
            return
        final = self._rebuilt(ready, changes)
        if final is None:
            return self.launcher._launch(_replaced(args, changes), stream)
        self._fire(ready, final, args, stream, changes if final is not ready[2] else None)

    def with_args(self, changes) -> "PreparedLaunch":
        """A prepared launch of these arguments with ``changes`` — ``((runtime argument index,
        value), ...)`` — in place, kept (where :meth:`launch_with` replaces them for one call):
        it shares this launch's resolved entry when every new value specializes as the one it
        replaces (as in :meth:`launch_with`), else it resolves on its first call through the
        launcher. Nothing is launched."""
        other = PreparedLaunch(self.launcher, _replaced(self.args, changes))
        ready = self._ready
        if ready is not None:
            final = self._rebuilt(ready, changes)
            if final is not None:
                other._ready = ready[:2] + (final,) + ready[3:]
                other._items = self._items  # (the new values specialize as the ones they replace)
        return other

    def _rebuilt(self, ready, changes):
        """The resolved kernel arguments with ``changes`` in place, or None where a new value
        does not specialize as the one it replaces (or replaces a re-encoded descriptor). A
        change to what the launch already holds — the prepared tensor itself, at the address
        the launch keeps (its storage may have been swapped since), or an equal int — replaces
        nothing: a loop on one output launches the resolved arguments as they are."""
        final = ready[2]
        items = self._items
        if items is None:
            items = self._items = {}
        flags, desc = self.launcher._flags, self.launcher._desc_cls
        args = self.args
        rebuilt = None
        for i, value in changes:
            seen = items.get(i)
            if seen is None:
                seen = items[i] = self._slot(i, flags, desc)
            item, pos, k, j, spec, align = seen
            if pos is not None:
                prepared = args[k] if j is None else args[k][j]
                # (a GPU tensor's pointer, a CPU tensor itself, an int)
                held = final[pos] if j is None else final[pos][j]
                if held is value or (type(held) is int and (
                        (type(value) is int and value == held)
                        or (value is prepared and value.is_cuda and value.data_ptr() == held))):
                    continue
            if pos is None:
                return None
            if type(value) is _Tensor and item[0] is _Tensor:  # (a new output: _item inlined)
                ptr = value.data_ptr()
                if value.dtype != item[1] or (len(item) == 3 and (not ptr & 15) != item[2]):
                    return None
                if value.is_cuda:
                    value = ptr
            else:
                try:
                    if _item(value, spec, align, desc) != item:
                        return None
                except _Unsupported:
                    return None
                # a device tensor as its pointer, as the prepared ones (:func:`_pointers`); a
                # tensor elsewhere stays one, for the driver's launcher to refuse
                if isinstance(value, _Tensor) and value.is_cuda:
                    value = value.data_ptr()
            if rebuilt is None:
                rebuilt = list(final)
            rebuilt[pos] = value if j is None else _with_element(rebuilt[pos], j, value)
        return final if rebuilt is None else tuple(rebuilt)

    def _slot(self, i, flags, desc) -> tuple:
        """What :meth:`_rebuilt` keeps of change index ``i`` (an int, or ``(i, j)``: element ``j``
        of a tuple argument, specialized as Triton specializes tuple elements):
        ``(specialization item of the prepared value, position in the resolved arguments, the
        argument's index, j, spec, align)``."""
        j = None
        if type(i) is tuple:
            i, j = i
        spec, align = flags[i]
        prepared = self.args[i]
        if j is not None:
            _check_element(prepared, i, j)
            prepared, spec, align = prepared[j], True, True
        return _item(prepared, spec, align, desc), self._final_index(i), i, j, spec, align

    def _final_index(self, i: int):
        """Where runtime argument ``i`` sits in the resolved kernel arguments: where the launch
        re-encodes TMA descriptors (Triton 3.6) the arguments after one have moved (``moved``:
        each kernel argument's position among the encoded ones; None for a descriptor, which
        a replacement cannot take without encoding it again)."""
        lau = self.launcher
        ready = self._ready
        if ready is None:
            return None
        pos = i if lau._prefix else lau._runtime_pos[i]
        moved = ready[6]
        return pos if moved is None else moved[pos]

    def _fire(self, ready, final, args, stream, changes=None) -> None:
        """The resolved launch of ``final`` (kernel arguments), unless something that could
        change the outcome changed: then the launcher's path on ``args`` (with ``changes`` in
        place: built only then)."""
        lau = self.launcher
        state = lau._state
        rt, comp, fn = state[0], state[1], state[2]
        chain = state[3]
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        if (enter is not None and (type(enter) is not chain or enter.calls)) or \
                (leave is not None and (type(leave) is not chain or leave.calls)) or \
                rt.add_stages_inspection_hook is not None or fn.pre_run_hooks:
            return lau._launch(args if changes is None else _replaced(args, changes), stream)
        if not lau._globals_unchanged(fn):
            return lau._launch(args if changes is None else _replaced(args, changes), stream)
        launch, head, _, as_tuple, device, opts, _ = ready
        get_device = state[5]
        if get_device() != device or (fn.debug, rt.debug, comp.instrumentation_mode,
                                      comp.fpsan_homomorphic_casts if state[4] else None) != opts:
            return lau._launch(args if changes is None else _replaced(args, changes), stream)
        handle = state[6](device) if stream is None else stream.cuda_stream
        if as_tuple:
            launch(lau._g0, lau._g1, lau._g2, handle, *head, final)
        else:
            launch(lau._g0, lau._g1, lau._g2, handle, *head, *final)

    def _resolve(self) -> None:
        """After a launch through the launcher: keep its entry for these arguments."""
        lau = self.launcher
        state = lau._state
        if state is None:  # interpreted, or the slow path only
            return
        device = state[5]()
        opts = lau._opts_key()
        key = state[7](self.args, device, opts)
        entry = state[8].get(key) if key is not None else None
        if entry is None:
            return
        launch, head, as_tuple = entry[0], entry[1], entry[2]
        kernel_args = lau.bound_args(self.args)
        moved = None
        if not as_tuple:
            unwrapped = _expanded_tensordesc_launch(launch, lau._version)
            if unwrapped is not None:
                launch, expand = unwrapped
                plain = kernel_args
                kernel_args, positions = expand(kernel_args)
                # (descriptors re-encoded: the arguments after one moved; launch_with replaces
                # the others at their new positions, a descriptor through the launcher's path)
                if len(plain) != len(kernel_args) or any(a is not b for a, b in zip(plain, kernel_args)):
                    moved = positions
        self._ready = (launch, head, _pointers(kernel_args), as_tuple, device, opts, moved)
