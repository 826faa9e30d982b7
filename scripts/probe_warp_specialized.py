"""The ``warp_specialized`` scheduler on one GPU at W = 1: the Triton and Gluon API it finds,
whether its Gluon kernel compiles and runs, each result against the float64 reference, and the
time of a call next to ``fused_sequential`` and torch's matmul of the same local product. Every
16-bit case runs on each GEMM tile path of the kernel (``mma_path``: the device's, ``mma_v2``,
then ``wgmma`` on Hopper — ``IRIS_FW_GLUON_MMA``).

    IRIS_FW_BOOTSTRAP=single python scripts/probe_warp_specialized.py [OUT.json]
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback

import torch
import triton


def _api() -> dict:
    out = {"triton": triton.__version__, "device": torch.cuda.get_device_name()}
    try:
        from triton.experimental.gluon import language as gl

        out["warp_specialize"] = str(inspect.signature(gl.warp_specialize))
        out["dot_fma"] = hasattr(gl, "dot_fma")
        from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: F401

        out["mma_v2"] = True
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401

        out["warpgroup_mma"] = True
    except Exception as exc:  # what is missing is the finding
        out["gluon_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _time(fn, iters=20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # µs


def main() -> None:
    import iris_fw
    from iris_fw import devinfo, ops
    from iris_fw import gluon_tiles as gtiles

    report = {"api": _api(), "cases": []}
    print(json.dumps(report["api"]), flush=True)
    shapes = {"all_gather_gemm": [((499, 1001), (1001, 301)), ((4096, 4096), (4096, 4096))],
              "gemm_reduce_scatter": [((300, 1001), (1001, 301)), ((4096, 4096), (4096, 4096))]}
    arch = devinfo.info(torch.device("cuda")).arch
    device_path = gtiles.mma_path(arch)
    paths = [device_path] + [p for p in gtiles.MMA_PATHS
                             if p != device_path and (p != "wgmma" or arch in gtiles.WGMMA_ARCHS)]
    report["api"]["mma_path"] = device_path
    cases = [(pattern, dtype, a_shape, b_shape, mma) for pattern, shapes_of in shapes.items()
             for dtype in (torch.bfloat16, torch.float16, torch.float32) for a_shape, b_shape in shapes_of
             for mma in (paths if dtype != torch.float32 else [device_path])]
    with iris_fw.init(heap_size=1 << 31) as ctx:
        for pattern, dtype, a_shape, b_shape, mma in cases:
            row = {"pattern": pattern, "dtype": str(dtype), "a": a_shape, "b": b_shape, "mma": mma}
            os.environ["IRIS_FW_GLUON_MMA"] = mma  # read by the op planned below
            try:
                g = torch.Generator().manual_seed(1)
                a = torch.randn(a_shape, generator=g).to(dtype).cuda()
                b = torch.randn(b_shape, generator=g).to(dtype).cuda()
                op = ops.plan(pattern, a, b, scheduler="warp_specialized")
                out = op(a, b)
                torch.cuda.synchronize()
                want = op.pattern.reference(0, 1, [(a, b)])
                err = (out.double() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
                row["rel_err"] = err
                if a_shape[0] >= 4096 and dtype != torch.float32:
                    fused = ops.plan(pattern, a, b, scheduler="fused_sequential")
                    row["us_warp_specialized"] = _time(lambda: op(a, b))
                    row["us_fused_sequential"] = _time(lambda: fused(a, b))
                    row["us_torch_matmul"] = _time(lambda: a @ b)
                    del fused
                del op, out
            except Exception as exc:
                row["error"] = "".join(traceback.format_exception_only(type(exc), exc))[-3000:]
            finally:
                os.environ.pop("IRIS_FW_GLUON_MMA", None)
            print(json.dumps(row), flush=True)
            report["cases"].append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
