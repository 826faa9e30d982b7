import iris_fw  # noqa: F401  (first: decides interpreter vs. GPU before any kernel is defined)
import pytest

from helpers import world_params

pytest_plugins = ["iris_fw.testing"]

#: World sizes of the ``world`` fixture. On CPU ranks four processes share the CI machine's two
#: cores: world size 4 runs under ``-m extended`` there (3 already catches power-of-two
#: assumptions, 2 the smallest exchange); on GPUs every size runs.
WORLD_SIZES = world_params(1, 2, 3)


@pytest.fixture(params=WORLD_SIZES, ids=lambda w: f"w{w}")
def world(request, iris_pool):
    """A pool of ranks for every world size 1-4 (3 catches power-of-two assumptions); on GPUs,
    sizes above the GPU count are skipped; on CPU ranks 4 is extended."""
    return iris_pool(request.param)


@pytest.fixture(scope="session")
def plugin_template_site(tmp_path_factory):
    """examples/plugin_template, copied as a user would copy it and pip-installed into a private
    directory (put it on PYTHONPATH: its entry points are then found like any installed
    package's). Built from a copy so that no build output lands in the source tree."""
    import os
    import shutil
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(os.path.join(root, "examples", "plugin_template"), work / "my-plugin",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(source)], check=True)
    return str(target)
