#!/usr/bin/env bash
# Run on a GPU machine (the device tool): `iris-fw bench ccl` (issue 11) on NPROCS GPUs (default 2)
# through the repo's launcher, under a time limit (BENCH_TIMEOUT seconds, default 480; SIGINT first,
# so the launcher stops its ranks). Extra arguments go to `iris-fw bench`, e.g. --quick,
# --sizes 8K,256K,1M,16M,256M, --dtype fp16, --iters 30 --warmup 5.
# Into $OUT (default ./gpu-out), at most 8 files: machine.txt, ccl.log (everything the ranks
# printed), ccl.json (raw rows + environment), ccl.md (the table), ccl-results.tgz (CSV, PNG plots).
#   bash scripts/gpu_ccl.sh                       # full sweep 4 KiB .. 1 GiB (+ 8 KiB), bf16
#   BENCH_TIMEOUT=300 bash scripts/gpu_ccl.sh --quick
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
NPROCS=${NPROCS:-2}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
python3 -m iris_fw plugins > "$OUT/plugins.txt" 2>&1
grep -q "gpu_ipc *available" "$OUT/plugins.txt" && grep -q "ccl *available" "$OUT/plugins.txt" \
    || { echo "iris-fw install incomplete"; cat "$OUT/plugins.txt"; exit 1; }
rm -f "$OUT/plugins.txt"
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    nvidia-smi topo -m
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    env | grep -E "^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)="
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
start=$(date +%s)
timeout -s INT -k 30 "${BENCH_TIMEOUT:-480}" python3 -m iris_fw.bench ccl -n "$NPROCS" --out "$OUT/bench" "$@" \
    > "$OUT/ccl.log" 2>&1
rc=$?
echo "iris-fw bench ccl: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/ccl.log"
grep -v "^|" "$OUT/ccl.log" | grep -v "^\[rank" | tail -60
if [ -d "$OUT/bench" ]; then
    cp "$OUT/bench/ccl.json" "$OUT/bench/ccl.md" "$OUT/" 2>/dev/null
    tar czf "$OUT/ccl-results.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
fi
ls -la "$OUT"
exit $rc
