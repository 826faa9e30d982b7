"""Probe of the ``nvshmem`` transport on this machine: run by scripts/gpu_nvshmem.sh under
``iris-fw launch -n W`` with ``IRIS_FW_TRANSPORT=nvshmem`` (and ``IRIS_FW_NVSHMEM_CALLS=auto|all``).

Each rank initialises an nvshmem context, then checks against torch references, with peer =
right neighbour (the rank itself at W = 1):

* put / get (``dv.put`` into the peer's heap, ``dv.get`` from it) for 8-, 16-, 32- and 64-bit
  elements (int8, bfloat16, float32, int64), ragged length, masked-off lanes poisoned and checked;
* atomics into rank 0's heap from every rank: int32 add (exact sum), float32 add (float64 sum),
  int32 max, int32 xchg into the right neighbour (the old values are the initial ones), int64 cas
  (succeeds once, then returns the stored value);
* signal / wait_until: the signal suite's ring (tests/test_signal.py): each round a put to the right
  neighbour, a signal, a wait for the left one's, mismatches counted on the device.

Then, with ``--time``, it times put and get bandwidth (1 MiB and 64 MiB of float32) and the ring's
round time (put + signal + wait). Rank 0 writes everything as JSON to ``--out``. Kernels take their
integer arguments unspecialized so that every world size reuses the compiled binaries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

import iris_fw
from iris_fw import device as dv
from iris_fw import env

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from test_signal import _ping_kernel as _ring_kernel  # noqa: E402  (the signal suite's message ring)

_BLOCK = 1024
_POISON = {torch.int8: -7, torch.bfloat16: -7.0, torch.float32: -7.0, torch.int64: -7}


@triton.jit(do_not_specialize=["n", "rank", "peer"])
def _rma_kernel(src, dst, out, n, rank, peer, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr):
    """``put``: ``src`` → ``peer``'s ``dst``; ``get``: ``peer``'s ``src`` → local ``out``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if OP == "put":
        dv.put(src + offs, dst + offs, rank, peer, heap_bases, mask=mask)
    else:
        dv.get(src + offs, out + offs, rank, peer, heap_bases, mask=mask)


