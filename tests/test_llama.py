"""A real model end to end (``iris_fw.models.llama``): a tensor-parallel Llama decoder built from a
``transformers`` ``LlamaForCausalLM`` with random weights (a seed, no download) generates
greedily on W ranks — eagerly, as one ``torch.compile``d decode step, as one CUDA graph per token
(GPU) — and gives the tokens of the single-process transformers model, with its logits; heap use
stays flat over many decode steps without a barrier; bad arguments raise.

CPU ranks (the interpreter is slow: ~1-3 s per decode step): 4 new tokens by default, 32 under
``-m extended`` (and on GPUs), in fp32. GPUs: a larger configuration, fp32 tokens and bf16 logits.
"""

import pytest
import torch

import iris_fw
from helpers import world_params

transformers = pytest.importorskip("transformers")

from iris_fw.errors import ArgumentError  # noqa: E402
from iris_fw.models.llama import LlamaTP, reference_generate  # noqa: E402

INTERP = iris_fw.interpreting()
#: New tokens of the default CPU run (every decode step interprets every kernel) and of the full check.
SHORT, FULL = 4, 32
#: fp32 logits of the decoder against transformers' (different summation orders only).
FP32_TOL = 1e-4


def _config(device_type: str, layers: int = 2, kv_heads: int = 2):
    """A tiny Llama (CPU ranks) or a small one (GPUs). Head counts are not multiples of 3 or 2
    everywhere on purpose (q/k/v columns and the MLP width are padded per rank); weights are
    larger than transformers' default init so that greedy choices have clear margins."""
    from transformers import LlamaConfig

    if device_type == "cpu":
        return LlamaConfig(hidden_size=96, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=6,
                           num_key_value_heads=kv_heads, vocab_size=128, max_position_embeddings=1024,
                           initializer_range=0.1)
    return LlamaConfig(hidden_size=320, intermediate_size=1000, num_hidden_layers=4, num_attention_heads=10,
                       num_key_value_heads=kv_heads, vocab_size=1000, max_position_embeddings=1024,
                       initializer_range=0.05)


