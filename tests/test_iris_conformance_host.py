"""Iris conformance, host side: ``iris.iris()`` created and dropped as Iris's tests do (nothing
accumulates), the host object's queries, barriers and broadcast, factories with torch's full
calling conventions (a size as ints, one tuple or a nested one; zero-element and 0-d tensors;
``out=``, ``dtype=``, ``device=``, ``layout=``, ``requires_grad=``, ``memory_format=``; ``arange``
with fractional and negative steps; ``linspace`` with ``steps`` as a tuple; complex dtypes),
Iris's error types, logging, and unchanged Iris programs run through ``iris-fw run --as-iris``.
Worlds 1-4 where ranks matter (on CPU ranks a few by default, all with ``-m extended``).
"""

import gc
import io
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import iris_fw.compat.iris as iris
from iris_fw.compat.iris import host as iris_host
from iris_fw.compat.state import state as compat_state
from helpers import fresh_seed, on_worlds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "iris_programs")


# ---- create / drop --------------------------------------------------------------------------------


def _counters():
    with open("/proc/self/maps") as f:
        maps = f.read().count("\n")
    prefix = os.environ.get("IRIS_FW_SHM_PREFIX", "iris_fw_")
    out = {"fds": len(os.listdir("/proc/self/fd")), "maps": maps,
           "shm_maps": open("/proc/self/maps").read().count("/dev/shm/" + prefix),
           "open": sum(1 for c in compat_state().open.values() if not c.closed)}
    if torch.cuda.is_available():
        # this process's GPU memory (NVML's process list): device-wide figures move with every
        # other process on the GPU (other test workers, ranks sharing it)
        import re

        listing = torch.cuda.list_gpu_processes()
        mine = re.search(rf"process\s+{os.getpid()}\s+uses\s+([0-9.]+)\s*MB", listing)
        if mine:
            out["gpu_used_mib"] = round(float(mine.group(1)))
    return out


def _create_drop(ctx, cycles):
    """``iris.iris()`` / use / ``del`` in a loop: every dropped context is closed by the next
    creation, and fds, mappings, /dev/shm mappings and GPU memory return to where they were."""
    heap = 1 << 20
    for _ in range(3):  # warm up (registries, first bootstrap, allocator pools)
        shmem = iris.iris(heap)
        del shmem
    gc.collect()
    shmem = iris.iris(heap)
    del shmem
    before = _counters()
    seed = fresh_seed(ctx) % 4096
    for i in range(cycles):
        shmem = iris.iris(heap)
        assert shmem.get_rank() == ctx.rank and shmem.get_num_ranks() == ctx.world_size
        x = shmem.full((64,), float(seed + i))
        shmem.barrier()
        assert shmem.ctx.peer_view(x, (ctx.rank + 1) % ctx.world_size)[0].item() == float(seed + i)
        shmem.barrier()
        del shmem, x
    shmem = iris.iris(heap)  # closes the last dropped one
    del shmem
    after = _counters()
    # the last one is dropped, not yet closed: close it (collective, as a next iris.iris() would)
    iris_host.close_dropped()
    assert sum(1 for c in compat_state().open.values() if not c.closed) == 0
    assert after["open"] == before["open"] == 1, (before, after)
    grown = {k: after[k] - before[k] for k in before if after[k] - before[k] > (2 if k in ("fds", "maps") else 0)}
    assert not grown, f"rank {ctx.rank}: grew over {cycles} create/drop cycles: {grown} ({before} -> {after})"


@on_worlds(2)
def test_create_drop_accumulates_nothing(world):
    world.run(_create_drop, 30)


@pytest.mark.extended
def test_create_drop_1000_cycles(world):
    world.run(_create_drop, 1000, timeout=3000)


@pytest.mark.extended
def test_probe_script(tmp_path):
    """scripts/probe_context_cycle.py (the GPU probe) on 2 ranks: exits 0, reports no growth."""
    res = subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", "2",
                          os.path.join(ROOT, "scripts", "probe_context_cycle.py"), "--cycles", "100"],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert res.stdout.count("PROBE ") == 2 and "nothing accumulated" in res.stdout, res.stdout


# ---- queries, synchronization, broadcast ------------------------------------------------------------


