#!/usr/bin/env bash
# The nvshmem transport on this machine's GPUs, in one call (written for one H200; more GPUs run
# the multi-rank cases too). Logs under $OUT (default ./gpu-out), at most 8 files come back.
#   1 facts     versions, GPUs, the NVSHMEM installations, `iris-fw plugins` for nvshmem
#   2 suites    IRIS_FW_TRANSPORT=nvshmem: tests/test_nvshmem.py + the primitive, atomic and signal
#               suites (world sizes up to the GPU count; with >= 2 GPUs also taxonomy and ccl)
#   3 calls     the same primitive suite (then signal, atomics) with every peer reached through
#               NVSHMEM device calls (IRIS_FW_NVSHMEM_CALLS=all), with the NVSHMEM whose device
#               bitcode this Triton can read (CALL_HOME below)
#   4 bench     iris-fw bench primitives,atomics --quick: load/store vs NVSHMEM calls
# NVSHMEM for the call path: the machine's own if its bitcode links with this Triton (Triton 3.6
# cannot read NVSHMEM 3.8's: docs/nvshmem.md), else a carried wheel .whl/nvidia_nvshmem_cu13-3.4.5-*.whl
# (unpacked to /tmp). Per-step limits keep the whole under ~9 minutes.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
elapsed() { echo "   ($(( $(date +%s) - T0 )) s so far)"; }

echo "== 1 facts"
CALL_HOME=""
for wheel in .whl/nvidia_nvshmem_cu13-3.4.5-*.whl; do
    [ -f "$wheel" ] || continue
    mkdir -p /tmp/iris_fw_nvshmem345 && python3 -m zipfile -e "$wheel" /tmp/iris_fw_nvshmem345 \
        && CALL_HOME=/tmp/iris_fw_nvshmem345/nvidia/nvshmem
done
export CALL_HOME
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvidia-smi topo -m 2>/dev/null | head -6
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    python3 - <<'EOF'
import os
from iris_fw import nvshmem as nv
print("machine NVSHMEM:", nv.describe({}))
home = os.environ.get("CALL_HOME")
if home:
    print("carried NVSHMEM:", nv.describe({nv.ENV_HOME: home}))
EOF
    IRIS_FW_TRANSPORT=nvshmem iris-fw plugins | grep -E "nvshmem|gpu_ipc"
    ls /sys/class/infiniband 2>/dev/null | head -3 | sed 's/^/IB device: /'
} > "$OUT/facts.txt" 2>&1
cat "$OUT/facts.txt"
echo "NVSHMEM for the call path: ${CALL_HOME:-the machine installation}"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
elapsed

run_tests() {  # name limit_s pytest-args...: verbose log, a count per outcome, the failures
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 -m pytest -v -p no:cacheprovider -ra --tb=short --timeout 240 -n "${XDIST:-4}" "$@" \
        > "$OUT/$name.log" 2>&1
    echo "   exit $?"
    grep -E " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/$name.log" | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
    grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | cut -c1-240 | head -20
    tail -1 "$OUT/$name.log"
}

echo "== 2 suites on IRIS_FW_TRANSPORT=nvshmem (load/store to every mapped peer)"
SUITES="tests/test_nvshmem.py tests/test_primitives.py tests/test_atomics.py tests/test_signal.py"
[ "$GPUS" -ge 2 ] && SUITES="$SUITES tests/test_taxonomy.py tests/test_ccl.py"
IRIS_FW_TRANSPORT=nvshmem run_tests suites 170 $SUITES -k "not compile"
elapsed

echo "== 3 NVSHMEM device calls for every peer (IRIS_FW_NVSHMEM_CALLS=all)"
(
    export IRIS_FW_TRANSPORT=nvshmem IRIS_FW_NVSHMEM_CALLS=all
    [ -n "$CALL_HOME" ] && export IRIS_FW_NVSHMEM_HOME=$CALL_HOME
    run_tests calls_primitives 170 tests/test_primitives.py tests/test_nvshmem.py \
        -k "primitive or transport or close or compile"
    echo "   ($(( $(date +%s) - T0 )) s so far)"
    left=$(( 500 - ($(date +%s) - T0) ))
    # scope does not apply to NVSHMEM calls: the atomics run once per op x sem (scope "sys")
    [ "$left" -gt 60 ] && run_tests calls_signal_atomics "$left" tests/test_signal.py tests/test_atomics.py \
        -k "sys or not atomic_contention"
)
elapsed

echo "== 4 bandwidth: load/store vs NVSHMEM calls (iris-fw bench primitives,atomics --quick, peer = right neighbour)"
left=$(( 570 - ($(date +%s) - T0) ))
if [ "$left" -gt 30 ]; then
    for mode in auto all; do
        ( export IRIS_FW_TRANSPORT=nvshmem IRIS_FW_NVSHMEM_CALLS=$mode
          [ "$mode" = all ] && [ -n "$CALL_HOME" ] && export IRIS_FW_NVSHMEM_HOME=$CALL_HOME
          timeout $(( left / 2 )) python3 -m iris_fw.bench primitives atomics -n "$GPUS" --quick --sizes 1M,16M,256M \
              --iters 10 --out "$OUT/bench_$mode" > "$OUT/bench_$mode.log" 2>&1
          echo "   calls=$mode exit $?"; grep "^|" "$OUT/bench_$mode.log" | grep -v "tune:" | head -30 )
    done
fi
elapsed

# at most 8 files come back: pack everything but the facts into one archive
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=facts.txt ./* && find . -mindepth 1 ! -name logs.tgz ! -name facts.txt -delete)
ls "$OUT"
