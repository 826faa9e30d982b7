"""Does a plain torch/transformers computation change with the MPS SM share? The GPU Llama
(tests/test_llama.py's config) in fp32 and bf16 (SDPA and eager attention), run in fresh
processes under ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` 100 / 50 / 34 / 33 / 25 (no iris-fw
anywhere), each compared with the 100 % process's fp32 logits; then, where a bf16 run's logits
differ from the 100 % bf16 run's, the first module (in execution order) whose output differs, and
a replay of every ``nn.Linear`` of the 100 % run on this share (the same bf16 inputs, so a
difference there is the GEMM's alone).

First run (one H100 under MPS, 2026-11-25): bf16 logits off by 4.79 at 34 % and 33 % (44 and
42 SMs), 0.058 at 100 / 50 / 25 %; fp32 within 6e-6 everywhere; no iris-fw involved.

    python3 scripts/diag_mps_numerics.py        (under MPS: scripts/gpu_mps.sh py:scripts/diag_mps_numerics.py)
"""

import os
import subprocess
import sys

CHILD = r'''
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
path, attn, replay = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
cfg = LlamaConfig(hidden_size=320, intermediate_size=1000, num_hidden_layers=4, num_attention_heads=10,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
cfg._attn_implementation = attn
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
dev = "cuda" if torch.cuda.is_available() else "cpu"
ids = torch.randint(0, 1000, (2, 12), generator=g).to(dev)
out = {"sms": torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 0, "modules": {}, "linear_in": {}}
def hook(name):
    def fn(mod, args, res):
        r = res[0] if isinstance(res, tuple) else res
        if torch.is_tensor(r):
            out["modules"][name] = r.detach().float().cpu()
        if isinstance(mod, torch.nn.Linear):
            out["linear_in"][name] = args[0].detach().cpu()
    return fn
with torch.no_grad():
    m32 = model.to(dev)
    out["fp32"] = m32(input_ids=ids, use_cache=False).logits.float().cpu()
    m16 = m32.to(torch.bfloat16)
    for name, mod in m16.named_modules():
        if name:
            mod.register_forward_hook(hook(name))
    out["bf16"] = m16(input_ids=ids, use_cache=False).logits.float().cpu()
    if replay:  # the 100 % run's Linear inputs through this process's GEMMs
        base = torch.load(replay)
        mods = dict(m16.named_modules())
        out["replay"] = {name: (torch.nn.functional.linear(x.to(dev), mods[name].weight).float().cpu()
                                - base["modules"][name]).abs().max().item() for name, x in base["linear_in"].items()}
torch.save(out, path)
'''


def _child(pct, attn, replay=""):
    import torch

    path = f"/tmp/mps_numerics_{pct}_{attn}.pt"
    env = {**os.environ, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
    p = subprocess.run([sys.executable, "-c", CHILD, path, attn, replay], env=env, capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        print(f"{pct} % {attn}: failed: {p.stderr[-800:]}", flush=True)
        return None, path
    return torch.load(path), path


def main():
    for attn, pcts in (("sdpa", (100, 50, 34, 33, 25)), ("eager", (100, 33))):
        base, base_path = _child(100, attn)
        if base is None:
            continue
        for pct in pcts:
            r, _ = _child(pct, attn, base_path) if pct != 100 else (base, base_path)
            if r is None:
                continue
            d16 = (r["bf16"] - base["bf16"]).abs().max().item()
            line = (f"{attn} MPS {pct:3d} % ({r['sms']} SMs): fp32 vs 100 % fp32 {(r['fp32'] - base['fp32']).abs().max():.3g}; "
                    f"bf16 vs 100 % fp32 {(r['bf16'] - base['fp32']).abs().max():.3g}; bf16 vs 100 % bf16 {d16:.3g}; "
                    f"nan: {bool(r['bf16'].isnan().any())}")
            if d16 > 0:
                first = next(((n, (t - base["modules"][n]).abs().max().item()) for n, t in r["modules"].items()
                              if n in base["modules"] and (t - base["modules"][n]).abs().max().item() > 0), None)
                worst = max(r.get("replay", {}).items(), key=lambda kv: kv[1], default=None)
                line += f"; first differing module {first}; worst Linear replay vs 100 % {worst}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
