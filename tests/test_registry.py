"""Registries, hook specs, entry points: built-ins load like a third party's plugin does."""

import os
import subprocess
import sys
import textwrap

import pytest

import iris_fw
import iris_fw.testing
from iris_fw.hookspecs import hookimpl
from iris_fw.registry import DuplicateNameError, Registry, UnknownNameError, load_registries, plugin_manager



def test_builtins_register_through_entry_points():
    regs = load_registries()
    assert {"gpu_ipc", "host_shm"} <= set(regs.transport.names())
    assert {"mpi", "torch", "single"} <= set(regs.bootstrap.names())
    for name in ("host_shm", "gpu_ipc", "torch"):
        registry = regs.transport if name != "torch" else regs.bootstrap
        assert registry.entry(name).provider.startswith("iris-fw (entry point")
    ok, reason = regs.transport.entry("gpu_ipc").availability()
    if not ok:
        assert "GPU" in reason or "TRITON_INTERPRET" in reason


class _Dup:
    name = "host_shm"


class _PluginA:
    @hookimpl
    def iris_fw_register_transports(self, registry):
        registry.register(_Dup)


class _PluginB:
    @hookimpl
    def iris_fw_register_transports(self, registry):
        registry.register(_Dup)


def test_duplicate_names_are_errors_naming_both_providers():
    pm = plugin_manager(load_entry_points=False)
    pm.register(_PluginA(), name="plugin-a")
    pm.register(_PluginB(), name="plugin-b")
    with pytest.raises(DuplicateNameError, match="transport 'host_shm' is registered twice: first by plugin 'plugin-a', again by plugin 'plugin-b'"):
        load_registries(pm)
    # and against a built-in loaded from its entry point
    pm = plugin_manager()
    pm.register(_PluginB(), name="plugin-b")
    with pytest.raises(DuplicateNameError, match=r"first by iris-fw \(entry point 'host_shm'\), again by plugin 'plugin-b'"):
        load_registries(pm)


def test_registry_lookup_and_availability():
    reg = Registry("pattern")

    class Broken:
        name = "broken"

        @staticmethod
        def available():
            raise RuntimeError("probe exploded")

    class No:
        name = "no"

        @staticmethod
        def available():
            return False, "needs a GPU"

    reg.register(Broken, provider="p")
    reg.register(No, provider="p")
    reg.register(object(), name="plain", provider="p")
    assert reg.entry("broken").availability() == (False, "availability check failed: RuntimeError: probe exploded")
    assert reg.entry("no").availability() == (False, "needs a GPU")
    assert reg.entry("plain").availability() == (True, "")
    with pytest.raises(UnknownNameError, match="no pattern named 'x'; registered: broken, no, plain"):
        reg.get("x")
    with pytest.raises(iris_fw.IrisError, match="pattern 'no' .* is not available here: needs a GPU"):
        reg.require_available("no")
    with pytest.raises(TypeError, match="non-empty string name"):
        reg.register(object(), provider="p")
    with pytest.raises(ValueError, match="kind must be one of"):
        Registry("widget")


def test_hookspecs_are_documented():
    from iris_fw import hookspecs

    from iris_fw.registry import _HOOKS, KINDS

    specs = [n for n in dir(hookspecs) if n.startswith("iris_fw_")]
    assert sorted(specs) == sorted(_HOOKS[k] for k in KINDS)  # one hook per registry kind
    for name in specs:
        doc = getattr(hookspecs, name).__doc__
        assert "Fires:" in doc and ":param registry:" in doc and ":return:" in doc, name


def test_cli_lists_registries(capsys):
    """``iris-fw plugins`` (in this process: test_third_party_plugin_is_seen_and_composes runs it
    as a command)."""
    from iris_fw.cli import main

    capsys.readouterr()
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for line in ("transports:", "bootstraps:", "schedulers:", "patterns:", "benchmarks:", "single  available"):
        assert line in out, out
    usable = "gpu_ipc   available" if iris_fw.testing.gpu_count() else "host_shm  available"
    assert usable in out, out


def test_third_party_plugin_is_seen_and_composes(plugin_template_site, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([plugin_template_site, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "iris_fw.cli", "plugins"], env=env, capture_output=True, text=True, check=True).stdout
    for name in ("private_shm", "filestore", "scale_all_gather", "reverse_fused", "broadcast.pull", "example_broadcast",
                 "iris-fw-example-plugin (entry point 'example')"):
        assert name in out, out
    # The plugin's transport, pattern and scheduler work with the framework's own pieces: its
    # pattern under every built-in scheduler, its scheduler running built-in patterns, 2 ranks.
    script = tmp_path / "use_plugin.py"
    script.write_text(textwrap.dedent("""
        import iris_fw, torch
        from iris_fw import ops
        with iris_fw.init(heap_size=16 << 20, transport="private_shm") as ctx:
            assert ctx.transport.name == "private_shm"
            xs = [torch.randn(300, generator=torch.Generator().manual_seed(r)) for r in range(ctx.world_size)]
            pattern = ctx.registries.pattern.get("scale_all_gather")
            want = pattern.reference(ctx.rank, ctx.world_size, [(x, 2.5) for x in xs])
            for sched in ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "reverse_fused"):
                op = ops.plan("scale_all_gather", xs[ctx.rank], 2.5, scheduler=sched)
                op.buffers["out"].fill_(float("nan"))
                got = op(xs[ctx.rank], 2.5)
                ctx.synchronize()
                assert torch.allclose(got.double(), want), (sched, got, want)
            for name in ("gemm_all_scatter", "gemm_reduce_scatter"):
                g = torch.Generator().manual_seed(7)
                ins = [(torch.randn(8, 12, generator=g), torch.randn(12, 6, generator=g)) for _ in range(ctx.world_size)]
                got = ops.plan(name, *ins[ctx.rank], scheduler="reverse_fused")(*ins[ctx.rank])
                ctx.synchronize()
                want = ctx.registries.pattern.get(name).reference(ctx.rank, ctx.world_size, ins)
                assert torch.allclose(got.double(), want, atol=1e-4), name
            ctx.barrier()
            print(f"plugin ok on rank {ctx.rank}")
    """))
    if iris_fw.testing.gpu_count():
        pytest.skip("the example transport is a CPU (host_shm) transport")
    res = subprocess.run([sys.executable, "-m", "iris_fw", "launch", "-n", "2", str(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "plugin ok on rank 0" in res.stdout and "plugin ok on rank 1" in res.stdout, \
        res.stdout + res.stderr
