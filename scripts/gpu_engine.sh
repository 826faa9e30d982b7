#!/usr/bin/env bash
# Run on a GPU machine (the device tool): the op-engine checks in one machine start. Steps (a
# space-separated list in STEPS, default all): probe (the launcher probe, 1 GPU), profile (where
# an op call's host time goes, 1 GPU), tests (engine / taxonomy / tile-communication / launcher /
# signal tests on every GPU; extra arguments go to pytest), engine (`iris-fw bench engine`),
# taxonomy (`iris-fw bench taxonomy --quick`). Logs go to $OUT (default ./gpu-out).
#   STEPS="probe tests engine" bash scripts/gpu_engine.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-probe profile tests engine taxonomy}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m iris_fw plugins > "$OUT/plugins.txt" 2>&1
grep -q "gpu_ipc *available" "$OUT/plugins.txt" || { echo "iris-fw install incomplete"; cat "$OUT/plugins.txt"; exit 1; }
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
for step in $STEPS; do
    echo "== $step"
    case $step in
    probe) mkdir -p "$OUT/probe"
        CUDA_VISIBLE_DEVICES=0 timeout 120 python3 scripts/probe_launch.py --out "$OUT/probe" 2>&1 | tee "$OUT/probe_launch.log" | tail -12 ;;
    profile) CUDA_VISIBLE_DEVICES=0 timeout 90 python3 scripts/profile_op_call.py > "$OUT/profile.log" 2>&1; grep "us per call" "$OUT/profile.log" ;;
    tests) timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -ra \
            tests/test_engine.py tests/test_taxonomy.py tests/test_tilecomm.py tests/test_launcher.py tests/test_signal.py "$@" \
            2>&1 | tee "$OUT/pytest.log" | tail -25 ;;
    engine) timeout ${BENCH_TIMEOUT:-150} python3 -m iris_fw.bench engine --iters 30 --warmup 5 --out "$OUT/bench" \
            2>&1 | tee "$OUT/bench.log" | grep -v "^\[rank" | tail -30 ;;
    taxonomy) timeout ${TAX_TIMEOUT:-240} python3 -m iris_fw.bench taxonomy --quick --iters 10 --warmup 2 --out "$OUT/bench" \
            2>&1 | tee "$OUT/taxonomy.log" | grep -v "^\[rank" | grep -v "^|" | tail -40 ;;
    esac
done
# at most 8 files come back: pack the result folders
tar czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls -d probe bench 2>/dev/null) 2>/dev/null && rm -rf "$OUT/probe" "$OUT/bench"
rm -f "$OUT/install.log"
ls -la "$OUT"