def _model(ctx, seed: int = 0, dtype=torch.float32, **kw):
    """The same random model on every rank (seeded on the CPU), on the rank's device."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_config(ctx.device.type, **kw)).eval()
    return model.to(device=ctx.device, dtype=dtype)


def _prompt(ctx, model, batch: int, length: int = 5, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g).to(ctx.device)


def _compare(ref, ref_logits, got, got_logits, prompt_len: int, tol: float) -> int:
    """Tokens equal step by step and logits within ``tol``, up to the first step where
    transformers' top-2 margin is within ``2 * tol`` and the choices differ (a tie either way:
    the sequences may then part); returns the steps compared, asserting otherwise."""
    top2 = ref_logits.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min(dim=-1).values                    # [n]
    for i in range(ref_logits.shape[0]):
        col = prompt_len + i
        if not torch.equal(ref[:, col], got[:, col]):
            assert margin[i] <= 2 * tol, (f"step {i}: token {got[:, col].tolist()} != transformers' "
                                          f"{ref[:, col].tolist()} (margin {margin[i]:.3g})")
            return i
        if got_logits is not None:
            err = (got_logits[i] - ref_logits[i]).abs().max().item()
            assert err <= tol, f"step {i}: logits differ by {err:.3g} > {tol}"
    return ref_logits.shape[0]


# ---- tokens against transformers -------------------------------------------------------------------


def _tokens_rank(ctx, n_new, reduce, batch):
    model = _model(ctx)
    ids = _prompt(ctx, model, batch)
    ref, ref_logits = reference_generate(model, ids, n_new)
    tp = LlamaTP(model, batch=batch, max_len=ids.shape[1] + n_new, reduce=reduce)
    got, logits = tp.generate(ids, n_new, return_logits=True)
    ctx.synchronize()
    assert got.shape == ref.shape and torch.equal(got[:, :ids.shape[1]], ids)
    tol = FP32_TOL if ctx.device.type == "cpu" else 1e-3
    steps = _compare(ref.cpu(), ref_logits.cpu(), got.cpu(), logits.cpu(), ids.shape[1], tol)
    assert steps == n_new, f"only {steps} of {n_new} steps before a tie"   # the seed's margins are clear
    return got.cpu()


def _token_cases():
    """``(world, reduce, batch, new tokens)``: the short run by default on CPU ranks, the rest extended."""
    arn, gar = "all_reduce_rmsnorm", "gemm_all_reduce"
    default = [(1, arn, 1, SHORT), (2, gar, 2, SHORT)]
    more = [(3, arn, 1, SHORT), (2, arn, 1, SHORT), (1, gar, 1, SHORT), (3, gar, 2, SHORT)] + [(w, arn, 1, FULL) for w in (1, 2, 3)]
    more += [(3, gar, 2, FULL)]
    if not INTERP:  # GPUs: every combination, 32 tokens
        combos = sorted({c[:3] for c in default + more})
        return [pytest.param(*c, FULL, id=f"w{c[0]}-{c[1]}-b{c[2]}-n{FULL}") for c in combos]
    cases = [pytest.param(*c, id=f"w{c[0]}-{c[1]}-b{c[2]}-n{c[3]}") for c in default]
    cases += [pytest.param(*c, id=f"w{c[0]}-{c[1]}-b{c[2]}-n{c[3]}", marks=pytest.mark.extended) for c in more]
    return cases


@pytest.mark.parametrize("w,reduce,batch,n_new", _token_cases())
def test_tokens_match_transformers(iris_pool, w, reduce, batch, n_new):
    """Greedy tokens and fp32 logits of the TP decoder equal transformers' (one process), every
    rank the same; both row-parallel reductions; batch 2 (two prompts)."""
    outs = iris_pool(w).run(_tokens_rank, n_new, reduce, batch, timeout=3600 if INTERP and n_new > SHORT else 600)
    assert all(torch.equal(o, outs[0]) for o in outs)


# ---- against transformers' own tensor parallelism ---------------------------------------------------


def _hf_tp_rank(ctx, path, n_new):
    """transformers' ``tp_plan="auto"`` (DTensor over torch.distributed: gloo on CPU ranks) on
    the same checkpoint, beside the iris-fw decoder."""
    import os
    import socket

    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    model = _model(ctx)
    if ctx.rank == 0:
        model.save_pretrained(path)                   # a local copy of the random model (nothing downloaded)
    port = None
    if not dist.is_initialized():
        if ctx.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = ctx.broadcast(port, src=0)
    ctx.barrier()
    os.environ.update(RANK=str(ctx.rank), LOCAL_RANK=str(ctx.device.index or 0), WORLD_SIZE=str(ctx.world_size))
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                                world_size=ctx.world_size)
    try:
        hf_tp = LlamaForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.float32).eval()
        ids = _prompt(ctx, model, 1)
        ref, ref_logits = reference_generate(hf_tp, ids, n_new)
        del hf_tp
    finally:
        if own:
            dist.destroy_process_group()
    tp = LlamaTP(model, batch=1, max_len=ids.shape[1] + n_new)
    got, logits = tp.generate(ids, n_new, return_logits=True)
    tol = FP32_TOL if ctx.device.type == "cpu" else 1e-3
    assert _compare(ref.cpu(), ref_logits.cpu(), got.cpu(), logits.cpu(), ids.shape[1], tol) == n_new


def test_tokens_match_transformers_tensor_parallel(iris_pool, tmp_path):
    """The same tokens and logits as transformers' own tensor parallelism (``tp_plan="auto"``)
    at W = 2 (its plan needs head counts that divide W). Needs ``accelerate`` (transformers
    asks for it with ``tp_plan``); on GPUs two of them (NCCL refuses two ranks on one GPU)."""
    from iris_fw.launch import gpu_count

    pytest.importorskip("accelerate")
    if not INTERP and gpu_count() < 2:
        pytest.skip("transformers' tensor parallelism runs over NCCL: two GPUs (NCCL refuses a shared GPU)")
    iris_pool(2).run(_hf_tp_rank, str(tmp_path / "llama"), 2 if INTERP else FULL)


# ---- torch.compile ---------------------------------------------------------------------------------


def _compile_rank(ctx, n_new):
    torch._dynamo.reset()
    model = _model(ctx)
    ids = _prompt(ctx, model, 1)
    ref, ref_logits = reference_generate(model, ids, n_new)
    tp = LlamaTP(model, batch=1, max_len=ids.shape[1] + n_new + 1)
    explained = tp.explain()                    # runs one traced step (its cache write is overwritten below)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    got, logits = tp.generate(ids, n_new, mode="compile", return_logits=True)
    ctx.synchronize()
    tol = FP32_TOL if ctx.device.type == "cpu" else 1e-3
    assert _compare(ref.cpu(), ref_logits.cpu(), got.cpu(), logits.cpu(), ids.shape[1], tol) == n_new
    torch._dynamo.reset()


@pytest.mark.parametrize("world", world_params(2), indirect=True, ids=lambda w: f"w{w}")
def test_compiled_decode_step(world):
    """The decode step under ``torch.compile(fullgraph=True)``: one graph, no graph break (every
    op a ``torch.ops.iris_fw`` custom op), and the same tokens as transformers."""
    world.run(_compile_rank, 2 if INTERP else FULL)


# ---- heap flat over many steps ---------------------------------------------------------------------


def _flat_rank(ctx, steps):
    model = _model(ctx, layers=1, kv_heads=1)
    ids = _prompt(ctx, model, 1, length=3)
    tp = LlamaTP(model, batch=1, max_len=ids.shape[1] + steps + 1)
    tp.prefill(ids)
    tp.decode_step()                                   # the first call of each op plans (and allocates) it
    ctx.synchronize()
    used = ctx.heap.bytes_used
    blocks = len(ctx.heap.blocks())
    for i in range(steps - 1):                         # no barrier, no synchronize: the ops pace themselves
        tp.decode_step()
        if i % 50 == 0:
            assert ctx.heap.bytes_used == used and len(ctx.heap.blocks()) == blocks, (i, ctx.heap.bytes_used, used)
    ctx.synchronize()
    assert ctx.heap.bytes_used == used and len(ctx.heap.blocks()) == blocks
    got = tp.tokens[:, :ids.shape[1] + steps + 1].cpu()
    ref, ref_logits = reference_generate(model, ids, steps + 1)
    n = _compare(ref.cpu(), ref_logits.cpu(), got, None, ids.shape[1], FP32_TOL)
    assert n >= min(steps, 32), f"tokens parted from transformers' after {n} steps"
    return used


def _small_heap_pool(w):
    from iris_fw.launch import gpu_count, share_gpus
    from iris_fw.testing import RankPool

    gpus = gpu_count()
    if gpus and w > gpus and not share_gpus():
        pytest.skip(f"world size {w} needs {w} GPUs, {gpus} visible (or IRIS_FW_SHARE_GPUS=1)")
    return RankPool(w, heap_size=8 << 20)


@pytest.mark.parametrize("steps", [pytest.param(6, id="6", marks=pytest.mark.extended if INTERP else ()),
                                   pytest.param(500, id="500", marks=pytest.mark.extended if INTERP else ())])
def test_heap_flat_over_decode_steps(steps):
    """Hundreds of decode steps on 2 ranks with an 8 MiB heap, no user barrier: heap bytes and
    blocks flat after the first step, nothing leaked (the pool checks), tokens still transformers'."""
    pool = _small_heap_pool(2)
    try:
        used = pool.run(_flat_rank, steps, timeout=3600)
        assert used[0] == used[1]
    finally:
        pool.close()


