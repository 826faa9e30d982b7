"""Where a tensor-parallel Llama step goes wrong: every collective and op call of
``iris_fw.models.llama.LlamaTP`` checked against a float64 reference built from every rank's
inputs (gathered on the host), through a prefill and teacher-forced decode steps; then the
step logits against transformers; every local ``F.linear`` (cuBLAS) too. Prints one line per call whose error exceeds the dtype's
tolerance (and a summary per op).

    iris-fw launch -n 3 scripts/diag_llama.py [--dtype bf16|fp32] [--steps 8] [--reduce all_reduce_rmsnorm|gemm_all_reduce]
"""

import argparse
import collections

import torch
import torch.nn.functional as F

import iris_fw
from iris_fw.models import llama as L

_D = L._Direct  # the real ops (the run below routes LlamaTP's own calls through Checked)
TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _gather(ctx, t):
    return [x.to(torch.float64) for x in ctx.bootstrap.all_gather(t.detach().cpu())]


class Checked:
    """``LlamaTP``'s ops (:class:`~iris_fw.models.llama._Direct`), each result compared with a
    float64 reference of every rank's inputs."""

    def __init__(self, ctx, dtype):
        self.ctx, self.tol, self.calls = ctx, TOL[dtype], collections.Counter()
        self.bad, self.worst = [], collections.defaultdict(float)

    def _note(self, name, got, want, scale=None):
        self.calls[name] += 1
        err = (got.detach().cpu().to(torch.float64) - want).abs().max().item() if got.numel() else 0.0
        scale = scale if scale is not None else max(want.abs().max().item(), 1e-6)
        rel = err / scale
        self.worst[name] = max(self.worst[name], rel)
        if rel > self.tol:
            self.bad.append(f"{name} #{self.calls[name]} {list(got.shape)} {got.dtype}: max err {err:.3g} "
                            f"(scale {scale:.3g}, rel {rel:.3g})")

    def all_gather(self, x, world):
        want = torch.cat(_gather(self.ctx, x))
        out = _D.all_gather(x, world)
        self._note("all_gather", out, want)
        return out

    def all_reduce_rmsnorm(self, x, residual, weight, eps):
        r = sum(_gather(self.ctx, x)) + residual.detach().cpu().double()   # (before: the call updates in place)
        out, res = _D.all_reduce_rmsnorm(x, residual, weight, eps)
        want = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.detach().cpu().double()
        self._note("all_reduce_rmsnorm.residual", res, r)
        self._note("all_reduce_rmsnorm.out", out, want)
        return out, res

    def gemm_all_reduce(self, a, b):
        want = sum(x @ y for x, y in zip(_gather(self.ctx, a), _gather(self.ctx, b)))
        out = _D.gemm_all_reduce(a, b)
        self._note("gemm_all_reduce", out, want)
        return out

    def flash_decode(self, q, k, v, kv_lens, sm_scale):
        ks, vs, lens = _gather(self.ctx, k), _gather(self.ctx, v), _gather(self.ctx, kv_lens)
        out = _D.flash_decode(q, k, v, kv_lens, sm_scale)
        w, qd = len(ks), q.detach().cpu().double()
        b_, hq, d = qd.shape
        hkv = ks[0].shape[2]
        want = torch.zeros(b_, hq, d, dtype=torch.float64)
        for b in range(b_):
            total = int(sum(x[b].item() for x in lens))
            kk = torch.stack([ks[p % w][b, p // w] for p in range(total)])     # [S, Hkv, D]
            vv = torch.stack([vs[p % w][b, p // w] for p in range(total)])
            kk = kk.repeat_interleave(hq // hkv, dim=1)
            vv = vv.repeat_interleave(hq // hkv, dim=1)
            s = torch.einsum("hd,shd->hs", qd[b], kk) * sm_scale
            want[b] = torch.einsum("hs,shd->hd", s.softmax(-1), vv)
        self._note("flash_decode", out, want)
        return out


class CheckedF:
    """``torch.nn.functional`` for ``LlamaTP`` with every ``linear`` (a cuBLAS GEMM of this rank's
    shard) compared with float64 on the host: on one H100 under MPS, torch's 16-bit GEMMs were
    wrong at many SM shares (scripts/diag_cublas_share.py)."""

    def __init__(self, chk):
        self.chk = chk

    def __getattr__(self, name):
        return getattr(F, name)

    def linear(self, x, w, bias=None):
        out = F.linear(x, w, bias)
        xd, wd = x.detach().cpu().double(), w.detach().cpu().double()
        want, scale = xd @ wd.T, (xd.abs() @ wd.abs().T).max().item()
        self.chk._note(f"F.linear {list(x.shape[-1:])}x{list(w.shape)}", out, want, scale)
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reduce", default="all_reduce_rmsnorm")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with iris_fw.init() as ctx:
        import sys
        import os
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
        import test_llama as T

        model = T._model(ctx, dtype=dtype)
        ids = T._prompt(ctx, model, 2)
        n = ids.shape[1]
        # the float32 model of the same weights is the reference; transformers' own `dtype` model
        # (sdpa and eager attention) is compared with it too, on the same tokens
        import copy

        ref, ref_logits = L.reference_generate(copy.deepcopy(model).float(), ids, args.steps)
        own = {}
        with torch.no_grad():
            for attn in ("sdpa", "eager"):
                m = copy.deepcopy(model)
                m.set_attn_implementation(attn)
                own[attn] = m(input_ids=ref[:, :n + args.steps - 1], use_cache=False).logits[:, n - 1:].float()
                own[attn] = own[attn].transpose(0, 1)                          # [steps, B, V]
                del m
        tp = L.LlamaTP(model, batch=2, max_len=n + args.steps, reduce=args.reduce)
        chk = Checked(ctx, dtype)
        L._Direct = chk  # the prefill's calls (it names the plain ops itself) checked too
        L.F = CheckedF(chk)  # and every local GEMM (F.linear)
        logits = [tp.prefill(ids)]
        for i in range(1, args.steps):
            pos = torch.full((2,), n + i - 1, dtype=torch.int64, device=ctx.device)
            logits.append(tp.step(ref[:, n + i - 1], pos, fns=chk))
        errs = [(g - r).abs().max().item() for g, r in zip(logits, ref_logits)]
        line = (f"[rank {ctx.rank}] W={ctx.world_size} {args.dtype} reduce={args.reduce}: max |logit| (fp32 model) "
                f"{ref_logits.abs().max().item():.3g}; per-step error vs the fp32 model: iris-fw "
                + " ".join(f"{e:.3g}" for e in errs))
        for attn, lg in own.items():
            line += f"; transformers {args.dtype} {attn} " + " ".join(f"{(a - b).abs().max().item():.3g}"
                                                                    for a, b in zip(lg, ref_logits))
        print(line)
        if ctx.rank == 0:
            print("worst relative error per op: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(chk.worst.items())))
        for line in chk.bad[:12]:
            print(f"BAD {line}")
        ctx.barrier()


if __name__ == "__main__":
    main()
