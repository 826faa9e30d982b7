"""The compile matrix: every ``@triton.jit`` kernel of iris-fw compiled, without a GPU, for NVIDIA
and AMD targets (tests/test_compile_matrix.py drives it; two child processes, since Triton reads
``TRITON_INTERPRET`` at import).

1. **Discover** every kernel: the ``*_kernel`` JIT functions of every module of ``iris_fw`` and
   of the packages it maps (``collectives``, ``plugins``, ``schedulers``, ``transports``) — a new
   kernel is found without being listed anywhere.
2. **Record** (child, interpreter on): one rank runs the public calls that launch kernels — the
   context's own kernels, every collective algorithm, every pattern under every scheduler that
   runs it, the GEMM, flash-decode, MoE dispatch/combine, a few of them traced, the benchmarks' kernels — with a pre-run hook on every discovered kernel
   that writes down the arguments of each distinct variant (argument types, constexprs). The
   ``_matmul_kernel`` also gets a TMA-descriptor variant (CPU tensors never take that path).
3. **Compile** (child, interpreter off): each recorded variant, its arguments rebuilt, goes
   through the binder Triton's JIT uses for the target's backend (``create_function_from_signature``,
   ``JITFunction._pack_args``) and ``triton.compile(ASTSource(...), target=GPUTarget(...))``.

A discovered kernel that no call launched makes the test fail (add a call to :func:`record`);
a variant that cannot compile for a target must be listed in :data:`KNOWN_FAILURES` with the
reason, else the test fails.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import traceback

#: Targets: name -> GPUTarget arguments. ``default`` ones run in the default test run.
TARGETS = {
    "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}
DEFAULT_TARGETS = ("sm_90", "gfx942")
#: (kernel, variant tag, target) -> why it cannot compile there. Tags: "tma" for descriptor
#: variants, "" for every variant of the kernel.
#: the warp_specialized scheduler's Gluon kernel: its layouts are NVIDIA's (32-thread warps), and with
#: AMD's Triton 3.9 does not lower warp_specialize below gfx1250 ("Warp specialization is only
#: supported on gfx1250, got gfx942"); the scheduler is unavailable on ROCm (schedulers/warp_specialized.py)
_NO_AMD_WARP_SPECIALIZE = "Gluon warp_specialize: NVIDIA layouts; AMD lowers it for gfx1250 only (Triton 3.9)"
KNOWN_FAILURES: dict[tuple[str, str, str], str] = {
    ("_warp_specialized_kernel", "", "gfx942"): _NO_AMD_WARP_SPECIALIZE,
    ("_warp_specialized_kernel", "", "gfx950"): _NO_AMD_WARP_SPECIALIZE,
}

#: Variant tag -> the only targets its variants are compiled for (the others get a row that
#: fails with the reason, listed in KNOWN_FAILURES): the warp_specialized kernel's wgmma tile is
#: Hopper's alone (iris_fw.gluon_tiles.mma_path launches it on sm_90 only), and Triton 3.9 aborts
#: the process compiling it for sm_100 ("LLVM ERROR: Cannot select: intrinsic
#: %llvm.nvvm.wgmma.commit_group.sync.aligned") instead of raising
TARGET_ONLY = {"wgmma": ("sm_90",)}
_WGMMA_ONLY_SM90 = "wgmma (Hopper's instructions) is launched on sm_90 only; Triton 3.9 aborts compiling it elsewhere"
KNOWN_FAILURES.update({("_warp_specialized_kernel", "wgmma", t): _WGMMA_ONLY_SM90 for t in ("sm_100", "gfx942", "gfx950")})
#: ... and with the device pointer checks compiled in (IRIS_FW_DEBUG=1: the debug matrix): they
#: build pointer blocks without a layout, which Gluon rejects; the scheduler refuses a debug
#: context on GPUs (schedulers/warp_specialized.py)
KNOWN_DEBUG_FAILURES: dict[tuple[str, str, str], str] = {
    ("_warp_specialized_kernel", tag, t): "Gluon: the debug pointer checks build layout-less blocks"
    for tag in ("", "wgmma") for t in ("sm_90", "sm_100")}

_MAPPED = ("iris_fw.collectives", "iris_fw.plugins", "iris_fw.schedulers", "iris_fw.transports")


# ---- discovery -----------------------------------------------------------------------------------


#: Modules that refuse to be imported (placeholders naming what is not provided, e.g. Iris's
#: Gluon backend in the compat layer), filled by :func:`modules`.
REFUSED: list = []


def modules() -> list:
    """Every module of iris_fw and of the packages mapped into it (those that raise ImportError
    on import go to :data:`REFUSED`)."""
    out = []
    for root in ("iris_fw", *_MAPPED):
        pkg = importlib.import_module(root)
        out.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, root + ".", onerror=REFUSED.append):
            if info.name.endswith("__main__") or any(info.name.startswith(m + ".") for m in _MAPPED if m != root):
                continue
            try:
                out.append(importlib.import_module(info.name))
            except ImportError:
                REFUSED.append(info.name)
    return out


def discover() -> dict:
    """``"module:name" -> JITFunction`` for every ``*_kernel`` JIT function defined in iris-fw."""
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
        kinds = (JITFunction, InterpretedFunction)
    except ImportError:
        kinds = (JITFunction,)
    found = {}
    for mod in modules():
        for name, obj in vars(mod).items():
            if isinstance(obj, kinds) and name.endswith("_kernel") and obj.fn.__module__ == mod.__name__:
                found[f"{mod.__name__}:{name}"] = obj
    return found


# ---- argument descriptions (picklable, rebuilt in the compile child) -----------------------------


def describe(value):
    """A JSON-able description of a launch argument."""
    import torch
    import triton.language as tl

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).replace("torch.", "")}
    if type(value).__name__ == "TensorDescriptor":
        return {"descriptor": str(value.base.dtype).replace("torch.", ""), "shape": list(value.shape),
                "block": list(value.block_shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, tl.constexpr):
        return {"constexpr": describe(value.value)}
    if isinstance(value, type):
        return {"type": f"{value.__module__}:{value.__qualname__}"}
    if hasattr(value, "fn") and hasattr(value, "arg_names"):  # a JIT function (a pattern's piece)
        return {"jit": f"{value.fn.__module__}:{value.fn.__qualname__}"}
    if isinstance(value, tuple):
        items = [describe(v) for v in value]
        if hasattr(value, "_fields"):
            return {"namedtuple": f"{type(value).__module__}:{type(value).__qualname__}", "items": items}
        return {"tuple": items}
    raise TypeError(f"no description for a launch argument of type {type(value).__name__}")


def _resolve(path: str):
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def rebuild(desc, constexpr: bool = False):
    """A launch argument like the described one (CPU tensors: the binder only reads dtype and
    alignment); ``constexpr``: for a constexpr parameter (its value is kept as it is)."""
    import torch
    import triton.language as tl

    if "tensor" in desc:
        return torch.empty(64, dtype=getattr(torch, desc["tensor"]))
    if "value" in desc:
        value = desc["value"]
        # recorded on one rank: a world size, peer count... of 1 would compile as a constant (the
        # JIT specializes ints equal to 1); 3 keeps them runtime values, as on a real job
        return 3 if type(value) is int and value == 1 and not constexpr else value
    if "constexpr" in desc:
        return tl.constexpr(rebuild(desc["constexpr"]))
    if "type" in desc:
        return _resolve(desc["type"])
    if "jit" in desc:
        return _resolve(desc["jit"])
    if "namedtuple" in desc:
        cls = _resolve(desc["namedtuple"])
        value = cls(*[rebuild(d) for d in desc["items"]])
        from iris_fw.device import DeviceHeaps

        if cls is DeviceHeaps:  # recorded under the interpreter (checks always on): a GPU context's
            # switch instead, its debug (IRIS_FW_DEBUG of this child: the debug matrix compiles them in)
            value = value._replace(CHECK_POINTERS=tl.constexpr(os.environ.get("IRIS_FW_DEBUG") == "1"))
        return value
    if "tuple" in desc:
        return tuple(rebuild(d) for d in desc["tuple"])
    if "descriptor" in desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        base = torch.empty(desc["shape"], dtype=getattr(torch, desc["descriptor"]))
        return TensorDescriptor.from_tensor(base, desc["block"])
    raise ValueError(f"bad description {desc!r}")


# ---- recording (interpreter on) ------------------------------------------------------------------


def record(out_path: str) -> None:
    """Run the calls that launch iris-fw's kernels on one CPU rank and write every distinct
    variant of every discovered kernel to ``out_path`` (JSON)."""
    os.environ.setdefault("IRIS_FW_BOOTSTRAP", "single")
    import torch

    import iris_fw

    kernels = discover()
    variants: dict = {}

    def hook_for(key, kernel):
        names = kernel.arg_names

        def hook(*args, **kwargs):
            bound = dict(zip(names, args))
            bound.update({k: v for k, v in kwargs.items() if k in names})
            desc = {k: describe(v) for k, v in bound.items()}
            variants.setdefault(key, {}).setdefault(json.dumps(desc, sort_keys=True), desc)

        return hook

    for key, kernel in kernels.items():
        kernel.add_pre_run_hook(hook_for(key, kernel))

    with iris_fw.init(heap_size=1 << 26) as ctx:
        _launch_everything(ctx, torch)
        ctx.synchronize()
    out = {"kernels": sorted(kernels), "variants": {}, "refused": sorted(set(REFUSED))}
    for key, found in variants.items():
        out["variants"][key] = list(found.values())
        for desc in out["variants"][key]:  # Hopper's instructions: tagged for KNOWN_FAILURES
            if desc.get("MMA", {}).get("constexpr", desc.get("MMA", {})).get("value") == "wgmma":
                desc["_tag"] = "wgmma"
    _add_tma_variants(out["variants"])
    with open(out_path, "w") as f:
        json.dump(out, f)


def _launch_everything(ctx, torch) -> None:
    """The public calls (and, for the benchmarks' kernels, their launches) at small sizes."""
    from iris_fw import ccl, ops
    from iris_fw.ccl import algorithm as al
    from dataclasses import replace

    from iris_fw.gemm import CPU_CONFIG, matmul

    from iris_fw.ccl import api
    from iris_fw.flash_decode import flash_decode

    dev = ctx.device
    ctx.device_barrier()
    # collectives: every registered algorithm, on a small message — launched although a one-rank
    # group's collective is its input (the call path's shortcut, turned off for the recording)
    shortcut, api._INPUT_IS_RESULT_AT_ONE_RANK = api._INPUT_IS_RESULT_AT_ONE_RANK, frozenset()
    ccl.new_group()
    x = torch.randn(300, device=dev)
    runs = {
        "all_reduce": lambda algo: ccl.all_reduce(x.clone(), algorithm=algo),
        "all_gather": lambda algo: ccl.all_gather_into_tensor(torch.empty(300 * ctx.world_size, device=dev), x,
                                                              algorithm=algo),
        "reduce_scatter": lambda algo: ccl.reduce_scatter_tensor(torch.empty(300, device=dev),
                                                                 torch.randn(300 * ctx.world_size, device=dev),
                                                                 algorithm=algo),
        "all_to_all": lambda algo: ccl.all_to_all_single(torch.empty(300 * ctx.world_size, device=dev),
                                                         torch.randn(300 * ctx.world_size, device=dev), algorithm=algo),
        "broadcast": lambda algo: ccl.broadcast(x.clone(), src=0, algorithm=algo),
        "reduce": lambda algo: ccl.reduce(x.clone(), dst=0, algorithm=algo),
        "gather": lambda algo: ccl.gather(x, [torch.empty_like(x) for _ in range(ctx.world_size)], dst=0,
                                          algorithm=algo),
        "scatter": lambda algo: ccl.scatter(torch.empty_like(x), [x.clone() for _ in range(ctx.world_size)], src=0,
                                            algorithm=algo),
    }
    for collective, run in runs.items():
        for algo in al.names(ctx, collective):
            run(algo)
    api._INPUT_IS_RESULT_AT_ONE_RANK = shortcut  # one rank: the call path's own copy (al.local_copy)
    ccl.all_gather_into_tensor(torch.empty(300 * ctx.world_size, device=dev), x)
    for algo in al.names(ctx, "all_reduce"):  # 16-bit floats accumulate in fp32; integers as they are
        for dtype, op in ((torch.bfloat16, "sum"), (torch.float16, "avg"), (torch.int32, "max"),
                          (torch.float8_e4m3fn, "sum")):
            try:
                ccl.all_reduce(torch.ones(64, dtype=dtype, device=dev), op=op, algorithm=algo)
            except ValueError:  # an algorithm that does not take the dtype (Lamport: floats only)
                pass
    for algo in al.names(ctx, "all_reduce_rmsnorm"):
        h = 256
        ccl.all_reduce_rmsnorm(torch.randn(2, h, device=dev), torch.randn(2, h, device=dev),
                               torch.ones(h, device=dev), algorithm=algo)
    ccl.barrier()
    # ops: every pattern under every scheduler that runs it
    a = torch.randn(32, 32, device=dev, dtype=torch.bfloat16)
    for pattern in ctx.registries.pattern.names():
        for scheduler in ctx.registries.scheduler.names():
            try:
                op = ops.plan(pattern, a, a, scheduler=scheduler)
            except Exception:  # the scheduler declines the pattern (it says why); not a kernel
                continue
            op(a, a)
    # split-K first: the default run compiles each kernel's first variant (and its TMA twin) —
    # with AMD's chiplet renumbering of the tile order (XCDS 8: MI300X / MI355X), which
    # compiled kernels see only on those GPUs; then the plain kernel as NVIDIA GPUs run it, and
    # with XCDS 8 (every variant: the extended run), and a pattern's kernels with XCDS 8
    matmul(a, a, config=replace(CPU_CONFIG, split_k=2, xcds=8))
    matmul(a, a)
    matmul(a, a, config=replace(CPU_CONFIG, xcds=8))
    ops.plan("all_gather_gemm", a, a, scheduler="fused_sequential", config=replace(CPU_CONFIG, xcds=8))(a, a)
    # the persistent schedule (tuning rows with "persistent": true), its first variant what Hopper
    # rows ask for: flattened, the epilogue in 2 pieces, the stream-K tail (5 tiles on the
    # interpreter's 4 programs: 4 whole, one shared out); then warp-specialized, without a tail
    rows = torch.randn(80, 32, device=dev, dtype=torch.bfloat16)
    persistent = replace(CPU_CONFIG, block_n=32, persistent=True)
    matmul(rows, a, config=replace(persistent, flatten=True, stream_k=1, epilogue_subtile=2))
    matmul(rows, a, config=replace(persistent, warp_specialize=True))
    # flash-decode under both schedulers, contiguous and paged KV
    q, k = torch.randn(2, 4, 16, device=dev, dtype=torch.bfloat16), torch.randn(2, 8, 2, 16, device=dev,
                                                                                  dtype=torch.bfloat16)
    pages = torch.arange(4, dtype=torch.int32, device=dev).reshape(2, 2)
    for scheduler in ("fused", "bulk_sync"):
        flash_decode(q, k, k, scheduler=scheduler)
    flash_decode(q, k.reshape(4, 4, 2, 16), k.reshape(4, 4, 2, 16), block_table=pages,
                 kv_lens=torch.tensor([7, 8], dtype=torch.int32, device=dev))
    # the split's products swapped (a tuning row's swap_ab), fused and local, contiguous and paged
    from iris_fw import flash_decode as fdm

    for scheduler, table in (("fused", None), ("bulk_sync", pages)):
        kv = k if table is None else k.reshape(4, 4, 2, 16)
        lens = None if table is None else torch.tensor([7, 8], dtype=torch.int32, device=dev)
        base = fdm.plan(q, kv, kv, kv_lens=lens, block_table=table, scheduler=scheduler)
        swapped = fdm.FlashDecode(base.group, base.call, replace(base.tune, swap_ab=True, max_registers=128))
        swapped(q, kv, kv, kv_lens=lens, block_table=table)
    # MoE dispatch + combine in both modes, bf16 and fp8
    from iris_fw.ops import moe_combine, moe_dispatch

    xm = torch.randn(3, 40, device=dev, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [1, -1], [0, 1]], device=dev)
    for mode in ("low_latency", "throughput"):
        for fp8 in (None, torch.float8_e4m3fn):
            d = moe_dispatch(xm, idx, torch.rand(3, 2, device=dev), 2 * ctx.world_size, max_tokens_per_rank=4,
                             dtype=fp8, mode=mode)
            moe_combine(torch.zeros(d.x.shape, dtype=torch.bfloat16, device=dev), d.handle)
            # the fused expert GEMMs (signalling dispatch variants, the tile-gated GEMM, GEMM -> combine)
            from iris_fw.ops import moe_dispatch_gemm, moe_gemm_combine

            g = moe_dispatch_gemm(xm, idx, torch.rand(3, 2, device=dev),
                                  torch.randn(2, 40, 24, device=dev, dtype=torch.bfloat16), 2 * ctx.world_size,
                                  max_tokens_per_rank=4, dtype=fp8, mode=mode)
            moe_gemm_combine(g.y, torch.randn(2, 24, 40, device=dev, dtype=torch.bfloat16), g.handle)
    with ctx.trace(None):  # traced variants (TRACE=1), and the session's clock synchronization
        ccl.all_reduce(x.clone())
        ops.plan("gemm_all_scatter", a, a, scheduler="fused_sequential")(a, a)
        flash_decode(q, k, k)
    ctx.synchronize()
    _launch_benchmark_kernels(ctx, torch)
    _record_gluon_kernels(ctx, torch)