# ---- CUDA graph (GPU) ------------------------------------------------------------------------------


def _graph_rank(ctx, n_new):
    model = _model(ctx)
    ids = _prompt(ctx, model, 2)
    eager_tp = LlamaTP(model, batch=2, max_len=ids.shape[1] + n_new)
    want, want_logits = eager_tp.generate(ids, n_new, return_logits=True)
    tp = LlamaTP(model, batch=2, max_len=ids.shape[1] + n_new)
    got, logits = tp.generate(ids, n_new, mode="graph", return_logits=True)
    ctx.synchronize()
    # the same kernels as the eager steps: equal tokens, logits within rounding (a near-tie of
    # the eager logits is the only place the two may part)
    steps = _compare(want.cpu(), want_logits.cpu(), got.cpu(), logits.cpu(), ids.shape[1], 1e-4)
    assert steps == n_new or steps >= 100, steps
    ref, ref_logits = reference_generate(model, ids, FULL)
    assert _compare(ref.cpu(), ref_logits.cpu(), got[:, :ids.shape[1] + FULL].cpu(), logits[:FULL].cpu(),
                    ids.shape[1], 1e-3) == FULL
    # a second generation replays the same graph from a new prompt
    ids2 = _prompt(ctx, model, 2, seed=5)
    assert torch.equal(tp.generate(ids2, 16, mode="graph"), eager_tp.generate(ids2, 16))


