"""The public ops as torch.library custom ops (``import iris_fw.torch_ops``): traced by
torch.compile(fullgraph=True) in tensor-parallel MLPs, against float64 references of the unsplit
model, and (GPU) captured with the compiled model in a CUDA graph and replayed with fresh inputs.

* Megatron MLP: ``y = relu(x @ w1_r) @ w2_r`` summed over ranks ``+ b2`` — the second layer as
  ``iris_fw::gemm_all_reduce`` (row-parallel, bias once).
* Sequence-parallel MLP: ``all_gather_gemm(x_shard, w1_r)`` then ``gemm_reduce_scatter(…, w2_r)``,
  and ``gemm_all_scatter`` gathering the column-parallel activations.
Compiled with ``aot_eager`` on CPU ranks (no C++ toolchain needed), ``inductor`` on GPUs.
"""

import pytest
import torch

from helpers import fresh_seed

HIDDEN, FFN, TOKENS = 48, 64, 6


def _draw(ctx, seed, tokens=TOKENS):
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(HIDDEN, FFN, generator=g) / HIDDEN ** 0.5,
            "w2": torch.randn(FFN, HIDDEN, generator=g) / FFN ** 0.5,
            "b2": torch.randn(HIDDEN, generator=g), "x": torch.randn(tokens, HIDDEN, generator=g)}


def _backend(ctx):
    return "aot_eager" if ctx.device.type == "cpu" else "inductor"


def _close(got, want, what):
    err = (got.detach().cpu().double() - want).abs().max().item()
    assert err <= 1e-4 * max(1.0, want.abs().max().item()), f"{what}: max error {err}"


def _megatron_rank(ctx, scheduler):
    import iris_fw.torch_ops  # noqa: F401  (registers torch.ops.iris_fw.*)

    torch._dynamo.reset()
    p = _draw(ctx, fresh_seed(ctx))
    cols = FFN // ctx.world_size
    part = slice(ctx.rank * cols, (ctx.rank + 1) * cols)
    w1_r = p["w1"][:, part].contiguous().to(ctx.device)
    w2_r = p["w2"][part, :].contiguous().to(ctx.device)
    b2 = p["b2"].to(ctx.device)

    def model(x):
        return torch.ops.iris_fw.gemm_all_reduce(torch.relu(x @ w1_r), w2_r, b2, scheduler)

    def reference(x):
        used = cols * ctx.world_size
        return torch.relu(x.double() @ p["w1"][:, :used].double()) @ p["w2"][:used].double() + p["b2"].double()

    compiled = torch.compile(model, fullgraph=True, backend=_backend(ctx))
    for _ in range(2):  # the second call runs the cached compiled graph
        _close(compiled(p["x"].to(ctx.device)), reference(p["x"]), f"compiled megatron MLP ({scheduler})")
    if ctx.device.type == "cuda":
        x = p["x"].to(ctx.device)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            compiled(x)
        torch.cuda.current_stream().wait_stream(s)
        ctx.synchronize()
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = compiled(x)
        for replay in range(3):  # fresh activations before every replay
            fresh = _draw(ctx, fresh_seed(ctx))["x"]
            x.copy_(fresh)
            graph.replay()
            ctx.synchronize()
            _close(y, reference(fresh), f"graph replay {replay} ({scheduler})")
            ctx.barrier()
        del graph, y


@pytest.mark.parametrize("world_size,scheduler", [
    (2, "fused_sequential"), (3, "library"),
    pytest.param(3, "fused_sequential", marks=pytest.mark.extended), pytest.param(2, "library", marks=pytest.mark.extended)])
def test_megatron_mlp_compiles(iris_pool, world_size, scheduler):
    iris_pool(world_size).run(_megatron_rank, scheduler)


def _sequence_parallel_rank(ctx):
    import iris_fw.torch_ops  # noqa: F401

    torch._dynamo.reset()
    w = ctx.world_size
    p = _draw(ctx, fresh_seed(ctx), tokens=2 * w)
    cols = FFN // w
    part = slice(ctx.rank * cols, (ctx.rank + 1) * cols)
    w1_r = p["w1"][:, part].contiguous().to(ctx.device)
    w2_r = p["w2"][part, :].contiguous().to(ctx.device)
    shard = p["x"][2 * ctx.rank:2 * ctx.rank + 2].contiguous().to(ctx.device)

    def model(x_shard):
        h = torch.relu(torch.ops.iris_fw.all_gather_gemm(x_shard, w1_r, "fused_sequential"))  # [T, F/W]
        gathered = torch.ops.iris_fw.gemm_all_scatter(h, w2_r[:, :HIDDEN // 2].contiguous(), "fused_sequential")
        return torch.ops.iris_fw.gemm_reduce_scatter(h, w2_r, "fused_sequential"), gathered

    used = cols * w
    h = torch.relu(p["x"].double() @ p["w1"][:, :used].double())
    got_rs, got_as = torch.compile(model, fullgraph=True, backend=_backend(ctx))(shard)
    _close(got_rs, (h @ p["w2"][:used].double())[2 * ctx.rank:2 * ctx.rank + 2], "all_gather_gemm -> gemm_reduce_scatter")
    want_as = torch.cat([h[:, r * cols:(r + 1) * cols] @ p["w2"][r * cols:(r + 1) * cols, :HIDDEN // 2].double()
                         for r in range(w)], dim=1)
    _close(got_as, want_as, "gemm_all_scatter")


def test_sequence_parallel_ops_compile(iris_pool):
    iris_pool(2).run(_sequence_parallel_rank)


def _fake_shapes_rank(ctx):
    import iris_fw.torch_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = ctx.world_size
    with FakeTensorMode():
        a, b = torch.empty(8 * w, 5), torch.empty(5, 7)
        assert torch.ops.iris_fw.gemm_all_reduce(a, b, None, "auto").shape == (8 * w, 7)
        assert torch.ops.iris_fw.gemm_reduce_scatter(a, b, "auto").shape == (8, 7)
        assert torch.ops.iris_fw.gemm_all_scatter(a, b, "auto").shape == (8 * w, 7 * w)
        assert torch.ops.iris_fw.all_gather_gemm(a, b, "auto").shape == (8 * w * w, 7)


def test_fake_shapes(iris_pool):
    """Fake implementations give every op's output shape without communication."""
    iris_pool(2).run(_fake_shapes_rank)