def _record_gluon_kernels(ctx, torch) -> None:
    """Gluon kernels, which the interpreter cannot run: the ``warp_specialized`` scheduler's, as
    its GPU launch binds it for each pattern with Gluon pieces, handed to the kernel's pre-run
    hooks (the recording's) instead of launched."""
    from iris_fw import ops
    from iris_fw.engine.contract import split_args
    from iris_fw.engine.scheduler import bind_kernel
    from iris_fw.schedulers import warp_specialized as wsm

    if not hasattr(wsm, "_warp_specialized_kernel"):  # a Triton without Gluon
        return
    from iris_fw.gemm import GemmConfig

    kernel = wsm._warp_specialized_kernel
    a = torch.randn(32, 32, device=ctx.device, dtype=torch.bfloat16)
    # first (the default run's): Hopper's wgmma tile at a GPU tile shape (a CPU rank's 16-row
    # tiles take mma_v2); then the CPU plan's tiles on mma_v2 (every other NVIDIA target's path)
    gpu_tile = GemmConfig(128, 128, 64, 8, 4, 3)
    for mma, config in (("wgmma", gpu_tile), ("mma_v2", None)):
        for pattern in ("all_gather_gemm", "gemm_reduce_scatter"):
            op = ops.plan(pattern, a, a, scheduler="warp_specialized", config=config)
            plan = op.pattern.bind(ctx, op.buffers, a, a)
            pplan, constexprs, runtime = op.scheduler.gluon_launch(ctx, plan, op.workspace, mma)
            launcher = bind_kernel(op.workspace, wsm.ROLE, kernel, pplan, constexprs)
            values = (*split_args(pplan.args), *runtime, None)
            bound = dict(zip(launcher.runtime_params, values), **launcher.constexprs)
            for hook in kernel.pre_run_hooks:
                hook(**bound)