def _host_api(ctx):
    shmem = iris.Iris(context=ctx)
    assert (shmem.get_rank(), shmem.get_num_ranks()) == (ctx.rank, ctx.world_size)
    assert (shmem.cur_rank, shmem.num_ranks) == (ctx.rank, ctx.world_size)
    assert shmem.get_device() == ctx.device and shmem.device == str(ctx.device)
    assert shmem.get_heap_bases() is ctx.heap_bases.bases and shmem.get_heap_bases().shape == (ctx.world_size,)
    assert shmem.get_cu_count() >= 1 and shmem.get_device_id() == (ctx.device.index or 0)
    assert iris.get_device_id_for_rank(ctx.rank) == (ctx.rank % torch.cuda.device_count()
                                                     if torch.cuda.is_available() else 0)
    # broadcast: Iris's return types (tensors and numeric lists as numpy), both argument names
    root = ctx.world_size - 1
    got = shmem.broadcast(torch.arange(6, dtype=torch.int32).reshape(2, 3) * (ctx.rank + 1) if ctx.rank == root
                          else None, source_rank=root)
    assert isinstance(got, np.ndarray) and got.shape == (2, 3) and np.array_equal(got.ravel(), np.arange(6) * (root + 1))
    assert shmem.broadcast(42 if ctx.rank == 0 else None, 0) == 42
    assert shmem.broadcast({"k": ctx.rank}, src=root) == {"k": root}
    assert shmem.broadcast("Hello, Iris!" if ctx.rank == 0 else None) == "Hello, Iris!"
    lst = shmem.broadcast([1.5, 2.5] if ctx.rank == 0 else None)
    assert isinstance(lst, np.ndarray) and lst.tolist() == [1.5, 2.5]
    t = shmem.broadcast_tensor(torch.full((4,), 7.0) if ctx.rank == 0 else None, source_rank=0)
    assert isinstance(t, np.ndarray) and t.tolist() == [7.0] * 4
    with pytest.raises(ValueError):
        shmem.broadcast(1, src=ctx.world_size)
    # barriers
    shmem.barrier()
    stream = torch.cuda.current_stream() if ctx.device.type == "cuda" else None
    shmem.barrier(stream=stream)
    shmem.device_barrier()
    shmem.barrier()


@on_worlds(1, 3)
def test_host_api(world):
    world.run(_host_api)


def test_allocator_types():
    """vmem is served by iris-fw's heap (tests/test_iris_conformance_api.py::test_allocator_vmem);
    the chunked vmem heap is AMD-only."""
    with pytest.raises(ValueError, match="vmem_chunked.*not provided"):
        iris.iris(1 << 20, allocator_type="vmem_chunked")
    with pytest.raises(ValueError, match="allocator_type must be one of"):
        iris.Iris(1 << 20, "cuda_malloc")


# ---- factories -------------------------------------------------------------------------------------


