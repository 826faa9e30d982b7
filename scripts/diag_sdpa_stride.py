"""Is torch's GPU attention right when ``v``'s rows are not 16-byte aligned? LlamaTP's prefill at
W = 3 gave ``scaled_dot_product_attention`` a ``v`` sliced from rows of 450 bf16 elements (the
padded all-gather of q, k, v); its logits were off by 4.39 while every iris-fw op and GEMM was
right (scripts/diag_llama.py, one H100 under MPS, 2026-11-25). Here: the same shapes, ``v``
contiguous and with row strides 448 (aligned) and 450, each against float64.

    python3 scripts/diag_sdpa_stride.py
"""

import torch
import torch.nn.functional as F

dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(0)
b, p, hq, hkv, d = 2, 12, 10, 2, 32
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    q = torch.randn(b, p, hq, d, generator=g).to(dev, dtype)
    k = torch.randn(b, p, hkv, d, generator=g).to(dev, dtype)
    v0 = torch.randn(b * p, hkv * d, generator=g)
    want = F.scaled_dot_product_attention(q.double().cpu().transpose(1, 2), k.double().cpu().transpose(1, 2),
                                          v0.double().view(b, p, hkv, d).transpose(1, 2), is_causal=True,
                                          enable_gqa=True)
    for row in (hkv * d, 448, 450):
        big = torch.zeros(b * p, row, dtype=dtype, device=dev)
        big[:, :hkv * d] = v0.to(dtype)
        v = big[:, :hkv * d].reshape(b, p, hkv, d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        err = (o.double().cpu() - want).abs().max().item()
        print(f"{str(dtype)[6:]:8s} v row stride {row:3d} ({row * big.element_size()} bytes): max error {err:.3g}",
              flush=True)
