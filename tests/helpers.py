"""Data, poison and reference helpers shared by the tests (run inside rank processes)."""

import time

import pytest
import torch

import iris_fw

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


def world_params(*default: int) -> list:
    """World sizes 1-4 as parameters: on CPU ranks only ``default`` run by default, the rest
    under ``-m extended`` (the default run's time budget on CI's two cores); on GPUs every size
    runs (sizes above the GPU count skip)."""
    return [w if w in default or not iris_fw.interpreting() else pytest.param(w, marks=pytest.mark.extended)
            for w in (1, 2, 3, 4)]


def cpu_extended(*values, id: str | None = None):
    """One parameter (``values``: one value, or the values of several argument names) that runs
    under ``-m extended`` on CPU ranks and by default on GPUs: for the cases of a sweep whose code
    paths the default CPU run already covers (the default run's time budget on CI's two cores)."""
    marks = pytest.mark.extended if iris_fw.interpreting() else ()
    return pytest.param(*values, marks=marks, id=id)


def on_worlds(*default: int):
    """Parametrizes the ``world`` fixture (tests/conftest.py) over :func:`world_params`."""
    return pytest.mark.parametrize("world", world_params(*default), indirect=True, ids=lambda w: f"w{w}")


def same(a, b):
    """Bitwise equality (NaN-safe) of two tensors of one dtype."""
    if a.dtype.is_floating_point:
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


#: Targets the collective kernels are compiled for without a GPU: name -> GPUTarget arguments.
COMPILE_TARGETS = {"sm90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64)}


def compile_kernel(kernel, target: str, constexprs: dict, types: dict, default: str = "i32",
                   options: dict | None = None) -> None:
    """Compile ``kernel`` for ``COMPILE_TARGETS[target]`` (call it in :func:`compile_in_child`'s
    child): parameters named in ``constexprs`` are those constexprs, the others typed by
    ``types`` (name -> Triton type, pointers as ``"*bf16"``; else ``default``), pointers 16-byte
    aligned; ``options``: Triton compile options (``num_warps``, ``num_stages``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs = {}, {}
    # constexpr parameters with a default (e.g. TRACE=0, tracing off) take it unless given
    constexprs = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constexprs}
    for i, arg in enumerate(kernel.arg_names):
        if arg in constexprs:
            sig[arg] = "constexpr"
            continue
        sig[arg] = types.get(arg, default)
        if sig[arg].startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    triton.compile(ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs),
                   target=GPUTarget(*COMPILE_TARGETS[target]), options=options)


def compile_in_child(tmp_path, module: str, function: str, target: str, expected: int) -> None:
    """Run ``<module>.<function>(target)`` (a test module's compile job list, printing one
    ``compiled`` line per kernel) in a child process that sets ``TRITON_INTERPRET=0`` before
    Triton is imported, and check it compiled ``expected`` kernels. AMD targets need Triton >= 3.9
    (skipped before)."""
    import os
    import subprocess
    import sys

    import pytest
    import triton

    if COMPILE_TARGETS[target][0] == "hip" and tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        pytest.skip("AMD compilation without a GPU needs Triton >= 3.9")
    script = tmp_path / "compile.py"
    script.write_text(
        "import os, sys\n"
        "os.environ['TRITON_INTERPRET'] = '0'\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        f"import {module}\n"
        f"{module}.{function}({target!r})\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("compiled") == expected, proc.stdout


def capture_graph(ctx, fn):
    """``fn()`` run once on a side stream (it validates and plans outside the capture), then
    captured in a CUDA graph after every rank got there; returns the graph."""
    dev = ctx.device
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream(dev).wait_stream(s)
    ctx.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def host_shm_unavailable() -> str | None:
    """Why the host_shm transport cannot run on this machine (e.g. a GPU image whose Triton
    interpreter fails on its numpy), or None: for tests of host-level behaviour that force it."""
    from iris_fw.registry import load_registries

    ok, reason = load_registries().transport.entry("host_shm").availability()
    return None if ok else reason


def needs_host_shm():
    """Skip the calling test where :func:`host_shm_unavailable` gives a reason."""
    reason = host_shm_unavailable()
    if reason is not None:
        pytest.skip(f"host_shm transport unavailable here: {reason}")


#: Seconds a peer may take to fail after a rank failed on its host inside a call, beyond the call's
#: own work (the bound of the call path's host failure, iris_fw/callpath.py).
PEER_FAILS_WITHIN_S = 2.0


def boom(*args, **kwargs):
    """An injected host failure (`inject` of :func:`peer_fails` sets a function of the call to it)."""
    raise RuntimeError("injected host failure")


def peer_fails(ctx, call, inject, where):
    """Rank W-1 fails on its host inside a call (``where``: ``"plan"`` while planning its first
    call — every rank's call caches cleared first —, ``"launch"`` inside the launch of a repeated
    (cached) call, both by ``inject(monkeypatch)`` on that rank only; ``"argument"`` a bad
    argument at a repeated call); every other rank raises an iris-fw error naming it. ``call(bad)``
    makes the call (``bad``: with a bad argument on this rank). Returns ``(time, own, text)``:
    when this rank raised (this machine's clock), how long a successful call took on this rank
    (timed before: on CPU ranks the interpreter runs the kernels' compute, which an abort does not
    shorten) and the error's text; :func:`assert_peers_fail_at_once` checks the results. The job
    is re-armed (``ctx.barrier()``) before it returns."""
    from iris_fw import callpath, ccl

    failing = ctx.world_size - 1
    old, ctx.wait_timeout = ctx.wait_timeout, 60.0  # a peer that waited for its bound would show
    try:
        ccl.new_group(ctx=ctx)  # the world group exists: the failing call's peers wait on the device
        call(False)  # planned and cached on every rank
        ctx.synchronize()
        ctx.barrier()
        start = time.time()
        call(False)
        ctx.synchronize()
        own = time.time() - start
        if where == "plan":  # every rank forgets the call: the next one plans again
            paths = callpath.state(ctx)
            paths.ops.clear()
            for group in paths.groups_once():
                group.calls.clear()
        ctx.barrier()
        if ctx.rank == failing:
            with pytest.MonkeyPatch.context() as mp:
                if where in ("plan", "launch"):
                    inject(mp)
                with pytest.raises(Exception) as info:
                    call(where == "argument")
                    ctx.synchronize()
            failed_at = time.time()
            assert not isinstance(info.value, iris_fw.PeerFailure), info.value
            return failed_at, own, str(info.value)
        with pytest.raises(iris_fw.IrisError) as info:
            call(False)
            ctx.synchronize()
        raised_at = time.time()
        text = str(info.value)
        assert f"rank {failing}" in text, text
        return raised_at, own, text
    finally:
        ctx.wait_timeout = old
        callpath.state(ctx).ops.clear()
        try:
            ctx.barrier()  # re-arms the job
        except iris_fw.IrisError:
            ctx.barrier()


def assert_peers_fail_at_once(results, injected: str | None = None) -> None:
    """Every peer of the failed rank (the last) raised within :data:`PEER_FAILS_WITHIN_S` of its
    failure beyond its own call's work (:func:`peer_fails`'s results); with ``injected``, every
    rank's error holds that text and every peer's names the failed rank."""
    failed_at, _, why = results[-1]
    for rank, (raised_at, own, text) in enumerate(results[:-1]):
        assert raised_at - failed_at < PEER_FAILS_WITHIN_S + own, (rank, raised_at - failed_at, own, text, why)
    if injected is not None:
        assert all(injected in text for _, _, text in results), results
        assert all(f"rank {len(results) - 1}" in text for _, _, text in results[:-1]), results
