"""The lean launch path (iris_fw.kernel_launcher).

Kernels: a KernelLauncher gives the results of a direct ``kernel[grid](...)`` (pointers, ints,
floats, tuples, a NamedTuple, None, constexprs between runtime parameters; on the CPU under the
interpreter, on a GPU through the fast path). Pure Python: the specialization key against
Triton's own ``native_specialize_impl`` and binder, the generated key function against
``spec_key``, the argument list against hand-made lists and Triton's binder, and the fast path's
decisions (which compiled kernel, when to fall back) with a stand-in for Triton's cache that
keys exactly as ``JITFunction.run`` does.
"""

import itertools
import random
from typing import NamedTuple

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import JITFunction, create_function_from_signature
from triton._C.libtriton import native_specialize_impl
from triton.tools.tensor_descriptor import TensorDescriptor

import iris_fw
from iris_fw import gluon_tiles  # noqa: F401  (Gluon imported now, under the interpreter switch: the fake
#                                 binder below would import it lazily under TRITON_INTERPRET=0, which its
#                                 module-level code asserts against when this file runs alone)
from iris_fw.device import DeviceHeaps
from iris_fw import dsmem
from iris_fw import kernel_launcher as lmod
from iris_fw.kernel_launcher import KernelLauncher, bound_args_template, make_key_fn, spec_key

DEVICE = "cpu" if iris_fw.interpreting() else "cuda"
BLOCK = 16


# ---------------------------------------------------------------------------------------------
# Kernels: launcher vs direct launch
# ---------------------------------------------------------------------------------------------


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, bias_ptr, n, alpha, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = alpha * tl.load(x_ptr + offs, mask=m) + k * tl.load(y_ptr + offs, mask=m)
    if bias_ptr is not None:
        v += tl.load(bias_ptr + offs, mask=m)
    tl.store(out_ptr + offs, v, mask=m)


