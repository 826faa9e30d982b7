"""One error hierarchy: every error iris-fw raises for bad input is an IrisError and the builtin
a user expects; timeouts are TimeoutErrors that say which rank did not arrive."""

import time

import pytest
import torch

import iris_fw
from iris_fw import errors
from iris_fw.ccl.group import WorkspaceFull
from iris_fw.engine.contract import CollectiveMismatch, PatternError
from iris_fw.registry import DuplicateNameError, UnknownNameError


@pytest.mark.parametrize("cls, builtin", [
    (errors.ArgumentError, ValueError), (errors.ArgumentTypeError, TypeError),
    (errors.EnvironmentVariableError, ValueError), (errors.HeapTooLarge, MemoryError),
    (errors.HeapOutOfMemory, MemoryError), (errors.NotOnHeapError, ValueError), (errors.WaitTimeout, TimeoutError),
    (errors.ContextClosed, RuntimeError), (PatternError, ValueError), (CollectiveMismatch, ValueError),
    (UnknownNameError, KeyError), (WorkspaceFull, MemoryError), (DuplicateNameError, RuntimeError),
])
def test_every_error_is_an_iris_error_and_the_expected_builtin(cls, builtin):
    assert issubclass(cls, iris_fw.IrisError) and issubclass(cls, builtin)
    exc = cls("x must be an int, got str 'a'")
    assert "x must be an int" in str(exc)


def test_helpers_name_argument_expectation_and_value():
    e = errors.bad_type("heap_size", "an int", "1G")
    assert isinstance(e, TypeError) and str(e) == "heap_size must be an int, got str '1G'"
    e = errors.bad_value("peer", "in [0, 2)", 5)
    assert isinstance(e, ValueError) and str(e) == "peer must be in [0, 2), got 5"
    assert "..." in str(errors.bad_type("t", "a tensor", list(range(100))))


def _device_barrier_missing_rank(ctx):
    """The last rank skips one device barrier: every rank raises WaitTimeout naming it (not
    "offset 0x88 (heap header)")."""
    w = ctx.world_size
    missing = w - 1
    sub = iris_fw.init(heap_size=1 << 20, transport=ctx.transport.name, wait_timeout=0.5)
    try:
        start = time.monotonic()
        if ctx.rank != missing:
            sub.device_barrier()
        with pytest.raises(iris_fw.WaitTimeout) as info:
            sub.barrier()
        elapsed = time.monotonic() - start
    finally:
        sub.close()
    text = str(info.value)
    assert isinstance(info.value, TimeoutError)
    for r in range(w - 1):
        assert f"device barrier: rank {missing} never arrived — rank {r} waited for it" in text, text
    assert "heap header)" not in text, text
    assert elapsed < 20, f"{elapsed:.1f}s to report"


def test_device_barrier_timeout_names_the_missing_rank(iris_pool):
    iris_pool(2).run(_device_barrier_missing_rank, timeout=300)


def test_wait_message_names_the_element_of_a_slot_array():
    """A timed-out wait on ``slots[k]`` of an int64 slot array (one slot per rank, as tilecomm's
    arrivals) says which element: the rank whose arrival was missing."""
    from iris_fw.diagnostics import _element
    from iris_fw.heap import Block

    block = Block(offset=4096, size=256, seq=0, site="x.py:1", what="int64[4]")
    assert _element(block, 4096 + 16) == ", element [2]"
    assert _element(block, 4096 + 3) == ""
    assert _element(Block(4096, 256, 0, "x.py:1", "uint8[256]"), 4100) == ", element [4]"
    assert _element(Block(4096, 256, 0, "x.py:1", "workspace"), 4100) == ""
