"""``warp_specialized``: one persistent kernel whose every program runs communication and
compute at the same time in separate warp groups (taxonomy #5). On NVIDIA GPUs the kernel is
Gluon's (``gl.warp_specialize``, :mod:`iris_fw.gluon_tiles` says why Gluon): the default
partition (the kernel's ``num_warps``) computes, a worker partition of :data:`COMM_WARPS` warps
communicates, both over the program's items ``pid, pid + NPROG, …``, handing them over with the
skeletons' per-item flags (:mod:`iris_fw.engine.skeletons`: epochs, claims, entry and exit
barriers — scalar code that Gluon compiles as it is).

- Communicate-first (``all_gather_gemm``): the communication warps fetch chunks
  ``pid, pid + NPROG, …`` (each claimed first) and release them; the compute warps compute
  tiles ``pid, pid + NPROG, …``, acquiring each tile's chunk — and fetching it themselves when
  the chunk's program has not started this call (the skeletons' rule: wait only for a running
  program).
- Compute-first (``gemm_reduce_scatter``): the compute warps compute and stash tiles
  ``pid, pid + NPROG, …`` and release them; the communication warps of the same program acquire
  and send them. Every wait is for the other partition of the same program: both are resident.

Patterns give Gluon versions of their tile pieces (:class:`~iris_fw.engine.contract.GluonPieces`);
``all_gather_gemm`` and ``gemm_reduce_scatter`` do. Where Gluon kernels cannot run — Triton's
interpreter (CPU ranks) — the same program runs the two roles one after the other with the
patterns' ``@triton.jit`` pieces (:func:`_sequential_roles_kernel`, same items, flags and
claims). AMD: not available (Triton 3.9 lowers ``warp_specialize`` for gfx1250 only).

GEMM tiles (:func:`iris_fw.gluon_tiles.matmul_tile`): ``mma_v2`` (measured the faster one), or on
Hopper shared-memory operands and asynchronous ``warpgroup_mma`` with ``IRIS_FW_GLUON_MMA=wgmma``
(scripts/probe_warp_specialized.py times both on one GPU: run 34, wgmma 2.2-2.4x slower).

Verified: on CPU ranks (the sequential fallback), by the compile matrix (the Gluon kernel for sm_90
and sm_100, Triton 3.9; its wgmma variant for sm_90 only) and by hand with Triton 3.6.0 for sm_90.
On one H100 under MPS both tiles are right at W = 1-4 (runs 31, 33, 34); at W = 1 and 4096³ the
mma_v2 kernel is ~5x slower than the Triton GEMM and the wgmma one ~11x (docs/performance.md). Not traced (the Gluon kernel records no events)."""

from __future__ import annotations

import dataclasses
import inspect

import torch
import triton
import triton.language as tl

from iris_fw import env
from iris_fw import gluon_tiles as gtiles
from iris_fw import trace as tr
from iris_fw.devinfo import info, persistent_programs
from iris_fw.errors import ArgumentError
from iris_fw.engine import skeletons as sk
from iris_fw.engine.scheduler import Scheduler, _memoized, _prepare, fire
from iris_fw.hookspecs import hookimpl

#: The kernel role (its grid and state region in the workspace).
ROLE = "warp_specialized"
#: Warps of the communication partition.
COMM_WARPS = 4
#: Registers a communication warp's thread asks for (``worker_num_regs``: optional in Triton 3.9,
#: required by earlier Gluon).
COMM_REGS = tl.constexpr(128)
#: Why AMD GPUs cannot run it (the compiler's words, Triton 3.9, gfx942 and gfx950).
AMD_REASON = ("Gluon's warp_specialize is lowered on AMD for gfx1250 only (Triton 3.9: 'Warp specialization is "
              "only supported on gfx1250, got gfx942'); CDNA3/CDNA4 (MI300, MI350) have no warp-specialized "
              "kernel here")


def _list_api() -> bool:
    """Whether ``gl.warp_specialize`` takes ``[(function, args), …]`` (Triton 3.9) rather than
    ``(default_args, default_partition, worker_args, worker_partitions, …)`` (earlier Gluon)."""
    from triton.experimental.gluon import language as gl

    return next(iter(inspect.signature(gl.warp_specialize).parameters)) == "functions_and_args"


