#!/usr/bin/env bash
# Run on a GPU machine (the device tool): install iris-fw over the machine's own torch and
# Triton, run the whole test suite on the GPUs, and the demo under iris-fw launch, torchrun
# and mpirun. Logs go to $OUT (default ./gpu-out). Extra arguments go to pytest.
#   bash scripts/gpu_suite.sh [pytest args]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then  # wheels carried for a machine without an index
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site PATH=$PATH:/tmp/site/bin
fi
# mpirun: the machine's own MPI when it has one (its mpi4py is built for it; the CUDA image
# has Open MPI 4.1, which refuses root unless told), else a carried one. A wheel's mpich
# cannot be carried with pip --target: its libmpi is a data file that --target drops.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export IRIS_FW_MPIRUN=$(command -v mpirun || true)
echo "mpirun: ${IRIS_FW_MPIRUN:-none}"
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
