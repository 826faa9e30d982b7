"""Where flash-decode's local kernel spends its time at batch 1 (issue 32), program by program:
its own trace (:mod:`iris_fw.trace`) of one call at B 1 x S tokens (default 16384), 32 q / 8 kv
heads, D 128, bf16, on one rank. Nsight Compute (run 52) found the SMs idle for 29 % of the
kernel's cycles (cuDNN's SDPA: 20 %); this shows when each program starts, reads its split and
ends, and how long each unit's last split combines the partials.

    python3 scripts/probe_fd_program_spans.py [S [ROW]]

``ROW``: JSON fields replacing the tuning row's for this call (as scripts/probe_fd_small_batch.py,
e.g. ``'{"combine_unroll": 16}'``), else the table's row.

Prints, over the programs of one traced call (after an untraced one): the kernel's window (first start to last
end), each program's start after the window opens, its attention time and its end before the
window closes (min / median / max), and the combines' times; the idle share is 1 - the mean
program span / the window. Times from the device clock the trace records (µs).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace

import iris_fw
import torch

from iris_fw import flash_decode as fd


def _spread(values) -> str:
    values = sorted(values)
    return f"{values[0]:.2f} / {statistics.median(values):.2f} / {values[-1]:.2f}" if values else "-"


def traced_calls(ctx, batch: int, tokens: int, fields: dict, calls: int):
    """``(plan, events)``: the table row's plan (``fields`` replacing its fields for this many
    units) at B ``batch`` x ``tokens`` tokens, 32 q / 8 kv heads, D 128, bf16, run once untraced
    and then ``calls`` times traced, one trace session a call; ``events``, per call, the local
    kernel's complete events (each call's result checked bitwise against the untraced one's)."""
    dev = ctx.device
    g = torch.Generator(device=dev).manual_seed(batch * 7 + tokens)
    q = torch.randn(batch, 32, 128, generator=g, device=dev).to(torch.bfloat16)
    k = torch.randn(batch, tokens, 8, 128, generator=g, device=dev).to(torch.bfloat16)
    v = torch.randn(batch, tokens, 8, 128, generator=g, device=dev).to(torch.bfloat16)
    plan = fd.plan(q, k, v, scheduler="bulk_sync", ctx=ctx)
    if fields:
        plan = fd.FlashDecode(plan.group, plan.call, replace(plan.tune, by_units=(), **fields))
    plain = plan(q, k, v).clone()
    events = []
    for _ in range(calls):
        with ctx.trace(None, label="fd spans") as session:  # one call a session: every event is its
            got = plan(q, k, v)
            ctx.synchronize()
        assert torch.equal(plain, got), "traced result differs"
        events.append([e for e in session.trace["traceEvents"] if e.get("ph") == "X"
                       and e["args"].get("kernel") == "flash_decode.bulk_sync local"])
    return plan, events


def main() -> int:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    fields = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else {}
    with iris_fw.init(heap_size=1 << 26, bootstrap="single") as ctx:
        plan, (events,) = traced_calls(ctx, 1, tokens, fields, 1)
        print(plan, plan.constexprs, flush=True)
    spans = [e for e in events if e["name"] == "program"]
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    window = t1 - t0
    mine = [e for e in events if e["name"] != "program"]
    attention = [e["dur"] for e in mine if e["name"] == "attention"]
    reduces = [e for e in mine if e["name"] == "reduce"]
    print(f"B 1 x {tokens}: {len(spans)} programs in the call's window of {window:.2f} us")
    print(f"  program start after the window opens (min / median / max): {_spread([e['ts'] - t0 for e in spans])}")
    print(f"  program end before the window closes: {_spread([t1 - e['ts'] - e['dur'] for e in spans])}")
    print(f"  program span: {_spread([e['dur'] for e in spans])}")
    print(f"  attention per work item: {_spread(attention)} ({len(attention)} items)")
    print(f"  splits' combine per unit: {_spread([e['dur'] for e in reduces])} ({len(reduces)} units), "
          f"ending {_spread([t1 - e['ts'] - e['dur'] for e in reduces])} before the window closes")
    busy = sum(e["dur"] for e in spans) / len(spans)
    print(f"  idle share of the window (1 - mean span / window, {len(spans)} programs): {1 - busy / window:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