@triton.jit
def _tuple_mix(ptrs, scales, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(ptrs[0] + offs, mask=m) * scales[0] + tl.load(ptrs[1] + offs, mask=m) * scales[1]
    tl.store(out_ptr + offs, v, mask=m)


class Operands(NamedTuple):
    a: object
    b: object
    n: int


@triton.jit
def _named(ops, out_ptr, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < ops.n
    tl.store(out_ptr + offs, (tl.load(ops.a + offs, mask=m) - tl.load(ops.b + offs, mask=m)) * SCALE, mask=m)


@triton.jit
def _rebuild(op0, op1, rest, ARGS: tl.constexpr, BLOCK: tl.constexpr):
    args = ARGS(op0, op1, *rest)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < args.n
    tl.store(args.out + offs, tl.load(args.a + offs, mask=m) * args.s + tl.load(args.b + offs, mask=m), mask=m)


class RebuildArgs(NamedTuple):
    a: object
    b: object
    out: object
    n: int
    s: float


@triton.jit
def _middle(x_ptr, SHIFT: tl.constexpr, out_ptr, n, BLOCK: tl.constexpr = 16):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + SHIFT, mask=m)


def _t(n=64, dtype=torch.float32, offset=0):
    return torch.zeros(n + 8, dtype=dtype)[offset:offset + n]


def _rand(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 4).to(DEVICE)


def _both(kernel, grid, constexprs, make_args, rounds=3, out_index=2, **opts):
    """Launch through a KernelLauncher and directly, with fresh arguments each round."""
    lau = KernelLauncher(kernel, grid, constexprs=constexprs, **opts)
    for r in range(rounds):
        args_l, out_l = make_args(r)
        args_d, out_d = make_args(r)
        lau(*args_l)
        full = lau.bound_args(args_d)
        kernel[grid](*full, **opts)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        assert torch.equal(out_l, out_d), f"{kernel}: round {r} differs"
        assert out_l.abs().sum() > 0
    return lau


def test_pointers_ints_floats_none():
    n = 37

    def make(r):
        x, y, b = _rand(n, r), _rand(n, r + 10), _rand(n, r + 20)
        out = torch.zeros(n, device=DEVICE)
        # n, the int k (1 in round 1: Triton's value-1 specialization) and a None pointer vary
        return (x, y, out, b if r != 1 else None, n - r, 0.5 + r, 1 if r == 1 else 3 + r), out

    lau = _both(_axpy, (triton.cdiv(n, BLOCK),), {"BLOCK": BLOCK}, make, rounds=4, num_warps=2)
    assert lau.runtime_params == ("x_ptr", "y_ptr", "out_ptr", "bias_ptr", "n", "alpha", "k")


def test_tuple_args():
    n = 29

    def make(r):
        a, b = _rand(n, r), _rand(n, r + 1)
        out = torch.zeros(n, device=DEVICE)
        return ((a, b), (1.5 + r, -2.0), out, n), out

    _both(_tuple_mix, (2,), {"BLOCK": BLOCK}, make)


def test_namedtuple_arg():
    n = 21

    def make(r):
        out = torch.zeros(n, device=DEVICE)
        return (Operands(_rand(n, r), _rand(n, r + 5), n - r), out), out

    _both(_named, (2,), {"SCALE": 3, "BLOCK": BLOCK}, make)


def test_namedtuple_rebuilt_in_kernel():
    n = 33

    def make(r):
        out = torch.zeros(n, device=DEVICE)
        return (_rand(n, r), _rand(n, r + 3), (out, n, 0.25 * (r + 1))), out

    _both(_rebuild, (3,), {"ARGS": RebuildArgs, "BLOCK": BLOCK}, make)


def test_constexpr_between_runtime_params_and_default():
    n = 19

    def make(r):
        out = torch.zeros(n, device=DEVICE)
        return (_rand(n, r), out, n), out

    lau = _both(_middle, (2,), {"SHIFT": 7}, make)
    assert lau.runtime_params == ("x_ptr", "out_ptr", "n")


def test_wrong_arity_names_kernel_and_params():
    lau = KernelLauncher(_axpy, (1,), constexprs={"BLOCK": BLOCK})
    names = "x_ptr, y_ptr, out_ptr, bias_ptr, n, alpha, k"
    with pytest.raises(TypeError, match=rf"_axpy\(\) takes 7 runtime argument.*{names}"):
        lau(1, 2, 3)
    with pytest.raises(TypeError, match="_axpy"):
        lau(*range(8))


def test_bad_constexprs_and_grid():
    with pytest.raises(TypeError, match="not parameters"):
        KernelLauncher(_axpy, (1,), constexprs={"BLOCK": 16, "NOPE": 1})
    with pytest.raises(TypeError, match="without a value.*BLOCK"):
        KernelLauncher(_axpy, (1,), constexprs={})
    with pytest.raises(TypeError, match="not a tl.constexpr"):
        KernelLauncher(_axpy, (1,), constexprs={"BLOCK": 16, "n": 4})
    with pytest.raises(TypeError, match="grid"):
        KernelLauncher(_axpy, (1, 1, 1, 1), constexprs={"BLOCK": 16})
    with pytest.raises(TypeError, match="grid"):
        KernelLauncher(_axpy, (1.5,), constexprs={"BLOCK": 16})
    assert KernelLauncher(_axpy, [torch.tensor(3)], constexprs={"BLOCK": 16}).grid == (3,)
    with pytest.raises(TypeError, match="@triton.jit"):
        KernelLauncher(lambda x: x, (1,), constexprs={})


# ---------------------------------------------------------------------------------------------
# The argument list (what JITFunction.run passes to CompiledKernel.run)
# ---------------------------------------------------------------------------------------------


def _plain_middle(x_ptr, SHIFT: tl.constexpr, out_ptr, n, BLOCK: tl.constexpr = 16):
    pass


def _plain_many(p0, p1, t, i0, f0, b0, nn, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr = "c"):
    pass


def _plain_dns(p, q, i, j, k, BLOCK: tl.constexpr):
    pass


def _plain_rebuild(op0, op1, rest, ARGS: tl.constexpr, BLOCK: tl.constexpr):
    pass


def test_bound_args_hand_made():
    """Both 3.6 and 3.9 hand ``*bound_args.values()`` to the launcher: every parameter in
    declaration order, constexprs in place (the launcher skips them), defaults applied, tuples
    nested (the launcher flattens them; TensorDescriptors stay objects and are expanded there)."""
    lau = KernelLauncher(JITFunction(_plain_middle), (1,), constexprs={"SHIFT": 7})
    assert lau.bound_args(("X", "O", 5)) == ("X", 7, "O", 5, 16)
    lau = KernelLauncher(JITFunction(_plain_middle), (1,), constexprs={"SHIFT": 7, "BLOCK": 32})
    assert lau.bound_args(("X", "O", 5)) == ("X", 7, "O", 5, 32)
    lau = KernelLauncher(JITFunction(_plain_many), (1,), constexprs={"A": 1, "B": None})
    t = ("T0", (3, None), "T2")
    assert lau.bound_args(("P0", "P1", t, 4, 2.5, True, None)) == ("P0", "P1", t, 4, 2.5, True, None, 1, None, "c")
    assert lau._tail == (1, None, "c") and lau._prefix
    template, runtime = bound_args_template(JITFunction(_plain_middle).params, {"SHIFT": 1})
    assert template == [None, 1, None, None, 16] and runtime == [0, 2, 3]


@pytest.mark.parametrize("fn,cx,args", [
    (_plain_middle, {"SHIFT": 7}, (_t(), _t(), 5)),
    (_plain_many, {"A": 1, "B": (2, 3)}, (_t(), _t(offset=1), (_t(), (1, None)), 4, 2.5, True, None)),
])
def test_bound_args_match_tritons_binder(fn, cx, args):
    jf = JITFunction(fn)
    lau = KernelLauncher(jf, (1,), constexprs=cx)
    binder = create_function_from_signature(jf.signature, jf.params, CUDABackend)
    kw = dict(zip(lau.runtime_params, args))
    bound, _, _ = binder(**kw, **cx)
    assert tuple(bound.values()) == lau.bound_args(args)


# ---------------------------------------------------------------------------------------------
# The specialization key
# ---------------------------------------------------------------------------------------------


def test_spec_key_rules():
    f = ((True, True),)
    assert spec_key((1,), f) == ("one",)
    assert spec_key((16,), f) == ("i32D",) and spec_key((-32,), f) == ("i32D",) and spec_key((17,), f) == ("i32",)
    assert spec_key((2**31 - 1,), f) == ("i32",) and spec_key((2**31,), f) == ("i64D",)
    assert spec_key((-2**31,), f) == ("i32D",) and spec_key((-2**31 - 1,), f) == ("i64",)
    assert spec_key((2**63,), f) == ("u64D",) and spec_key((2**64 - 1,), f) == ("u64",)
    assert spec_key((2**64,), f) is None and spec_key((-2**63 - 1,), f) is None  # Triton raises
    assert spec_key((1,), ((False, True),)) == ("i32",)  # do_not_specialize: no value-1, no "D"
    assert spec_key((16,), ((False, True),)) == ("i32",) and spec_key((16,), ((True, False),)) == ("i32",)
    assert spec_key((True, 1.0, None), f * 3) == ("u1", "fp32", "none")
    a, u = _t(), _t(offset=1)
    assert spec_key((a,), f) == (torch.float32, True) and spec_key((u,), f) == (torch.float32, False)
    assert spec_key((u,), ((True, False),)) == (torch.float32, None) == spec_key((a,), ((False, True),))
    assert spec_key((_t(dtype=torch.bfloat16),), f) == (torch.bfloat16, True)
    # inside tuples everything is specialized, whatever the parameter's flags
    k = spec_key(((a, 1, 16, None, u),), ((False, False),))
    assert k == ((tuple, (torch.Tensor, torch.float32, True), "one", "i32D", "none",
                  (torch.Tensor, torch.float32, False)),)
    k = spec_key((Operands(a, u, 3),), f)
    assert k[0][0] is Operands
    assert spec_key(((),), f) == ((tuple,),)
    d = TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.float16), [32, 16])
    kd = spec_key((d,), f)[0]
    assert kd[:4] == (TensorDescriptor, torch.float16, (32, 16), 2)
    # a constexpr of a plain value (DeviceHeaps' switches): its value and the value's type
    assert spec_key((tl.constexpr(3),), f) == ((tl.constexpr, int, 3),)
    assert spec_key(((a, tl.constexpr(True)),), f) != spec_key(((a, tl.constexpr(1)),), f)
    # types the key does not model: the slow path
    assert spec_key((tl.constexpr((1, 2)),), f) is None
    assert spec_key((object(),), f) is None
    assert spec_key((JITFunction(_plain_dns),), f) is None