def _factories(ctx):
    shmem = iris.Iris(context=ctx)
    dev, sym = ctx.device, shmem._Iris__on_symmetric_heap
    # sizes: ints, one tuple/list, nested, torch.Size; zero-element and 0-d tensors are symmetric
    cases = [((2, 3, 4), (2, 3, 4)), (((2, 3, 4),), (2, 3, 4)), (([2, 5],), (2, 5)), ((((3, 4),),), (3, 4)),
             ((torch.Size([2, 2]),), (2, 2)), ((0,), (0,)), ((2, 0), (2, 0)), (((),), ()), ((5,), (5,))]
    for make in (shmem.zeros, shmem.ones, shmem.empty, shmem.randn, shmem.rand):
        for size, shape in cases:
            t = make(*size)
            assert t.shape == shape and t.dtype == torch.get_default_dtype() and t.device == dev and sym(t), \
                (make.__name__, size, t.shape)
    assert torch.equal(shmem.zeros(2, 3), torch.zeros(2, 3, device=dev))
    assert torch.equal(shmem.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32, device=dev))
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                  torch.float64, torch.bool, torch.complex64):
        t = shmem.empty(3, 4, dtype=dtype)
        assert t.dtype == dtype and t.shape == (3, 4) and sym(t)
    # full: dtype follows the fill value like torch
    assert shmem.full((2, 3), 3.14).dtype == torch.get_default_dtype()
    assert shmem.full((2,), 7).dtype == torch.int64 and shmem.full(3, True).dtype == torch.bool
    assert shmem.full((2,), 1 + 2j).dtype == torch.complex64
    assert torch.equal(shmem.full([2, 2], 5, dtype=torch.int16), torch.full((2, 2), 5, dtype=torch.int16, device=dev))
    # out=: Iris's view of out; errors are RuntimeError (size, dtype, off the heap)
    out = shmem.allocate(6, torch.float32)
    for make in (shmem.zeros, shmem.ones, shmem.empty, shmem.randn, shmem.rand):
        r = make(2, 3, out=out)
        assert r.data_ptr() == out.data_ptr() and r.shape == (2, 3)
    assert torch.equal(shmem.ones(3, 2, out=out), torch.ones(3, 2, device=dev))
    assert torch.equal(shmem.full((2, 3), 2.5, out=out), torch.full((2, 3), 2.5, device=dev))
    with pytest.raises(RuntimeError, match="6 elements, but 9"):
        shmem.zeros(3, 3, out=out)
    with pytest.raises(RuntimeError, match="dtype"):
        shmem.zeros(2, 3, dtype=torch.float64, out=out)
    with pytest.raises(RuntimeError, match="not on the symmetric heap"):
        shmem.zeros(2, 3, out=torch.zeros(6, device=dev))
    # device / layout / requires_grad / pin_memory
    for device in (None, dev, str(dev), dev.type):
        assert shmem.zeros(2, device=device).device == dev
    other = "cpu" if dev.type == "cuda" else "meta"
    with pytest.raises(RuntimeError, match="Device mismatch"):
        shmem.zeros(2, device=other)
    if dev.type == "cuda":
        with pytest.raises(RuntimeError, match="Device mismatch"):
            shmem.ones(2, device=f"cuda:{dev.index + 1}")
    with pytest.raises(ValueError, match="torch.strided"):
        shmem.empty(2, 4, layout=torch.sparse_coo)
    assert shmem.zeros(2, layout=None).layout == torch.strided
    g = shmem.zeros(3, requires_grad=True)
    assert g.requires_grad and g.is_leaf and not shmem.zeros(3).requires_grad
    assert shmem.randn(2, 2, pin_memory=False).shape == (2, 2)
    # memory formats: channels_last strides on the heap; formats that do not fit stay contiguous (Iris)
    e = shmem.empty(2, 3, 4, 5, memory_format=torch.channels_last)
    assert e.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride() and sym(e)
    e3 = shmem.empty(2, 3, 4, 5, 6, memory_format=torch.channels_last_3d)
    assert e3.is_contiguous(memory_format=torch.channels_last_3d) and sym(e3)
    assert shmem.empty(3, 3, memory_format=torch.channels_last).is_contiguous()
    z = shmem.zeros_like(e)
    assert z.stride() == e.stride() and torch.all(z == 0) and sym(z)
    assert shmem.zeros_like(e, memory_format=torch.contiguous_format).is_contiguous()
    z16 = shmem.zeros_like(torch.ones(2, 3, device=dev), dtype=torch.float16, requires_grad=True)
    assert z16.dtype == torch.float16 and z16.requires_grad and sym(z16)
    if dev.type == "cuda":
        with pytest.raises(RuntimeError, match="Device mismatch"):
            shmem.zeros_like(torch.ones(2))  # the input's device by default
    # randint (torch's forms), rand/randn with a generator, uniform
    r = shmem.randint(10, (3, 4))
    assert r.dtype == torch.int64 and r.shape == (3, 4) and 0 <= r.min() and r.max() < 10 and sym(r)
    r = shmem.randint(-5, 5, (1000,), dtype=torch.int32)
    assert r.dtype == torch.int32 and r.min() >= -5 and r.max() < 5 and len(r.unique()) > 5
    assert shmem.randint(low=2, high=3, size=(4,)).tolist() == [2] * 4
    with pytest.raises(ValueError):
        shmem.randint(5)
    gen = torch.Generator(device=dev).manual_seed(1)
    a = shmem.randn(64, generator=gen)
    b = shmem.randn(64, generator=torch.Generator(device=dev).manual_seed(1))
    assert torch.equal(a, b) and a.std() > 0.5
    u = shmem.uniform((64,), low=2.0, high=3.0)
    assert u.dtype == torch.float32 and u.min() >= 2 and u.max() <= 3 and shmem.uniform(5, dtype=torch.float64).shape == (5,)
    # as_symmetric copies (Iris's torch allocator does too); is_symmetric
    ext = torch.arange(4.0, device=dev)
    s = shmem.as_symmetric(ext)
    assert torch.equal(s, ext) and sym(s) and not shmem.is_symmetric(ext) and s.data_ptr() != ext.data_ptr()


@on_worlds(2)
def test_factories(world):
    world.run(_factories)


