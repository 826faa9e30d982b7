"""Why flash-decode's local kernel trails torch SDPA at small batches (issue 32): one call of each
at B x S tokens (``S`` or ``BxS``, default 1 x 4096), 32 q / 8 kv heads, D 128, bf16, for Nsight
Compute to profile side by side. Run under ncu (scripts/gpu_kernels.sh step ``fdncu``)::

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,... python3 scripts/probe_fd_small_batch.py [[B]xS] [ROW]

``ROW``: JSON fields replacing the tuning row's for this call (``iris_fw.flash_decode.Tuning``'s,
e.g. ``'{"swap_ab": true, "programs_per_sm": 3, "max_registers": 168, "items_per_program": 1,
"max_splits": 64}'``; ``FDNCU_ROW`` of scripts/gpu_kernels.sh), else the table's row.

Every kernel of the last round is one call: the split-KV kernel (``_flash_decode_kernel``)
and SDPA's kernels (names vary with torch's backend choice).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import iris_fw
import torch
import torch.nn.functional as F

from iris_fw import flash_decode as fd


def main() -> int:
    point = sys.argv[1] if len(sys.argv) > 1 else "4096"
    batch, tokens = (int(n) for n in point.split("x")) if "x" in point else (1, int(point))
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch, 32, 128, generator=g, device=dev).to(torch.bfloat16)
    k = torch.randn(batch, tokens, 8, 128, generator=g, device=dev).to(torch.bfloat16)
    v = torch.randn(batch, tokens, 8, 128, generator=g, device=dev).to(torch.bfloat16)
    kt, vt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    with iris_fw.init(heap_size=1 << 26, bootstrap="single") as ctx:
        plan = fd.plan(q, k, v, scheduler="bulk_sync", ctx=ctx)
        if len(sys.argv) > 2 and sys.argv[2]:  # the row's fields replaced (for this many units)
            tune = replace(plan.tune, by_units=(), **json.loads(sys.argv[2]))
            plan = fd.FlashDecode(plan.group, plan.call, tune)
        print(plan, flush=True)
        for _ in range(3):
            mine = plan.partial(q, k, v)
            ref = F.scaled_dot_product_attention(q.unsqueeze(2), kt, vt, enable_gqa=True)
        torch.cuda.synchronize()
        o, _ = plan.unpack(mine)
        err = (o.float() - ref.squeeze(2).float()).abs().max().item()
        print(f"B {batch} x {tokens}: max |fd - sdpa| = {err:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
