#!/usr/bin/env bash
# On a GPU machine (the device tool): the ccl tests on every GPU, then the one-minute latency
# probe. Logs go to $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-10}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/machine.txt"
echo "== probe"
timeout ${PROBE_TIMEOUT:-150} iris-fw launch -n 2 scripts/probe_ccl.py 2>&1 | tee "$OUT/probe.log" | grep -v "^\[rank" | tail -12
echo "== tests"
timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -ra -x tests/test_ccl.py "$@" 2>&1 | tee "$OUT/pytest.log" | tail -30
rm -f "$OUT/install.log"
