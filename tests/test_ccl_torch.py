"""The collectives as torch.library custom ops: traced by torch.compile(fullgraph=True), run in a
two-layer tensor-parallel MLP, against a float64 reference of the unsplit model.

The MLP: ``y = rmsnorm(all_reduce(relu(x @ w1_r) @ w2_r) + residual) * g`` with ``w1`` split by
columns and ``w2`` by rows over the ranks (Megatron-style), the all-reduce + residual + norm
either as ``iris_fw::all_reduce`` followed by torch ops or fused as
``iris_fw::all_reduce_rmsnorm``; a second model gathers the column-parallel activations with
``iris_fw::all_gather_into_tensor`` and reduce-scatters with ``iris_fw::reduce_scatter_tensor``.
Compiled with the ``aot_eager`` backend on CPU ranks (no C++ toolchain needed); worlds 2 and 3
(on CPU ranks the MLP at 3 by default, at 2 under ``-m extended``: the traced graph does not
depend on the world size, and the gather/scatter model runs at 2).
"""

import pytest
import torch

from helpers import cpu_extended, fresh_seed


def _weights(ctx, hidden, ffn, seed):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, ffn, generator=g) / hidden ** 0.5
    w2 = torch.randn(ffn, hidden, generator=g) / ffn ** 0.5
    gamma = 1 + 0.1 * torch.randn(hidden, generator=g)
    x = torch.randn(5, hidden, generator=g)
    residual = torch.randn(5, hidden, generator=g)
    return w1, w2, gamma, x, residual


def _reference(w1, w2, gamma, x, residual, eps):
    h = torch.relu(x.double() @ w1.double()) @ w2.double() + residual.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gamma.double(), h


def _mlp_rank(ctx, fused):
    import iris_fw.ccl.custom_ops  # noqa: F401  (registers torch.ops.iris_fw.*)

    torch._dynamo.reset()
    hidden, ffn, eps = 64, 96, 1e-6
    w1, w2, gamma, x, residual = _weights(ctx, hidden, ffn, fresh_seed(ctx))
    cols = ffn // ctx.world_size
    part = slice(ctx.rank * cols, (ctx.rank + 1) * cols)
    w1_r, w2_r = w1[:, part].contiguous(), w2[part, :].contiguous()
    dev = ctx.device
    w1_r, w2_r, gamma_d = w1_r.to(dev), w2_r.to(dev), gamma.to(dev)

    def model(x, residual):
        partial = torch.relu(x @ w1_r) @ w2_r
        if fused:
            return torch.ops.iris_fw.all_reduce_rmsnorm(partial, residual, gamma_d, eps, [], "auto")
        h = torch.ops.iris_fw.all_reduce(partial, "sum", [], "auto") + residual
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gamma_d, h

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    want_out, want_h = _reference(w1[:, :cols * ctx.world_size], w2[:cols * ctx.world_size], gamma, x, residual, eps)
    for _ in range(2):  # the second call runs the cached compiled graph
        out, h = compiled(x.to(dev), residual.to(dev))
        ctx.synchronize()
        assert torch.allclose(h.cpu().double(), want_h, rtol=1e-4, atol=1e-4)
        assert torch.allclose(out.cpu().double(), want_out, rtol=1e-4, atol=1e-4)
    eager_out, _ = model(x.to(dev), residual.to(dev))
    assert torch.allclose(eager_out.cpu(), out.cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True], ids=["all_reduce", "fused_rmsnorm"])
@pytest.mark.parametrize("world_size", [cpu_extended(2), 3])
def test_tensor_parallel_mlp_compiles(iris_pool, world_size, fused):
    iris_pool(world_size).run(_mlp_rank, fused)


def _gather_scatter_rank(ctx):
    import iris_fw.ccl.custom_ops  # noqa: F401

    torch._dynamo.reset()
    w = ctx.world_size
    g = torch.Generator().manual_seed(fresh_seed(ctx))
    xs = [torch.randn(3, 8, generator=g) for _ in range(w)]
    big = [torch.randn(2 * w, 8, generator=g) for _ in range(w)]

    def model(x, y):
        gathered = torch.ops.iris_fw.all_gather_into_tensor(x * 2, [], "auto")
        scattered = torch.ops.iris_fw.reduce_scatter_tensor(y, "sum", [], "auto")
        return gathered.sum(0, keepdim=True) + 0 * gathered[:1], scattered

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got_g, got_s = compiled(xs[ctx.rank].to(ctx.device), big[ctx.rank].to(ctx.device))
    ctx.synchronize()
    want_g = torch.cat([2 * t for t in xs]).sum(0, keepdim=True)
    want_s = torch.stack(big).sum(0)[2 * ctx.rank:2 * ctx.rank + 2]
    assert torch.allclose(got_g.cpu(), want_g, atol=1e-5)
    assert torch.allclose(got_s.cpu(), want_s, atol=1e-5)


def test_gather_and_scatter_ops_compile(iris_pool):
    iris_pool(2).run(_gather_scatter_rank)


def test_fake_shapes():
    """The fake implementations give the shapes without a context's communication (one-rank
    world given as ranks)."""
    import iris_fw.ccl.custom_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(6, 4)
        assert torch.ops.iris_fw.all_gather_into_tensor(x, [0, 1, 2], "auto").shape == (18, 4)
        assert torch.ops.iris_fw.reduce_scatter_tensor(x, "sum", [0, 1, 2], "auto").shape == (2, 4)
        assert torch.ops.iris_fw.all_reduce(x, "max", [0, 1], "auto").shape == (6, 4)
