"""The ``nvshmem`` transport and the NVSHMEM device-call seam.

CPU (always): availability reasons, the call-mode choice, the unique-id exchange through a real
bootstrap, the init-attribute layout against NVSHMEM's own host library (when installed), the
Triton hooks of :class:`iris_fw.transports.nvshmem.library.DeviceLink`, and, when NVSHMEM's device bitcode is here,
the test suites' kernels compiled for sm_90 with every peer reached through NVSHMEM calls.
GPU (``IRIS_FW_TRANSPORT=nvshmem``, run by scripts/gpu_nvshmem.sh): set-up and teardown of the
transport, heap bases, and the primitive / atomic / signal suites themselves (tests/test_*.py
pick the transport from the variable; ``IRIS_FW_NVSHMEM_CALLS=all`` forces the call path).
"""

import ctypes
import os
import subprocess
import sys

import pytest
import torch
import triton.language as tl

import iris_fw
from iris_fw import device as dv
from iris_fw import env
from iris_fw.transports.nvshmem import library as nv
from iris_fw.bootstraps.single import SingleBootstrap
from iris_fw.errors import EnvironmentVariableError, IrisError

HERE = os.path.dirname(os.path.abspath(__file__))


def _home():
    return nv.find_home()[0]


def _on_nvshmem():
    return os.environ.get("IRIS_FW_TRANSPORT") == "nvshmem"


# ---- availability and choices (CPU) -------------------------------------------------------------


def _problem(**overrides):
    facts = dict(cuda=True, hip=False, capability=(9, 0), interpreting=False, home="/opt/nvshmem", home_why="found")
    facts.update(overrides)
    return nv.problem(**facts)


def test_available_on_a_hopper_gpu_with_nvshmem():
    assert _problem() == ""


@pytest.mark.parametrize("overrides, words", [
    (dict(interpreting=True), "TRITON_INTERPRET=1"),
    (dict(hip=True), "NVIDIA-only"),
    (dict(cuda=False, capability=None), "no CUDA GPU"),
    (dict(capability=(6, 1)), "unsupported GPU: compute capability 6.1"),
    (dict(home=None, home_why="NVSHMEM is not installed: pip install nvidia-nvshmem-cu13"), "pip install nvidia-nvshmem"),
    (dict(bootstrap_choice="mpi", mpi_library=None), "needs mpi4py"),
    (dict(bootstrap_choice="mpi", mpi_library="MPICH Version: 4.2.0\nMPICH Release date"), "built for Open MPI"),
], ids=["interpreter", "rocm", "no-gpu", "pascal", "no-wheel", "no-mpi", "mpich"])
def test_unavailable_reasons(overrides, words):
    why = _problem(**overrides)
    assert words in why, why


def test_open_mpi_bootstrap_accepted():
    assert _problem(bootstrap_choice="mpi", mpi_library="Open MPI v4.1.5, package: ...") == ""


def test_plugin_reports_a_reason_here():
    ok, why = iris_fw.context.load_registries().transport.entry("nvshmem").availability()
    if torch.cuda.is_available() and not iris_fw.interpreting():
        pytest.skip("a GPU is present: availability depends on the installation")
    assert not ok and why, why


def test_find_home_by_variable(tmp_path):
    assert nv.find_home({nv.ENV_HOME: str(tmp_path)}) == (None, f"{nv.ENV_HOME}={tmp_path} has no lib/ folder")
    (tmp_path / "lib").mkdir()
    assert nv.find_home({nv.ENV_HOME: str(tmp_path)}) == (str(tmp_path), f"{nv.ENV_HOME}={tmp_path}")


