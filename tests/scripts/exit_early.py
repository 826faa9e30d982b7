"""Rank 1 calls os._exit(0) after set-up while rank 0 runs collectives (tests/test_exit.py)."""

import os
import time

import torch

import iris_fw
from iris_fw import ccl

ctx = iris_fw.init(heap_size=1 << 24)
t = torch.ones(8, device=ctx.device)
ccl.all_reduce(t)
if ctx.rank == 1:
    os._exit(0)
start = time.monotonic()
try:
    for _ in range(20):
        ccl.all_reduce(t)
    ctx.synchronize()
    print("SURVIVOR completed", flush=True)
except iris_fw.IrisError as exc:
    print(f"SURVIVOR failed after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}", flush=True)
    raise