def _samples():
    """Values covering every specialization rule (and neighbours that must not collide)."""
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31 - 16, 2**31, -2**31, -2**31 - 1, -2**31 - 16,
            2**62, 2**63 - 1, 2**63, 2**64 - 16, 2**64 - 1]
    tensors = [_t(), _t(offset=1), _t(offset=4), _t(dtype=torch.float16), _t(dtype=torch.float16, offset=8),
               _t(dtype=torch.int32), _t(dtype=torch.bfloat16, offset=3)]
    descs = [TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.float16), [32, 16]),
             TensorDescriptor.from_tensor(torch.zeros(64, 32, dtype=torch.float16), [32, 16]),
             TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.float16), [16, 16]),
             TensorDescriptor.from_tensor(torch.zeros(64, 64, dtype=torch.float32), [32, 16])]
    scalars = [True, False, 0.0, 1.0, 2.5, None]
    tuples = [(1, 2), (16, 2), (tensors[0], 1), (tensors[1], 1), (None, 3), Operands(tensors[0], tensors[1], 16),
              Operands(tensors[0], tensors[1], 17), ((1, (2, None)), 3.0), (), (descs[0],),
              # the switches of iris_fw.device.DeviceHeaps: constexprs inside a tuple
              (tensors[0], tl.constexpr(True), tl.constexpr(0)), (tensors[0], tl.constexpr(False), tl.constexpr(0)),
              (tensors[0], tl.constexpr(1), tl.constexpr(0)), (tensors[0], tl.constexpr(True), tl.constexpr(2)),
              (tensors[0], tl.constexpr("1"), tl.constexpr(None)),
              DeviceHeaps(tensors[0], tl.constexpr(True), tl.constexpr(0)),
              DeviceHeaps(tensors[0], tl.constexpr(False), tl.constexpr(0)),
              DeviceHeaps(tensors[1], tl.constexpr(False), tl.constexpr(2)),
              DeviceHeaps(tensors[0], tl.constexpr(1), tl.constexpr(0))]  # not as a context builds it
    return ints + tensors + descs + scalars + tuples


def _triton_spec(v, spec, align):
    try:
        return repr(native_specialize_impl(CUDABackend, v, False, spec, align))
    except Exception as e:  # noqa: BLE001  (Triton refuses: the launcher's slow path raises too)
        return f"error {type(e).__name__}"


@pytest.mark.parametrize("spec,align", [(True, True), (True, False), (False, True)])
def test_spec_key_refines_tritons_specialization(spec, align):
    """Equal keys imply equal Triton specializations, for every pair of samples."""
    vals = _samples()
    keys = [spec_key((v,), ((spec, align),)) for v in vals]
    trit = [_triton_spec(v, spec, align) for v in vals]
    for i, j in itertools.combinations(range(len(vals)), 2):
        if keys[i] is not None and keys[i] == keys[j]:
            assert trit[i] == trit[j], f"{vals[i]!r} and {vals[j]!r} share a key, not a specialization"
    for k, t in zip(keys, trit):
        if t.startswith("error"):
            assert k is None


def test_generated_key_fn_equals_spec_key():
    vals = _samples()
    rng = random.Random(0)
    flags = ((True, True), (False, True), (True, False), (True, True), (True, True))
    for _ in range(30):
        sample = tuple(rng.choice(vals) for _ in flags)
        fn = make_key_fn(flags, sample)
        for _ in range(40):  # mostly other types than the sample: the fallback; sometimes the same
            args = tuple(rng.choice(vals) if rng.random() < 0.5 else s for s in sample)
            k = spec_key(args, flags)
            assert fn(args, 3, "o") == (None if k is None else (3, "o") + k), fn.source
    assert make_key_fn((), ())((), 0, None) == (0, None)


# ---------------------------------------------------------------------------------------------
# The fast path's decisions, with a stand-in for Triton's compiled-kernel cache
# ---------------------------------------------------------------------------------------------


class _Target:
    def __init__(self, backend):
        self.backend = backend


class _Meta:
    def __init__(self, backend):
        self.target = _Target(backend)


class FakeCompiled:
    """Stands for a CompiledKernel: ``run`` records what it is given."""

    def __init__(self, key, calls, backend="cuda"):
        self.key, self.calls = key, calls
        self.metadata = _Meta(backend)
        self.function = object()
        self.packed_metadata = (4, 1, 0)

    def run(self, *a):
        self.calls.append(("fast", self, a))


class FakeJIT(JITFunction):
    """A JITFunction whose ``kernel[grid](...)`` keys exactly as JITFunction.run (Triton's
    binder on the CUDA backend, options, device) but returns a FakeCompiled instead of
    compiling and launching."""

    backend = "cuda"
    device = 0

    def setup(self):
        self.binder = create_function_from_signature(self.signature, self.params, CUDABackend)
        self.compiled, self.calls = {}, []
        return self

    def triton_kernel(self, args, opts):
        _, specialization, options = self.binder(*args, **opts)
        options = dict(options, debug=self.debug or triton.knobs.runtime.debug)
        key = (self.device, str(specialization), str(sorted(options.items())))
        if key not in self.compiled:
            self.compiled[key] = FakeCompiled(key, self.calls, self.backend)
        return self.compiled[key]

    def __getitem__(self, grid):
        def launch(*args, **opts):
            k = self.triton_kernel(args, opts)
            self.calls.append(("slow", k, args))
            return k
        return launch


class _Driver:
    def __init__(self, jit):
        self.jit = jit

    def get_current_device(self):
        return self.jit.device

    def get_current_stream(self, device):
        return 1000 + device


class _FakeDriverLauncher(KernelLauncher):
    def _driver(self):
        return _Driver(self.kernel)


