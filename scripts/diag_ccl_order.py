"""Diagnose ordering on GPUs (``iris-fw launch -n 2 scripts/diag_ccl_order.py``): all-reduces
where one rank enters late (it sleeps first), for the built-in one-shot kernel, a copy of it with
a system fence in every thread before the arrival, and the Lamport kernel. Prints how many
elements are wrong and whether the wrong ones equal the rank's own input (peer data missing)."""

import time

import torch
import triton
import triton.language as tl
from triton.language import target_info

import iris_fw
from iris_fw import ccl
from iris_fw import tilecomm as tc


@triton.jit
def _fence_sys():
    if target_info.is_cuda():
        tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _fenced_one_shot_kernel(src, dst, recv, slots, counters, n, rank, world_size, heap_bases,
                            OP: tl.constexpr, AVG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tc.program_epoch(counters)
    buf = recv + (epoch % 2) * world_size * CAP
    for t in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tc.tile_put_all(src + offs, buf + rank * CAP + offs, rank, world_size, heap_bases, mask=mask)
    _fence_sys()
    tc.arrive(slots + pid * world_size, epoch, rank, world_size, heap_bases)
    if tc.wait_arrivals(slots + pid * world_size, epoch, rank, world_size, heap_bases):
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = t * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            acc = tc.tile_reduce_rows(buf + offs, CAP, world_size, mask=mask, OP=OP)
            tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)


def main():
    ctx = iris_fw.init(heap_size=1 << 30)
    torch.cuda.set_device(ctx.device)
    print(f"rank {ctx.rank}: device {ctx.device}, current {torch.cuda.current_device()}", flush=True)
    n = (1 << 20) + 1037
    from iris_fw.collectives import all_reduce as ar

    for label in ("one_shot", "fenced", "lamport", "one_shot"):
        if label == "fenced":
            ar.OneShot.kernel = _fenced_one_shot_kernel
            ctx.comm_groups.clear()
            ctx.barrier()
        algo = "lamport" if label == "lamport" else "one_shot"
        for trial in range(4):
            g = torch.Generator().manual_seed(100 + trial)
            xs = [torch.randn(n, generator=g) for _ in range(ctx.world_size)]
            want = sum(x.double() for x in xs)
            t = xs[ctx.rank].to(ctx.device, copy=True)
            ctx.barrier()
            late = trial % ctx.world_size
            if ctx.rank == late:
                time.sleep(1.5)
            ctx.wait_timeout = 5.0
            try:
                ccl.all_reduce(t, algorithm=algo)
                ctx.synchronize()
                err = None
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {str(exc)[:200]}"
            got = t.cpu().double()
            bad = (got - want).abs() > 1e-4 * want.abs().clamp(min=1)
            own = (got - xs[ctx.rank].double()).abs() < 1e-6
            print(f"rank {ctx.rank} {label} trial {trial} late rank {late}: {int(bad.sum())} wrong of {n}, "
                  f"{int((bad & own).sum())} of them equal own input; first wrong {bad.nonzero().flatten()[:3].tolist()}"
                  f"{'; ' + err if err else ''}", flush=True)
            ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
