"""Flash-decode's split-KV kernel compiled offline (no GPU) for sm_90 under every launch
configuration of ``scripts/tune_flash_decode.py``'s candidate grids: registers a thread and
spilled bytes (``ptxas -v``, Triton's bundled ``ptxas``), shared memory, and how many programs
an H100 SM holds of it (:func:`iris_fw.devinfo.resident_programs`) — issue 32's question of
which tiles are light enough to run several programs per SM.

The shape is ``iris-fw bench flash_decode``'s (32 q / 8 kv heads, D 128, bf16); the arguments
are bound as the JIT binds a call's (strides of contiguous operands, 16-byte aligned pointers),
so the counts are those of the GPU's compile. The local variant by default; ``--fused`` the
fused one and its traced variant (what the fused plan's residency fit compiles).

    TRITON_INTERPRET=0 python3 scripts/fd_registers.py [--fused] [--all]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # (before Triton is imported: compile, do not interpret)

import torch  # noqa: E402
import triton  # noqa: E402

from iris_fw import devinfo  # noqa: E402
from iris_fw.bench.flash_decode import HEAD_DIM, KV_HEADS, Q_HEADS  # noqa: E402
from iris_fw.flash_decode_kernels import _flash_decode_kernel  # noqa: E402

#: An H100's SM (what :func:`iris_fw.devinfo.sm_limits` reads from the device).
H100 = devinfo.SMLimits(registers=65536, register_unit=256, shared_bytes=233472, shared_reserved=1024,
                        threads=2048, warp_size=32, programs=32)
H100_SMS = 132
SEQ = 4096


def compile_variant(block_n, num_warps, num_stages, swap_ab, max_registers, fused=False, traced=False,
                    max_splits=64, arch=90, combine_unroll=8, cluster=0, pdl=False):
    """The kernel compiled for ``sm_<arch>`` as the JIT compiles a call of the bench's shape."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = _flash_decode_kernel
    hq, hkv, d = Q_HEADS, KV_HEADS, HEAD_DIM
    bf16, f32, i64 = torch.bfloat16, torch.float32, torch.int64

    def ptr(dtype):  # the binder reads a pointer's dtype and alignment only
        return torch.empty(16, dtype=dtype)

    args = dict(q=ptr(bf16), k=ptr(bf16), v=ptr(bf16), kv_lens=None, block_table=None,
                out=ptr(bf16) if fused else None, partials=ptr(f32), partial_lse=ptr(f32), unit_counters=ptr(i64),
                mine=None if fused else ptr(f32), recv=ptr(f32) if fused else None,
                slots=ptr(i64) if fused else None, epochs=ptr(i64) if fused else None,
                batch=1, seq=SEQ, n_split=16, stride_qb=hq * d, stride_qh=d, stride_qd=1,
                stride_kb=SEQ * hkv * d, stride_ks=hkv * d, stride_kh=d, stride_kd=1,
                stride_vb=SEQ * hkv * d, stride_vs=hkv * d, stride_vh=d, stride_vd=1, stride_tb=0,
                qk_scale=0.1275, rank=0, world_size=2 if fused else 1, heap_bases=ptr(i64),
                trace=(1 << 40) if traced else None,
                HQ=hq, HKV=hkv, D=d, DV=d, ROWS=16, BD=d, BDV=d, BLOCK_N=block_n, MAX_SPLITS=max_splits,
                HAS_LENS=False, PAGE=0, FUSED=fused, EXACT=False, TRACE=1 if traced else 0, SWAP_AB=swap_ab,
                CROWS=min(16, hq // hkv), COMBINE_UNROLL=min(combine_unroll, max_splits),
                CLUSTER=cluster, PDL=pdl)  # (the plan's values)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {"debug": False, "instrumentation_mode": "", "num_warps": num_warps, "num_stages": num_stages}
    if "fpsan_homomorphic_casts" in backend.parse_options({}).__dict__:
        kwargs["fpsan_homomorphic_casts"] = False
    if max_registers:
        kwargs["maxnreg"] = max_registers
    if pdl:
        kwargs["launch_pdl"] = True
    bound, specialization, options = binder(*(args[p.name] for p in kernel.params), **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def ptxas_counts(compiled, arch=90) -> tuple[int, int]:
    """(registers a thread, bytes spilled) of the compiled kernel's PTX, from ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(compiled.asm["ptx"])
        proc = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", src, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    if regs is None:
        raise RuntimeError(f"ptxas: {text[-2000:]}")
    return int(regs.group(1)), int(spill.group(1)) if spill else 0


def configurations(everything: bool) -> list[tuple]:
    """The distinct ``(block_n, warps, stages, swap_ab, max_registers, MAX_SPLITS)`` of the
    tuner's grids (``MAX_SPLITS`` as a plan on an H100's 132 SMs makes it)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tune_flash_decode as tune

    seen = []
    for cand in tune.SMALL_GRID + tune.GRID:
        bound = triton.next_power_of_2(min(cand.max_splits, H100_SMS * cand.programs_per_sm * cand.items_per_program))
        key = (cand.block_n, cand.num_warps, cand.num_stages, cand.swap_ab, cand.max_registers, bound)
        if key not in seen and (everything or cand.swap_ab or cand.max_registers):
            seen.append(key)
    return seen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fused", action="store_true", help="the fused variant and its traced one")
    p.add_argument("--all", action="store_true", help="every configuration (default: the new ones)")
    opts = p.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90, {Q_HEADS} q / {KV_HEADS} kv heads, D {HEAD_DIM}, bf16"
          f"{', fused (+ traced)' if opts.fused else ', local'}")
    print("| block_n | warps | stages | swap_ab | max_registers | MAX_SPLITS | regs | spilled B | shared B | "
          "per H100 SM |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for bn, w, st, swap, cap, bound in configurations(opts.all):
        for traced in ((False, True) if opts.fused else (False,)):
            head = f"| {bn} | {w} | {st} | {swap} | {cap or '-'} | {bound} |"
            try:
                c = compile_variant(bn, w, st, swap, cap, fused=opts.fused, traced=traced, max_splits=bound)
                regs, spill = ptxas_counts(c)
                fits = devinfo.resident_programs(H100, regs, w, c.metadata.shared)
                print(f"{head} {regs} | {spill} | {c.metadata.shared} | {fits} |{' (traced)' if traced else ''}",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 (reported, the next one compiled)
                print(f"{head} {type(exc).__name__}: {str(exc)[:120]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
