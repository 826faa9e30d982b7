"""Data, poison and reference helpers shared by the tests (run inside rank processes)."""

import torch

DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32]


def poison_value(dtype):
    return float("nan") if dtype.is_floating_point else -77


def random_data(n, dtype, device, seed):
    """Fresh random values of ``dtype`` (never all zeros), different per seed."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        t = torch.randn(n, generator=g) * 8
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -(1 << 30)), min(info.max, 1 << 30), (n,), generator=g)
    return t.to(dtype).to(device)


def fresh_seed(ctx):
    """A seed every rank agrees on, new for each call."""
    return ctx.broadcast(int(torch.randint(0, 1 << 30, ()).item()), src=0)


def sizes(ctx):
    """(BLOCK, n_full, n_ragged): tiny on the CPU interpreter, larger on GPUs."""
    if ctx.device.type == "cpu":
        return 64, 128, 128 - 37
    return 1024, 1 << 20, (1 << 20) - 37


def same(a, b):
    """Bitwise equality (NaN-safe) of two tensors of one dtype."""
    if a.dtype.is_floating_point:
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)
