#!/usr/bin/env bash
# Run on a GPU machine (the device tool): the hardening tests (issue 19; issue 16 items 5, 6, 8) with
# gpu_ipc, one rank per GPU — resource checks against torch.cuda.mem_get_info, a heap tensor used
# after close (the allocation freed with its last tensor), the bad-input matrix (extended: 1, 2 and
# 3 ranks), the launcher (failures, signals, loopback-only rendezvous with gpu_ipc). Into $OUT
# (default ./gpu-out): hardening.log.
#   bash scripts/gpu_hardening.sh            # NPROCS GPUs visible (>= 2 for the multi-rank cases)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
{
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
    # a heap larger than the GPU is refused with the sizes, not a cudaMalloc error
    python3 -c "import iris_fw; iris_fw.init(heap_size=1 << 40)" 2>&1 | tail -1
    timeout 1500 python3 -m pytest -q -m '' -s tests/test_resources.py tests/test_errors.py tests/test_env.py \
        tests/test_bad_input.py tests/test_launch_control.py 2>&1 | tail -60
} > "$OUT/hardening.log" 2>&1
cat "$OUT/hardening.log"