@pytest.mark.skipif(INTERP, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("world", world_params(1, 2, 3), indirect=True, ids=lambda w: f"w{w}")
def test_graph_decode_500_tokens(world):
    """The whole decode step captured in one CUDA graph and replayed per token, the KV length
    advancing on the device: 500 tokens equal to the eager decoder's, the first 32 to transformers'."""
    world.run(_graph_rank, 500)


def _bf16_rank(ctx):
    """Teacher-forced against the float32 model of the same (bf16) weights: its greedy tokens fed
    to iris-fw's bf16 decoder, every step's logits compared with its logits. The bound is bf16's
    own: 5% of the largest logit, or 1.5x the error of transformers' bf16 model on the same tokens
    where that is larger (on one H100 under MPS at W = 3 transformers' own bf16 logits were off
    by ~4, scripts/diag_mps_numerics.py)."""
    import copy

    model = _model(ctx, dtype=torch.bfloat16)
    ids = _prompt(ctx, model, 2)
    p = ids.shape[1]
    ref, ref_logits = reference_generate(copy.deepcopy(model).float(), ids, FULL)     # [FULL, B, V]
    with torch.no_grad():
        own = model(input_ids=ref[:, :p + FULL - 1], use_cache=False).logits[:, p - 1:].float().transpose(0, 1)
    tp = LlamaTP(model, batch=2, max_len=p + FULL)
    got = [tp.prefill(ids)]
    for i in range(1, FULL):
        pos = torch.full((2,), p + i - 1, dtype=torch.int64, device=ctx.device)
        got.append(tp.step(ref[:, p + i - 1], pos))
    got = torch.stack(got)
    scale = ref_logits.abs().max().item()
    err, own_err = (got - ref_logits).abs().max().item(), (own - ref_logits).abs().max().item()
    bound = max(0.05 * scale, 1.5 * own_err)
    assert err <= bound, (f"iris-fw's bf16 logits differ from the fp32 model's by {err:.3g} > {bound:.3g} "
                          f"(transformers' bf16: {own_err:.3g}; largest logit {scale:.3g})")
    top2 = ref_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * err
    assert torch.equal(got.argmax(-1)[clear], ref_logits.argmax(-1)[clear])


@pytest.mark.skipif(INTERP, reason="bf16 against transformers' bf16 kernels is checked on GPUs")
@pytest.mark.parametrize("world", world_params(1, 2, 3), indirect=True, ids=lambda w: f"w{w}")
def test_bf16_logits(world):
    """bf16 on GPUs: logits within bf16 tolerance of transformers' bf16 model while the tokens agree."""
    world.run(_bf16_rank)


# ---- bad arguments ---------------------------------------------------------------------------------


def _bad_rank(ctx):
    model = _model(ctx, layers=1)
    msgs = []
    for kwargs in ({"batch": 0, "max_len": 8}, {"batch": 1, "max_len": 8, "reduce": "nccl"}):
        with pytest.raises(ArgumentError) as e:
            LlamaTP(model, **kwargs)
        msgs.append(str(e.value))
    tp = LlamaTP(model, batch=1, max_len=8)
    for ids, what in ((torch.zeros(2, 3, dtype=torch.int64), "batch=1"), (torch.zeros(1, 8, dtype=torch.int64),
                                                                            "prompt length")):
        with pytest.raises(ArgumentError, match=what):
            tp.generate(ids.to(ctx.device), 1)
    with pytest.raises(ArgumentError, match="exceeds max_len"):
        tp.generate(torch.zeros(1, 4, dtype=torch.int64, device=ctx.device), 5)
    with pytest.raises(ArgumentError, match="mode"):
        tp.generate(torch.zeros(1, 4, dtype=torch.int64, device=ctx.device), 1, mode="fast")
    if ctx.device.type == "cpu":
        with pytest.raises(ArgumentError, match="needs a CUDA device"):
            tp.generate(torch.zeros(1, 4, dtype=torch.int64, device=ctx.device), 2, mode="graph")
    model.config.hidden_act = "gelu"
    with pytest.raises(ArgumentError, match="hidden_act"):
        LlamaTP(model, batch=1, max_len=8)
    return msgs


def _mismatch_rank(ctx):
    from iris_fw.errors import CollectiveMismatch

    model = _model(ctx, layers=1)
    msgs = []
    refused = (ArgumentError, CollectiveMismatch)
    with pytest.raises(CollectiveMismatch) as e:      # rank 1 holds other weights
        LlamaTP(_model(ctx, seed=ctx.rank, layers=1), batch=1, max_len=8)
    msgs.append(str(e.value))
    with pytest.raises(CollectiveMismatch) as e:      # rank 1 asks for a longer cache
        LlamaTP(model, batch=1, max_len=8 + ctx.rank)
    msgs.append(str(e.value))
    with pytest.raises(refused) as e:                 # rank 1 rejects its own argument
        LlamaTP(model, batch=1 - ctx.rank, max_len=8)
    msgs.append(str(e.value))
    tp = LlamaTP(model, batch=1, max_len=8)
    with pytest.raises(CollectiveMismatch) as e:      # rank 1 has another prompt
        tp.generate(torch.full((1, 3), ctx.rank, dtype=torch.int64, device=ctx.device), 2)
    msgs.append(str(e.value))
    return msgs


def test_ranks_must_agree(iris_pool):
    """Every rank's model, sizes and prompt are compared once per call: a difference raises on
    every rank naming what differs (no kernel runs on mismatched shards)."""
    for rank, msgs in enumerate(iris_pool(2).run(_mismatch_rank)):
        assert "'weights (checksum)'" in msgs[0] and "ranks 0:" in msgs[0] and "ranks 1:" in msgs[0], msgs
        assert "'max_len'" in msgs[1], msgs
        assert "batch must be an int >= 1" in msgs[2], msgs
        assert rank == 1 or "rank 1 rejected its arguments" in msgs[2], msgs
        assert "'input_ids'" in msgs[3], msgs


def test_bad_arguments(iris_pool):
    """Bad constructor and generate arguments raise naming the argument (before any collective)."""
    msgs = iris_pool(1).run(_bad_rank)[0]
    assert "batch" in msgs[0] and "reduce" in msgs[1]


# ---- the benchmark ---------------------------------------------------------------------------------


def _bench_rank(ctx):
    from iris_fw.bench import BenchOptions
    from iris_fw.bench.model import ModelBench

    opts = BenchOptions(sizes=[16], iters=1, warmup=0, quick=True, rotate_bytes=1 << 16, log=lambda msg: None)
    return ModelBench().run(ctx, opts)


@pytest.mark.skipif(not INTERP, reason="the GPU run is `iris-fw bench model` (docs/run-a-model.md)")
def test_bench_rows(iris_pool):
    """``iris-fw bench model`` on one CPU rank (the smoke run): timed rows for iris-fw eager and
    compiled and for transformers, the logits checked against transformers', graphs skipped."""
    rows = iris_pool(1).run(_bench_rank)[0]
    timed = {r["method"]: r for r in rows if "us_per_token" in r}
    assert set(timed) == {"iris_fw eager", "iris_fw compiled", "transformers eager"}, rows
    assert all(r["tokens_per_s"] > 0 and r["vs_transformers"] > 0 for r in timed.values()), rows
    assert timed["iris_fw eager"]["max_err"] < 0.05, rows      # bf16 logits against transformers' on one cache
    skipped = {r["method"]: r["skipped"] for r in rows if "skipped" in r}
    assert "CUDA graphs" in skipped["iris_fw graph"], skipped
