#!/usr/bin/env bash
# Run on a GPU machine (the device tool): install iris-fw over the machine's own torch and
# Triton, run the whole test suite on the GPUs, and the demo under iris-fw launch, torchrun
# and mpirun. Logs go to $OUT (default ./gpu-out). Extra arguments go to pytest.
#   bash scripts/gpu_suite.sh [pytest args]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then  # wheels carried for a machine without an index
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
    # mpi4py must load the carried MPICH, not an MPI library found on the system path
    [ -e /tmp/site/lib/libmpi.so.12 ] && export MPI4PY_LIBMPI=/tmp/site/lib/libmpi.so.12
fi
# mpi4py takes an MPI library already loaded into the process first (dlopen(NULL)). If
# importing torch brings one in, mpirun must be that MPI's, not the carried MPICH's.
if python3 -c "import torch, ctypes; ctypes.CDLL(None).MPI_Get_version" 2> /dev/null; then
    echo "an MPI library is loaded with torch: $(python3 -c 'import torch,re;print(sorted({l.split()[-1] for l in open("/proc/self/maps") if "libmpi" in l}))')"
    export PATH=${PATH#/tmp/site/bin:}
    unset MPI4PY_LIBMPI
    export IRIS_FW_MPIRUN=$(command -v mpirun || true)
    echo "using mpirun: ${IRIS_FW_MPIRUN:-none}"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvidia-smi topo -m
    python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
    env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 -m iris_fw plugins | tee "$OUT/plugins.txt"
N=$(python3 -c "import torch; print(torch.cuda.device_count())")
for launcher in "python3 -m iris_fw launch -n $N" "python3 -m torch.distributed.run --nproc-per-node $N" "mpirun -n $N python3"; do
    echo "== $launcher examples/ring_exchange.py" | tee -a "$OUT/demo.log"
    timeout 300 $launcher examples/ring_exchange.py 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*" | tee -a "$OUT/demo.log"
done
timeout ${SUITE_TIMEOUT:-480} python3 -m pytest -q -p no:cacheprovider -ra "$@" 2>&1 | tee "$OUT/pytest.log" | tail -60
