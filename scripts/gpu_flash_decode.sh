#!/usr/bin/env bash
# Run on a GPU machine (the device tool): distributed flash-decode (issue 12) in one machine start.
# Steps (a space-separated list in STEPS, default "tests bench1 bench"):
#   tests   tests/test_flash_decode.py (+ the ccl torch-op tests) on every GPU (world sizes up to
#           the GPU count; CUDA-graph replays included); extra arguments go to pytest
#   bench1  `iris-fw bench flash_decode` on 1 GPU (world size 1: the local kernel's bandwidth,
#           fused/bulk_sync overheads without peers)
#   bench   the same on NPROCS GPUs (default 2): fused and bulk_sync against the BSP baseline
#   tune    the local kernel under every launch configuration at B 8 x 16K tokens (1 GPU;
#           IRIS_FW_BENCH_TUNE=1) — the rows for iris_fw/tuning/flash_decode.json
# BENCH_ARGS (default "--quick --iters 20 --warmup 3": batches 1, 8, 16 x 4K/16K/64K tokens per
# rank) go to every bench step. Logs and results go to $OUT (default ./gpu-out).
#   bash scripts/gpu_flash_decode.sh                          # 1 GPU and 2 GPUs
#   STEPS="bench" NPROCS=2 BENCH_ARGS="--sizes 16K" bash scripts/gpu_flash_decode.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-tests bench1 bench}
NPROCS=${NPROCS:-2}
BENCH_ARGS=${BENCH_ARGS:---quick --iters 20 --warmup 3}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m iris_fw plugins > "$OUT/plugins.txt" 2>&1
grep -q "gpu_ipc *available" "$OUT/plugins.txt" && grep -q "flash_decode *available" "$OUT/plugins.txt" \
    || { echo "iris-fw install incomplete"; cat "$OUT/plugins.txt"; exit 1; }
rm -f "$OUT/plugins.txt" "$OUT/install.log"
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
rc=0
for step in $STEPS; do
    echo "== $step"
    case $step in
    tests) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -ra \
            tests/test_flash_decode.py tests/test_ccl_torch.py "$@" 2>&1 | tee "$OUT/pytest.log" | tail -25
        rc=$(( rc | ${PIPESTATUS[0]} )) ;;
    bench1) CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 30 ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench flash_decode -n 1 \
            $BENCH_ARGS --out "$OUT/bench1" > "$OUT/bench1.log" 2>&1
        rc=$(( rc | $? )); grep -v "^|" "$OUT/bench1.log" | grep -v "^\[rank" | tail -25 ;;
    bench) timeout -s INT -k 30 ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench flash_decode -n "$NPROCS" \
            $BENCH_ARGS --out "$OUT/bench$NPROCS" > "$OUT/bench$NPROCS.log" 2>&1
        rc=$(( rc | $? )); grep -v "^|" "$OUT/bench$NPROCS.log" | grep -v "^\[rank" | tail -25 ;;
    tune) CUDA_VISIBLE_DEVICES=0 IRIS_FW_BENCH_TUNE=1 timeout -s INT -k 30 ${BENCH_TIMEOUT:-300} \
            python3 -m iris_fw.bench flash_decode -n 1 --quick --sizes 16K --iters 20 --warmup 3 --out "$OUT/tune" \
            > "$OUT/tune.log" 2>&1
        rc=$(( rc | $? )); grep "tune\|B 8 S 16384" "$OUT/tune.log" | grep -v "^|" | tail -8 ;;
    *) echo "unknown step $step"; rc=1 ;;
    esac
done
# at most 8 files come back: the tables beside the logs, the rest packed
for d in bench1 "bench$NPROCS"; do
    [ -f "$OUT/$d/flash_decode.md" ] && cp "$OUT/$d/flash_decode.md" "$OUT/$d.md"
done
tar czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls -d bench1 "bench$NPROCS" tune 2>/dev/null) 2>/dev/null \
    && rm -rf "$OUT/bench1" "$OUT/bench$NPROCS" "$OUT/tune"
ls -la "$OUT"
exit $rc
