#!/usr/bin/env bash
# One GPU machine start, several steps (the device tool's lease is short: batch). Steps come as
# arguments, each "name[:arg,arg…]"; logs go to $OUT (default ./gpu-out), at most 8 files:
#   tests:FILES   pytest on the GPUs, verbose (one line per test, so a run cut short still says
#                 which tests passed), a per-test limit (TEST_LIMIT s, default 150), XDIST
#                 workers (default 4); FILES are test paths separated by commas.
#                 SHARE=1 lets ranks share GPUs (IRIS_FW_SHARE_GPUS: world sizes above the GPU
#                 count run, time-sliced; correctness only).
#   bench:NAME,ARGS…  iris-fw bench NAME on NPROCS GPUs (default: all) with ARGS; results packed.
#   profile       host time per op call (scripts/profile_op_call.py) on one GPU.
#   run:SCRIPT,ARGS…  python3 SCRIPT ARGS under iris-fw launch -n NPROCS.
#   env:NAME=VALUE    export NAME=VALUE for the steps after it (env:NAME= unsets it).
# Example:
#   SHARE=1 bash scripts/gpu_session.sh tests:tests/test_ccl.py,tests/test_gemm_all_reduce.py profile
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
    python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
NPROCS=${NPROCS:-$GPUS}
n=0
for step in "$@"; do
    n=$((n + 1))
    name=${step%%:*}
    args=""
    [ "$name" != "$step" ] && args=${step#*:}
    IFS=, read -r -a parts <<< "$args"
    echo "== $n $name ${parts[*]:-}"
    start=$(date +%s)
    case $name in
    tests)
        ( [ "${SHARE:-0}" = 1 ] && export IRIS_FW_SHARE_GPUS=1
          export PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" IRIS_FW_FAILURE_LOG="$OUT/failures$n.log"
          timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -v -p no:cacheprovider -p pytest_failure_log -ra --tb=short \
              --timeout "${TEST_LIMIT:-150}" -n "${XDIST:-4}" "${parts[@]}" ) > "$OUT/tests$n.log" 2>&1
        grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/tests$n.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' \
            | awk '{print $1}' | sort | uniq -c
        grep -E "^(FAILED|ERROR) " "$OUT/tests$n.log" | cut -c1-220
        tail -1 "$OUT/tests$n.log" ;;
    bench)
        bench=${parts[0]}
        timeout ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench "$bench" -n "$NPROCS" --out "$OUT/bench$n" "${parts[@]:1}" \
            > "$OUT/bench$n.log" 2>&1
        grep -v "^|" "$OUT/bench$n.log" | grep -v "^\[rank" | tail -25
        tar czf "$OUT/bench$n.tgz" -C "$OUT" "bench$n" 2>/dev/null && rm -rf "$OUT/bench$n" ;;
    profile)
        CUDA_VISIBLE_DEVICES=0 timeout 120 python3 scripts/profile_op_call.py > "$OUT/profile$n.log" 2>&1
        grep "us per call" "$OUT/profile$n.log" ;;
    run)
        timeout ${RUN_TIMEOUT:-240} iris-fw launch -n "$NPROCS" "${parts[@]}" > "$OUT/run$n.log" 2>&1
        grep -v "^\[rank" "$OUT/run$n.log" | tail -25 ;;
    env)
        var=${args%%=*}; val=${args#*=}
        if [ -n "$val" ]; then export "$var=$val"; else unset "$var"; fi ;;
    *) echo "unknown step $name" ;;
    esac
    echo "   ($(( $(date +%s) - start )) s)"
done

# at most 8 files come back: pack the logs when there are more
if [ "$(ls "$OUT" | wc -l)" -gt 8 ]; then
    (cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=machine.txt ./* && find . -type f ! -name logs.tgz ! -name machine.txt -delete)
fi
ls "$OUT"
