"""A Llama decode step end to end (:class:`iris_fw.models.llama.LlamaTP`) beside transformers'
own, as a benchmark plugin (``iris-fw bench model``).

The model: a Llama-3-8B-shaped layer stack — hidden 4096, 32 query / 8 KV heads of 128, MLP
14336, vocabulary 128256, ``IRIS_FW_BENCH_LAYERS`` layers (default 4) — with
random weights (``transformers.LlamaForCausalLM`` from a ``LlamaConfig``, no download), bf16
(``--dtype``). For every batch of :data:`BATCHES` and every KV length per rank of
:data:`TOKENS` (``--sizes 1K,8K,32K``: tokens), the caches are filled with random keys and
values at that length (:meth:`~iris_fw.models.llama.LlamaTP.fill_cache`) and one interleaved
measurement (:func:`~iris_fw.bench.harness.measure_interleaved`) times one greedy decode step
(all layers, LM head, argmax) per call:

* ``iris_fw eager`` — :meth:`LlamaTP.step` with the ops called eagerly;
* ``iris_fw compiled`` — the step under ``torch.compile(fullgraph=True)`` (inductor on GPUs);
* ``iris_fw graph`` — the whole step captured in one CUDA graph, one replay per token
  (:meth:`LlamaTP.capture`; GPUs only);
* ``transformers eager`` — the same model's own forward over a ``StaticCache`` holding the
  same keys and values (one process: W = 1 only);
* ``transformers compiled`` — that forward under ``torch.compile`` (GPUs, W = 1).

Rows: ``us_per_token`` (one decode step of the batch), ``tokens_per_s`` = batch / step time,
``vs_transformers`` = transformers eager's time over the method's (the issue's target: iris-fw
at W = 1 within 5% of transformers). Before timing, at W = 1 the iris-fw step's logits are
compared with transformers' on the same cache (``max_err``, relative to the largest logit).
Methods that cannot run get a ``skipped`` row with the reason. ``--quick``: batches 1 and 8,
KV 1K and 8K per rank. On CPU ranks (a smoke run) the model is tiny: :data:`CPU_CONFIG`.
"""

from __future__ import annotations

import gc
import itertools

import torch

from .. import env
from ..hookspecs import hookimpl
from .ccl import _attempt, parse_dtype
from .harness import measure_interleaved

#: Llama-3-8B's shapes (hidden, query heads, kv heads, MLP width, vocabulary).
CONFIG = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
          "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
BATCHES, QUICK_BATCHES = (1, 8, 32), (1, 8)
TOKENS, QUICK_TOKENS = (1024, 8192, 32768), (1024, 8192)
#: The CPU smoke run: a tiny model, one point.
CPU_CONFIG = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
              "vocab_size": 64, "rms_norm_eps": 1e-5}
CPU_LAYERS, CPU_BATCHES, CPU_TOKENS = 1, (1,), (16,)
#: Decode steps past the filled length the caches hold (warm-up and timed graph replays advance it).
SLACK = 512


def _model(ctx, dtype, gpu: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(CONFIG if gpu else CPU_CONFIG)
    cfg["num_hidden_layers"] = env.get("IRIS_FW_BENCH_LAYERS") if gpu else CPU_LAYERS
    cfg["max_position_embeddings"] = 1 << 20
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = LlamaForCausalLM(LlamaConfig(**cfg)).to(dtype).eval()
    return model


class _HF:
    """transformers' decode step of ``tokens [B]`` over a ``StaticCache`` of ``length + SLACK``
    positions holding the first ``length`` keys and values of ``tp``'s cache (W = 1: one rank
    holds them all)."""

    def __init__(self, model, tp, batch: int, length: int, tokens: torch.Tensor):
        from transformers import StaticCache

        self.model, self.length = model, length
        self.cache = StaticCache(config=model.config, max_cache_len=length + SLACK)
        dev = tp.ctx.device
        # the tokens iris-fw's step is fed (tp.next_tokens has moved on if a capture ran a step)
        self.tokens = tokens.clone()[:, None]
        self.position = torch.full((batch, 1), length, dtype=torch.int64, device=dev)
        with torch.no_grad():  # initializes the layers' tensors (one token at position 0), then the state
            model(input_ids=self.tokens, past_key_values=self.cache, position_ids=torch.zeros_like(self.position),
                  use_cache=True)
            for layer, mine in zip(self.cache.layers, tp.layers):
                layer.keys.zero_()
                layer.values.zero_()
                layer.keys[:, :, :length] = mine.k_cache[:, :length].transpose(1, 2)
                layer.values[:, :, :length] = mine.v_cache[:, :length].transpose(1, 2)
        self.rewind()

    def rewind(self) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.length)

    def step(self, forward=None) -> torch.Tensor:
        forward = self.model if forward is None else forward  # (a model's truth value is its len())
        with torch.no_grad():
            out = forward(input_ids=self.tokens, past_key_values=self.cache, position_ids=self.position,
                          use_cache=True)
        return out.logits[:, -1].float()


