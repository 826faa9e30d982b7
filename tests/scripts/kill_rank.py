"""Fault injection: one rank fails while the others work; every survivor must fail soon after,
with a message naming it (tests/test_faults.py runs this under iris-fw launch, mpirun and
torchrun).

    kill_rank.py [after-setup|during-setup]          # rank 1 SIGKILLs itself (the original use)
    kill_rank.py --fault F --when W --work K [--rank R] [--stamp PATH]

``--fault``: ``kill`` (SIGKILL), ``raise`` (an exception), ``exit`` (``sys.exit(0)``),
``osexit`` (``os._exit(0)``: no atexit, no clean-up) or ``stop`` (SIGSTOP). ``--when``:
``setup`` (inside ``iris_fw.init``, after the heaps are mapped), ``op`` (while the others are
inside the work, waiting for this rank), ``after`` (between two calls, after set-up) or
``loop`` (inside a loop of :data:`LOOP_CALLS` calls enqueued without synchronizing, after
:data:`LOOP_FAULT_AT` of them: on a GPU its queued kernels are still running when it fails). ``--work``: ``kernel`` (a raw kernel of device primitives), ``ccl``
(``iris_fw.ccl.all_reduce``) or ``op`` (``iris_fw.ops.gemm_all_scatter``). The failing rank
writes the time of its fault to ``--stamp`` and prints ``FAULT …``; every other rank prints
``SURVIVOR rank r failed after S s: <error>`` (``S`` since the fault) or, if nothing failed,
``SURVIVOR rank r completed`` — then exits 1 either way. ``pids: …`` lines let the caller
check that no process outlives the job.
"""
import argparse
import faulthandler
import os
import signal
import sys
import time

import iris_fw  # first: switches Triton's interpreter on when there is no GPU
import torch
import triton
import triton.language as tl
from iris_fw import device as dv


