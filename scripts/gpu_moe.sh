#!/usr/bin/env bash
# Run on a GPU machine (the device tool): MoE dispatch/combine and the fused expert GEMMs (issue 30)
# in one machine start.
# With one GPU the ranks share it (IRIS_FW_SHARE_GPUS=1) under CUDA MPS, so their kernels are
# co-resident (without MPS they time-slice and every cross-rank wait costs a time slice).
# Steps (a space-separated list in STEPS, default "tests bench1 bench"):
#   tests   tests/test_moe.py and tests/test_moe_gemm.py at world sizes 1-4 sharing the GPU(s),
#           CUDA-graph replays with fresh routing included; extra arguments go to pytest
#   bench1  `iris-fw bench moe` at world size 1 (the local kernels' bandwidth, no peers)
#   bench   the same at NPROCS ranks (default 2) sharing the GPU(s) under MPS
#   iris_example  Iris's examples/31_expert_sharded_moe/example_run.py unchanged through the compat
#           layer (python -m iris_fw.compat.run), from the ROCm/iris checkout at IRIS_SRC: 1 rank
#           (one GPU per rank: all one GPU allows), and 2 ranks where there are two GPUs; its
#           "PASSED" line checked (docs/moe.md says why it cannot run on CPU ranks)
# BENCH_ARGS (default "--quick --iters 20 --warmup 3": the decode points) go to every bench step.
# Logs and results go to $OUT (default ./gpu-out).
#   bash scripts/gpu_moe.sh
#   STEPS="bench" BENCH_ARGS="--iters 10 --warmup 2 --heap-size 24G" bash scripts/gpu_moe.sh   # prefill too
#   IRIS_SRC=shared/iris STEPS=iris_example bash scripts/gpu_moe.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-tests bench1 bench}
NPROCS=${NPROCS:-2}
BENCH_ARGS=${BENCH_ARGS:---quick --iters 20 --warmup 3}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10} IRIS_FW_SHARE_GPUS=1
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m iris_fw plugins > "$OUT/plugins.txt" 2>&1
grep -q "moe *available" "$OUT/plugins.txt" || { echo "iris-fw install incomplete"; cat "$OUT/plugins.txt"; exit 1; }
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
rc=0
for step in $STEPS; do
    echo "== $step"
    case $step in
    tests) timeout ${TEST_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider -ra tests/test_moe.py \
            tests/test_moe_gemm.py "$@" 2>&1 \
            | tee "$OUT/pytest.log" | tail -25
        rc=$(( rc | ${PIPESTATUS[0]} )) ;;
    bench1) timeout -s INT -k 30 ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench moe -n 1 $BENCH_ARGS \
            --out "$OUT/bench1" > "$OUT/bench1.log" 2>&1
        rc=$(( rc | $? )); grep -v "^|" "$OUT/bench1.log" | grep -v "^\[rank" | tail -25 ;;
    bench) timeout -s INT -k 30 ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench moe -n "$NPROCS" $BENCH_ARGS \
            --out "$OUT/bench$NPROCS" > "$OUT/bench$NPROCS.log" 2>&1
        rc=$(( rc | $? )); grep -v "^|" "$OUT/bench$NPROCS.log" | grep -v "^\[rank" | tail -25 ;;
    iris_example)
        example="${IRIS_SRC:?set IRIS_SRC to a checkout of ROCm/iris}/examples/31_expert_sharded_moe/example_run.py"
        [ -f "$example" ] || { echo "no $example"; rc=1; continue; }
        gpus=$(nvidia-smi -L | wc -l)
        for n in 1 $([ "$gpus" -ge 2 ] && echo 2); do
            timeout -k 30 ${EXAMPLE_TIMEOUT:-300} python3 -m iris_fw.compat.run "$example" --num_ranks "$n" \
                > "$OUT/iris_moe_example_w$n.log" 2>&1
            status=$?
            tail -12 "$OUT/iris_moe_example_w$n.log"
            if [ $status -ne 0 ] || ! grep -q "PASSED: sharded MoE matches reference" "$OUT/iris_moe_example_w$n.log"; then
                echo "iris_example W=$n: FAILED (exit $status)"; rc=1
            else
                echo "iris_example W=$n: passed"
            fi
        done
        [ "$gpus" -ge 2 ] || echo "iris_example W=2 not run: one GPU (the example puts rank r on cuda:r)" ;;
    *) echo "unknown step $step"; rc=1 ;;
    esac
done
exit $rc
