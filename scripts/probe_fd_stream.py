"""How fast one GPU streams a batch-1 KV cache with flash-decode's grids (issue 32): the K/V read
alone, no attention, to separate the streaming rate a grid and a load path reach from what the
split-KV kernel's math and combine add. At B 1 x S tokens (default 16K and 64K), 8 kv heads,
D 128, bf16 (the ``[B, S, Hkv, D]`` layout of ``iris-fw bench flash_decode``), every program sums
its K and V tiles (so no load is dropped) over:

* the plan's grid: ``units x splits`` programs, split ``s`` of a unit reading its contiguous
  run of ``BLOCK_N``-token tiles (16 splits: 128 programs, one per SM of the H200 but 4; 33: 264);
* the balanced grid: the 8 heads' tiles dealt out in equal contiguous runs over 132 (or 264)
  programs, a run crossing from one head into the next;
* pointer loads (``tl.load``, pipelined by Triton through ``cp.async``) or TMA loads (a tensor
  descriptor made on the device, ``tl.make_tensor_descriptor``), 2-5 stages, 4 or 8 warps.

Beside them torch SDPA (``enable_gqa``, K/V as ``[B, Hkv, S, D]``) and the table's
``FlashDecode.partial``. Method as scripts/tune_flash_decode.py: CUDA graphs of ``--calls``
calls over K/V copies beyond L2, replays interleaved, median µs per call, TB/s of K and V read.

    python3 scripts/probe_fd_stream.py [--tokens 16384 65536] [--out DIR]
    python3 scripts/probe_fd_stream.py --quick   # CPU smoke run (interpreter)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import iris_fw
import torch
import triton
import triton.language as tl
from iris_fw import devinfo
from iris_fw import flash_decode as fd
from iris_fw.bench.flash_decode import HEAD_DIM, KV_HEADS, Q_HEADS
from tune_flash_decode import ROTATE_BYTES, sdpa_replay  # (this folder leads sys.path)
from tune_gemm import graph_of, interleaved


@triton.jit
def _stream_kernel(k, v, out, seq, n_split, HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                   TMA: tl.constexpr, BALANCED: tl.constexpr):
    """Sum of program ``pid``'s K and V tiles of ``k, v [S, HKV, D]`` into ``out [programs, D]``.
    Not ``BALANCED``: unit ``pid // n_split``'s split ``pid % n_split`` (block-aligned runs);
    ``BALANCED``: the flat tiles ``[pid·T/P, (pid+1)·T/P)`` of all ``T`` (head-major) tiles."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tok = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    tpu = tl.cdiv(seq, BLOCK_N)  # tiles per head
    if BALANCED:
        total = tpu * HKV
        first = (pid * total) // nprog
        last = ((pid + 1) * total) // nprog
    else:
        u = pid // n_split
        s = pid % n_split
        chunk = tl.cdiv(tpu, n_split)
        first = u * tpu + tl.minimum(s * chunk, tpu)
        last = u * tpu + tl.minimum((s + 1) * chunk, tpu)
    if TMA:
        kd = tl.make_tensor_descriptor(k, shape=[seq, HKV * D], strides=[HKV * D, 1], block_shape=[BLOCK_N, D])
        vd = tl.make_tensor_descriptor(v, shape=[seq, HKV * D], strides=[HKV * D, 1], block_shape=[BLOCK_N, D])
    for f in range(first, last):
        head = f // tpu
        t0 = (f % tpu) * BLOCK_N
        if TMA:
            kt = kd.load([t0, head * D])
            vt = vd.load([t0, head * D])
        else:
            off = (t0 + tok[:, None]).to(tl.int64) * (HKV * D) + head * D + d[None, :]
            live = (t0 + tok[:, None]) < seq
            kt = tl.load(k + off, mask=live, other=0.0)
            vt = tl.load(v + off, mask=live, other=0.0)
        acc += kt.to(tl.float32) + vt.to(tl.float32)
    tl.store(out + pid * D + d, tl.sum(acc, axis=0))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT") or "fd-stream")
    return p.parse_args(argv)