class ModelBench:
    name = "model"
    description = ("a Llama-3-8B-shaped layer stack decoding on iris-fw (tensor parallel; eager, compiled, one "
                   "CUDA graph per token) beside transformers' own decode step (W = 1): us per token, tokens/s")
    plot = [
        {"x": "kv_tokens_per_rank", "y": "us_per_token", "series": "method", "facet": "batch", "logy": True,
         "xlabel": "KV tokens per rank", "ylabel": "us per decode step", "suffix": "_latency"},
    ]

    def run(self, ctx, opts):
        dtype = parse_dtype(opts.extra.get("dtype")) if opts.extra.get("dtype") else torch.bfloat16
        gpu = ctx.device.type == "cuda"
        if gpu:
            tokens = list(opts.sizes) if opts.extra.get("explicit_sizes") else list(QUICK_TOKENS if opts.quick
                                                                                     else TOKENS)
            batches = list(QUICK_BATCHES if opts.quick else BATCHES)
        else:
            tokens, batches = list(CPU_TOKENS), list(CPU_BATCHES)
        rows, skipped = [], {}
        try:
            import transformers  # noqa: F401
        except ImportError:
            return [{"method": "all", "skipped": "needs transformers (pip install transformers)"}]
        if ctx.world_size != 1:
            skipped["transformers"] = "one process: runs at W = 1 only"
        if not gpu:
            skipped["iris_fw graph"] = "CPU ranks: no CUDA graphs"
            skipped["transformers compiled"] = "CPU ranks: left out of the smoke run (compile time)"
        model = _model(ctx, dtype, gpu)
        cfg = model.config
        opts.log(f"  {ctx.world_size} ranks, {dtype}, hidden {cfg.hidden_size}, {cfg.num_attention_heads} q / "
                 f"{cfg.num_key_value_heads} kv heads, MLP {cfg.intermediate_size}, {cfg.num_hidden_layers} layers, "
                 f"vocab {cfg.vocab_size}; batches {batches}, KV tokens per rank {tokens}")
        for batch, ntok in itertools.product(batches, tokens):
            rows += self._point(ctx, opts, model, batch, ntok, gpu, dict(skipped))
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
            ctx.barrier()
        rows += [{"method": m, "skipped": why} for m, why in skipped.items()]
        return rows

    def _point(self, ctx, opts, model, batch, ntok, gpu, skipped) -> list[dict]:
        from ..models.llama import LlamaTP

        w = ctx.world_size
        length = ntok * w
        tp = LlamaTP(model, batch=batch, max_len=length + SLACK)
        tp.fill_cache(length, seed=batch)
        tok, pos = tp.next_tokens.clone(), tp.pos.clone()
        fns, notes = {}, {}
        fns["iris_fw eager"] = lambda i: tp.step(tok, pos).argmax(-1)
        if "iris_fw graph" not in skipped:
            why = _attempt(ctx, tp.capture)
            if why is None:
                graph = tp._graph
                fns["iris_fw graph"] = lambda i: graph.replay()
            else:
                notes["iris_fw graph"] = why
        holder = {}
        why = _attempt(ctx, lambda: holder.setdefault("f", tp.compile()) and holder["f"](tok, pos))
        if why is None:
            compiled = holder["f"]
            fns["iris_fw compiled"] = lambda i: compiled(tok, pos).argmax(-1)
        else:
            notes["iris_fw compiled"] = why
        hf, err = None, None
        if "transformers" not in skipped:
            why = _attempt(ctx, lambda: holder.setdefault("hf", _HF(model, tp, batch, length, tok)))
            if why is None:
                hf = holder["hf"]
                with torch.no_grad():
                    mine = tp.step(tok, pos)
                ref = hf.step()
                hf.rewind()
                err = float((mine - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                fns["transformers eager"] = lambda i: hf.step().argmax(-1)
                if "transformers compiled" not in skipped:
                    cf = torch.compile(model)
                    why = _attempt(ctx, lambda: (hf.step(cf), hf.rewind()))
                    if why is None:
                        fns["transformers compiled"] = lambda i: hf.step(cf).argmax(-1)
                    else:
                        notes["transformers compiled"] = why
            else:
                notes["transformers eager"] = why
        if hf is not None:
            hf.rewind()
        times = measure_interleaved(ctx, fns, opts.iters, opts.warmup)
        base = times.get("transformers eager")
        rows, parts = [], []
        for name, us in times.items():
            row = {"batch": batch, "kv_tokens_per_rank": ntok, "method": name, "us_per_token": us,
                   "tokens_per_s": batch / us * 1e6, "layers": model.config.num_hidden_layers}
            if base:
                row["vs_transformers"] = base / us
            if err is not None and name.startswith("iris_fw"):
                row["max_err"] = err
            rows.append(row)
            parts.append(f"{name} {us:.0f}")
        rows += [{"batch": batch, "kv_tokens_per_rank": ntok, "method": m, "skipped": why} for m, why in notes.items()]
        opts.log(f"  B {batch} KV {ntok}/rank (us per token): " + ", ".join(parts)
                 + (f"; logits vs transformers: max rel err {err:.2g}" if err is not None else ""))
        del fns, holder, hf, tp
        torch._dynamo.reset()
        return rows


@hookimpl
def iris_fw_register_benchmarks(registry):
    registry.register(ModelBench())
