"""Built-in benchmarks of the overlap taxonomy, registered like any plugin's.

* ``gemm`` – the Triton GEMM alone against cuBLAS (``torch.matmul``) at the local GEMM shape
  of every taxonomy shape, over a few tile configurations; the best is what ``taxonomy``
  uses for that shape.
* ``taxonomy`` – every scheduler x pattern at the issue's shapes, side by side with the torch
  bulk-synchronous baseline (cuBLAS + NCCL collective + layout copy), torch symmetric
  memory's fused ops where torch has the pattern, and the GEMM alone. Each scheduler's output
  is compared with the baseline's (``max_rel_err``). Every method is timed interleaved with
  the baseline and the cuBLAS GEMM alone (``a b c a b c …``, see
  :func:`~iris_fw.bench.measure_interleaved`): its speedup (baseline time / time) and its time
  over the GEMM alone come from the same stretch of time, whatever the GPU's clocks do.
"""

from __future__ import annotations

import statistics

import torch

from ..devinfo import num_sms
from ..gemm import GemmConfig, default_config, matmul
from ..hookspecs import hookimpl
from .harness import measure_interleaved

#: (pattern, M, N, K) global shapes of the issue's table (bf16).
SHAPES = [
    ("gemm_all_scatter", 8192, 28672, 8192),
    ("gemm_all_scatter", 4096, 8192, 8192),
    ("gemm_all_scatter", 1024, 8192, 8192),
    ("gemm_all_scatter", 8192, 4608, 36864),
    ("all_gather_gemm", 8192, 28672, 8192),
    ("all_gather_gemm", 16384, 14336, 4096),
    ("gemm_reduce_scatter", 8192, 8192, 28672),
]
#: Tiny shapes for a CPU smoke run.
CPU_SHAPES = [("gemm_all_scatter", 32, 64, 32), ("all_gather_gemm", 32, 64, 32), ("gemm_reduce_scatter", 32, 32, 64)]
SCHEDULERS = ["bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "copy_engine"]
#: SM splits tried for the two-role schedules on GPUs (None: the default estimate).
COMM_SMS = (None, 8, 16, 32)

#: Tile configurations the ``gemm`` benchmark tries on GPUs (bf16).
CANDIDATES = [
    GemmConfig(128, 256, 64, 8, 8, 3),
    GemmConfig(128, 256, 64, 8, 8, 4),
    GemmConfig(256, 128, 64, 8, 8, 3),
    GemmConfig(128, 128, 64, 8, 8, 4),
    GemmConfig(128, 128, 64, 8, 4, 4),
    GemmConfig(64, 256, 64, 8, 4, 4),
]


def local_shape(pattern: str, M: int, N: int, K: int, world: int) -> tuple[int, int, int]:
    """``(m, n, k)`` of the GEMM one rank runs for the global shape."""
    return {"gemm_all_scatter": (M, N // world, K), "all_gather_gemm": (M, N // world, K),
            "gemm_reduce_scatter": (M, N, K // world)}[pattern]


def operands(pattern: str, M: int, N: int, K: int, world: int, device, dtype=torch.bfloat16, seed: int = 0):
    """This rank's inputs for the op and their shapes' meaning as in :mod:`iris_fw.ops`."""
    g = torch.Generator(device=device).manual_seed(seed)
    if pattern == "gemm_all_scatter":
        a, b = (M, K), (K, N // world)
    elif pattern == "all_gather_gemm":
        a, b = (M // world, K), (K, N // world)
    else:
        a, b = (M, K // world), (K // world, N)
    scale = lambda k: 1.0 / k ** 0.5  # noqa: E731  (keeps products O(1) at every K)
    return (torch.randn(a, generator=g, device=device).mul_(scale(a[1])).to(dtype),
            torch.randn(b, generator=g, device=device).to(dtype))


def _shapes(ctx, opts):
    if ctx.device.type == "cpu":
        return CPU_SHAPES
    wanted = opts.extra.get("cases")
    return [s for s in SHAPES if not wanted or s[0] in wanted]


def _tune_gemm(ctx, opts, m, n, k, log, candidates=None):
    """``(best config, {config: us}, cuBLAS us)`` of the Triton GEMM at ``[m, k] @ [k, n]``, every
    configuration (``candidates``, default :data:`CANDIDATES`) and cuBLAS measured interleaved
    (same stretch of time)."""
    a = torch.randn(m, k, device=ctx.device, dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(k, n, device=ctx.device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=ctx.device, dtype=torch.bfloat16)
    default = default_config(m, n, k, a.dtype, ctx.device)
    if ctx.device.type == "cuda" and not opts.quick:
        candidates = list(dict.fromkeys([default, *(candidates or CANDIDATES)]))
    else:
        candidates = [default]
    fns = {}
    for cfg in candidates:
        try:  # a configuration that does not fit (shared memory) is skipped
            matmul(a, b, out=out, config=cfg, ctx=ctx)
            ctx.synchronize()
            fns[cfg] = lambda i, c=cfg: matmul(a, b, out=out, config=c, ctx=ctx)
        except Exception as exc:
            log(f"  gemm {m}x{n}x{k} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        ctx.barrier()
    fns["cublas"] = lambda i: torch.matmul(a, b)
    times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
    cublas = times.pop("cublas")
    best = min(times, key=times.get)
    log(f"  triton gemm {m}x{n}x{k}: " + ", ".join(f"{_cfg(c)} {us:.1f} us" for c, us in times.items())
        + f"; cublas {cublas:.1f} us")
    return best, times, cublas


#: Tile configurations tried at the few-row GEMMs of GEMM + all-reduce (decode and small
#: prefill batches: memory-bound, and too few 128-row tiles to fill the SMs).
SMALL_M_CANDIDATES = [
    GemmConfig(16, 64, 128, 1, 4, 4), GemmConfig(32, 64, 128, 1, 4, 4), GemmConfig(64, 64, 128, 1, 4, 4),
    GemmConfig(64, 64, 64, 1, 4, 6), GemmConfig(64, 128, 128, 1, 4, 4), GemmConfig(64, 128, 64, 1, 4, 5),
    GemmConfig(64, 256, 64, 1, 4, 4), GemmConfig(128, 64, 64, 1, 4, 4), GemmConfig(128, 128, 64, 8, 8, 4),
]
#: Rows up to which GEMM + all-reduce's local GEMMs are tuned with :data:`SMALL_M_CANDIDATES`.
SMALL_M = 1024


def _small_m_shapes(ctx):
    """``(m, n, k)`` of the local GEMMs of ``iris-fw bench gemm_all_reduce`` up to :data:`SMALL_M` rows."""
    from .gemm_all_reduce import MS, SHAPES as AR_SHAPES

    if ctx.device.type != "cuda":
        return []
    return [(m, n, k // ctx.world_size) for n, k in AR_SHAPES for m in MS if m <= SMALL_M]


class GemmAlone:
    name = "gemm"
    description = ("Triton GEMM vs cuBLAS at the local GEMM shapes of the taxonomy and of GEMM + all-reduce "
                   "(tile configs tried, interleaved)")

    def run(self, ctx, opts):
        rows, seen = [], set()
        groups = opts.extra.get("cases") or ("taxonomy", "small_m")
        shapes = []
        if "taxonomy" in groups:
            shapes += [(local_shape(p, M, N, K, ctx.world_size), None) for p, M, N, K in (CPU_SHAPES if ctx.device.type == 'cpu' else SHAPES)]
        if "small_m" in groups:
            shapes += [(mnk, SMALL_M_CANDIDATES) for mnk in _small_m_shapes(ctx)]
        for (m, n, k), candidates in shapes:
            if (m, n, k) in seen:
                continue
            seen.add((m, n, k))
            best, times, ref = _tune_gemm(ctx, opts, m, n, k, opts.log, candidates)
            flops = 2 * m * n * k
            for cfg, us in times.items():
                rows.append({"m": m, "n": n, "k": k, "method": f"triton {_cfg(cfg)}", "us": us,
                             "TFLOPs": flops / us / 1e6, "pct_of_cublas": 100 * ref / us, "best": cfg == best})
            rows.append({"m": m, "n": n, "k": k, "method": "cublas", "us": ref, "TFLOPs": flops / ref / 1e6,
                         "pct_of_cublas": 100.0, "best": False})
            opts.log(f"gemm {m}x{n}x{k}: cublas {ref:.1f} us, triton best {times[best]:.1f} us "
                     f"({100 * ref / times[best]:.1f}% of cuBLAS) with {_cfg(best)}")
        return named_by_device(ctx, rows)


def _cfg(cfg: GemmConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/g{cfg.group_m}/w{cfg.num_warps}/s{cfg.num_stages}"


def _variants(ctx, opts, sched, cfg, m, n, k):
    """``(comm_sms, config)`` pairs a scheduler is measured at: the default split and the
    tuned tile configuration; two-role schedules also at :data:`COMM_SMS`, each with the tile
    shape :func:`default_config` picks for the programs left to compute when it differs."""
    if sched not in ("producer_consumer", "wg_specialized") or ctx.device.type != "cuda" or opts.quick:
        return [(None, cfg)]
    out = []
    for comm in COMM_SMS:
        out.append((comm, cfg))
        if comm is not None:
            alt = default_config(m, n, k, torch.bfloat16, ctx.device, programs=num_sms(ctx.device) - comm)
            if alt != cfg:
                out.append((comm, alt))
    return out


class Taxonomy:
    name = "taxonomy"
    description = "4 schedulers x GEMM+all-scatter / all-gather+GEMM / GEMM+reduce-scatter vs torch+NCCL"
    plot = {"kind": "bars", "x": "shape", "y": "speedup", "series": "scheduler", "series_fallback": "method",
            "ylabel": "speedup over torch BSP (each scheduler at its best SM split)",
            "skip": {"method": ("gemm_alone_cublas", "gemm_alone_torch_matmul", "gemm_alone_triton")},
            "only_flag": "plot"}

    def run(self, ctx, opts):
        from .. import ops

        gpu = ctx.device.type == "cuda"
        world = ctx.world_size
        rows = []
        symm = _symm_mem_group(ctx) if gpu else None
        for pattern, M, N, K in _shapes(ctx, opts):
            label = f"{pattern} {M}x{N}x{K}"
            m, n, k = local_shape(pattern, M, N, K, world)
            a, b = operands(pattern, M, N, K, world, ctx.device, seed=ctx.rank + 1)
            flops = 2 * m * n * k

            first_row = len(rows)

            def row(method, us, err=None, at=None, **more):
                r = {"pattern": pattern, "M": M, "N": N, "K": K, "shape": label, "method": method, "us": us,
                     "TFLOPs_per_rank": flops / us / 1e6 if us else None}
                r.update(more)
                if err is not None:
                    r["max_rel_err"] = err
                rows.insert(len(rows) if at is None else at, r)
                return r

            base_fn, base_out = _baseline(ctx, pattern, a, b, M, N)
            expected = base_out().float()
            ga = torch.randn(m, k, device=ctx.device, dtype=a.dtype) / k ** 0.5  # the GEMM one rank runs
            gb = torch.randn(k, n, device=ctx.device, dtype=a.dtype)
            cfg, times, _ = _tune_gemm(ctx, opts, m, n, k, opts.log)
            pairs = {"torch_bsp": [], "gemm_alone_cublas": []}  # the references, per interleaved measurement
            configs = {}  # id(row) -> GemmConfig

            def measure(method, fn, **more):
                """``fn`` interleaved with the BSP baseline and the cuBLAS GEMM alone."""
                t = measure_interleaved(ctx, {"bsp": base_fn, "cublas": lambda i: torch.matmul(ga, gb), "fn": fn},
                                        opts.iters, opts.warmup)
                pairs["torch_bsp"].append(t["bsp"])
                pairs["gemm_alone_cublas"].append(t["cublas"])
                return row(method, t["fn"], speedup=t["bsp"] / t["fn"], vs_gemm_alone=t["fn"] / t["cublas"],
                           bsp_us=t["bsp"], cublas_us=t["cublas"], **more)

            triton_row = measure("gemm_alone_triton", lambda i: matmul(ga, gb, config=cfg, ctx=ctx), config=_cfg(cfg))
            triton_row["pct_of_cublas"] = 100 / triton_row["vs_gemm_alone"]
            if symm is not None and pattern in ("all_gather_gemm", "gemm_reduce_scatter"):
                fn = _symm_mem_op(pattern, a, b, symm)
                try:
                    fn(0)
                    measure("torch_symm_mem", fn)
                except Exception as exc:
                    opts.log(f"  symm_mem {pattern}: {type(exc).__name__}: {str(exc)[:160]}")
                    ctx.barrier()
            comm_first = ctx.registries.pattern.get(pattern).comm_first
            for sched in SCHEDULERS:
                if sched == "copy_engine" and not comm_first:
                    continue  # it moves a communicate-first pattern's operand chunks only
                results = []
                for comm, config in _variants(ctx, opts, sched, cfg, m, n, k):
                    method = sched if comm is None else f"{sched} comm_sms={comm}"
                    method += "" if config == cfg else f" {_cfg(config)}"
                    try:
                        op = ops.plan(pattern, a, b, scheduler=sched, config=config, comm_sms=comm)
                        a_in = a
                        if "a_heap" in op.buffers:  # all-gather + GEMM: the shard where peers read it, no copy
                            a_in = op.buffers["a_heap"]
                            a_in.copy_(a)
                        got = op(a_in, b).float()
                        ctx.synchronize()
                        err = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
                        err = max(ctx.bootstrap.all_gather(err))
                        r = measure(method, lambda i: op(a_in, b), scheduler=sched, comm_sms=comm, config=_cfg(config),
                                    max_rel_err=err, plot=False)
                        results.append(r)
                        configs[id(r)] = config
                        opts.log(f"{label} {method}: {r['us']:.1f} us ({r['speedup']:.2f}x BSP, "
                                 f"{r['vs_gemm_alone']:.3f}x cuBLAS GEMM), max rel err {err:.2e}")
                        op = got = a_in = None  # free the op's heap buffers before the next
                    except Exception as exc:
                        import traceback

                        opts.log(f"{label} {method}: FAILED " + "".join(traceback.format_exception(exc)[-4:])[-1500:])
                        row(method, None, scheduler=sched, error=f"{type(exc).__name__}: {str(exc)[:200]}", plot=False)
                    ctx.barrier()
                if results:  # the plot shows each scheduler at its best variant
                    max(results, key=lambda r: r["speedup"])["plot"] = True
            bsp = statistics.median(pairs["torch_bsp"])
            cublas = statistics.median(pairs["gemm_alone_cublas"])
            row("torch_bsp", bsp, speedup=1.0, at=first_row)  # (medians of the interleaved measurements)
            row("gemm_alone_cublas", cublas, speedup=bsp / cublas, at=first_row + 1)
            best = max((r for r in rows if r["shape"] == label and r.get("scheduler") and r["us"]),
                       key=lambda r: r["speedup"], default=None)
            if best:
                opts.log(f"{label}: best {best['method']} {best['us']:.1f} us = {best['speedup']:.2f}x BSP "
                         f"(paired BSP {best['bsp_us']:.1f}, cuBLAS GEMM {best['cublas_us']:.1f}); "
                         f"auto entry: ({pattern!r}, {world}, {M}, {N}, {K}): ({best['scheduler']!r}, "
                         f"{best['comm_sms']!r}, {configs[id(best)]!r})")
            a = b = expected = ga = gb = None
            ctx.barrier()
        return named_by_device(ctx, rows)


def _baseline(ctx, pattern, a, b, M, N):
    """``(fn(i), result())``: the torch bulk-synchronous version (cuBLAS + NCCL + layout)."""
    import torch.distributed as dist

    world = ctx.world_size
    gpu = ctx.device.type == "cuda" and dist.is_initialized()
    if pattern == "gemm_all_scatter":
        parts = torch.empty(world, M, b.shape[1], device=ctx.device, dtype=a.dtype)
        box = {}

        def fn(i):
            c = a @ b
            if gpu:
                dist.all_gather_into_tensor(parts, c)
            else:
                parts.copy_(torch.stack(ctx.bootstrap.all_gather(c)))
            box["out"] = parts.permute(1, 0, 2).reshape(M, N)
        return fn, lambda: (fn(0), box["out"])[1]
    if pattern == "all_gather_gemm":
        gathered = torch.empty(M, a.shape[1], device=ctx.device, dtype=a.dtype)
        box = {}

        def fn(i):
            if gpu:
                dist.all_gather_into_tensor(gathered, a)
            else:
                gathered.copy_(torch.cat(ctx.bootstrap.all_gather(a)))
            box["out"] = gathered @ b
        return fn, lambda: (fn(0), box["out"])[1]
    out = torch.empty(M // world, b.shape[1], device=ctx.device, dtype=a.dtype)

    def fn(i):
        c = a @ b
        if gpu:
            dist.reduce_scatter_tensor(out, c)
        else:
            total = sum(t.float() for t in ctx.bootstrap.all_gather(c))
            out.copy_(total[ctx.rank * (M // world):(ctx.rank + 1) * (M // world)])
    return fn, lambda: (fn(0), out)[1]


def _symm_mem_group(ctx):
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name
        try:
            symm_mem.enable_symm_mem_for_group(name)
        except Exception:
            pass  # newer torch enables it on first use
        return name
    except Exception:
        return None


def _symm_mem_op(pattern, a, b, group):
    if pattern == "all_gather_gemm":
        return lambda i: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=group)
    return lambda i: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0, group_name=group)


def named_by_device(ctx, rows: list[dict]) -> list[dict]:
    """``rows`` with the GEMM library named by what ran: cuBLAS on GPUs, torch's CPU matmul on
    CPU ranks (``cublas`` in method names and columns becomes ``torch_matmul`` there)."""
    if ctx.device.type == "cuda":
        return rows

    def rename(v):
        return v.replace("cublas", "torch_matmul") if isinstance(v, str) else v

    return [{rename(k): rename(v) for k, v in r.items()} for r in rows]


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(GemmAlone())
    registry.register(Taxonomy())