def variants(sms: int, quick: bool):
    """(name, programs, splits, block_n, warps, stages, tma, balanced)."""
    if quick:
        return [("plan_p16_bn16_tma", 4, 2, 16, 4, 1, True, False), ("bal_p3_bn16", 3, 0, 16, 4, 1, False, True)]
    out = []
    for tma in (False, True):
        for bn, w, st in ((64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 8, 4), (128, 8, 3), (128, 4, 2), (32, 4, 6)):
            t = "_tma" if tma else ""
            out.append((f"plan16_bn{bn}_w{w}_s{st}{t}", 8 * 16, 16, bn, w, st, tma, False))
            out.append((f"bal{sms}_bn{bn}_w{w}_s{st}{t}", sms, 0, bn, w, st, tma, True))
        for bn, st in ((64, 2), (64, 3), (32, 3)):
            t = "_tma" if tma else ""
            out.append((f"plan33_bn{bn}_w4_s{st}{t}", 8 * 33, 33, bn, 4, st, tma, False))
            out.append((f"bal{2 * sms}_bn{bn}_w4_s{st}{t}", 2 * sms, 0, bn, 4, st, tma, True))
    return out


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.quick:
        opts.tokens, opts.calls, opts.rounds = [40], 1, 1
    os.makedirs(opts.out, exist_ok=True)
    with iris_fw.init(heap_size=1 << 26) as ctx:
        dev = ctx.device
        if dev.type == "cuda":  # device-made descriptors take global scratch
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
        sms = devinfo.num_sms(dev)
        hkv, d, hq = (2, 16, 4) if opts.quick else (KV_HEADS, HEAD_DIM, Q_HEADS)
        rows = []
        print(f"device {devinfo.info(dev).name}, {sms} SMs; B 1, {hkv} kv heads, D {d}, bf16", flush=True)
        for tokens in opts.tokens:
            one = tokens * hkv * d * 2 * 2
            copies = 1 if opts.quick else max(1, math.ceil(ROTATE_BYTES / one))
            g = torch.Generator(device=dev).manual_seed(tokens)
            ks = [torch.randn(1, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
            vs = [torch.randn(1, tokens, hkv, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(copies)]
            q = torch.randn(1, hq, d, generator=g, device=dev).to(torch.bfloat16)
            want = (ks[0].float() + vs[0].float()).sum()
            replays = {}
            for name, nprog, n_split, bn, w, st, tma, bal in variants(sms, opts.quick):
                out = torch.zeros(nprog, d, dtype=torch.float32, device=dev)

                def call(i, out=out, nprog=nprog, n_split=n_split, bn=bn, w=w, st=st, tma=tma, bal=bal):
                    _stream_kernel[(nprog,)](ks[i % copies], vs[i % copies], out, tokens, max(n_split, 1),
                                             HKV=hkv, D=d, BLOCK_N=bn, TMA=tma, BALANCED=bal, num_warps=w,
                                             num_stages=st)
                try:
                    call(0)
                    got = out.sum()
                    if not abs(float(got - want)) <= 1e-3 * float(want.abs() + one):
                        print(f"  S {tokens} {name}: WRONG ({float(got):.4g} vs {float(want):.4g})")
                        continue
                    replays[name] = graph_of(call, opts.calls, dev)
                except Exception as exc:
                    print(f"  S {tokens} {name}: {type(exc).__name__}: {str(exc)[:200]}")
            plan = fd.plan(q, ks[0], vs[0], scheduler="bulk_sync", ctx=ctx)
            mine = torch.empty(plan.pack, dtype=torch.float32, device=dev)
            replays["flash_decode_partial"] = graph_of(
                lambda i: plan.partial(q, ks[i % copies], vs[i % copies], None, mine), opts.calls, dev)
            replays["torch_sdpa"] = sdpa_replay(q, ks, vs, opts.calls, dev)
            times = interleaved(replays, opts.rounds, opts.calls, dev)
            print(f"| S | method | us | KV TB/s |  (B 1 x {tokens}: {one / 1e6:.1f} MB)")
            for name, us in sorted(times.items(), key=lambda kv: kv[1]):
                rows.append({"tokens": tokens, "method": name, "us": us, "TBps": one / us / 1e6})
                print(f"| {tokens} | {name} | {us:.1f} | {one / us / 1e6:.2f} |")
            del ks, vs, replays
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        with open(os.path.join(opts.out, "fd_stream.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