def _fake(fn, constexprs, monkeypatch, **kw):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read by the launcher's constructor only
    monkeypatch.delenv("IRIS_FW_SLOW_LAUNCH", raising=False)
    jit = FakeJIT(fn).setup()
    return jit, _FakeDriverLauncher(jit, (5, 2), constexprs=constexprs, **kw)


def _as_pointers(args):
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else _as_pointers(a) if isinstance(a, tuple) else a
                 for a in args)


def _check_last(jit, lau, args, path):
    """The last launch went ``path`` and used the kernel Triton would have used."""
    how, k, got = jit.calls[-1]
    assert how == path, jit.calls[-1]
    full = lau.bound_args(args)
    assert k is jit.triton_kernel(full, lau.options)
    if how == "fast":  # (a prepared launch passes its tensors as their pointers: the same launch)
        assert _as_pointers(got) == _as_pointers(
            (5, 2, 1, 1000 + jit.device, k.function, k.packed_metadata, None, None, None, *full))
    else:
        assert got == full


def test_fast_path_uses_tritons_kernel(monkeypatch):
    jit, lau = _fake(_plain_many, {"A": 2, "B": None}, monkeypatch, num_warps=4)
    vals = _samples()
    a, u = _t(), _t(offset=1)
    base = [a, u, (a, 3), 5, 1.5, False, None]
    lau(*base)
    _check_last(jit, lau, base, "slow")
    lau(*base)
    _check_last(jit, lau, base, "fast")
    rng = random.Random(1)
    pool = rng.sample(vals, 5)  # few values, so that specializations repeat
    for i in range(1200):
        args = list(base)
        for j in rng.sample(range(len(args)), 2):
            args[j] = rng.choice(pool)
        seen = len(lau.variants())
        try:
            lau(*args)
        except Exception:  # noqa: BLE001  (Triton's binder refuses, e.g. 2**64): the slow path raised
            assert jit.calls[-1][0] != "fast"
            continue
        how = jit.calls[-1][0]
        assert how == "slow" if len(lau.variants()) > seen or spec_key(args, lau._flags) is None else how == "fast"
        _check_last(jit, lau, args, how)
    assert len(jit.compiled) > 20 and sum(c[0] == "fast" for c in jit.calls) > 300


def test_alignment_and_int_changes_make_variants(monkeypatch):
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a, u = _t(), _t(offset=1)
    seq = [(a, a, 16, 5, 7), (u, a, 16, 5, 7), (a, a, 1, 5, 7), (a, a, 17, 5, 7), (a, a, 2**40, 5, 7)]
    for args in seq:
        lau(*args)
        _check_last(jit, lau, args, "slow")
    assert len({id(k) for k in lau.variants().values()}) == len(seq) == lau.slow_calls
    for args in seq * 3:  # alternating: each goes to its own variant, fast
        lau(*args)
        _check_last(jit, lau, args, "fast")
    assert lau.slow_calls == len(seq)


def test_do_not_specialize_shares_variants(monkeypatch):
    jit = FakeJIT(_plain_dns, do_not_specialize=["i"], do_not_specialize_on_alignment=["q"]).setup()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lau = _FakeDriverLauncher(jit, (5, 2), constexprs={"BLOCK": 64})
    a, u = _t(), _t(offset=1)
    lau(a, a, 16, 5, 7)
    for args in [(a, u, 1, 5, 7), (a, a, 17, 5, 7), (a, u, 32, 5, 7)]:
        lau(*args)
        _check_last(jit, lau, args, "fast")
    assert lau.slow_calls == 1


def test_fallbacks(monkeypatch):
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a = _t()
    args = (a, a, 16, 5, 7)
    lau(*args)
    lau(*args)
    _check_last(jit, lau, args, "fast")
    rt = triton.knobs.runtime
    for hook_name in ("launch_enter_hook", "launch_exit_hook"):
        hook = getattr(rt, hook_name)
        f = lambda meta: None  # noqa: E731
        hook.add(f)
        try:
            lau(*args)
            _check_last(jit, lau, args, "slow")
        finally:
            hook.remove(f)
        lau(*args)
        _check_last(jit, lau, args, "fast")
    monkeypatch.setattr(rt, "add_stages_inspection_hook", lambda: ("k", "h"))
    lau(*args)
    _check_last(jit, lau, args, "slow")
    monkeypatch.setattr(rt, "add_stages_inspection_hook", None)
    jit.pre_run_hooks.append(lambda *a, **k: None)
    lau(*args)
    _check_last(jit, lau, args, "slow")
    jit.pre_run_hooks.clear()
    g = {"X": 1}
    jit.used_global_vals = {("X", id(g)): (1, g)}
    lau(*args)
    _check_last(jit, lau, args, "fast")
    g["X"] = 2  # Triton would raise; the launcher lets it
    lau(*args)
    _check_last(jit, lau, args, "slow")
    jit.used_global_vals = {}
    # an argument type the key does not model: always slow
    for _ in range(2):
        odd = (a, a, tl.constexpr((16,)), 5, 7)
        lau(*odd)
        assert jit.calls[-1][0] == "slow"
    # the debug knob is part of Triton's options: a new variant
    monkeypatch.setattr(rt, "debug", True)
    lau(*args)
    _check_last(jit, lau, args, "slow")
    lau(*args)
    _check_last(jit, lau, args, "fast")
    monkeypatch.setattr(rt, "debug", False)
    lau(*args)
    _check_last(jit, lau, args, "fast")
    # another device: its own variant
    jit.device = 1
    lau(*args)
    _check_last(jit, lau, args, "slow")
    lau(*args)
    _check_last(jit, lau, args, "fast")