def test_device_bitcode_per_architecture(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    assert "has no device bitcode for sm_90 (shipped: none)" in nv.device_bitcode(str(tmp_path), (9, 0))[1]
    (lib / "libnvshmem_device.bc").write_bytes(b"")  # NVSHMEM <= 3.4: one file
    assert nv.device_bitcode(str(tmp_path), (9, 0))[0].endswith("libnvshmem_device.bc")
    (lib / "libnvshmem_device.bc").unlink()
    for arch in (75, 80, 89, 90, 100):  # NVSHMEM >= 3.5: one per architecture
        (lib / f"libnvshmem_device_sm_{arch}.bc").write_bytes(b"")
    pick = {cap: os.path.basename(nv.device_bitcode(str(tmp_path), cap)[0] or "-")
            for cap in ((9, 0), (8, 6), (8, 9), (10, 3), (7, 5))}
    assert pick == {(9, 0): "libnvshmem_device_sm_90.bc", (8, 6): "libnvshmem_device_sm_80.bc",
                    (8, 9): "libnvshmem_device_sm_89.bc", (10, 3): "libnvshmem_device_sm_100.bc",
                    (7, 5): "libnvshmem_device_sm_75.bc"}
    path, why = nv.device_bitcode(str(tmp_path), (12, 0))
    assert path is None and "sm_120 (shipped: sm_75, sm_80, sm_89, sm_90, sm_100)" in why


def test_call_mode_choice():
    assert nv.call_mode("auto", []) == nv.CALLS_OFF  # every peer mapped: kernels as on gpu_ipc
    assert nv.call_mode("auto", [2, 3]) == nv.CALLS_REMOTE
    assert nv.call_mode("all", []) == nv.CALLS_ALL


@pytest.mark.parametrize("name, text, words", [
    (nv.ENV_CALLS, "always", "one of auto, all"),
    (nv.ENV_BOOTSTRAP, "pmix", "one of uid, mpi"),
])
def test_bad_variables_raise_and_make_the_plugin_unavailable(monkeypatch, name, text, words):
    assert env.get(nv.ENV_CALLS, {nv.ENV_CALLS: " ALL"}) == "all"
    assert env.get(nv.ENV_BOOTSTRAP, {}) == "uid"
    with pytest.raises(EnvironmentVariableError, match=f"{name}='{text}' is not valid: expected {words}"):
        env.get(name, {name: text})
    monkeypatch.setenv(name, text)
    if name == nv.ENV_BOOTSTRAP:  # read by availability: the plugin says why, naming the variable
        ok, why = iris_fw.context.load_registries().transport.entry("nvshmem").availability()
        assert not ok and name in why, why


def test_call_mode_is_checked():
    with pytest.raises(ValueError, match="must be 0, 1 or 2"):
        dv.device_heaps(torch.zeros(2, dtype=torch.int64), False, nvshmem_calls=3)
    assert dv.device_heaps(torch.zeros(2, dtype=torch.int64), False).NVSHMEM_CALLS.value == 0


# ---- unique-id exchange through the bootstrap (CPU ranks) --------------------------------------------


class _FakeApi:
    """Records what a rank would pass to NVSHMEM; each rank would create its own unique id."""

    def __init__(self, rank):
        self.rank = rank
        self.created = 0
        self.joined = None

    def unique_id(self):
        self.created += 1
        return bytes([self.rank + 1]) * nv.UNIQUE_ID_BYTES

    def init_unique_id(self, uid, rank, world_size):
        self.joined = (uid, rank, world_size)


def _exchange(ctx):
    api = _FakeApi(ctx.rank)
    nv.init_by_unique_id(api, ctx.bootstrap)
    uid, rank, world_size = api.joined
    return api.created, uid, rank, world_size


def _check_exchange(results):
    W = len(results)
    for r, (created, uid, rank, world_size) in enumerate(results):
        assert created == (1 if r == 0 else 0), "only rank 0 creates the unique id"
        assert uid == bytes([1]) * nv.UNIQUE_ID_BYTES, f"rank {r} joined with another rank's id"
        assert (rank, world_size) == (r, W)


class _ThreadBootstrap:
    """The part of a bootstrap :func:`nv.init_by_unique_id` uses, for ranks that are threads of
    this process (every wait bounded)."""

    def __init__(self, shared, rank, world_size):
        self.shared, self.rank, self.world_size = shared, rank, world_size

    def broadcast(self, obj, src):
        if self.rank == src:
            self.shared["value"] = obj
        self.shared["barrier"].wait()
        value = self.shared["value"]
        self.shared["barrier"].wait()  # nobody overwrites it before every rank has read it
        return value


def test_unique_id_broadcast_from_rank0():
    """Three ranks (threads): rank 0 alone creates the id, every rank joins with it."""
    import threading

    W = 3
    shared = {"barrier": threading.Barrier(W, timeout=30)}
    results, errors = [None] * W, []

    def rank_main(r):
        try:
            api = _FakeApi(r)
            nv.init_by_unique_id(api, _ThreadBootstrap(shared, r, W))
            results[r] = (api.created, *api.joined)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and all(not t.is_alive() for t in threads), errors
    _check_exchange(results)


@pytest.mark.extended
def test_unique_id_broadcast_through_the_torch_bootstrap(iris_pool):
    """The same through a real bootstrap: three rank processes, the torch (gloo) bootstrap."""
    _check_exchange(iris_pool(3).run(_exchange))


def test_malformed_unique_id_raises():
    class Bad(_FakeApi):
        def unique_id(self):
            return b"short"

    with pytest.raises(IrisError, match="malformed NVSHMEM unique id"):
        nv.init_by_unique_id(Bad(0), SingleBootstrap())


def test_init_attributes_layout_with_the_real_library():
    """NVSHMEM's own nvshmemx_set_attr_uniqueid_args fills our ctypes image of
    nvshmemx_init_attr_t at the offsets we read (rank, size, the id's address)."""
    home = _home()
    if home is None:
        pytest.skip("NVSHMEM's host library is not installed (pip install nvidia-nvshmem-cu13, or IRIS_FW_NVSHMEM_HOME)")
    api = nv.HostApi(nv.host_library(home))
    uid = api.unique_id()  # needs no GPU
    assert len(uid) == nv.UNIQUE_ID_BYTES and uid != bytes(nv.UNIQUE_ID_BYTES)
    attr, keep = api.unique_id_attr(uid, 3, 8)
    args = attr.args.uid_args
    assert (args.myrank, args.nranks) == (3, 8)
    assert args.id == ctypes.addressof(keep) and bytes(keep) == uid
    assert attr.version >> 16 == 1 and attr.mpi_comm is None
    assert not api.initialized()
    assert api.version() >= (3, 0, 0)


# ---- the Triton hooks (CPU, no compilation) -------------------------------------------------------------


class _Runtime:
    def __init__(self):
        from triton.knobs import HookChain

        self.add_stages_inspection_hook = None
        self.kernel_load_end_hook = HookChain(reversed=True)
        self.kernel_unload_hook = HookChain()


class _Knobs:
    def __init__(self):
        self.runtime = _Runtime()


def test_device_link_hooks(tmp_path):
    import dataclasses

    bitcode = tmp_path / "libnvshmem_device.bc"
    bitcode.write_bytes(b"BC")
    inited = []
    link = nv.DeviceLink(str(bitcode), inited.append, has_state=lambda module: module % 2 == 1)
    knobs = _Knobs()
    link.install(knobs)
    rt = knobs.runtime
    assert rt.add_stages_inspection_hook == link.stages_hook
    key, digest = rt.add_stages_inspection_hook()  # Triton >= 3.9 asks for a cache key
    assert str(bitcode) in str(key) and digest

    @dataclasses.dataclass(frozen=True)
    class Options:
        extern_libs: tuple = (("libdevice", "/x/libdevice.10.bc"),)

    class Backend:
        def make_llir(self, src, metadata, options, capability):
            return dict(options.extern_libs)

    stages = {"llir": None}
    rt.add_stages_inspection_hook(Backend(), stages, Options(), "triton", 90)
    assert stages["llir"]("src", {}) == {"libdevice": "/x/libdevice.10.bc", "libnvshmem_device": str(bitcode)}

    rt.kernel_load_end_hook(7, None, "k", None, "h")  # a module with NVSHMEM's device state
    rt.kernel_load_end_hook(8, None, "k", None, "h")  # one without
    assert inited == [7] and link.modules == [7]
    rt.kernel_unload_hook(7, None, "k", None, "h")
    assert link.modules == []
    link.uninstall(knobs)
    assert rt.add_stages_inspection_hook is None and rt.kernel_load_end_hook.calls == []


def test_device_link_names_an_unreadable_bitcode(tmp_path):
    bitcode = str(tmp_path / "libnvshmem_device_sm_90.bc")

    class Backend:
        def make_llir(self, src, metadata, options, capability):
            raise ValueError(f"Failed to parse library at {bitcode}")

    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Options:
        extern_libs: tuple = ()

    link = nv.DeviceLink(bitcode, lambda m: None, has_state=lambda m: False)
    stages = {"llir": None}
    link.stages_hook(Backend(), stages, Options(), "triton", 90)
    with pytest.raises(IrisError, match="cannot read NVSHMEM's device bitcode .* needs Triton >= 3.9"):
        stages["llir"]("src", {})


# ---- the call path compiled for sm_90 (CPU, needs the bitcode) --------------------------------------------


def _compile_suites_sm90(mode: int, which: str):
    """Child process: compile the primitive / atomic / signal suites' kernels for sm_90 with
    ``heap_bases.NVSHMEM_CALLS = mode`` (a :class:`iris_fw.device.DeviceHeaps` signature, pointer
    checks off); print one line per kernel."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    home = _home()
    link = None
    if mode:
        bitcode, why = nv.device_bitcode(home, (9, 0))
        assert bitcode, why
        link = nv.DeviceLink(bitcode, lambda m: None, has_state=lambda m: False)
        link.install()
    sys.path.insert(0, HERE)
    import test_atomics
    import test_iris_conformance
    import test_primitives
    import test_signal

    ints = {"n": "i32", "dst_row": "i32", "rank": "i32", "peer": "i32", "src_rank": "i32", "iters": "i32",
            "world_size": "i32", "rounds": "i32", "heap_bases": "*i64", "n_valid": "i32", "other": "fp32"}
    jobs = []
    for op in (["load", "store", "get", "put", "copy"] if which in ("all", "primitives") else []):
        for elem in (["i8", "bf16", "fp32", "i64"] if which == "all" else ["fp32"]):
            jobs.append((test_primitives._primitive_kernel, {"src": "*" + elem, "dst": "*" + elem},
                         {"OP": op, "MASKED": True, "BLOCK": 1024}))
    for op, elem in ([("add", "fp32"), ("xchg", "fp32"), ("cas", "i64"), ("min", "i32")] if which == "all" else []):
        jobs.append((test_atomics._atomic_kernel, {"acc": "*" + elem, "vals": "*" + elem, "olds": "*" + elem},
                     {"OP": op, "SEM": "acq_rel", "SCOPE": "sys", "MASKED": op != "cas", "BLOCK": 256}))
    for op, volatile in ([("load", True), ("copy_push", False)] if which == "all" else []):
        # constexpr ranks, cache modifiers, volatile and hints (the options Iris programs pass)
        jobs.append((test_iris_conformance._rma_kernel, {"data": "*fp32", "results": "*fp32"},
                     {"cur_rank": 0, "num_ranks": 2, "OP": op, "LCM": ".cg", "SCM": ".wt", "VOLATILE": volatile,
                      "BLOCK": 256}))
    if which in ("all", "signal"):
        jobs.append((test_signal._ping_kernel, {"data": "*i32", "box": "*i32", "flag": "*i64"}, {"BLOCK": 1024}))
    for kernel, types, constexprs in jobs:
        sig, attrs = {}, {}
        constexprs = dict(constexprs)
        for i, arg in enumerate(kernel.arg_names):
            if arg == "heap_bases":  # as a context passes it: the bases and the two switches
                sig[arg] = dv.DeviceHeaps("*i64", "constexpr", "constexpr")
                constexprs[(i, 1)], constexprs[(i, 2)] = tl.constexpr(False), tl.constexpr(mode)
                attrs[(i, 0)] = [["tt.divisibility", 16]]
                continue
            sig[arg] = "constexpr" if arg in constexprs else {**ints, **types}[arg]
            if sig[arg].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]  # as the JIT specializes aligned pointers
        compiled = triton.compile(ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        state = "nvshmem-state" if nv.DEVICE_STATE_SYMBOL.decode() in ptx else "no-nvshmem"
        print("compiled", kernel.fn.__name__, constexprs.get("OP", "-"), sig.get("src", sig.get("acc", "i32")), state,
              "cross-lane" if re.search(r"(shfl|redux)\.sync", ptx) else "-", flush=True)
    if link is not None:
        link.uninstall()


def _run_child(tmp_path, mode, which):
    script = tmp_path / "compile_nvshmem.py"
    script.write_text(
        "import os, sys\n"
        "os.environ['TRITON_INTERPRET'] = '0'\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import test_nvshmem\n"
        f"test_nvshmem._compile_suites_sm90({mode}, {which!r})\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    return [line.split() for line in proc.stdout.splitlines() if line.startswith("compiled")]


def _need_bitcode():
    home = _home()
    if home is None:
        pytest.skip("NVSHMEM is not installed here (CI does not install the 60-180 MB wheel): pip install "
                    "nvidia-nvshmem-cu13 or set IRIS_FW_NVSHMEM_HOME to run this compile check")
    bitcode, why = nv.device_bitcode(home, (9, 0))
    if bitcode is None:
        pytest.skip(why)
    return bitcode


def test_calls_compile_for_sm90(tmp_path):
    """Every peer through NVSHMEM calls (mode 2): a put/get kernel, an atomic and the signal suite's
    ping kernel link NVSHMEM's device library and assemble for sm_90 (ptxas ran); their atomics
    and waits share thread 0's result through a cross-lane reduction."""
    _need_bitcode()
    lines = _run_child(tmp_path, nv.CALLS_ALL, "signal")
    assert len(lines) == 1 and lines[0][4] == "nvshmem-state" and lines[0][5] == "cross-lane", lines


@pytest.mark.extended
def test_suites_compile_with_calls_for_sm90(tmp_path):
    """The primitive suite's kernels for 4 element widths, the atomic suite's (float add and min
    as compare-and-swap loops, xchg, 64-bit cas), the Iris conformance RMA kernel (constexpr
    ranks, cache modifiers, volatile, hints) and the signal suite's, under modes 1 and 2."""
    _need_bitcode()
    for mode in (nv.CALLS_REMOTE, nv.CALLS_ALL):
        lines = _run_child(tmp_path, mode, "all")
        assert len(lines) == 20 + 4 + 2 + 1, lines
        assert all(line[4] == "nvshmem-state" for line in lines), lines


def test_mode_off_compiles_without_nvshmem(tmp_path):
    """Mode 0 (the default, and nvshmem within a node): the signal suite's kernel (store, load,
    signal, wait) has no NVSHMEM symbol."""
    lines = _run_child(tmp_path, nv.CALLS_OFF, "signal")
    assert len(lines) == 1 and lines[0][4] == "no-nvshmem", lines


# ---- GPU: the transport itself -------------------------------------------------------------------------------


def _need_nvshmem_gpu():
    if not torch.cuda.is_available() or iris_fw.interpreting():
        pytest.skip("the nvshmem transport needs a CUDA GPU")
    if not _on_nvshmem():
        pytest.skip("run with IRIS_FW_TRANSPORT=nvshmem (scripts/gpu_nvshmem.sh)")


def _transport_facts(ctx):
    tr = ctx.transport
    assert tr.name == "nvshmem", tr.name
    api = tr._api
    assert (api.my_pe(), api.n_pes()) == (ctx.rank, ctx.world_size)
    bases = ctx.heap_bases.bases.tolist()
    assert bases == tr.bases and bases[ctx.rank] == tr.heap.data_ptr()
    assert all(b % dv.HEAP_BASE_ALIGN.value == 0 for b in bases)
    # a value written into the heap by torch is what every rank reads through the peer mappings
    t = ctx.full((1000,), float(ctx.rank + 1), dtype=torch.float32)
    ctx.barrier()
    seen = [ctx.peer_view(t, p)[0].item() for p in range(ctx.world_size) if tr.bases[p]]
    ctx.barrier()
    del t
    return {"mode": tr.call_mode, "unmapped": tr.unmapped, "seen": seen, "version": tr.version,
            "calls_env": env.get(nv.ENV_CALLS)}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4], ids=lambda w: f"w{w}")
