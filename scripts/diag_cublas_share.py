"""Are torch's GEMMs (cuBLAS) right at every MPS SM share? A fresh process per
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` runs ``torch.matmul`` / ``F.linear`` on the shapes of the
GPU Llama test and of iris-fw's library schedule, in bf16, fp16 and fp32, and compares each
with float64; no iris-fw anywhere. One line per share: SMs torch sees, and the shapes/dtypes
whose error exceeds a few units in the last place (with the error), or "all right".

Why: scripts/diag_mps_numerics.py found transformers' bf16 Llama wrong at 34 % and 33 % (44 and
42 SMs of an H100) and right at 100 / 50 / 25 %, the first wrong module a q_proj Linear whose
replay on the 100 % run's inputs was off by 35 (2026-11-25).

    python3 scripts/diag_cublas_share.py [PCT,...]    (under MPS: scripts/gpu_mps.sh py:scripts/diag_cublas_share.py)
"""

import os
import subprocess
import sys

SHAPES = [(24, 320, 320), (24, 320, 64), (24, 320, 1000), (24, 1000, 320), (24, 320, 2000), (192, 128, 288),
          (16, 2048, 4096), (1, 4096, 4096), (128, 128, 128), (512, 512, 512), (1024, 1024, 1024)]
CASES = "/tmp/diag_cublas_share_cases.pt"

# The child: [M, K] @ [K, N] of the Llama test's projections (24 tokens, hidden 320), iris-fw's
# library schedule at W = 3 (192 x 128 @ 128 x 288), a decode GEMM and square ones, against the
# float64 products the parent computed once (on the CPU).
CHILD = r'''
import sys, torch, torch.nn.functional as F
dev = "cuda" if torch.cuda.is_available() else "cpu"
sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 0
ulp = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -20}
bad = []
for (m, k, n), dt, a, b, want, scale in torch.load(sys.argv[1]):
    for how, f in (("matmul", lambda: a.to(dev) @ b.to(dev)), ("linear", lambda: F.linear(a.to(dev), b.t().contiguous().to(dev)))):
        got = f().double().cpu()
        err = (got - want).abs().nan_to_num(float("inf")).max().item()
        if err > 8 * ulp[dt] * scale:
            bad.append(f"{how} {m}x{k}@{k}x{n} {str(dt)[6:]}: err {err:.3g} (scale {scale:.3g})")
print(f"{sms} SMs: " + ("all right" if not bad else f"{len(bad)} wrong: " + "; ".join(bad[:8])))
'''


def _cases():
    import torch

    g, cases = torch.Generator().manual_seed(0), []
    for m, k, n in SHAPES:
        a64, b64 = torch.randn(m, k, generator=g, dtype=torch.float64), torch.randn(k, n, generator=g, dtype=torch.float64)
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            a, b = a64.to(dt), b64.to(dt)
            cases.append(((m, k, n), dt, a, b, a.double() @ b.double(), (a.double().abs() @ b.double().abs()).max().item()))
    torch.save(cases, CASES)


def main():
    pcts = ([int(p) for p in sys.argv[1].split(",")] if len(sys.argv) > 1 else
            [100, 75, 50, 45, 40, 36, 35, 34, 33, 32, 30, 25, 20, 15, 10, 5])
    _cases()
    for pct in pcts:
        env = {**os.environ, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
        p = subprocess.run([sys.executable, "-c", CHILD, CASES], env=env, capture_output=True, text=True, timeout=120)
        text = p.stdout.strip() if not p.returncode else f"failed: {p.stderr.strip()[-400:]}"
        print(f"MPS {pct:3d} %: {text}", flush=True)


if __name__ == "__main__":
    main()