def _arange_linspace(ctx):
    shmem = iris.Iris(context=ctx)
    dev, sym = ctx.device, shmem._Iris__on_symmetric_heap
    for args, kwargs in [((5,), {}), ((1, 4), {}), ((1, 2.5, 0.5), {}), ((5, 0, -1), {}), ((0, 1, 0.1), {}),
                         ((1.0, 2.0, 0.25), {}), ((0, 10, 2), {}), ((3,), {"dtype": torch.float64}),
                         ((10, 1, -0.5), {}), ((-3, 3, 1.5), {"dtype": torch.float16}), ((3, 3), {}),
                         ((), {"start": 0, "end": 5, "step": 1, "dtype": torch.int64})]:
        got = shmem.arange(*args, **kwargs)
        want = torch.arange(*args, **kwargs, device=dev)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want) and sym(got), (args, kwargs)
    out = shmem.allocate(3, torch.int64)
    assert shmem.arange(3, out=out) is out and out.tolist() == [0, 1, 2]
    assert shmem.arange(3, dtype=torch.float32, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match="step must be non-zero"):
        shmem.arange(1, 5, 0)
    for bad in [(5, 1), (1, 5, -1)]:
        with pytest.raises(ValueError):
            shmem.arange(*bad)
    with pytest.raises(RuntimeError):
        shmem.arange(3, out=shmem.allocate(4, torch.int64))
    # linspace: steps as int / (5,) / [5] / ((5,),); complex; 0-d tensor bounds; out=
    for steps in (5, (5,), [5], ((5,),)):
        got = shmem.linspace(0.0, 1.0, steps)
        assert torch.allclose(got, torch.linspace(0, 1, 5, device=dev)) and sym(got)
    for start, end, steps, dtype in [(-10.0, 10.0, 11, torch.float64), (3.0, 10.0, 5, torch.float16),
                                     (0.0, 100.0, 101, torch.complex64), (5.0, 5.0, 1, None), (0.0, 1.0, 0, None)]:
        got = shmem.linspace(start, end, steps, dtype=dtype)
        want = torch.linspace(start, end, steps, dtype=dtype, device=dev)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.allclose(got, want) and sym(got)
    c = shmem.linspace(0.0 + 0.0j, 1.0 + 1.0j, 5)
    assert c.dtype == torch.complex64 and torch.allclose(c[-1], torch.tensor(1 + 1j, device=dev))
    t = shmem.linspace(torch.tensor(0.0, device=dev), torch.tensor(2.0, device=dev), 3)
    assert t.tolist() == [0.0, 1.0, 2.0]
    out = shmem.allocate(5, torch.float32)
    assert shmem.linspace(0, 1, 5, out=out).data_ptr() == out.data_ptr()
    with pytest.raises(RuntimeError):
        shmem.linspace(0.0, 1.0, 5, dtype=torch.float32, out=shmem.allocate(5, torch.int32))
    with pytest.raises(ValueError):
        shmem.linspace(0.0, 1.0, 5, layout=torch.sparse_coo)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert shmem.linspace(0.0, 1.0, 5).dtype == torch.float64 and shmem.zeros(2).dtype == torch.float64
        assert shmem.arange(0.5, 2).dtype == torch.float64
    finally:
        torch.set_default_dtype(default)


@on_worlds(1)
def test_arange_linspace(world):
    world.run(_arange_linspace)


# ---- logging ---------------------------------------------------------------------------------------


def test_logging():
    """Iris's logger: name, default level and handler, IRIS_LOG_LEVEL, IrisFormatter with and
    without rank, the host object's rank-tagged messages."""
    from iris_fw.compat.iris import logging as ilog

    assert (iris.DEBUG, iris.INFO, iris.WARNING, iris.ERROR) == (logging.DEBUG, logging.INFO, logging.WARNING,
                                                                 logging.ERROR)
    assert iris.logger is logging.getLogger("iris") and iris.logging.logger is iris.logger
    assert iris.logger.handlers and isinstance(iris.logger.handlers[0], logging.StreamHandler)
    saved_level, saved_handlers = iris.logger.level, iris.logger.handlers[:]
    try:
        for env, level in [({"IRIS_LOG_LEVEL": "debug"}, logging.DEBUG), ({"IRIS_LOG_LEVEL": "ERROR"}, logging.ERROR),
                           ({"IRIS_LOG_LEVEL": "bogus"}, logging.INFO), ({}, logging.INFO)]:
            ilog._configure(env)
            assert iris.logger.level == level, env
        fmt = ilog.IrisFormatter()
        record = logging.LogRecord("iris", logging.INFO, "", 0, "Test message without rank", (), None)
        assert fmt.format(record) == "[Iris] Test message without rank"
        record.iris_rank, record.iris_num_ranks = 2, 4
        assert fmt.format(record) == "[Iris] [2/4] Test message without rank"
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        handler.setFormatter(fmt)
        iris.logger.handlers[:] = [handler]
        iris.set_logger_level(iris.INFO)
        assert iris.logger.level == logging.INFO
        shmem = iris.Iris.__new__(iris.Iris)
        shmem.cur_rank, shmem.num_ranks = 1, 3
        shmem.debug("hidden")
        shmem.info("shown")
        iris.logger.debug("also hidden")
        iris.set_logger_level(iris.DEBUG)
        shmem.debug("dbg")
        shmem.warning("warn")
        shmem.error("err")
        iris.logger.info("plain")
        assert buf.getvalue().splitlines() == ["[Iris] [1/3] shown", "[Iris] [1/3] dbg", "[Iris] [1/3] warn",
                                               "[Iris] [1/3] err", "[Iris] plain"]
    finally:
        iris.logger.handlers[:] = saved_handlers
        iris.logger.setLevel(saved_level)


