import iris_fw  # noqa: F401  (first: decides interpreter vs. GPU before any kernel is defined)
import pytest

pytest_plugins = ["iris_fw.testing"]

WORLD_SIZES = (1, 2, 3, 4)


@pytest.fixture(params=WORLD_SIZES, ids=lambda w: f"w{w}")
def world(request, iris_pool):
    """A pool of ranks for every world size 1-4 (3 catches power-of-two assumptions); on GPUs,
    sizes above the GPU count are skipped."""
    return iris_pool(request.param)