def test_transport_set_up(iris_pool, world_size):
    _need_nvshmem_gpu()  # before any pool starts
    facts = iris_pool(world_size).run(_transport_facts)
    W = len(facts)
    for r, f in enumerate(facts):
        assert f["unmapped"] == [], f"rank {r}: peers on one node must all be mapped: {f}"
        assert f["seen"] == [float(p + 1) for p in range(W)], f
        assert f["mode"] == (nv.CALLS_ALL if f["calls_env"] == "all" else nv.CALLS_OFF), f


def _init_close_in_child(heap_size: int) -> str:
    """A fresh process: init a 1-rank nvshmem context, use it, close it; returns a summary."""
    code = (
        "import iris_fw, torch\n"
        f"ctx = iris_fw.init(heap_size={heap_size}, transport='nvshmem', bootstrap='single')\n"
        "x = ctx.arange(1 << 20, dtype=torch.float32)\n"
        "ctx.barrier()\n"
        "assert float(x.sum()) == float(torch.arange(1 << 20, dtype=torch.float64).sum())\n"
        "tr = ctx.transport\n"
        "ctx.close()\n"
        "print('closed', tr._api.initialized(), tr._own, torch.cuda.memory_allocated())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def test_init_and_clean_close():
    """Set-up on one GPU, then close: NVSHMEM finalized, heap freed (in a process of its own)."""
    _need_nvshmem_gpu()
    out = _init_close_in_child(64 << 20)
    assert "closed False 0 " in out, out


def test_heap_larger_than_nvshmem_default():
    """iris-fw sizes NVSHMEM's symmetric heap for the requested heap (NVSHMEM's default is 1 GiB)."""
    _need_nvshmem_gpu()
    if "NVSHMEM_SYMMETRIC_SIZE" in os.environ:
        pytest.skip("NVSHMEM_SYMMETRIC_SIZE is set by the caller")
    out = _init_close_in_child(3 << 30)
    assert "closed False 0 " in out, out
