"""A program without a `with` block or close(): rank ``sys.argv[1]`` finishes first — normally,
or with an uncaught exception when ``sys.argv[2]`` is ``raise`` — the others a moment later
(tests/test_exit.py)."""

import sys
import time

import torch

import iris_fw
from iris_fw import ccl

ctx = iris_fw.init(heap_size=1 << 24)
t = torch.ones(8, device=ctx.device)
ccl.all_reduce(t)
assert t[0].item() == ctx.world_size
if ctx.rank == int(sys.argv[1]):
    if sys.argv[2:] == ["raise"]:
        raise RuntimeError("this rank's own bug")
else:
    time.sleep(2.0)
    print(f"rank {ctx.rank} ends after its peer", flush=True)
