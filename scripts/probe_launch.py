"""GPU check of the lean launch path (iris_fw.kernel_launcher.KernelLauncher).

    python3 scripts/probe_launch.py --out DIR

For four kernels (pointers + ints; a tuple and a NamedTuple argument rebuilt in the kernel as
``ARGS(op0, op1, *rest)``; two TMA TensorDescriptors first; 20 mixed arguments) it checks that

* launches through the launcher are bit-identical to ``kernel[grid](...)`` with fresh inputs
  each round, and that after the first call they take the fast path (no further slow calls);
* a change of pointer alignment / int specialization (value 1, divisibility by 16, i64) /
  None-ness goes to a new compiled variant, and alternating between them stays correct;
* launches captured in a ``torch.cuda.CUDAGraph`` replay correctly with new input values;
* with a launch-enter hook set, calls go through Triton (the hook sees them);
* with 2+ GPUs, a launch on another device gets its own variant and is correct there;

then measures host time per launch (enqueue only: N launches timed with ``time.perf_counter``,
no synchronization inside the loop) for ``kernel[grid](...)``, the launcher, and the floor
(calling ``CompiledKernel.run`` directly with everything precomputed). Prints a table, writes
``DIR/probe_launch.json``, exits 1 if any correctness check failed (listed as FAIL lines).
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import triton
import triton.language as tl

BLOCK = 256

# ---------------------------------------------------------------------------------------------
# Kernels (module level, importable without torch, so that they can be compile-checked)
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_plain(x_ptr, y_ptr, out_ptr, n, scale_i, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x * scale_i + y, mask=m)


class RebuildArgs(NamedTuple):
    a: object
    b: object
    out: object
    n: int
    s: float


class Extra(NamedTuple):
    bias: object
    k: int


@triton.jit
def k_rebuild(op0, op1, rest, extra, ARGS: tl.constexpr, BLOCK: tl.constexpr):
    args = ARGS(op0, op1, *rest)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < args.n
    v = tl.load(args.a + offs, mask=m) * args.s + tl.load(args.b + offs, mask=m)
    v += tl.load(extra.bias + offs, mask=m) * extra.k
    tl.store(args.out + offs, v, mask=m)


@triton.jit
def k_tma(a_desc, o_desc, b_ptr, M, N, stride_b, scale, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a = a_desc.load([pid_m * BM, pid_n * BN])
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    msk = (rm[:, None] < M) & (rn[None, :] < N)
    b = tl.load(b_ptr + rm[:, None] * stride_b + rn[None, :], mask=msk, other=0.0)
    v = a.to(tl.float32) * scale + b.to(tl.float32)
    o_desc.store([pid_m * BM, pid_n * BN], v.to(tl.float16))


@triton.jit
def k_many(x0, x1, x2, x3, out0, out1, bias, n, i_one, i_mul, stride, off, f0, f1, f2, flag, pair, h0, n2, tag,
           BLOCK: tl.constexpr, RELU: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x0 + offs, mask=m) * f0 + tl.load(x1 + offs, mask=m) * f1
    v += tl.load(x2 + offs, mask=m).to(tl.float32) * f2
    v += tl.load(x3 + offs, mask=m).to(tl.float32) * i_mul
    v += tl.load(pair[0] + offs, mask=m) * pair[1]
    if bias is not None:
        v += tl.load(bias + offs, mask=m)
    v = v * i_one
    v += (tag % 7).to(tl.float32)
    if flag:
        v = -v
    if RELU:
        v = tl.maximum(v, 0.0)
    tl.store(out0 + offs, v, mask=m)
    tl.store(out1 + offs * stride + off, v.to(tl.float16), mask=m)
    tl.store(h0 + offs, offs.to(tl.int64) + n2, mask=m)


# ---------------------------------------------------------------------------------------------
# Cases: how to make arguments, which are outputs
# ---------------------------------------------------------------------------------------------


class Case:
    """A kernel, its launch configuration and a maker of (args, outputs) on a device."""

    def __init__(self, name, kernel, grid, constexprs, make, opts=None):
        self.name, self.kernel, self.grid, self.constexprs, self.make = name, kernel, grid, constexprs, make
        self.opts = opts or {}


def _cases(torch):
    def rnd(shape, dtype, dev, gen):
        if dtype.is_floating_point:
            return (torch.randn(shape, generator=gen, device=dev) * 4).to(dtype)
        shape = shape if isinstance(shape, tuple) else (shape,)
        return torch.randint(-1000, 1000, shape, generator=gen, device=dev, dtype=dtype)

    def plain(dev, gen, n=5000, scale=3, misalign=False):
        x = rnd(n + 4, torch.float32, dev, gen)
        x = x[1:n + 1] if misalign else x[:n]
        y = rnd(n, torch.float32, dev, gen)
        out = torch.zeros(n, device=dev)
        return (x, y, out, n, scale), [out]

    def rebuild(dev, gen, n=4000, k=2):
        a, b, bias = (rnd(n, torch.float32, dev, gen) for _ in range(3))
        out = torch.zeros(n, device=dev)
        return (a, b, (out, n, 0.75), Extra(bias, k)), [out]

    def tma(dev, gen, M=256, N=192):
        from triton.tools.tensor_descriptor import TensorDescriptor

        a = rnd((M, N), torch.float16, dev, gen)
        b = rnd((M, N), torch.float16, dev, gen)
        o = torch.zeros(M, N, device=dev, dtype=torch.float16)
        return (TensorDescriptor.from_tensor(a, [64, 64]), TensorDescriptor.from_tensor(o, [64, 64]),
                b, M, N, b.stride(0), 0.5), [o]

    def many(dev, gen, n=3000, i_one=3, bias=True, misalign=False, tag=5, flag=False):
        f32 = torch.float32
        x0 = rnd(n + 4, f32, dev, gen)
        x0 = x0[1:n + 1] if misalign else x0[:n]
        x1 = rnd(n, f32, dev, gen)
        x2 = rnd(n, torch.float16, dev, gen)
        x3 = rnd(n, torch.int32, dev, gen)
        p = rnd(n, f32, dev, gen)
        out0 = torch.zeros(n, device=dev)
        out1 = torch.zeros(2 * n + 16, device=dev, dtype=torch.float16)
        h0 = torch.zeros(n, device=dev, dtype=torch.int64)
        bias_t = rnd(n, f32, dev, gen) if bias else None
        args = (x0, x1, x2, x3, out0, out1, bias_t, n, i_one, 4, 2, 16, 0.5, -1.25, 2.0, flag, (p, 0.125), h0,
                7, tag)
        return args, [out0, out1, h0]

    return [
        Case("plain", k_plain, (20,), {"BLOCK": BLOCK}, plain, {"num_warps": 4}),
        Case("rebuild", k_rebuild, (16,), {"ARGS": RebuildArgs, "BLOCK": BLOCK}, rebuild),
        Case("tma", k_tma, (4, 3), {"BM": 64, "BN": 64}, tma, {"num_warps": 4}),
        Case("many20", k_many, (12,), {"BLOCK": BLOCK, "RELU": False}, many, {"num_warps": 4, "num_stages": 2}),
    ]


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.checks, self.timing, self.info = [], [], {}

    def check(self, name, ok, detail=""):
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def guarded(self, name, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self.check(name, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    @property
    def failed(self):
        return [c["name"] for c in self.checks if not c["ok"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for probe_launch.json")
    ap.add_argument("--launches", type=int, default=500, help="launches per timing round")
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds (median and min reported)")
    opts = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("probe_launch: no CUDA GPU visible", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("probe_launch: TRITON_INTERPRET is set; unset it", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from iris_fw import kernel_launcher as lmod
    from iris_fw.kernel_launcher import KernelLauncher

    rep = Report()
    rep.info = {"triton": triton.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
                "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                "fast_path_supported": lmod.fast_path_supported(triton.__version__)}
    print(json.dumps(rep.info), flush=True)
    rep.check("fast path supported on this Triton", rep.info["fast_path_supported"], triton.__version__)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    cases = _cases(torch)
    gen = torch.Generator(device=dev)

    def fresh(case, seed, device=dev, **kw):
        g = gen if device == dev else torch.Generator(device=device)
        g.manual_seed(seed)
        return case.make(device, g, **kw)

    def direct(case, lau, args):
        case.kernel[case.grid](*lau.bound_args(args), **case.opts)

    def same(outs_a, outs_b):
        return all(torch.equal(a, b) for a, b in zip(outs_a, outs_b))

    def nonzero(outs):
        return all(bool(o.abs().sum() > 0) for o in outs)

    launchers = {}

    # -- 1. fast == slow, fresh inputs, fast path taken --------------------------------------
    def equality(case):
        lau = KernelLauncher(case.kernel, case.grid, constexprs=case.constexprs, **case.opts)
        launchers[case.name] = lau
        bad = []
        for r in range(6):
            args_f, outs_f = fresh(case, 100 + r)
            args_s, outs_s = fresh(case, 100 + r)
            lau(*args_f)
            direct(case, lau, args_s)
            torch.cuda.synchronize()
            if not same(outs_f, outs_s) or not nonzero(outs_f):
                bad.append(r)
        rep.check(f"{case.name}: launcher == kernel[grid] over 6 rounds of fresh inputs", not bad,
                  f"rounds differing: {bad}" if bad else "")
        rep.check(f"{case.name}: fast path taken after the first call", lau._state is not None and lau.slow_calls == 1,
                  f"slow calls {lau.slow_calls} of 6, variants {len(lau.variants())}, "
                  f"levels {sorted(set(lau.fast_levels().values()))}")

    for case in cases:
        rep.guarded(f"{case.name}: equality", lambda: equality(case))

    # -- 2. specialization changes go to new variants -----------------------------------------
    def variants(case, variations):
        lau = KernelLauncher(case.kernel, case.grid, constexprs=case.constexprs, **case.opts)
        seen = []
        for label, kw in variations:
            args, outs = fresh(case, 7, **kw)
            before = len(lau.variants())
            lau(*args)
            new = [k for k in lau.variants().values() if all(k is not s for s in seen)]
            ok = len(lau.variants()) == before + 1 and len(new) == 1
            rep.check(f"{case.name}: '{label}' compiles/uses a new variant", ok,
                      f"variants {before} -> {len(lau.variants())}")
            seen.extend(new)
        hashes = {getattr(k, "hash", id(k)) for k in seen}
        rep.check(f"{case.name}: the variants are distinct compiled kernels", len(hashes) == len(seen),
                  f"{len(hashes)} hashes for {len(seen)} variants")
        slow_before, bad = lau.slow_calls, []
        for rnd_ in range(3):  # alternate: each call must pick its own variant
            for i, (label, kw) in enumerate(variations):
                args_f, outs_f = fresh(case, 200 + 10 * rnd_ + i, **kw)
                args_s, outs_s = fresh(case, 200 + 10 * rnd_ + i, **kw)
                lau(*args_f)
                direct(case, lau, args_s)
                torch.cuda.synchronize()
                if not same(outs_f, outs_s):
                    bad.append(f"{label}@{rnd_}")
        extra = lau.slow_calls - slow_before
        rep.check(f"{case.name}: alternating variants stay bit-identical and fast", not bad and not extra,
                  f"differing: {bad}; extra slow calls {extra}")

    by_name = {c.name: c for c in cases}
    rep.guarded("plain: variants", lambda: variants(by_name["plain"], [
        ("aligned, n % 16 == 8, scale 3", dict(n=5000, scale=3)),
        ("x misaligned by 4 bytes", dict(n=5000, scale=3, misalign=True)),
        ("n divisible by 16", dict(n=4096, scale=3)),
        ("scale == 1 (constexpr 1)", dict(n=5000, scale=1)),
        ("scale == 32 (divisible by 16)", dict(n=5000, scale=32)),
    ]))
    rep.guarded("many20: variants", lambda: variants(by_name["many20"], [
        ("base", dict()),
        ("x0 misaligned", dict(misalign=True)),
        ("i_one == 1", dict(i_one=1)),
        ("bias None", dict(bias=False)),
        ("tag needs i64", dict(tag=(1 << 40) + 5)),
    ]))

    def bool_runtime():  # Triton does not specialize a runtime bool: both values share a variant
        case = by_name["many20"]
        lau = KernelLauncher(case.kernel, case.grid, constexprs=case.constexprs, **case.opts)
        bad = []
        for i, flag in enumerate([False, True, False, True]):
            args_f, outs_f = fresh(case, 300 + i, flag=flag)
            args_s, outs_s = fresh(case, 300 + i, flag=flag)
            lau(*args_f)
            direct(case, lau, args_s)
            torch.cuda.synchronize()
            if not same(outs_f, outs_s):
                bad.append(i)
        rep.check("many20: runtime bool flips stay on one variant, bit-identical", not bad and lau.slow_calls == 1
                  and len(lau.variants()) == 1, f"differing {bad}, slow calls {lau.slow_calls}")

    rep.guarded("many20: bool", bool_runtime)

    # -- 3. CUDA graphs -----------------------------------------------------------------------
    def graph(case):
        lau = launchers.get(case.name) or KernelLauncher(case.kernel, case.grid, constexprs=case.constexprs,
                                                         **case.opts)
        args, outs = fresh(case, 400)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (and compile) outside the capture
            lau(*args)
            lau(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        slow_before = lau.slow_calls
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            lau(*args)
        rep.check(f"{case.name}: capture used the fast path", lau.slow_calls == slow_before,
                  f"slow calls during capture: {lau.slow_calls - slow_before}")
        bad = []
        for r in range(3):
            new_args, _ = fresh(case, 500 + r)
            for a, b in zip(_tensors(args), _tensors(new_args)):  # new input values, same buffers
                a.copy_(b)
            for o in outs:
                o.zero_()
            torch.cuda.synchronize()
            g.replay()
            torch.cuda.synchronize()
            got = [o.clone() for o in outs]
            for o in outs:
                o.zero_()
            direct(case, lau, args)
            torch.cuda.synchronize()
            if not same(got, outs) or not nonzero(got):
                bad.append(r)
        rep.check(f"{case.name}: CUDA graph replays == kernel[grid] with new inputs", not bad,
                  f"replays differing or empty: {bad}" if bad else "")
        del g

    def _tensors(args):
        from triton.tools.tensor_descriptor import TensorDescriptor

        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, TensorDescriptor):
                out.append(a.base)
            elif isinstance(a, tuple):
                out.extend(_tensors(a))
        return out

    for case in cases:
        rep.guarded(f"{case.name}: graph", lambda: graph(case))

    # -- 4. launch hooks go through Triton ----------------------------------------------------
    def hooks():
        case = by_name["plain"]
        lau = launchers["plain"]
        args, outs = fresh(case, 600)
        lau(*args)
        seen = []
        hook = lambda meta: seen.append(meta)  # noqa: E731
        knobs = triton.knobs.runtime
        knobs.launch_enter_hook.add(hook)
        try:
            before = lau.slow_calls
            for _ in range(3):
                lau(*args)
            rep.check("hooks: with a launch_enter_hook set, calls go through Triton and reach it",
                      len(seen) == 3 and lau.slow_calls == before + 3, f"hook calls {len(seen)}")
        finally:
            knobs.launch_enter_hook.remove(hook)
        before = lau.slow_calls
        lau(*args)
        torch.cuda.synchronize()
        rep.check("hooks: removed again, the fast path resumes", lau.slow_calls == before)

    rep.guarded("hooks", hooks)

    # -- 5. another device ----------------------------------------------------------------------
    def other_device():
        case = by_name["many20"]
        lau = launchers["many20"]
        d1 = torch.device("cuda", 1)
        n_before = len(lau.variants())
        with torch.cuda.device(d1):
            bad = []
            for r in range(3):
                args_f, outs_f = fresh(case, 700 + r, device=d1)
                args_s, outs_s = fresh(case, 700 + r, device=d1)
                lau(*args_f)
                direct(case, lau, args_s)
                torch.cuda.synchronize(d1)
                if not same(outs_f, outs_s) or not nonzero(outs_f):
                    bad.append(r)
        rep.check("device 1: launcher == kernel[grid] on cuda:1", not bad, f"differing {bad}" if bad else "")
        rep.check("device 1: its own variant", len(lau.variants()) == n_before + 1,
                  f"variants {n_before} -> {len(lau.variants())}")
        args_f, outs_f = fresh(case, 800)
        args_s, outs_s = fresh(case, 800)
        slow = lau.slow_calls
        lau(*args_f)
        direct(case, lau, args_s)
        torch.cuda.synchronize()
        rep.check("device 0 again: fast and correct", same(outs_f, outs_s) and lau.slow_calls == slow)

    if torch.cuda.device_count() >= 2:
        rep.guarded("other device", other_device)
    else:
        print("(one GPU: the other-device check is skipped)")

    # -- 6. host time per launch ----------------------------------------------------------------
    def host_us(fn, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        torch.cuda.synchronize()
        return t / n * 1e6

    def timing(case):
        lau = KernelLauncher(case.kernel, case.grid, constexprs=case.constexprs, **case.opts)
        args, _ = fresh(case, 900)
        full = lau.bound_args(args)
        lau(*args)
        lau(*args)
        (launch, head, as_tuple, kernel), = lau._cache.values()
        g = case.grid + (1, 1)
        stream = torch.cuda.current_stream().cuda_stream
        run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        key_fn, opts_key, get_device, get_stream = lau._state[7], lau._opts_key(), lau._state[5], lau._state[6]
        fns = {
            "slow": lambda: case.kernel[case.grid](*full, **case.opts),
            "fast": lambda: lau(*args),
            "run_floor": lambda: run(g[0], g[1], g[2], stream, function, packed, None, None, None, *full),
            "launch_floor": ((lambda: launch(g[0], g[1], g[2], stream, *head, full)) if as_tuple
                             else (lambda: launch(g[0], g[1], g[2], stream, *head, *full))),
            "key_fn": lambda: key_fn(args, 0, opts_key),
            "dev_stream": lambda: get_stream(get_device()),
        }
        res = {name: [] for name in fns}
        for fn in fns.values():
            host_us(fn, 50)  # warm
        for _ in range(opts.rounds):
            for name, fn in fns.items():
                res[name].append(host_us(fn, opts.launches))
        row = {"kernel": case.name, "runtime_args": len(args), "launches": opts.launches, "rounds": opts.rounds,
               "fast_level": lau.fast_levels()[next(iter(lau._cache))]}
        for name, v in res.items():
            row[f"{name}_us_median"] = statistics.median(v)
            row[f"{name}_us_min"] = min(v)
        row["slow_calls_during_timing"] = lau.slow_calls - 1
        rep.timing.append(row)
        rep.check(f"{case.name}: timing loop stayed on the fast path", lau.slow_calls == 1,
                  f"slow calls {lau.slow_calls}")

    for case in cases:
        rep.guarded(f"{case.name}: timing", lambda: timing(case))

    print()
    print(f"host time per launch, us (median of {opts.rounds} rounds x {opts.launches} launches; min in brackets)")
    cols = [("slow", "kernel[grid]"), ("fast", "launcher"), ("run_floor", "run() floor"),
            ("launch_floor", "launch() floor"), ("key_fn", "key fn"), ("dev_stream", "device+stream")]
    print(f"{'kernel':8s} {'args':>4s} " + " ".join(f"{title:>16s}" for _, title in cols) + f" {'speedup':>8s}  level")
    for r in rep.timing:
        print(f"{r['kernel']:8s} {r['runtime_args']:4d} "
              + " ".join(f"{r[c + '_us_median']:8.2f} ({r[c + '_us_min']:5.2f})" for c, _ in cols)
              + f" {r['slow_us_median'] / r['fast_us_median']:7.1f}x  {r['fast_level']}")
    print("(run() floor: CompiledKernel.run with everything precomputed, what JITFunction.run ends in; "
          "launch() floor: the driver launcher's launch, what the launcher calls; key fn: its key alone; "
          "device+stream: Triton's current device and stream getters)")
    over = [r["kernel"] for r in rep.timing if r["fast_us_median"] > 15.0]
    print(f"target <= 15 us per launch through the launcher: {'met' if not over else 'missed by ' + ', '.join(over)}")

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"info": rep.info, "checks": rep.checks, "timing": rep.timing, "failed": rep.failed}
    (out / "probe_launch.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out / 'probe_launch.json'}")
    if rep.failed:
        print(f"\n{len(rep.failed)} check(s) FAILED:")
        for name in rep.failed:
            print(f"  FAIL {name}")
        return 1
    print(f"\nall {len(rep.checks)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
