#!/usr/bin/env bash
# On a GPU machine (2 GPUs): the fail-fast checks of docs/reliability.md that CPU CI cannot make —
# 1. the watchdog's header access through gpu_ipc (a pinned buffer on a non-blocking stream) and
#    the abort word under running kernels: tests/test_failfast.py and the signal / missing-rank
#    tests with the default build (pointer checks compiled out: that test skips);
# 2. the same with IRIS_FW_DEBUG=1 (pointer checks compiled in: a stray pointer or peer must be
#    reported, not fault the GPU);
# 3. the fault-injection scenarios, one rank per GPU: the default three, or all with STEPS=...matrix;
# 4. the abort-word overhead: the latency benchmark (signal -> wait_until) to compare with
#    docs/performance.md.
#   STEPS="abort debug faults bench" bash scripts/gpu_failfast.sh      (add "matrix" for all 84)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-abort debug faults bench}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
PYTEST="python3 -m pytest -q -p no:cacheprovider -ra --tb=short"
for step in $STEPS; do
    echo "== $step"
    case $step in
    abort) timeout 900 $PYTEST tests/test_failfast.py tests/test_signal.py tests/test_tilecomm.py -k "failfast or missing or signal or lost" 2>&1 \
            | tee "$OUT/abort.log" | grep -E "Error|passed|failed|FAILED" | cut -c1-300 | tail -30 ;;
    debug) IRIS_FW_DEBUG=1 timeout 900 $PYTEST tests/test_failfast.py -k pointer 2>&1 \
            | tee "$OUT/debug.log" | grep -E "Error|passed|failed|FAILED" | cut -c1-300 | tail -30 ;;
    faults) timeout 900 $PYTEST tests/test_faults.py 2>&1 | tee "$OUT/faults.log" | grep -E "Error|passed|failed|FAILED" | tail -30 ;;
    matrix) IRIS_FW_FAULT_REPORT="$OUT/faults.tsv" timeout 3600 $PYTEST -m extended tests/test_faults.py -k matrix 2>&1 \
            | tee "$OUT/matrix.log" | grep -E "passed|failed|FAILED" | tail -30 ;;
    bench) timeout 300 iris-fw bench -n 2 latency 2>&1 | tee "$OUT/bench.log" | tail -12 ;;
    esac
done
