"""Iris's ``iris.do_bench``: time ``fn`` on this rank, with a barrier and a preamble around
every call and the L2 cache flushed between calls (CUDA events on GPUs, the host clock on CPU
ranks)."""

from __future__ import annotations

import statistics
import time

import torch

#: Bytes written between timed calls so no call starts with the previous one's data in L2.
_FLUSH_BYTES = 256 << 20


def _quantiles(times: list[float], quantiles) -> float | list[float]:
    ordered = sorted(times)
    out = []
    for q in quantiles:
        if not 0 <= q <= 1:
            raise ValueError("Quantiles must be in the range [0, 1]")
        point = q * (len(ordered) - 1)
        low, high = int(point), min(int(point) + 1, len(ordered) - 1)
        out.append(ordered[low] + (point - low) * (ordered[high] - ordered[low]))
    return out[0] if len(out) == 1 else out


def do_bench(fn, barrier_fn=lambda: None, preamble_fn=lambda: None, n_warmup: int = 25, n_repeat: int = 100,
             quantiles=None, return_mode: str = "mean"):
    """Milliseconds per call of ``fn``: ``quantiles`` of the ``n_repeat`` timings if given, else
    their ``return_mode`` (``"mean"``, ``"min"``, ``"max"``, ``"median"`` or ``"all"``)."""
    if return_mode not in ("mean", "min", "max", "median", "all"):
        raise ValueError(f"return_mode must be mean, min, max, median or all, got {return_mode!r}")
    cuda = torch.cuda.is_available()
    flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if cuda else None
    barrier_fn()
    preamble_fn()
    fn()
    barrier_fn()
    times = []
    for i in range(n_warmup + n_repeat):
        barrier_fn()
        preamble_fn()
        if flush is not None:
            flush.zero_()
        barrier_fn()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            if i >= n_warmup:
                times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            if i >= n_warmup:
                times.append((time.perf_counter() - t0) * 1e3)
    barrier_fn()
    if cuda:
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in times]
    if quantiles is not None:
        return _quantiles(times, quantiles)
    return {"mean": statistics.mean, "min": min, "max": max, "median": statistics.median,
            "all": list}[return_mode](times)