@triton.jit
def _ring_kernel(src, dst, flag, n, epoch, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    right = (rank + 1) % world_size
    dv.put(src + offs, dst + offs, rank, right, heap_bases, mask=offs < n)
    dv.signal(flag, epoch, rank, right, heap_bases)
    dv.wait_until(flag, ">=", epoch, rank, rank, heap_bases)


#: the raw kernel's destination and flag for each call (allocated up front)
_BUFFERS: list = []
#: ``--when loop``: calls every rank enqueues, and the call before which the faulty rank fails
LOOP_CALLS, LOOP_FAULT_AT = 200, 50


def _env_rank() -> int:
    for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _legacy(how: str) -> None:
    with iris_fw.init(heap_size=1 << 22) as ctx:
        ctx.ones(1000)
        ctx.barrier()
        if ctx.rank == 1:
            if how == "during-setup":
                # what a crash between creating and unlinking a segment would leave
                open(os.path.join("/dev/shm", os.environ.get("IRIS_FW_SHM_PREFIX", "iris_fw_") + "leftover"), "w").close()
            print("rank 1: killing myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.barrier()


def _fault(args, where: str) -> None:
    """Fail this rank now, the way ``args.fault`` says."""
    with open(args.stamp, "w") as f:
        f.write(repr(time.time()))
    print(f"FAULT rank {args.rank} {args.fault} {where} at {time.time():.3f}", flush=True)
    if args.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)  # only a SIGCONT gets here; the job must have killed it by then
    elif args.fault == "exit":
        sys.exit(0)
    elif args.fault == "osexit":
        os._exit(0)
    raise RuntimeError(f"injected fault on rank {args.rank}")


def _work(ctx, kind: str, step: int):
    """One collective call of ``kind``; returns a check of its result (a callable raising on a
    wrong value) to run after synchronizing."""
    import torch

    w, r = ctx.world_size, ctx.rank
    if kind == "ccl":
        from iris_fw import ccl

        t = torch.full((1000,), float(r + step), device=ctx.device)
        ccl.all_reduce(t)
        want = float(sum(range(w)) + w * step)
        return lambda: torch.testing.assert_close(t, torch.full_like(t, want))
    if kind == "op":
        from iris_fw import ops

        g = torch.Generator().manual_seed(step)
        a = torch.randn(32, 16, generator=g).to(ctx.device, torch.bfloat16)
        b = (torch.randn(16, 16, generator=g) + r).to(ctx.device, torch.bfloat16)
        c = ops.gemm_all_scatter(a, b, scheduler="fused_sequential")
        return lambda: torch.testing.assert_close(c[:, r * 16:(r + 1) * 16].float(), (a.float() @ b.float()),
                                                  atol=0.1, rtol=0.05)
    # a raw kernel: every rank puts a block into its right neighbour's heap and waits for its
    # left's; the buffers of both calls were allocated (and a barrier passed) before the first
    n = 256
    dst, flag = _BUFFERS[step]
    src = torch.arange(n, dtype=torch.float32, device=ctx.device) + 1000 * r + step
    _ring_kernel[(1,)](src, dst, flag, n, step + 1, r, w, ctx.heap_bases, BLOCK=n)
    left = (r + w - 1) % w
    return lambda: torch.testing.assert_close(dst, torch.arange(n, dtype=torch.float32, device=ctx.device)
                                              + 1000 * left + step)


def main() -> int:
    if len(sys.argv) == 1 or sys.argv[1] in ("after-setup", "during-setup"):
        _legacy(sys.argv[1] if len(sys.argv) > 1 else "after-setup")
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["kill", "raise", "exit", "osexit", "stop"], required=True)
    parser.add_argument("--when", choices=["setup", "op", "after", "loop"], required=True)
    parser.add_argument("--work", choices=["kernel", "ccl", "op"], required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--stamp", default=os.environ.get("FAULT_STAMP", "/tmp/iris_fw_fault_stamp"))
    args = parser.parse_args()
    me = _env_rank()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 pid` shows where a rank is
    print(f"pids: rank {me} pid {os.getpid()}", flush=True)
    faulty = me == args.rank
    if faulty and args.when == "setup":
        original = iris_fw.context.Context._calibrate_wait

        def calibrate_then_fail(self):
            original(self)
            _fault(args, "during set-up")

        iris_fw.context.Context._calibrate_wait = calibrate_then_fail
    try:
        with iris_fw.init(heap_size=1 << 24) as ctx:
            steps = LOOP_CALLS if args.when == "loop" else 2
            _BUFFERS.extend((ctx.full((256,), -1.0), ctx.zeros(1, dtype=torch.int64)) for _ in range(steps))
            ctx.barrier()
            _work(ctx, args.work, 0)()  # every rank: one good call (kernels compiled, caches warm)
            ctx.synchronize()
            ctx.barrier()
            if faulty and args.when == "after":
                _fault(args, "after set-up")
            if faulty and args.when == "op":
                _fault(args, "instead of its part of the call")
            if args.when == "after":
                time.sleep(0.5)  # the others' next call starts after the fault
            if args.when == "loop":
                for step in range(1, LOOP_CALLS):
                    if faulty and step == LOOP_FAULT_AT:
                        _fault(args, f"inside a loop of calls, before call {step}")
                    check = _work(ctx, args.work, step)
            else:
                check = _work(ctx, args.work, 1)
            ctx.synchronize()
            check()
            ctx.barrier()
        print(f"SURVIVOR rank {me} completed", flush=True)
    except BaseException as exc:
        if faulty:
            raise
        try:
            with open(args.stamp) as f:
                since = f"{time.time() - float(f.read()):.2f}"
        except (OSError, ValueError):
            since = "?"
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"SURVIVOR rank {me} failed after {since} s: {type(exc).__name__}: {first}", flush=True)
        raise
    return 1


if __name__ == "__main__":
    sys.exit(main())