def test_prepared_launch_reuses_the_resolved_kernel(monkeypatch):
    """A prepared launch (fixed arguments) launches what the launcher's fast path would, from
    its second call without the key, and goes back through the launcher whenever a hook, a
    global, the debug option or the device changed."""
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a = _t()
    args = (a, a, 16, 5, 7)
    prepared = lau.prepare(*args)
    prepared()
    _check_last(jit, lau, args, "slow")
    calls = []
    real_key = lau._state[7]
    lau._state = lau._state[:7] + ((lambda *k: calls.append(k) or real_key(*k)),) + lau._state[8:]
    for _ in range(3):
        prepared()
        _check_last(jit, lau, args, "fast")
    assert not calls, "a prepared launch computed the specialization key again"
    rt = triton.knobs.runtime
    f = lambda meta: None  # noqa: E731
    rt.launch_enter_hook.add(f)
    try:
        prepared()
        _check_last(jit, lau, args, "slow")
    finally:
        rt.launch_enter_hook.remove(f)
    prepared()
    _check_last(jit, lau, args, "fast")
    g = {"X": 1}
    jit.used_global_vals = {("X", id(g)): (1, g)}
    g["X"] = 2
    prepared()
    _check_last(jit, lau, args, "slow")

    class Compared:  # a global compiled as a copy (Triton deep-copies it): equal, never the same object
        compared = 0

        def __ne__(self, other):
            Compared.compared += 1
            return not isinstance(other, Compared)

    g = {"C": Compared(), "D": (1, 2)}
    jit.used_global_vals = {("C", id(g)): (Compared(), g), ("D", id(g)): ((1, 2), g)}
    for _ in range(3):
        prepared()
        _check_last(jit, lau, args, "fast")
    assert Compared.compared == 1, "an unchanged global was compared in full on every launch"
    g["C"] = Compared()  # rebound to an equal value: compared again, still fast
    prepared()
    _check_last(jit, lau, args, "fast")
    assert Compared.compared == 2
    g["C"] = 3  # rebound to another value: Triton's path
    prepared()
    _check_last(jit, lau, args, "slow")
    g["C"] = Compared()
    prepared()
    _check_last(jit, lau, args, "fast")
    del g["D"]  # deleted: Triton's path
    prepared()
    _check_last(jit, lau, args, "slow")
    jit.used_global_vals = {}
    monkeypatch.setattr(rt, "debug", True)
    prepared()
    _check_last(jit, lau, args, "slow")
    monkeypatch.setattr(rt, "debug", False)
    jit.device = 1
    prepared()
    _check_last(jit, lau, args, "slow")
    jit.device = 0
    prepared()
    _check_last(jit, lau, args, "fast")
    with pytest.raises(TypeError, match="runtime argument"):
        lau.prepare(a, a)


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU (the prepared path's pointer conversion)."""

    @property
    def is_cuda(self):
        return True


def test_prepared_launch_passes_gpu_tensors_as_pointers(monkeypatch):
    """A resolved prepared launch hands the driver's launcher a GPU tensor's pointer (an int:
    no ``data_ptr()`` call and driver query per launch), a replaced one too; a CPU tensor stays
    a tensor (for the driver's launcher to refuse)."""
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    g, h, c = _t().as_subclass(_OnGpu), _t().as_subclass(_OnGpu), _t()
    prepared = lau.prepare(g, c, 16, 5, 7)
    prepared()
    prepared()
    sent = jit.calls[-1][2][9:]
    assert jit.calls[-1][0] == "fast" and sent[0] == g.data_ptr() and type(sent[0]) is int and sent[1] is c
    prepared.launch_with(((0, h),))
    sent = jit.calls[-1][2][9:]
    assert jit.calls[-1][0] == "fast" and sent[0] == h.data_ptr() and type(sent[0]) is int
    # what the launch holds "replaced" by itself: the prepared pointer and int, as they are
    prepared.launch_with(((0, g), (2, 16)))
    sent = jit.calls[-1][2][9:]
    assert jit.calls[-1][0] == "fast" and sent[0] == g.data_ptr() and sent[2] == 16
    # the prepared tensor, its storage swapped since: its new address replaces the kept one
    old = g.data_ptr()
    g.set_(_t().as_subclass(_OnGpu))
    assert g.data_ptr() != old
    prepared.launch_with(((0, g),))
    sent = jit.calls[-1][2][9:]
    assert jit.calls[-1][0] == "fast" and sent[0] == g.data_ptr()


def test_prepared_launch_with_replaced_arguments(monkeypatch):
    """``launch_with`` replaces runtime arguments for one call: while each new value specializes
    as the prepared one (a tensor of its dtype and alignment, an int of its class), the resolved
    kernel launches on the new values without the key; otherwise the launcher's path does, with
    the kernel Triton would use; the prepared arguments themselves never change."""
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a, b, c, u = _t(), _t(), _t(), _t(offset=1)
    args = (a, a, 16, 5, 7)
    prepared = lau.prepare(*args)
    prepared.launch_with(((1, b), (3, 6)))  # before the first resolved launch: the launcher's path
    _check_last(jit, lau, (a, b, 16, 6, 7), "slow")
    calls = []
    real_key = lau._state[7]
    lau._state = lau._state[:7] + ((lambda *k: calls.append(k) or real_key(*k)),) + lau._state[8:]
    for q, j in ((b, 6), (c, 9), (a, 5)):
        prepared.launch_with(((1, q), (3, j)))
        _check_last(jit, lau, (a, q, 16, j, 7), "fast")
    prepared()
    _check_last(jit, lau, args, "fast")
    assert not calls, "launch_with computed the specialization key for values of the prepared specialization"
    hook = triton.knobs.runtime.launch_enter_hook
    f = lambda meta: None  # noqa: E731
    hook.add(f)
    try:  # a hook set: Triton's path, on the replaced arguments
        prepared.launch_with(((1, c), (3, 9)))
        _check_last(jit, lau, (a, c, 16, 9, 7), "slow")
    finally:
        hook.remove(f)
    lau._state = lau._state[:7] + (real_key,) + lau._state[8:]
    for changed in ((1, u), (3, 1), (3, 32), (3, 2 ** 40), (2, 17)):  # another alignment, int class, divisibility
        prepared.launch_with((changed,))
        full = list(args)
        full[changed[0]] = changed[1]
        _check_last(jit, lau, tuple(full), jit.calls[-1][0])  # (slow the first time, then its variant)
    assert prepared.args == args
    prepared.launch_with(((1, b),))
    _check_last(jit, lau, (a, b, 16, 5, 7), "fast")
    # a constexpr between runtime parameters: the replaced values land in their kernel positions
    jit, lau = _fake(_plain_middle, {"SHIFT": 7}, monkeypatch)
    prepared = lau.prepare(a, b, 19)
    prepared()
    for out, n in ((c, 20), (a, 31)):
        prepared.launch_with(((1, out), (2, n)))
        _check_last(jit, lau, (a, out, n), "fast")


def test_launch_with_replaces_an_element_of_a_tuple_argument(monkeypatch):
    """A change at ``(i, j)`` replaces element ``j`` of the tuple argument ``i`` (a pattern's
    ``rest``): the resolved kernel while the new element specializes as the prepared one (a
    tuple element: its dtype and 16-byte alignment), the launcher's path on the rebuilt tuple
    otherwise; the prepared element itself replaces nothing; a GPU tensor goes as its pointer."""
    jit, lau = _fake(_plain_rebuild, {"ARGS": RebuildArgs, "BLOCK": BLOCK}, monkeypatch)
    a, b, out, other, odd = _t(), _t(), _t(), _t(), _t(offset=1)
    args = (a, b, (out, 33, 0.5))
    prepared = lau.prepare(*args)
    prepared()
    calls = []
    real_key = lau._state[7]
    lau._state = lau._state[:7] + ((lambda *k: calls.append(k) or real_key(*k)),) + lau._state[8:]
    for dst in (other, out, other):
        prepared.launch_with((((2, 0), dst),))
        _check_last(jit, lau, (a, b, (dst, 33, 0.5)), "fast")
    prepared.launch_with((((2, 0), other), (1, a)))  # with a plain argument in the same call
    _check_last(jit, lau, (a, a, (other, 33, 0.5)), "fast")
    assert not calls and prepared.args == args
    lau._state = lau._state[:7] + (real_key,) + lau._state[8:]
    prepared.launch_with((((2, 0), odd),))  # another alignment: its own variant, through the launcher
    _check_last(jit, lau, (a, b, (odd, 33, 0.5)), "slow")
    kept = prepared.with_args((((2, 0), other),))
    kept()
    _check_last(jit, lau, (a, b, (other, 33, 0.5)), "fast")
    assert kept.args == (a, b, (other, 33, 0.5)) and prepared.args == args
    g, h = _t().as_subclass(_OnGpu), _t().as_subclass(_OnGpu)
    on_gpu = lau.prepare(a, b, (g, 33, 0.5))
    on_gpu()
    on_gpu()
    on_gpu.launch_with((((2, 0), h),))
    sent = jit.calls[-1][2][9:]
    assert jit.calls[-1][0] == "fast" and sent[2][0] == h.data_ptr() and type(sent[2][0]) is int
    with pytest.raises(IndexError, match="not a tuple with an element 5"):
        prepared.launch_with((((2, 5), other),))


def test_with_args_keeps_the_replacement(monkeypatch):
    """``with_args`` gives a prepared launch of the replaced arguments that shares the resolved
    entry (no key computed, the original unchanged) when the new values specialize alike, and
    one that resolves through the launcher otherwise."""
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a, b, c, u = _t(), _t(), _t(), _t(offset=1)
    args = (a, a, 16, 5, 7)
    prepared = lau.prepare(*args)
    early = prepared.with_args(((1, c),))  # before the first resolved launch: resolves on its own
    early()
    _check_last(jit, lau, (a, c, 16, 5, 7), "slow")
    prepared()
    calls = []
    real_key = lau._state[7]
    lau._state = lau._state[:7] + ((lambda *k: calls.append(k) or real_key(*k)),) + lau._state[8:]
    kept = prepared.with_args(((1, b), (3, 6)))
    for _ in range(2):
        kept()
        _check_last(jit, lau, (a, b, 16, 6, 7), "fast")
    prepared()
    _check_last(jit, lau, args, "fast")
    assert not calls and prepared.args == args and kept.args == (a, b, 16, 6, 7)
    lau._state = lau._state[:7] + (real_key,) + lau._state[8:]
    other = prepared.with_args(((1, u),))  # another alignment: its own variant, through the launcher
    other()
    _check_last(jit, lau, (a, u, 16, 5, 7), jit.calls[-1][0])
    assert other.args == (a, u, 16, 5, 7)


def test_non_cuda_and_kill_switch_stay_slow(monkeypatch):
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    jit.backend = "hip"
    a = _t()
    for _ in range(3):
        lau(a, a, 16, 5, 7)
        assert jit.calls[-1][0] == "slow"
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    monkeypatch.setenv("IRIS_FW_SLOW_LAUNCH", "1")
    lau = _FakeDriverLauncher(jit, (1,), constexprs={"BLOCK": 64})
    for _ in range(3):
        lau(a, a, 16, 5, 7)
        assert jit.calls[-1][0] == "slow"


def _cuda_launcher_like(scratch):
    """An object of a class named like Triton's CudaLauncher, with its attributes, whose
    ``launch`` records what it is given, and Triton's own ``CudaLauncher.__call__``."""
    from triton.backends.nvidia import driver as nvd

    class CudaLauncher:
        __call__ = nvd.CudaLauncher.__call__

    CudaLauncher.__module__ = nvd.__name__
    fake = CudaLauncher()
    fake.got = []
    fake.launch = lambda *a: fake.got.append(a)
    fake.global_scratch_size = fake.profile_scratch_size = scratch
    fake.global_scratch_align = fake.profile_scratch_align = 16
    fake.launch_cooperative_grid, fake.launch_pdl, fake.num_ctas, fake.gsan_enabled = False, True, 1, False
    fake.arg_annotations, fake.kernel_signature = ["ann"], b"sig"
    return fake


@pytest.mark.parametrize("scratch", [0, 128])
def test_launch_entry(scratch):
    """The direct ``launch`` call gets, per version, what CudaLauncher.__call__ hands its
    ``launch`` (hand-made lists from reading 3.6's and 3.9's driver.py); elsewhere, or when the
    kernel needs scratch, the fast path calls ``run`` as JITFunction.run does."""
    fake = _cuda_launcher_like(scratch)

    class Compiled:
        run, function, packed_metadata = fake, 77, (4, 1, 0)

    full = (_t(), 3, (_t(), 1.5), None, 64)
    for version in [(3, 6), (3, 9), (3, 10), (3, 7)]:
        launch, head, as_tuple = lmod.launch_entry(Compiled(), version)
        if scratch or version not in ((3, 6), (3, 9)):
            assert launch is fake and head == (77, (4, 1, 0), None, None, None) and not as_tuple
            continue
        assert launch == fake.launch
        fake.got.clear()
        launch(5, 2, 1, 99, *head, full) if as_tuple else launch(5, 2, 1, 99, *head, *full)
        if version == (3, 6):  # gx gy gz stream function coop pdl gscratch pscratch meta lmeta enter exit *args
            assert fake.got == [(5, 2, 1, 99, 77, False, True, None, None, (4, 1, 0), None, None, None, *full)]
        else:  # gx gy gz stream function coop pdl meta lmeta enter exit gscratch pscratch ann sig args
            assert fake.got == [(5, 2, 1, 99, 77, False, True, (4, 1, 0), None, None, None, None, None,
                                 ["ann"], b"sig", full)]
    fake.gsan_enabled = True
    assert lmod.launch_entry(Compiled(), (3, 9))[0] is fake


def test_launch_entry_matches_this_tritons_cudalauncher():
    """With this Triton's own CudaLauncher.__call__ (it needs an active driver: GPU hosts)."""
    try:
        triton.runtime.driver.active.get_current_device()
    except Exception:  # noqa: BLE001
        pytest.skip("no GPU driver: CudaLauncher.__call__ looks up the active driver")
    fake = _cuda_launcher_like(0)

    class Compiled:
        run, function, packed_metadata = fake, 77, (4, 1, 0)

    full = (3, (5, 1.5), None, 64)
    launch, head, as_tuple = lmod.launch_entry(Compiled(), lmod._triton_version(triton.__version__))
    if launch is fake:
        pytest.skip(f"Triton {triton.__version__}: the fast path calls run")
    launch(5, 2, 1, 99, *head, full) if as_tuple else launch(5, 2, 1, 99, *head, *full)
    type(fake).__call__(fake, 5, 2, 1, 99, 77, (4, 1, 0), None, None, None, *full)
    assert len(fake.got) == 2 and fake.got[0] == fake.got[1]


def test_namedtuple_class_constexpr_is_wrapped(monkeypatch):
    jit, lau = _fake(_rebuild_plain, {"ARGS": RebuildArgs, "BLOCK": 16}, monkeypatch)
    cx = lau.bound_args((1, 2, (3,)))[3]
    assert isinstance(cx, tl.constexpr) and cx.value is RebuildArgs
    assert lau.constexprs["ARGS"] is RebuildArgs


def _rebuild_plain(op0, op1, rest, ARGS: tl.constexpr, BLOCK: tl.constexpr):
    pass


def test_fast_path_versions():
    assert lmod.fast_path_supported("3.6.0") and lmod.fast_path_supported("3.9.0")
    assert lmod.fast_path_supported("3.6.1+git") and lmod.fast_path_supported("3.9.2")
    assert not lmod.fast_path_supported("3.10.1+git") and not lmod.fast_path_supported("4.0")
    assert not lmod.fast_path_supported("3.5.1") and not lmod.fast_path_supported("3.7.0")
    assert not lmod.fast_path_supported("3.8.0")


@pytest.mark.parametrize("version", ["3.8.0", "3.10.0", "4.1.0"])
def test_unknown_triton_release_takes_the_public_path(monkeypatch, version):
    """A Triton release whose launch code was not read: every launch, prepared ones included,
    goes through the public ``kernel[grid](...)`` with the arguments Triton's binder expects."""
    monkeypatch.setattr(triton, "__version__", version)
    jit, lau = _fake(_plain_dns, {"BLOCK": 64}, monkeypatch)
    a = _t()
    args = (a, a, 16, 5, 7)
    prepared = lau.prepare(*args)
    for _ in range(3):
        lau(*args)
        _check_last(jit, lau, args, "slow")
        prepared()
        _check_last(jit, lau, args, "slow")
    assert lau.slow_calls == 6 and not lau.variants()


def test_interpreter_takes_the_public_path():
    """Under the CPU interpreter every launch is Triton's public ``kernel[grid](...)``."""
    if not iris_fw.interpreting():
        pytest.skip("compiled Triton here")
    lau = KernelLauncher(_axpy, (1,), constexprs={"BLOCK": BLOCK})
    assert lau.interpreted and not lau._fast


def test_launch_entry_of_a_clustered_launch(monkeypatch):
    """``cluster=(n, extra)``: the launcher's packed metadata becomes ``(num_warps, n, shared +
    extra)`` (3.6's and 3.9's launchers launch gridX x num_ctas programs in clusters of
    num_ctas), the function is allowed that much shared memory first; without a direct launch
    (scratch, an unread release) it raises rather than launch one CTA a program."""
    from iris_fw import driver
    from iris_fw.errors import IrisError

    allowed = []

    class Calls:
        def allow_shared(self, function, nbytes):
            allowed.append((function, nbytes))

        def allow_cluster(self, function, size):
            allowed.append((function, "cluster", size))

    monkeypatch.setattr(driver, "cluster_calls", lambda: Calls())
    for scratch, version in ((0, (3, 6)), (0, (3, 9)), (128, (3, 6)), (0, (3, 10))):
        fake = _cuda_launcher_like(scratch)

        class Compiled:
            run, function, packed_metadata = fake, 77, (4, 1, 1000)

        if scratch or version == (3, 10):
            with pytest.raises(IrisError, match="direct launch"):
                lmod.launch_entry(Compiled(), version, (8, 24))
            continue
        launch, head, as_tuple = lmod.launch_entry(Compiled(), version, (8, 24))
        assert launch == fake.launch and (4, 8, 1024) in head and (4, 1, 1000) not in head
        assert allowed[-2:] == [(77, "cluster", 8), (77, 1024)]


def test_clustered_launcher_needs_a_compiled_kernel_and_whole_clusters():
    """Under the interpreter a clustered launcher is refused (and cluster_launch_supported says
    so); a grid that is not whole clusters is refused everywhere."""
    from iris_fw.errors import IrisError

    if iris_fw.interpreting():
        assert not lmod.cluster_launch_supported(torch.device("cpu"))
        with pytest.raises(IrisError, match="interpreter"):
            KernelLauncher(_cluster_sum, (8,), constexprs={"CLUSTER": 4}, cluster=4, cluster_shared=16)
        return
    with pytest.raises(TypeError, match="whole clusters"):
        KernelLauncher(_cluster_sum, (6,), constexprs={"CLUSTER": 4}, cluster=4, cluster_shared=16)
    with pytest.raises(TypeError, match="whole clusters"):  # (beyond CUDA's 16)
        KernelLauncher(_cluster_sum, (64,), constexprs={"CLUSTER": 32}, cluster=32, cluster_shared=16)


@triton.jit
def _pdl_step(src, dst, n, BLOCK: tl.constexpr):
    """``dst = src + 1`` (``[n]`` fp32), launched as a programmatic dependent launch: the next
    kernel may launch at once; this one waits for the kernel before it (which wrote ``src``)."""
    tl_cuda.gdc_launch_dependents()
    tl_cuda.gdc_wait()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n) + 1.0, mask=i < n)