# ---- unchanged Iris programs -------------------------------------------------------------------------


def test_import_hook_maps_iris(monkeypatch):
    """With the mapping installed, ``import iris`` / ``iris.*`` are the compat modules themselves
    (one module object per name), and child processes get the shim first on PYTHONPATH."""
    import importlib

    from iris_fw.compat import run

    env = {"PYTHONPATH": "/somewhere"}
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in [n for n in sys.modules if n == "iris" or n.startswith("iris.")]:
        monkeypatch.delitem(sys.modules, name)
    run.install(env)
    run.install(env)  # idempotent
    try:
        assert env["PYTHONPATH"] == run.SHIM_DIR + os.pathsep + "/somewhere"
        assert sum(isinstance(f, run.IrisFinder) for f in sys.meta_path) == 1
        mapped = importlib.import_module("iris")
        ccl = importlib.import_module("iris.ccl")
        reduce_scatter = importlib.import_module("iris.ccl.reduce_scatter")
        config = importlib.import_module("iris.ops.config")
        assert mapped is iris and ccl is iris.ccl and config.FusedConfig is iris.ops.FusedConfig
        assert reduce_scatter is sys.modules["iris_fw.compat.iris.ccl.reduce_scatter"]
        assert mapped.__spec__.name == "iris_fw.compat.iris"  # the module keeps its own spec
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("iris.no_such_module")
    finally:
        for name in [n for n in sys.modules if n == "iris" or n.startswith("iris.")]:
            del sys.modules[name]


@pytest.mark.extended
def test_iris_programs_unchanged(tmp_path):
    """``python -m iris_fw.compat.run`` maps ``iris`` in the program and in a process it starts;
    ``iris-fw run --as-iris -n 3`` runs a program written for Iris (its kernels, ccl, ops) on 3
    ranks; ``pytest -p iris_fw.compat.pytest_iris`` runs an Iris-style test file."""
    res = subprocess.run([sys.executable, "-m", "iris_fw.compat.run", os.path.join(PROGRAMS, "hook_check.py"), "x"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "hook ok ['x']" in res.stdout and "child ok" in res.stdout, \
        res.stdout + res.stderr[-3000:]
    res = subprocess.run([sys.executable, "-m", "iris_fw", "run", "--as-iris", "-n", "3", "--timeout", "900",
                          os.path.join(PROGRAMS, "iris_program.py")], capture_output=True, text=True, timeout=1000)
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    assert res.stdout.count("iris program ok") == 3, res.stdout
    test_file = tmp_path / "iris_style_tests.py"
    test_file.write_text(open(os.path.join(PROGRAMS, "iris_style_tests.py")).read())
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "iris_fw.compat.pytest_iris", "-q", "-p",
                          "no:cacheprovider", "--rootdir", str(tmp_path), str(test_file)],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0 and "passed" in res.stdout, res.stdout + res.stderr[-3000:]


def _launchers(n):
    """(name, command prefix) for every launcher here, for ``n`` ranks."""
    import iris_fw.testing

    out = [("torchrun", iris_fw.testing.torchrun(n))]
    mpirun = iris_fw.testing.find_mpirun()
    if mpirun:
        out.append(("mpirun", [mpirun, "-n", str(n), sys.executable]))
    return out


@pytest.mark.extended
@pytest.mark.parametrize("program,ranks,expect", [
    ("message_passing.py", 2, "message passing over"),
    ("all_load.py", 3, "all-load on"),
])
def test_example_programs_under_launchers(program, ranks, expect):
    """examples/iris_compat (Iris programs with the import line changed) under torchrun and mpirun."""
    path = os.path.join(ROOT, "examples", "iris_compat", program)
    for name, cmd in _launchers(ranks):
        res = subprocess.run(cmd + [path], capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{name}: {res.stdout}{res.stderr[-3000:]}"
        assert expect in res.stdout and "correct" in res.stdout and "WRONG" not in res.stdout, f"{name}: {res.stdout}"
