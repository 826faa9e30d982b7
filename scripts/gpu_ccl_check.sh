#!/usr/bin/env bash
# On a GPU machine (the device tool): the ccl correctness checks in one machine start — first the
# diagnostic replay of the sequences that failed on 2x H200 (back-to-back all-reduces, alternating
# reductions, late ranks; prints wrong-element counts per call), then the collective tests on
# every GPU (ccl, fused RMSNorm, torch ops, multi-step patterns), then the one-minute latency
# probe. Steps: STEPS (default "diag tests probe"); extra arguments go to pytest; XDIST=N runs the
# tests in N pytest-xdist workers (compiling is CPU-bound; each worker has its own rank pools). Logs in $OUT.
#   STEPS="diag tests" bash scripts/gpu_ccl_check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-diag tests probe}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/machine.txt"
for step in $STEPS; do
    echo "== $step"
    case $step in
    diag) timeout ${DIAG_TIMEOUT:-180} iris-fw launch --no-tag-output -n ${NPROCS:-2} scripts/diag_ccl_order.py 2>&1 | grep -v "^\[rank" \
            | sed 's/(uint8.*//' > "$OUT/diag.log"; grep -c " 0 wrong" "$OUT/diag.log"; grep -v " 0 wrong" "$OUT/diag.log" | head -20 ;;
    tests) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -ra --tb=short ${XDIST:+-n $XDIST} \
            tests/test_ccl.py tests/test_ccl_fused.py tests/test_ccl_torch.py tests/test_engine_steps.py "$@" 2>&1 \
            | tee "$OUT/pytest.log" | grep -E "Error|passed|failed|FAILED" | cut -c1-300 | tail -40 ;;
    probe) timeout ${PROBE_TIMEOUT:-150} iris-fw launch --no-tag-output -n ${NPROCS:-2} scripts/probe_ccl.py 2>&1 | tee "$OUT/probe.log" \
            | grep -v "^\[rank" | tail -12 ;;
    esac
done