def _launch_benchmark_kernels(ctx, torch) -> None:
    """The benchmarks' kernels, launched as the benchmarks do, once each."""
    from iris_fw.bench import engine as be
    from iris_fw.bench import primitives as bp

    src, dst = ctx.randn(1024), ctx.zeros(1024)
    for op in ("load", "store", "get", "put"):
        bp._one_peer_kernel[(1,)](src, dst, 1024, ctx.rank, ctx.rank, ctx.heap_bases, OP=op, BLOCK=256, CACHE="")
    for push in (True, False):
        bp._all_peers_kernel[(1,)](src, dst, 1024 // ctx.world_size, ctx.rank, ctx.world_size, ctx.heap_bases,
                                   PUSH=push, BLOCK=256)
    buf = ctx.zeros(256, dtype=torch.int32)
    for op in ("add", "cas"):
        bp._atomic_rate_kernel[(1,)](buf, 64, 1, ctx.rank, ctx.rank, ctx.heap_bases, OP=op, BLOCK=64)
    flag = ctx.zeros(1, dtype=torch.int64)
    bp._ping_pong_kernel[(1,)](flag, 0, 0, ctx.rank, ctx.rank, ctx.heap_bases, SERVE=True)
    n, nprog = 512, 2
    recv, slots = ctx.zeros(2 * ctx.world_size * n), ctx.zeros(nprog * ctx.world_size, dtype=torch.int64)
    st = ctx.zeros(64, dtype=torch.int64)
    be._tile_all_reduce_kernel[(nprog,)](src, recv, dst, st, slots, n, ctx.rank, ctx.world_size, ctx.heap_bases,
                                         BLOCK=256, NPROG=nprog)
    x = torch.zeros(16)
    be._twenty_args_kernel[(1,)](x, torch.empty_like(x), *range(3, 21), BLOCK=16)
    from iris_fw.bench import host as bh

    bh._bare_kernel[(1,)](torch.zeros(128), BLOCK=128)
    ctx.synchronize()


