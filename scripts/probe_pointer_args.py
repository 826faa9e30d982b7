"""Host time of a prepared launch whose pointer arguments are tensors vs their ``data_ptr()`` ints.

    python3 scripts/probe_pointer_args.py [--calls 200] [--rounds 7]

The driver's launcher (Triton 3.6's generated C launcher, 3.9's ``driver.c``) calls a tensor's
``data_ptr()`` and asks the driver (``cuPointerGetAttribute``) about the pointer on every launch;
an int it takes as the pointer. :class:`~iris_fw.kernel_launcher.PreparedLaunch` passes ints
(its tensors were checked by its first launch). This probe times the resolved launch entry
called both ways, interleaved round by round, for kernels of 1, 4 and 8 pointer arguments:
enqueue-only µs per launch, median over rounds. Prints one line per case (GPU only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl

from iris_fw.kernel_launcher import KernelLauncher


@triton.jit
def _one_kernel(a, BLOCK: tl.constexpr):
    tl.store(a + tl.arange(0, BLOCK), tl.zeros((BLOCK,), dtype=tl.float32))


@triton.jit
def _four_kernel(a, b, c, d, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(d + offs, tl.load(a + offs, mask=m) + tl.load(b + offs, mask=m) + tl.load(c + offs, mask=m), mask=m)


@triton.jit
def _eight_kernel(a, b, c, d, e, f, g, h, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    s = tl.load(a + offs, mask=m) + tl.load(b + offs, mask=m) + tl.load(c + offs, mask=m)
    s += tl.load(d + offs, mask=m) + tl.load(e + offs, mask=m) + tl.load(f + offs, mask=m)
    tl.store(h + offs, s + tl.load(g + offs, mask=m), mask=m)


def _timed(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    opts = p.parse_args()
    dev = torch.device("cuda", 0)
    ts = [torch.zeros(128, device=dev) for _ in range(8)]
    cases = {
        "1 pointer": (_one_kernel, (ts[0],)),
        "4 pointers + int": (_four_kernel, (*ts[:4], 128)),
        "8 pointers + int": (_eight_kernel, (*ts, 128)),
    }
    runs = {}
    for name, (kernel, args) in cases.items():
        prepared = KernelLauncher(kernel, (1,), constexprs={"BLOCK": 128}, num_warps=1).prepare(*args)
        prepared()
        prepared()
        ready = prepared._ready
        assert ready is not None, "the prepared launch did not resolve (not a fast-path Triton?)"
        launch, head, final, as_tuple = ready[0], ready[1], ready[2], ready[3]
        lau = prepared.launcher
        handle = torch.cuda.current_stream().cuda_stream
        as_tensors = lau.bound_args(args)

        def call(kargs, launch=launch, head=head, lau=lau, handle=handle, as_tuple=as_tuple):
            if as_tuple:
                return lambda: launch(lau._g0, lau._g1, lau._g2, handle, *head, kargs)
            return lambda: launch(lau._g0, lau._g1, lau._g2, handle, *head, *kargs)

        runs[f"{name}: tensors"] = call(as_tensors)
        runs[f"{name}: ints (prepared)"] = call(final)
        runs[f"{name}: PreparedLaunch()"] = prepared
    times = {k: [] for k in runs}
    names = list(runs)
    for r in range(opts.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(_timed(runs[k], opts.calls))
    print(f"# {torch.cuda.get_device_name(dev)}, triton {triton.__version__}, torch {torch.__version__}: "
          f"enqueue-only us per launch, median of {opts.rounds} rounds x {opts.calls}")
    for k in names:
        print(f"{k:40s} {statistics.median(times[k]):7.2f}   (min {min(times[k]):.2f})")


if __name__ == "__main__":
    main()
