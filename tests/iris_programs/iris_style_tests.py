# An Iris-style unit-test file (what Iris's tests/unittests look like): a context per test,
# dropped with `del` + gc. Run by tests/test_iris_conformance_host.py with
# `pytest -p iris_fw.compat.pytest_iris`.
import gc

import pytest
import torch
import triton
import triton.language as tl

import iris


@triton.jit
def get_kernel(data, results, cur_rank: tl.constexpr, num_ranks: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               heap_bases: tl.tensor):
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    acc = tl.zeros([BLOCK_SIZE], dtype=data.type.element_ty)
    for target_rank in range(num_ranks):
        iris.get(data + offsets, results + offsets, cur_rank, target_rank, heap_bases, mask=mask)
        acc += tl.load(results + offsets, mask=mask)
    tl.store(results + offsets, acc, mask=mask)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float32])
@pytest.mark.parametrize("BLOCK_SIZE", [1, 8, 16, 32])
def test_get_api(dtype, BLOCK_SIZE):
    shmem = iris.iris(1 << 20)
    num_ranks, heap_bases, cur_rank = shmem.get_num_ranks(), shmem.get_heap_bases(), shmem.get_rank()
    data = shmem.ones(BLOCK_SIZE, dtype=dtype)
    results = shmem.zeros_like(data)
    shmem.barrier()
    get_kernel[(1,)](data, results, cur_rank, num_ranks, BLOCK_SIZE, heap_bases)
    shmem.barrier()
    torch.testing.assert_close(results, torch.ones(BLOCK_SIZE, dtype=dtype, device=shmem.get_device()) * num_ranks,
                               rtol=0, atol=0)
    shmem.barrier()
    del shmem
    gc.collect()


def test_factories_and_private_names():
    shmem = iris.iris(1 << 20)
    out = shmem._Iris__allocate(3, torch.int64)
    assert shmem.arange(3, out=out) is out and shmem._Iris__on_symmetric_heap(shmem.empty(0))
    with pytest.raises(ValueError, match="step must be non-zero"):
        shmem.arange(1, 5, 0)
    del shmem
    gc.collect()
