# Run by tests/test_iris_conformance_host.py through `python -m iris_fw.compat.run`: written for
# AMD Iris (`import iris`), it checks that `iris` and `iris.*` are the compat modules — also in a
# process it starts.
import subprocess
import sys

import iris
import iris.ccl
import iris.ops
from iris.ccl import Config, ReduceOp
from iris.ops.config import FusedConfig

import iris_fw.compat.iris as compat

assert iris is compat and iris.ccl is compat.ccl and iris.ops is compat.ops, (iris, compat)
assert iris.__name__ == "iris_fw.compat.iris" and Config().block_size_m == 32 and ReduceOp.SUM == 0
assert FusedConfig().block_size_m == 256
shmem = iris.iris(1 << 20)
x = shmem.arange(4)
assert x.tolist() == [0, 1, 2, 3] and shmem.is_symmetric(x)
print("hook ok", sys.argv[1:], flush=True)
child = subprocess.run([sys.executable, "-c", "import iris, iris.ccl, iris_fw.compat.iris as c; "
                        "assert iris is c and iris.ccl is c.ccl; print('child ok')"],
                       capture_output=True, text=True, timeout=300)
print(child.stdout.strip(), child.stderr[-2000:], flush=True)