def test_pdl_launcher_needs_a_compiled_kernel():
    """Under the interpreter (and on a CPU) a launcher with ``launch_pdl=True`` is refused and
    pdl_launch_supported says no."""
    from iris_fw.errors import IrisError

    assert not lmod.pdl_launch_supported(torch.device("cpu"))
    if iris_fw.interpreting():
        with pytest.raises(IrisError, match="interpreter"):
            KernelLauncher(_pdl_step, (4,), constexprs={"BLOCK": 128}, launch_pdl=True)


def test_pdl_launch_chain():
    """On an sm_90+ GPU: a chain of programmatic dependent launches, each reading what the one
    before wrote and letting the next launch before its own reads, eager and replayed in a CUDA
    graph: every step sees its predecessor's writes (the chain's count in every element)."""
    if iris_fw.interpreting() or not lmod.pdl_launch_supported(torch.device("cuda")):
        pytest.skip("a programmatic dependent launch needs a compiled kernel on an NVIDIA GPU of compute "
                    "capability 9.0+")
    n, block, steps = 100_003, 1024, 24
    lau = KernelLauncher(_pdl_step, (triton.cdiv(n, block),), constexprs={"BLOCK": block}, num_warps=4,
                         launch_pdl=True)
    bufs = [torch.full((n,), float("nan"), device="cuda") for _ in range(2)]

    def chain():
        for s in range(steps):
            lau(bufs[s % 2], bufs[(s + 1) % 2], n)

    start = torch.randn(n, device="cuda").round()
    for _ in range(2):  # the first call compiles; the rest take the cached entry
        bufs[0].copy_(start)
        bufs[1].fill_(float("nan"))
        chain()
        torch.cuda.synchronize()
        assert torch.equal(bufs[steps % 2], start + steps)
    assert lau.variants() and all(k.metadata.launch_pdl for k in lau.variants().values())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for rep in range(3):
        start = torch.randn(n, device="cuda").round()
        bufs[0].copy_(start)
        bufs[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bufs[steps % 2], start + steps), rep