def _add_tma_variants(variants: dict) -> None:
    """``_matmul_kernel`` with TMA descriptors for both operands (what GPUs with TMA run)."""
    key = "iris_fw.gemm:_matmul_kernel"
    for desc in list(variants.get(key, [])):
        if desc["A_DESC"].get("value") is False:
            tma = dict(desc)
            bm, bn, bk = (desc[n]["value"] for n in ("BM", "BN", "BK"))
            elem = desc["a"]["tensor"]
            tma["a"] = {"descriptor": elem, "shape": [256, 256], "block": [bm, bk]}
            tma["b"] = {"descriptor": elem, "shape": [256, 256], "block": [bk, bn]}
            tma["A_DESC"], tma["B_DESC"] = {"value": True}, {"value": True}
            tma["_tag"] = "tma"
            variants[key].append(tma)
            return


# ---- compiling (interpreter off) -----------------------------------------------------------------


def compile_variant(kernel, desc: dict, target_args: tuple):
    """Compile one recorded variant for a target as Triton's JIT would on that device."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget(*target_args)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = [rebuild(desc[p.name], p.is_constexpr) for p in kernel.params]
    if "TRACE" in kernel.arg_names:  # a traced variant reads the target's clock, not the host's
        from iris_fw.trace import CLOCKS

        at = kernel.arg_names.index("TRACE")
        if args[at]:
            args[at] = CLOCKS.index("globaltimer" if target.backend == "cuda" else "memrealtime") + 1
    kwargs = {"debug": False, "instrumentation_mode": "", "fpsan_homomorphic_casts": False}
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    source = GluonASTSource if kernel.is_gluon() else ASTSource
    return triton.compile(source(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_all(recorded_path: str, targets: list[str], report_path: str, first_only: bool = False) -> None:
    """Compile every recorded variant (``first_only``: each kernel's first) for ``targets``;
    write one JSON line per (variant, target): ``{"kernel", "variant", "target", "ok", "error"}``."""
    with open(recorded_path) as f:
        recorded = json.load(f)
    kernels = discover()
    with open(report_path, "w") as out:
        for key, descs in sorted(recorded["variants"].items()):
            kernel = kernels[key]
            for i, desc in enumerate(descs[:1] if first_only else descs):
                tag = desc.get("_tag", "")
                for target in targets:
                    try:
                        if target not in TARGET_ONLY.get(tag, (target,)):
                            raise RuntimeError(f"not compiled for {target}: tag {tag!r} is for {TARGET_ONLY[tag]}")
                        compile_variant(kernel, desc, TARGETS[target])
                        ok, error = True, ""
                    except Exception as exc:  # reported, then judged against KNOWN_FAILURES
                        ok = False
                        lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
                        error = lines[-1].strip()[:300]
                    out.write(json.dumps({"kernel": key, "variant": i, "tag": tag, "target": target, "ok": ok,
                                          "error": error}) + "\n")
                    out.flush()


if __name__ == "__main__":  # python compile_matrix.py record OUT | compile RECORDED TARGETS REPORT [first]
    if sys.argv[1] == "record":
        record(sys.argv[2])
    else:
        compile_all(sys.argv[2], sys.argv[3].split(","), sys.argv[4], first_only=sys.argv[5:] == ["first"])
