"""A tensor-parallel Llama decoder on iris-fw's ops, its weights read from a Hugging Face
``transformers`` ``LlamaForCausalLM``, generating greedily — eagerly, as one ``torch.compile``d
decode step, or as one CUDA graph replayed per token.

    model = LlamaForCausalLM(LlamaConfig(...))           # any weights; every rank the same
    tp = LlamaTP(model, batch=B, max_len=S)               # collective: every rank of the context
    tokens = tp.generate(input_ids, 32)                   # [B, P + 32], the same on every rank
    tokens = tp.generate(input_ids, 32, mode="graph")     # one CUDA graph, replayed per token

The data flow of one layer on rank ``r`` of ``W`` (``T`` rows: ``B`` at decode, ``B * P`` at
prefill; ``H`` hidden, ``Hq`` / ``Hkv`` heads of dim ``D``, ``I`` the MLP width)::

    qkv   = all_gather(normed @ Wqkv[:, cols_r])          column-parallel q, k, v  [T, (Hq + 2 Hkv) D]
    q, k  = rope(q, pos), rope(k, pos)                    Llama's rotary embedding (rope_type from the model)
    cache[p // W] on rank p % W  <-  k, v                 the KV cache split along the sequence
    o     = flash_decode(q, cache_k, cache_v, kv_lens)    [T, Hq, D] on every rank (prefill: torch SDPA)
    normed, residual = all_reduce_rmsnorm(o[:, rows_r] @ Wo[rows_r], residual, post_norm)   row-parallel
    act   = silu(normed @ Wgate[:, cols_r]) * (normed @ Wup[:, cols_r])                     column-parallel
    normed, residual = all_reduce_rmsnorm(act @ Wdown[cols_r], residual, next_norm)          row-parallel

At W = 1 the gather is skipped (there is nobody to gather from); every other op runs as at
any W. ``reduce="gemm_all_reduce"`` runs the two row-parallel products through
:func:`iris_fw.ops.gemm_all_reduce` instead, with the residual add and RMSNorm in torch
afterwards. Columns / rows that do not divide by ``W`` are padded with zeros (exact: a zero
column of ``Wgate`` and ``Wup`` gives ``silu(0) * 0 = 0``). The embedding, the norms and the
LM head are replicated. Token ``p`` of every sequence is stored on rank ``p mod W`` (balanced
while the cache grows; attention is a sum over keys whose positions are already in the rotary
embedding, so which rank holds a key does not change the result).

Decode state lives on the device — positions ``pos [B]``, the next tokens, the generated
tokens and the per-rank valid lengths (computed from ``pos``) — so a captured decode step
replays with the sequence advancing on the device and no host synchronization.
:func:`reference_generate` is the single-process transformers loop the tests compare with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .. import ccl
from .. import context as _context
from .. import ops
from ..errors import ArgumentError, ArgumentTypeError
from ..flash_decode import MAX_HEAD_DIM

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["MODES", "REDUCES", "LlamaTP", "reference_generate"]

#: ``generate(mode=...)``: eager calls, one compiled decode step, one CUDA graph per decode step.
MODES = ("eager", "compile", "graph")
#: ``LlamaTP(reduce=...)``: how the row-parallel products are summed over the ranks.
REDUCES = ("all_reduce_rmsnorm", "gemm_all_reduce")
#: Model dtypes (the ops' dtypes).
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: ``rope_type``s whose frequencies do not depend on the sequence length (read once from the model).
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass
class _Layer:
    """One decoder layer's shard on this rank (weights in ``F.linear``'s ``[out, in]`` layout)."""

    ln_in: torch.Tensor      # [H]
    ln_post: torch.Tensor    # [H]
    w_qkv: torch.Tensor      # [NL, H]: this rank's columns of the concatenated q, k, v projections
    w_o: torch.Tensor        # [H, KO]: this rank's input columns of o_proj
    w_o_kn: torch.Tensor     # [KO, H]: the same as gemm_all_reduce's b
    w_gu: torch.Tensor       # [2 IL, H]: this rank's gate rows, then its up rows
    w_down: torch.Tensor     # [H, IL]
    w_down_kn: torch.Tensor  # [IL, H]
    k_cache: torch.Tensor    # [B, S_cap, Hkv, D]: the keys of positions p = r, r + W, ... at p // W
    v_cache: torch.Tensor    # [B, S_cap, Hkv, D]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _rows(w: torch.Tensor, rank: int, per: int, world: int) -> torch.Tensor:
    """Rows ``rank * per ... (rank + 1) * per`` of ``w`` padded with zero rows to ``per * world``."""
    pad = per * world - w.shape[0]
    if pad:
        w = torch.cat([w, w.new_zeros(pad, *w.shape[1:])])
    return w[rank * per:(rank + 1) * per].contiguous()


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: statistics in fp32, the normalized value rounded to x's dtype, times ``weight``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Direct:
    """The ops as plain calls (eager and CUDA-graph capture)."""

    @staticmethod
    def all_gather(x: torch.Tensor, world: int) -> torch.Tensor:
        out = x.new_empty((world * x.shape[0], *x.shape[1:]))
        ccl.all_gather_into_tensor(out, x)
        return out

    @staticmethod
    def all_reduce_rmsnorm(x, residual, weight, eps):
        return ccl.all_reduce_rmsnorm(x, residual, weight, eps)

    @staticmethod
    def gemm_all_reduce(a, b):
        return ops.gemm_all_reduce(a, b)

    @staticmethod
    def flash_decode(q, k, v, kv_lens, sm_scale):
        return ops.flash_decode(q, k, v, kv_lens=kv_lens, sm_scale=sm_scale)


class _TorchOps:
    """The ops as ``torch.ops.iris_fw`` custom ops (what ``torch.compile`` traces without breaks)."""

    @staticmethod
    def all_gather(x: torch.Tensor, world: int) -> torch.Tensor:
        return torch.ops.iris_fw.all_gather_into_tensor(x, None, "auto")

    @staticmethod
    def all_reduce_rmsnorm(x, residual, weight, eps):
        return torch.ops.iris_fw.all_reduce_rmsnorm(x, residual, weight, eps, None, "auto")

    @staticmethod
    def gemm_all_reduce(a, b):
        return torch.ops.iris_fw.gemm_all_reduce(a, b, None, "auto")

    @staticmethod
    def flash_decode(q, k, v, kv_lens, sm_scale):
        return torch.ops.iris_fw.flash_decode(q, k, v, kv_lens, sm_scale, "auto", None, None)


def _check_config(config: Any) -> None:
    """Raise :class:`ArgumentError` for a Llama configuration this decoder does not implement."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ArgumentError(f"model.config.hidden_act must be 'silu' (Llama's MLP), got {act!r}")
    for name in ("attention_bias", "mlp_bias"):
        if getattr(config, name, False):
            raise ArgumentError(f"model.config.{name}=True is not supported (Llama checkpoints have no biases)")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % kv:
        raise ArgumentError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise ArgumentError(f"the head dim must be even (rotary halves) and at most {MAX_HEAD_DIM} (flash_decode), "
                            f"got {head_dim}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in STATIC_ROPE:
        raise ArgumentError(f"rope_type {rope_type!r} is not supported (its frequencies change with the sequence "
                            f"length); supported: {', '.join(STATIC_ROPE)}")


def _agree(ctx: Context, what: str, check) -> None:
    """Run ``check() -> dict`` (this rank's fields; it may raise) on every rank and compare the
    fields across ranks through :meth:`Context.agree` (bounded, with the call's identity): a
    rank's error re-raises there and raises :class:`~iris_fw.errors.CollectiveMismatch` naming it
    on the others; a field that differs raises on every rank naming it."""
    error, fields = None, {}
    try:
        fields = check()
    except Exception as exc:  # noqa: BLE001 - every rank must take part in the exchange
        error = exc
    ctx.agree(what, fields, error)


def _fingerprint(model: Any) -> float:
    """A cheap checksum of the weights (float64 sums of a few rows of every matrix), to catch
    ranks holding different models."""
    total = 0.0
    with torch.no_grad():
        for p in model.parameters():
            total += float(p.reshape(-1)[:4096].double().sum())
    return round(total, 6)


class LlamaTP:
    """A tensor-parallel Llama decoder over the context's ranks (collective: every rank
    constructs it from the same ``model`` and calls its methods in the same order).

    ``model``: a ``transformers`` ``LlamaForCausalLM`` (or anything with its ``config``,
    ``model.embed_tokens``, ``model.layers``, ``model.norm``, ``model.rotary_emb`` and
    ``lm_head``), the same weights on every rank; its parameters' dtype (fp32, bf16, fp16) is the
    decoder's. ``batch``: sequences decoded together; ``max_len``: prompt + generated tokens at
    most (the KV cache holds ``ceil(max_len / W)`` positions per rank). ``reduce``: one of
    :data:`REDUCES`. The model is not kept: its weights are sliced and copied to ``ctx.device``."""

    def __init__(self, model: Any, *, batch: int, max_len: int, reduce: str = "all_reduce_rmsnorm",
                 ctx: Context | None = None) -> None:
        ctx = _context.resolve(ctx)

        def check() -> dict:
            if reduce not in REDUCES:
                raise ArgumentError(f"reduce must be one of {', '.join(REDUCES)}, got {reduce!r}")
            for name, value in (("batch", batch), ("max_len", max_len)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ArgumentError(f"{name} must be an int >= 1, got {value!r}")
            _check_config(model.config)
            dtype = model.lm_head.weight.dtype
            if dtype not in DTYPES:
                raise ArgumentTypeError(f"the model's dtype is {dtype}; supported: {', '.join(map(str, DTYPES))}")
            c = model.config
            return {"batch": batch, "max_len": max_len, "reduce": reduce, "dtype": str(model.lm_head.weight.dtype),
                    "config": (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                               c.num_key_value_heads, c.vocab_size, float(c.rms_norm_eps)),
                    "weights (checksum)": _fingerprint(model)}

        _agree(ctx, "LlamaTP", check)
        config = model.config
        self.ctx, self.config, self.reduce = ctx, config, reduce
        self.batch, self.max_len = batch, max_len
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        self.world, self.rank = w, r
        self.hidden = config.hidden_size
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.n_heads
        self.eps = float(config.rms_norm_eps)
        self.sm_scale = self.head_dim ** -0.5
        self.dtype = model.lm_head.weight.dtype

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(dev).contiguous()

        d, hq, hkv = self.head_dim, self.n_heads, self.n_kv
        self.qkv_cols = (hq + 2 * hkv) * d
        self.qkv_per_rank = _ceil_div(self.qkv_cols, w)
        self.o_per_rank = _ceil_div(hq * d, w)
        inter = config.intermediate_size
        self.mlp_per_rank = _ceil_div(inter, w)
        self.cache_len = _ceil_div(max_len, w)
        inner = model.model
        rot = inner.rotary_emb
        self.inv_freq = put(rot.inv_freq.float())                      # [D / 2]
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.embed = put(inner.embed_tokens.weight)                    # [V, H]
        self.norm_w = put(inner.norm.weight)                           # [H]
        self.lm_head = put(model.lm_head.weight)                       # [V, H]
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in inner.layers:
                at, mlp = layer.self_attn, layer.mlp
                qkv = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])   # [(Hq + 2 Hkv) D, H]
                w_o = _rows(at.o_proj.weight.t(), r, self.o_per_rank, w)                   # [KO, H]
                w_down = _rows(mlp.down_proj.weight.t(), r, self.mlp_per_rank, w)          # [IL, H]
                gate = _rows(mlp.gate_proj.weight, r, self.mlp_per_rank, w)
                up = _rows(mlp.up_proj.weight, r, self.mlp_per_rank, w)
                self.layers.append(_Layer(
                    ln_in=put(layer.input_layernorm.weight), ln_post=put(layer.post_attention_layernorm.weight),
                    w_qkv=put(_rows(qkv, r, self.qkv_per_rank, w)),
                    w_o=put(w_o.t()), w_o_kn=put(w_o), w_gu=put(torch.cat([gate, up])),
                    w_down=put(w_down.t()), w_down_kn=put(w_down),
                    k_cache=torch.zeros(batch, self.cache_len, hkv, d, dtype=self.dtype, device=dev),
                    v_cache=torch.zeros(batch, self.cache_len, hkv, d, dtype=self.dtype, device=dev)))
        # decode state, on the device
        self.pos = torch.zeros(batch, dtype=torch.int64, device=dev)          # position of the next token to feed
        self.next_tokens = torch.zeros(batch, dtype=torch.int64, device=dev)  # the token to feed at pos
        self.tokens = torch.zeros(batch, max_len, dtype=torch.int64, device=dev)
        self.logits = torch.zeros(batch, config.vocab_size, dtype=torch.float32, device=dev)
        self._arange = torch.arange(batch, device=dev)
        self._host_len = 0   # host copy of the sequence length (bounds checks; never read back from the device)
        self._compiled = None
        self._graph = None

    # ---- the math ------------------------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``x [T, heads, D]`` rotated by positions ``pos [T]`` (fp32 angles, as transformers)."""
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)[:, None, :]
        sin = (emb.sin() * self.rope_scale).to(x.dtype)[:, None, :]
        return x * cos + _rotate_half(x) * sin

    def _qkv(self, fns, layer: _Layer, normed: torch.Tensor):
        """Column-parallel q, k, v of ``normed [T, H]``: ``([T, Hq, D], [T, Hkv, D], [T, Hkv, D])``."""
        t, d = normed.shape[0], self.head_dim
        part = F.linear(normed, layer.w_qkv)                                  # [T, NL]
        if self.world == 1:                                                   # nobody to gather from
            full = part
        else:
            full = fns.all_gather(part, self.world)                           # [W * T, NL]
            # contiguous: a padded gather leaves rows of W * NL > (Hq + 2 Hkv) D elements, and torch's
            # fused attention misreads rows that are not 16-byte aligned: on one H100, a bf16 v with a
            # 450-element row stride (W = 3's) gave an error of 3.49, strides of 64 or 448 gave 0.008
            # (scripts/diag_sdpa_stride.py, docs/gpu-tests.md run 17)
            full = full.view(self.world, t, self.qkv_per_rank).transpose(0, 1).reshape(t, -1)[:, :self.qkv_cols]
            full = full.contiguous()
        q, k, v = full.split([self.n_heads * d, self.n_kv * d, self.n_kv * d], dim=-1)
        return q.reshape(t, self.n_heads, d), k.reshape(t, self.n_kv, d), v.reshape(t, self.n_kv, d)

    def _row_parallel(self, fns, a: torch.Tensor, w: torch.Tensor, w_kn: torch.Tensor, residual: torch.Tensor,
                      norm_w: torch.Tensor):
        """``sum over ranks of a @ w.T`` added to ``residual``, then RMSNorm with ``norm_w``:
        ``(normed, residual)``."""
        if self.reduce == "all_reduce_rmsnorm":
            return fns.all_reduce_rmsnorm(F.linear(a, w), residual, norm_w, self.eps)
        residual = residual + fns.gemm_all_reduce(a, w_kn)
        return _rmsnorm(residual, norm_w, self.eps), residual

    def _o_shard(self, o: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the attention output ``o [T, Hq * D]`` (zero-padded)."""
        pad = self.o_per_rank * self.world - o.shape[1]
        if pad:
            o = F.pad(o, (0, pad))
        return o[:, self.rank * self.o_per_rank:(self.rank + 1) * self.o_per_rank]

    def _layers(self, fns, x: torch.Tensor, attend) -> torch.Tensor:
        """Every layer over the rows ``x [T, H]`` (embeddings); ``attend(i, layer, q, k, v) -> o
        [T, Hq * D]``. Returns the final-norm hidden states ``[T, H]``."""
        residual = x
        normed = _rmsnorm(x, self.layers[0].ln_in, self.eps)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(fns, layer, normed)
            o = attend(layer, q, k, v)
            normed, residual = self._row_parallel(fns, self._o_shard(o), layer.w_o, layer.w_o_kn, residual,
                                                  layer.ln_post)
            gate, up = F.linear(normed, layer.w_gu).split(self.mlp_per_rank, dim=-1)
            act = F.silu(gate) * up
            nxt = self.layers[i + 1].ln_in if i + 1 < len(self.layers) else self.norm_w
            normed, residual = self._row_parallel(fns, act, layer.w_down, layer.w_down_kn, residual, nxt)
        return normed

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, fns: Any = _Direct) -> torch.Tensor:
        """One decode step: feed ``tokens [B]`` at positions ``pos [B]`` (int64, on the device),
        store their keys and values in the cache, return the logits ``[B, V]`` (fp32).
        Nothing is read back to the host."""
        w, r = self.world, self.rank
        owner = (pos % w == r)[:, None, None]                          # this rank stores position pos
        slot = torch.clamp(pos // w, max=self.cache_len - 1)
        kv_lens = torch.div(pos + w - r, w, rounding_mode="floor").to(torch.int32)   # valid tokens here, pos included

        def attend(layer: _Layer, q, k, v):
            k = self._rope(k, pos)
            q = self._rope(q, pos)
            idx = (self._arange, slot)
            layer.k_cache[idx] = torch.where(owner, k, layer.k_cache[idx])
            layer.v_cache[idx] = torch.where(owner, v, layer.v_cache[idx])
            o = fns.flash_decode(q, layer.k_cache, layer.v_cache, kv_lens, self.sm_scale)   # [B, Hq, D]
            return o.reshape(o.shape[0], -1)

        hidden = self._layers(fns, F.embedding(tokens, self.embed), attend)
        return F.linear(hidden, self.lm_head).float()

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompts ``input_ids [B, P]`` (torch attention, causal), fill the cache, set the
        decode state (``pos = P``, next tokens = the greedy choice); returns the last position's
        logits ``[B, V]`` (fp32)."""
        holder = {}

        def check() -> dict:
            holder["ids"] = self._check_ids(input_ids)
            return {"input_ids": holder["ids"].cpu().tolist()}

        _agree(self.ctx, "LlamaTP.prefill", check)
        return self._prefill(holder["ids"])

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        b, p = ids.shape
        w, r, dev = self.world, self.rank, self.ctx.device
        positions = torch.arange(p, device=dev)
        mine = p // w + (1 if r < p % w else 0)                        # positions r, r + W, ... < P

        def attend(layer: _Layer, q, k, v):
            q = self._rope(q, positions.repeat(b)).view(b, p, self.n_heads, self.head_dim)
            k = self._rope(k, positions.repeat(b)).view(b, p, self.n_kv, self.head_dim)
            v = v.reshape(b, p, self.n_kv, self.head_dim)
            layer.k_cache[:, :mine] = k[:, r::w]
            layer.v_cache[:, :mine] = v[:, r::w]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, scale=self.sm_scale, enable_gqa=True)
            return o.transpose(1, 2).reshape(b * p, -1)

        with torch.no_grad():
            hidden = self._layers(_Direct, F.embedding(ids.reshape(-1), self.embed), attend)
            logits = F.linear(hidden.view(b, p, -1)[:, -1], self.lm_head).float()
            self.tokens.zero_()
            self.tokens[:, :p] = ids
            nxt = logits.argmax(-1)
            self.tokens[:, p] = nxt
            self.next_tokens.copy_(nxt)
            self.pos.fill_(p)
            self.logits.copy_(logits)
        self._host_len = p + 1
        return logits

    def fill_cache(self, length: int, seed: int = 0) -> None:
        """Set the state as if a prompt of ``length`` tokens had been run, with random keys and
        values (normal, seeded by ``seed`` and the rank) and random next tokens (the same on every
        rank): benchmarks at a given KV length without a prefill."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 < length < self.max_len:
            raise ArgumentError(f"length must be an int in [1, max_len={self.max_len}), got {length!r}")
        dev = self.ctx.device
        mine = _ceil_div(length - self.rank, self.world) if length > self.rank else 0
        g = torch.Generator(device=dev).manual_seed(seed * 1009 + self.rank)
        with torch.no_grad():
            for layer in self.layers:
                for cache in (layer.k_cache, layer.v_cache):
                    cache.zero_()
                    cache[:, :mine] = torch.randn(cache[:, :mine].shape, generator=g, device=dev).to(cache.dtype)
            g.manual_seed(seed)
            self.next_tokens.copy_(torch.randint(0, self.config.vocab_size, (self.batch,), generator=g, device=dev))
            self.pos.fill_(length)
            self.tokens.zero_()
        self._host_len = length + 1

    def decode_step(self) -> None:
        """One greedy step on the device state: feeds ``next_tokens`` at ``pos``, writes the
        logits to ``self.logits`` and the chosen tokens to ``self.tokens[:, pos + 1]`` and
        ``next_tokens``, advances ``pos``. In ``compile`` mode the step is the compiled one."""
        if self._host_len >= self.max_len:
            raise ArgumentError(f"the sequence is full: max_len={self.max_len} tokens")
        self._decode_step_device()
        self._host_len += 1

    def _decode_step_device(self) -> None:
        with torch.no_grad():
            fn = self._compiled if self._compiled is not None else self.step
            logits = fn(self.next_tokens, self.pos)
            self.logits.copy_(logits)
            nxt = logits.argmax(-1)
            self.next_tokens.copy_(nxt)
            self.tokens[self._arange, self.pos + 1] = nxt
            self.pos.add_(1)

    # ---- the three ways ------------------------------------------------------------------------------

    def compile(self, backend: str | None = None, **kwargs: Any):
        """Compile the decode step with ``torch.compile(fullgraph=True)`` (the ops as
        ``torch.ops.iris_fw`` custom ops); later steps use it. ``backend``: default inductor on
        GPUs, ``aot_eager`` on CPU ranks. Returns the compiled function ``(tokens, pos) -> logits``."""
        import iris_fw.torch_ops  # noqa: F401  (registers torch.ops.iris_fw.*)

        if backend is None:
            backend = "inductor" if self.ctx.device.type == "cuda" else "aot_eager"
        self._compiled = torch.compile(self._traced_step, fullgraph=True, backend=backend, **kwargs)
        return self._compiled

    def _traced_step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, pos, _TorchOps)

    def explain(self):
        """``torch._dynamo.explain`` of the decode step with the custom ops (graph and break counts)."""
        import iris_fw.torch_ops  # noqa: F401

        torch._dynamo.reset()
        with torch.no_grad():
            return torch._dynamo.explain(self._traced_step)(self.next_tokens.clone(), self.pos.clone())

    def capture(self) -> torch.cuda.CUDAGraph:
        """Capture one decode step (of the current mode: eager ops, or the compiled step) in a
        CUDA graph; :meth:`replay` then advances one token per replay. Runs one real step first
        (on a side stream: it plans every op, validated across ranks) — the state advances by it."""
        if self.ctx.device.type != "cuda":
            raise ArgumentError("CUDA graphs need a CUDA device (this context runs on "
                                f"{self.ctx.device.type})")
        dev = self.ctx.device
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self.decode_step()
        torch.cuda.current_stream(dev).wait_stream(side)
        self.ctx.synchronize()
        self.ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._decode_step_device()
        self._graph = graph
        return graph

    def replay(self) -> None:
        """One decode step by replaying the captured graph (see :meth:`capture`)."""
        if self._graph is None:
            raise ArgumentError("replay() needs capture() first")
        if self._host_len >= self.max_len:
            raise ArgumentError(f"the sequence is full: max_len={self.max_len} tokens")
        self._graph.replay()
        self._host_len += 1

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, mode: str = "eager",
                 return_logits: bool = False):
        """Greedy generation: ``[B, P + max_new_tokens]`` tokens (prompt included), the same on
        every rank; with ``return_logits`` also the logits that chose each new token,
        ``[max_new_tokens, B, V]`` fp32. ``mode``: ``"eager"``, ``"compile"`` (the decode step
        compiled on the first call; kept for later calls) or ``"graph"`` (a CUDA graph captured
        on the first call at this state, replayed per token)."""
        holder = {}

        def check() -> dict:
            if mode not in MODES:
                raise ArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
            if mode == "graph" and self.ctx.device.type != "cuda":
                raise ArgumentError(f"mode='graph' needs a CUDA device (this context runs on {self.ctx.device.type})")
            if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
                raise ArgumentError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
            ids = holder["ids"] = self._check_ids(input_ids)
            if ids.shape[1] + max_new_tokens > self.max_len:
                raise ArgumentError(f"prompt ({ids.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds "
                                    f"max_len={self.max_len}")
            return {"mode": mode, "max_new_tokens": max_new_tokens, "input_ids": ids.cpu().tolist()}

        _agree(self.ctx, "LlamaTP.generate", check)
        p = holder["ids"].shape[1]
        first = self._prefill(holder["ids"])
        logits = [first.clone()] if return_logits else None
        if mode == "compile" and self._compiled is None:
            self.compile()
        remaining = max_new_tokens - 1
        if mode == "graph" and remaining:
            if self._graph is None:
                self.capture()     # one real step
            else:
                self.replay()
            remaining -= 1
            if logits is not None:
                logits.append(self.logits.clone())
            for _ in range(remaining):
                self.replay()
                if logits is not None:
                    logits.append(self.logits.clone())
        else:
            for _ in range(remaining):
                self.decode_step()
                if logits is not None:
                    logits.append(self.logits.clone())
        out = self.tokens[:, :p + max_new_tokens].clone()
        return (out, torch.stack(logits)) if return_logits else out

    def _check_ids(self, input_ids: Any) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ArgumentError(f"input_ids must be a [B, P] tensor, got {type(input_ids).__name__} "
                                f"{list(getattr(input_ids, 'shape', []))}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ArgumentTypeError(f"input_ids must be int64 or int32, got {input_ids.dtype}")
        if input_ids.shape[0] != self.batch:
            raise ArgumentError(f"input_ids must have batch={self.batch} rows, got {input_ids.shape[0]}")
        if not 1 <= input_ids.shape[1] < self.max_len:
            raise ArgumentError(f"the prompt length must be in [1, max_len={self.max_len}), got {input_ids.shape[1]}")
        return input_ids.to(self.ctx.device, torch.int64)


def reference_generate(model: Any, input_ids: torch.Tensor, max_new_tokens: int):
    """Greedy generation by ``model`` itself (transformers, one process, no cache: the whole
    sequence each step): ``(tokens [B, P + n], logits [n, B, V] fp32)``."""
    ids = input_ids
    logits = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(input_ids=ids, use_cache=False).logits[:, -1].float()
            logits.append(out)
            ids = torch.cat([ids, out.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(logits)