@triton.jit
def _sequential_roles_kernel(top0, top1, rest, st, flags, num_tiles, num_items, rank, world_size, heap_bases, trace,
                             ARGS: tl.constexpr, NTOP: tl.constexpr, CFG: tl.constexpr,
                             PRODUCE: tl.constexpr, CONSUME: tl.constexpr, STASH: tl.constexpr,
                             RELOAD: tl.constexpr, FETCH: tl.constexpr, DEPENDS: tl.constexpr,
                             NPROG: tl.constexpr, COMM_FIRST: tl.constexpr, ENTRY: tl.constexpr,
                             EXIT: tl.constexpr, TRAFFIC: tl.constexpr = None, TRACE: tl.constexpr = 0):
    """The warp-specialized kernel's two roles one after the other in each program (where Gluon
    kernels cannot run: the interpreter): items ``pid, pid + NPROG, …`` produced (fetched, or
    computed and stashed) and released, then tiles ``pid, pid + NPROG, …`` consumed — a chunk
    whose program has not started is fetched by the program that needs it (``HELP``)."""
    started = 0
    if TRACE:
        started = tr.record_start(trace, TRACE)
    epoch, ok = sk.start_call(st, rank, world_size, heap_bases, ENTRY, trace, TRACE)
    pid = tl.program_id(0)
    if ok:
        sk.produce_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                        pid, num_items, NPROG, flags, epoch, rank, heap_bases, PRODUCE, STASH, FETCH, CFG, COMM_FIRST,
                        True, trace, TRACE, TRAFFIC)
        sk.consume_role((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                        pid, num_tiles, NPROG, st, flags, num_items, epoch, epoch, rank, heap_bases,
                        st + sk.ST_ARRIVE + world_size, PRODUCE, CONSUME, RELOAD, DEPENDS, STASH, FETCH, CFG,
                        COMM_FIRST, True, True, NPROG, False, NPROG, trace, TRACE, TRAFFIC)
    sk.end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False, trace, TRACE, started)