@triton.jit(do_not_specialize=["n", "rank", "peer"])
def _rma_widths_kernel(s8, d8, o8, s16, d16, o16, s32, d32, o32, s64, d64, o64, n, rank, peer, heap_bases,
                       BLOCK: tl.constexpr):
    """put and get of 8-, 16-, 32- and 64-bit elements in one kernel (one compilation: with
    NVSHMEM calls each links NVSHMEM's device library)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dv.put(s8 + offs, d8 + offs, rank, peer, heap_bases, mask=mask)
    dv.get(s8 + offs, o8 + offs, rank, peer, heap_bases, mask=mask)
    dv.put(s16 + offs, d16 + offs, rank, peer, heap_bases, mask=mask)
    dv.get(s16 + offs, o16 + offs, rank, peer, heap_bases, mask=mask)
    dv.put(s32 + offs, d32 + offs, rank, peer, heap_bases, mask=mask)
    dv.get(s32 + offs, o32 + offs, rank, peer, heap_bases, mask=mask)
    dv.put(s64 + offs, d64 + offs, rank, peer, heap_bases, mask=mask)
    dv.get(s64 + offs, o64 + offs, rank, peer, heap_bases, mask=mask)


@triton.jit(do_not_specialize=["n", "rank", "peer", "target"])
def _atomics_kernel(iacc, facc, macc, xslots, cslots, ivals, fvals, iold, xold, cold, n, rank, peer, target,
                    heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    iv = tl.load(ivals + offs, mask=mask, other=0)
    fv = tl.load(fvals + offs, mask=mask, other=0.0)
    tl.store(iold + offs, dv.atomic_add(iacc + offs, iv, rank, target, heap_bases, mask=mask), mask=mask)
    dv.atomic_add(facc + offs, fv, rank, target, heap_bases, mask=mask)
    dv.atomic_max(macc + offs, iv, rank, target, heap_bases, mask=mask)
    tl.store(xold + offs, dv.atomic_xchg(xslots + offs, iv, rank, peer, heap_bases, mask=mask), mask=mask)
    if tl.program_id(0) == 0:
        zero = (rank * 0).to(tl.int64)
        first = dv.atomic_cas(cslots + rank, zero, (rank + 1).to(tl.int64), rank, target, heap_bases)
        second = dv.atomic_cas(cslots + rank, zero, (rank + 100).to(tl.int64), rank, target, heap_bases)
        tl.store(cold, first)
        tl.store(cold + 1, second)


def _data(n, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).to(device)
    lo, hi = (-128, 128) if dtype == torch.int8 else (-(1 << 62), 1 << 62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype).to(device)


def _grid(n):
    return (triton.cdiv(n, _BLOCK),)


def check_rma(ctx, seed):
    """put and get of every element width, ragged length; returns a list of failures."""
    W, me = ctx.world_size, ctx.rank
    right, left = (me + 1) % W, (me - 1) % W
    n = 3 * _BLOCK + 77
    n_alloc = _grid(n)[0] * _BLOCK
    dtypes = (torch.int8, torch.bfloat16, torch.float32, torch.int64)
    data = {dt: [_data(n_alloc, dt, seed + 10 * k + r, ctx.device) for r in range(W)] for k, dt in enumerate(dtypes)}
    bufs = {dt: (ctx.as_symmetric(data[dt][me]), ctx.full((n_alloc,), _POISON[dt], dtype=dt),
                 torch.full((n_alloc,), _POISON[dt], dtype=dt, device=ctx.device)) for dt in dtypes}
    ctx.barrier()
    _rma_widths_kernel[_grid(n)](*[b for dt in dtypes for b in bufs[dt]], n, me, right, ctx.heap_bases, BLOCK=_BLOCK)
    ctx.barrier()
    bad = []
    for dt in dtypes:
        _, dst, out = bufs[dt]
        poison = torch.full((n_alloc - n,), _POISON[dt], dtype=dt, device=ctx.device)
        if not torch.equal(dst[:n], data[dt][left][:n]):
            bad.append(f"put {dt}: {int((dst[:n] != data[dt][left][:n]).sum())} of {n} wrong")
        if not torch.equal(out[:n], data[dt][right][:n]):
            bad.append(f"get {dt}: {int((out[:n] != data[dt][right][:n]).sum())} of {n} wrong")
        if not (torch.equal(dst[n:], poison) and torch.equal(out[n:], poison)):
            bad.append(f"put/get {dt}: masked-off lanes were written")
    ctx.barrier()
    return bad


def check_atomics(ctx, seed):
    W, me = ctx.world_size, ctx.rank
    right, left = (me + 1) % W, (me - 1) % W
    n = _BLOCK + 45  # two programs, the second ragged; at calls=all each element is one serial atomic
    n_alloc = _grid(n)[0] * _BLOCK
    ivals = [_data(n_alloc, torch.int64, seed + r, "cpu").remainder(1 << 20).to(torch.int32) for r in range(W)]
    fvals = [_data(n_alloc, torch.float32, seed + 100 + r, "cpu") for r in range(W)]
    lowest = torch.iinfo(torch.int32).min
    iacc, facc = ctx.zeros(n_alloc, dtype=torch.int32), ctx.zeros(n_alloc, dtype=torch.float32)
    macc = ctx.full((n_alloc,), lowest, dtype=torch.int32)
    xslots = ctx.full((n_alloc,), -5, dtype=torch.int32)
    cslots = ctx.zeros(W, dtype=torch.int64)
    iold = torch.full((n_alloc,), -9, dtype=torch.int32, device=ctx.device)
    xold = torch.full((n_alloc,), -9, dtype=torch.int32, device=ctx.device)
    cold = torch.full((2,), -9, dtype=torch.int64, device=ctx.device)
    ctx.barrier()
    _atomics_kernel[_grid(n)](iacc, facc, macc, xslots, cslots, ivals[me].to(ctx.device), fvals[me].to(ctx.device),
                              iold, xold, cold, n, me, right, 0, ctx.heap_bases, BLOCK=_BLOCK)
    ctx.barrier()
    bad = []
    if me == 0:
        isum = sum(v[:n].to(torch.int64) for v in ivals)
        fsum = sum(v[:n].to(torch.float64) for v in fvals)
        imax = torch.stack([v[:n] for v in ivals]).amax(0)
        if not torch.equal(iacc[:n].cpu().to(torch.int64), isum):
            bad.append("atomic_add int32: wrong sums")
        if not torch.allclose(facc[:n].cpu().to(torch.float64), fsum, rtol=1e-6, atol=1e-5):
            bad.append(f"atomic_add float32: max error {float((facc[:n].cpu().double() - fsum).abs().max()):.3g}")
        if not torch.equal(macc[:n].cpu(), imax):
            bad.append("atomic_max int32: wrong maxima")
        if cslots.cpu().tolist() != [r + 1 for r in range(W)]:
            bad.append(f"atomic_cas int64: slots {cslots.cpu().tolist()}, expected {[r + 1 for r in range(W)]}")
        if n_alloc > n and not (torch.equal(iacc[n:].cpu(), torch.zeros(n_alloc - n, dtype=torch.int32))
                                and bool((macc[n:] == lowest).all())):
            bad.append("atomics: masked-off lanes were changed")
    if W == 1 and not torch.equal(iold[:n].cpu(), torch.zeros(n, dtype=torch.int32)):
        bad.append("atomic_add int32: old values are not the initial zeros")
    if not (torch.equal(xold[:n].cpu(), torch.full((n,), -5, dtype=torch.int32))
            and torch.equal(xslots[:n].cpu(), ivals[left][:n])):
        bad.append("atomic_xchg int32: wrong old or new values")
    if cold.cpu().tolist() != [0, me + 1]:
        bad.append(f"atomic_cas int64: returned {cold.cpu().tolist()}, expected [0, {me + 1}]")
    ctx.barrier()
    return bad


def ring(ctx, seed, rounds, n=_BLOCK - 5):
    """The signal ring (``rounds`` rounds): (mismatches, seconds of the kernel)."""
    data = ctx.as_symmetric(_data(_BLOCK, torch.int64, seed + ctx.rank, "cpu").remainder(1 << 30).to(torch.int32)
                            .to(ctx.device))
    box = ctx.full((_BLOCK,), -1, dtype=torch.int32)
    flag = ctx.zeros(3, dtype=torch.int64)
    ctx.barrier()
    t = time.perf_counter()
    _ring_kernel[(1,)](data, box, flag, n, rounds, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=_BLOCK)
    ctx.synchronize()
    seconds = time.perf_counter() - t  # one launch: its launch overhead is spread over the rounds
    ctx.barrier()
    flags = flag.cpu().tolist()
    wrong = flags[1] + (0 if flags[0] == rounds and flags[2] == rounds else 1)
    return wrong, seconds


def time_rma(ctx, nbytes, op, iters):
    """Seconds per ``op`` (put / get) of ``nbytes`` of float32 with the right neighbour."""
    n = nbytes // 4
    src = ctx.zeros(n, dtype=torch.float32)
    dst = ctx.zeros(n, dtype=torch.float32)
    out = torch.empty(n, dtype=torch.float32, device=ctx.device)
    peer = (ctx.rank + 1) % ctx.world_size
    launch = lambda: _rma_kernel[_grid(n)](src, dst, out, n, ctx.rank, peer, ctx.heap_bases, OP=op, BLOCK=_BLOCK)
    launch()
    ctx.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        launch()
    end.record()
    ctx.barrier()
    return start.elapsed_time(end) / 1e3 / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--time", action="store_true", help="also time put/get bandwidth and the ring's latency")
    parser.add_argument("--heap-mib", type=int, default=512)
    args = parser.parse_args()
    t0 = time.time()
    ctx = iris_fw.init(heap_size=args.heap_mib << 20)
    tr = ctx.transport
    gpu = ctx.device.type == "cuda"  # (on CPU ranks, host_shm, the checks run too: a test of this script)
    result = {"world_size": ctx.world_size, "transport": tr.name,
              "device": torch.cuda.get_device_name(ctx.device) if gpu else "cpu",
              "calls_env": env.get("IRIS_FW_NVSHMEM_CALLS"), "call_mode": ctx.heap_bases.NVSHMEM_CALLS.value,
              "nvshmem_version": ".".join(map(str, getattr(tr, "version", ()))), "unmapped": getattr(tr, "unmapped", []),
              "mapped": [bool(b) for b in tr.bases], "init_s": round(time.time() - t0, 2), "checks": {}}
    seed = int(os.environ.get("PROBE_SEED", str(time.time_ns() % (1 << 30))))
    seed = ctx.bootstrap.broadcast(seed, 0)  # one seed for every rank
    for name, fn in (("put/get", lambda: check_rma(ctx, seed)), ("atomics", lambda: check_atomics(ctx, seed)),
                     ("signal ring", lambda: [f"{w} wrong" for w in [ring(ctx, seed, 20)[0]] if w])):
        t = time.time()
        try:
            failures = fn()
        except Exception:  # one broken check must not hide the others' results
            failures = [traceback.format_exc(limit=6)]
        everyone = ctx.bootstrap.all_gather(failures)
        result["checks"][name] = {"ok": not any(everyone), "seconds": round(time.time() - t, 2),
                                  "failures": {r: f for r, f in enumerate(everyone) if f}}
    if args.time and gpu:
        timing = {}
        for nbytes in (1 << 20, 64 << 20):
            for op in ("put", "get"):
                s = time_rma(ctx, nbytes, op, iters=20 if nbytes > (1 << 20) else 200)
                timing[f"{op} {nbytes >> 20} MiB GB/s"] = round(nbytes / s / 1e9, 2)
        rounds = 2000
        _, s = ring(ctx, seed, rounds)
        timing["signal ring round us"] = round(s / rounds * 1e6, 3)
        result["timing"] = timing
    result["total_s"] = round(time.time() - t0, 2)
    if ctx.rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result), flush=True)
    ok = all(c["ok"] for c in result["checks"].values())
    ctx.close()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
