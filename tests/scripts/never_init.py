"""Rank 1 of an mpirun job never starts MPI (it never calls iris_fw.init) and idles; rank 0's
iris_fw.init must end within the arrival bound, naming why (tests/test_exit.py)."""
import os
import sys
import time

import iris_fw  # noqa: F401  (first: the interpreter switch)

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
if rank == 1:
    time.sleep(20)
    sys.exit(0)
start = time.monotonic()
try:
    iris_fw.init(heap_size=1 << 22)
finally:
    print(f"rank 0 left init after {time.monotonic() - start:.1f} s", flush=True)