if gtiles.AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    _LIST_API = gl.constexpr(_list_api())

    @gluon.jit
    def _obtain(top0, top1, rest, item, flags, counters, num_items, epoch, rank, heap_bases,
                ARGS: gl.constexpr, NTOP: gl.constexpr, CFG: gl.constexpr, COMM: gl.constexpr,
                NPROG: gl.constexpr, NW: gl.constexpr):
        """Chunk ``item`` of this call: fetched here (``COMM``) if it is not released, its program
        (``item % NPROG``) has not started and nobody claimed it; then acquired (bounded: 1, or
        0 if the wait gave up)."""
        if tl.load(flags + item, volatile=True) < epoch:
            if tl.load(counters + item % NPROG, volatile=True) < epoch:
                if sk.claim(flags, num_items, item, epoch):
                    COMM((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                         item, CFG, NW)
                    sk.release(flags, item, epoch, rank, heap_bases)
        return sk.acquire(flags, item, epoch, rank, heap_bases)

    @gluon.jit
    def _compute_partition(top0, top1, rest, flags, counters, num_tiles, num_items, epoch, ok, rank, heap_bases,
                           ARGS: gl.constexpr, NTOP: gl.constexpr, CFG: gl.constexpr, COMM: gl.constexpr,
                           COMPUTE: gl.constexpr, DEPENDS: gl.constexpr, NPROG: gl.constexpr,
                           COMM_FIRST: gl.constexpr, NW: gl.constexpr, MMA: gl.constexpr):
        """The default partition: tiles ``pid, pid + NPROG, …`` computed (communicate-first:
        after obtaining their chunk; compute-first: stashed, then released), GEMM tiles on the
        tensor-core path ``MMA`` (:func:`iris_fw.gluon_tiles.mma_path`)."""
        for tile in range(gl.program_id(0), num_tiles, NPROG):
            if COMM_FIRST:
                if ok:
                    ok = _obtain(top0, top1, rest,
                                 DEPENDS((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1
                                          else ARGS(*rest)), tile, CFG),
                                 flags, counters, num_items, epoch, rank, heap_bases, ARGS, NTOP, CFG, COMM, NPROG, NW)
                if ok:
                    COMPUTE((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                            tile, CFG, NW, MMA)
            else:
                if ok:
                    COMPUTE((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                            tile, CFG, NW, MMA)
                    sk.release(flags, tile, epoch, rank, heap_bases)

    @gluon.jit
    def _comm_partition(top0, top1, rest, flags, counters, num_tiles, num_items, epoch, ok, rank, heap_bases,
                        ARGS: gl.constexpr, NTOP: gl.constexpr, CFG: gl.constexpr, COMM: gl.constexpr,
                        COMPUTE: gl.constexpr, DEPENDS: gl.constexpr, NPROG: gl.constexpr,
                        COMM_FIRST: gl.constexpr, NW: gl.constexpr):
        """The worker partition: chunks ``pid, pid + NPROG, …`` fetched (each claimed first) and
        released, or tiles ``pid, pid + NPROG, …`` acquired from the compute partition and sent."""
        for item in range(gl.program_id(0), num_items, NPROG):
            if COMM_FIRST:
                if ok:
                    if sk.claim(flags, num_items, item, epoch):
                        COMM((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1
                              else ARGS(*rest)), item, CFG, NW)
                        sk.release(flags, item, epoch, rank, heap_bases)
            else:
                if ok:
                    ok = sk.acquire(flags, item, epoch, rank, heap_bases)
                if ok:
                    COMM((ARGS(top0, top1, *rest) if NTOP == 2 else ARGS(top0, *rest) if NTOP == 1 else ARGS(*rest)),
                         item, CFG, NW)

    @gluon.jit
    def _warp_specialized_kernel(top0, top1, rest, st, flags, num_tiles, num_items, rank, world_size, heap_bases,
                                 trace, ARGS: gl.constexpr, NTOP: gl.constexpr, CFG: gl.constexpr,
                                 COMM: gl.constexpr, COMPUTE: gl.constexpr, DEPENDS: gl.constexpr,
                                 NPROG: gl.constexpr, COMM_FIRST: gl.constexpr, ENTRY: gl.constexpr,
                                 EXIT: gl.constexpr, NW: gl.constexpr, COMM_NW: gl.constexpr,
                                 MMA: gl.constexpr = "mma_v2", TRACE: gl.constexpr = 0):
        """Persistent, ``NW`` compute warps + ``COMM_NW`` communication warps a program: the
        entry barrier, the two partitions at once (:func:`_compute_partition`,
        :func:`_comm_partition`), the exit barrier. ``MMA``: the GEMM tiles' tensor-core path
        (:func:`iris_fw.gluon_tiles.mma_path`). ``trace``/``TRACE``: accepted, not recorded."""
        epoch, ok = sk.start_call(st, rank, world_size, heap_bases, ENTRY)
        counters = st + sk.ST_ARRIVE + world_size  # every program's call counter
        if _LIST_API:
            gl.warp_specialize([(_compute_partition, (top0, top1, rest, flags, counters, num_tiles, num_items, epoch,
                                                      ok, rank, heap_bases, ARGS, NTOP, CFG, COMM, COMPUTE, DEPENDS,
                                                      NPROG, COMM_FIRST, NW, MMA)),
                                (_comm_partition, (top0, top1, rest, flags, counters, num_tiles, num_items, epoch, ok,
                                                   rank, heap_bases, ARGS, NTOP, CFG, COMM, COMPUTE, DEPENDS, NPROG,
                                                   COMM_FIRST, COMM_NW))], [COMM_NW], [COMM_REGS])
        else:
            gl.warp_specialize((top0, top1, rest, flags, counters, num_tiles, num_items, epoch, ok, rank, heap_bases,
                                ARGS, NTOP, CFG, COMM, COMPUTE, DEPENDS, NPROG, COMM_FIRST, NW, MMA), _compute_partition,
                               (top0, top1, rest, flags, counters, num_tiles, num_items, epoch, ok, rank, heap_bases,
                                ARGS, NTOP, CFG, COMM, COMPUTE, DEPENDS, NPROG, COMM_FIRST, COMM_NW),
                               [_comm_partition], [COMM_NW], [COMM_REGS])
        sk.end_call(st, flags, epoch, 0, rank, world_size, heap_bases, NPROG, EXIT, False)


def pointer_args(args):
    """``args`` with every TMA descriptor replaced by its tensor (Gluon pieces take pointers)."""
    return args._replace(**{name: value.base for name, value in args._asdict().items()
                            if type(value).__name__ == "TensorDescriptor"})


class WarpSpecialized(Scheduler):
    name = "warp_specialized"
    replaces_result = True  # (every kernel through the launch helpers: engine.scheduler.fire)
    description = ("one kernel, each program split into warp groups: communication warps fetch (or send) while "
                   "compute warps compute (Gluon warp_specialize; CPU: the two roles in turn)")
    uses_stash = True

    def available(self):
        if torch.version.hip:
            return False, AMD_REASON
        if not gtiles.AVAILABLE:
            return False, gtiles.WHY
        return True, ""

    def supports(self, plan):
        if plan.pieces.gluon is None:
            return False, f"pattern {plan.pattern} has no Gluon pieces (Pieces.gluon)"
        return True, ""

    def grids(self, ctx, plan, comm_sms):
        self.no_split(comm_sms, self.name)
        if ctx.device.type == "cuda" and ctx.debug:
            # the pointer checks of iris_fw.device build pointer blocks without a layout, which
            # Gluon rejects ("expected expand_dims input to be a distributed_type"): refused
            # while planning, on every rank alike (IRIS_FW_DEBUG is the job's setting)
            raise ArgumentError(f"scheduler {self.name!r} cannot run with IRIS_FW_DEBUG=1 on a GPU: its Gluon "
                                f"kernel does not compile the device pointer checks; use another scheduler "
                                f"(fused_sequential, wg_specialized, ...) or run without IRIS_FW_DEBUG")
        return {ROLE: persistent_programs(ctx.device, plan.num_tiles)}

    def launch(self, ctx, plan, ws):
        gluon_kernel = ctx.device.type == "cuda"
        # the tile path is decided once per op (the first launch), not per call
        mma = ws.extra.get("mma") if gluon_kernel else None
        if gluon_kernel and mma is None:
            mma = ws.extra["mma"] = self.mma_path(ctx)
        key = ("warp_specialized", gluon_kernel, mma)
        call = _memoized(ctx, plan, ws, key)
        if call is None:
            if gluon_kernel:
                pplan, constexprs, runtime = self.gluon_launch(ctx, plan, ws, mma)
                call = _prepare(ctx, pplan, ws, key, ROLE, _warp_specialized_kernel, constexprs, *runtime)
            else:
                call = _prepare(ctx, plan, ws, key, ROLE, _sequential_roles_kernel, self._constexprs(plan, ws),
                                *self._runtime(ctx, plan, ws))
        fire(call, ws)

    def gluon_launch(self, ctx, plan, ws, mma: str | None = None):
        """``(plan, constexprs, runtime arguments)`` of the Gluon kernel's launch (the runtime
        arguments after the pattern's): the plan with pointers for TMA descriptors (sharing
        ``plan.memo``).
        ``mma``: the GEMM tiles' path (default :meth:`mma_path`). The compile matrix records the
        kernel from it (the interpreter cannot run Gluon)."""
        g = plan.pieces.gluon
        pplan = dataclasses.replace(plan, args=pointer_args(plan.args))
        constexprs = dict(self._constexprs(plan, ws), COMM=g.comm, COMPUTE=g.compute, NW=plan.num_warps,
                          COMM_NW=COMM_WARPS, MMA=mma or self.mma_path(ctx))
        return pplan, constexprs, self._runtime(ctx, plan, ws)

    @staticmethod
    def mma_path(ctx) -> str:
        """The GEMM tiles' tensor-core path: ``IRIS_FW_GLUON_MMA`` if not ``auto``, else the
        device's (:func:`iris_fw.gluon_tiles.mma_path`)."""
        chosen = env.get("IRIS_FW_GLUON_MMA")
        arch = info(ctx.device).arch
        if chosen == "wgmma" and arch not in gtiles.WGMMA_ARCHS:  # the compiler aborts the process there
            raise ArgumentError(f"IRIS_FW_GLUON_MMA=wgmma needs a Hopper GPU ({', '.join(gtiles.WGMMA_ARCHS)}); "
                                f"this device is {arch}")
        return gtiles.mma_path(arch) if chosen == "auto" else chosen

    @staticmethod
    def _constexprs(plan, ws):
        return dict(NPROG=ws.grids[ROLE], COMM_FIRST=plan.comm_first, ENTRY=True, EXIT=True)

    @staticmethod
    def _runtime(ctx, plan, ws):
        """The runtime arguments after the pattern's (both kernels take the same)."""
        return ws.state[ROLE], ws.flags, plan.num_tiles, plan.num_items, ctx.rank, ctx.world_size, ctx.heap_bases


@hookimpl
def iris_fw_register_schedulers(registry):
    registry.register(WarpSpecialized())
