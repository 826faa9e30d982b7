"""Does a plain torch/transformers computation change with the MPS SM share? The GPU Llama
(tests/test_llama.py's config) in fp32 and bf16, and a bf16 matmul, run in fresh processes
under ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` 100 / 50 / 34 / 33 / 25 (no iris-fw anywhere),
each compared with the 100 % process's fp32 logits.

    python3 scripts/diag_mps_numerics.py        (under MPS: scripts/gpu_mps.sh py:scripts/diag_mps_numerics.py)
"""

import os
import subprocess
import sys

CHILD = r'''
import sys, torch
sys.path.insert(0, "tests")
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=320, intermediate_size=1000, num_hidden_layers=4, num_attention_heads=10,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 1000, (2, 12), generator=g).cuda()
out = {"sms": torch.cuda.get_device_properties(0).multi_processor_count}
with torch.no_grad():
    m32 = model.to("cuda")
    out["fp32"] = m32(input_ids=ids, use_cache=False).logits.float().cpu()
    m16 = m32.to(torch.bfloat16)
    out["bf16"] = m16(input_ids=ids, use_cache=False).logits.float().cpu()
    a = torch.randn(10, 320, generator=g).cuda().bfloat16(); b = torch.randn(1000, 320, generator=g).cuda().bfloat16()
    out["mm"] = (a @ b.T).float().cpu()
    out["mm_ref"] = (a.double() @ b.double().T).float().cpu()
torch.save(out, sys.argv[1])
'''


def main():
    res = {}
    for pct in (100, 50, 34, 33, 25):
        path = f"/tmp/mps_numerics_{pct}.pt"
        env = {**os.environ, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
        p = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True, timeout=300)
        if p.returncode:
            print(f"{pct} %: failed: {p.stderr[-800:]}")
            continue
        import torch
        res[pct] = torch.load(path)
    base = res[100]["fp32"]
    for pct, r in res.items():
        print(f"MPS {pct:3d} % ({r['sms']} SMs): fp32 vs 100 % fp32 {(r['fp32'] - base).abs().max():.3g}; "
              f"bf16 vs 100 % fp32 {(r['bf16'] - base).abs().max():.3g}; bf16 matmul vs float64 "
              f"{(r['mm'] - r['mm_ref']).abs().max():.3g}; nan: {bool(r['bf16'].isnan().any())}")


if __name__ == "__main__":
    main()