@triton.jit
def _cluster_sum(out, zeros, CLUSTER: tl.constexpr):
    """Each program of a cluster stores pid + 1 into slot ``rank`` of its cluster's program 0's
    region (:mod:`iris_fw.dsmem`); program 0 stores the slots' sum and their product with the
    slot index into ``out[2 * cluster]`` and ``out[2 * cluster + 1]``. (``zeros``: 512 zeros
    summed across the warps, so Triton allocates shared memory — the region is found from it.)"""
    pid = tl.program_id(0)
    nothing = tl.sum(tl.load(zeros + tl.arange(0, 512)))
    rank = pid % CLUSTER
    dsmem.arrive(True)
    base = dsmem.region(CLUSTER * 4)
    one = tl.arange(0, 2)
    dsmem.wait()
    dsmem.store_remote(base + rank * 4 + one * 0, (pid + 1 + one * 0).to(tl.float32), 0, one == 0)
    dsmem.arrive(False)
    dsmem.wait()
    if rank == 0:
        i = tl.arange(0, CLUSTER)
        got = dsmem.load_local(base + i * 4, tl.float32)
        tl.store(out + 2 * (pid // CLUSTER), tl.sum(got) + nothing)
        tl.store(out + 2 * (pid // CLUSTER) + 1, tl.sum(got * i.to(tl.float32)))


@pytest.mark.parametrize("cluster", [2, 4, 8, 16])
def test_clustered_launch_exchanges_through_shared_memory(cluster):
    """On an sm_90+ GPU: a kernel launched in clusters of 2-16 programs (16: CUDA's non-portable
    size) exchanges values through distributed shared memory — every cluster's program 0 sees
    each program's value in its slot — launched again through the cached entry and inside a
    CUDA graph replay."""
    if iris_fw.interpreting() or not lmod.cluster_launch_supported(torch.device("cuda")):
        pytest.skip("thread-block clusters need a compiled kernel on an NVIDIA GPU of compute capability 9.0+")
    clusters = 12
    lau = KernelLauncher(_cluster_sum, (cluster * clusters,), constexprs={"CLUSTER": cluster}, num_warps=4,
                         cluster=cluster, cluster_shared=cluster * 4)
    want = torch.empty(2 * clusters, dtype=torch.float64)
    for c in range(clusters):
        ids = torch.arange(c * cluster + 1, (c + 1) * cluster + 1, dtype=torch.float64)
        want[2 * c], want[2 * c + 1] = ids.sum(), (ids * torch.arange(cluster, dtype=torch.float64)).sum()
    out = torch.full((2 * clusters,), float("nan"), device="cuda")
    zeros = torch.zeros(512, device="cuda")
    for _ in range(2):  # the first call compiles; the second takes the cached entry
        out.fill_(float("nan"))
        lau(out, zeros)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu().double(), want), (out, want)
    assert lau.slow_calls == 1 and len(lau.variants()) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lau(out, zeros)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu().double(), want)
