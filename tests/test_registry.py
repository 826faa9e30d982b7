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

HERE = os.path.dirname(os.path.abspath(__file__))


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

    specs = [n for n in dir(hookspecs) if n.startswith("iris_fw_")]
    assert len(specs) == 5
    for name in specs:
        doc = getattr(hookspecs, name).__doc__
        assert "Fires:" in doc and ":param registry:" in doc and ":return:" in doc, name


def test_cli_lists_registries():
    out = subprocess.run([sys.executable, "-m", "iris_fw.cli", "plugins"], capture_output=True, text=True, check=True).stdout
    for line in ("transports:", "bootstraps:", "schedulers:", "patterns:", "benchmarks:", "single  available"):
        assert line in out, out
    usable = "gpu_ipc   available" if iris_fw.testing.gpu_count() else "host_shm  available"
    assert usable in out, out


@pytest.fixture(scope="module")
def thirdparty_site(tmp_path_factory):
    """The example plugin package under tests/thirdparty, pip-installed into a private dir."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), os.path.join(HERE, "thirdparty")],
        check=True,
    )
    return str(target)


def test_third_party_plugin_is_seen_and_composes(thirdparty_site, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([thirdparty_site, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "iris_fw.cli", "plugins"], env=env, capture_output=True, text=True, check=True).stdout
    assert "private_shm" in out and "scale" in out and "iris-fw-example-plugin (entry point 'example')" in out, out
    # the plugin's transport and pattern work with the framework's own pieces
    script = tmp_path / "use_plugin.py"
    script.write_text(textwrap.dedent("""
        import iris_fw, torch
        from iris_fw.registry import load_registries
        regs = load_registries()
        scale = regs.pattern.get("scale")
        with iris_fw.init(heap_size=1 << 20, transport="private_shm", bootstrap="single") as ctx:
            assert ctx.transport.name == "private_shm"
            x = ctx.randn(300); y = ctx.full((300,), float("nan"))
            scale.run(ctx, x, y, 2.5, peer=0)
            ctx.barrier()
            assert torch.equal(y, scale.reference(x, 2.5))
            print("plugin ok")
    """))
    if iris_fw.testing.gpu_count():
        pytest.skip("the example transport is a CPU (host_shm) transport")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and "plugin ok" in res.stdout, res.stderr
