#!/usr/bin/env bash
# Run on a GPU machine: every numbered example on the GPUs (one rank per GPU, at most the
# example's rank count; 08's CUDA-graph capture and 09's inductor compile only run here), the
# CLI tests, and `iris-fw info` as a record. Logs go to $OUT (default ./gpu-out).
#   bash scripts/gpu_examples.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m iris_fw info | tee "$OUT/info.txt"
timeout ${EXAMPLES_TIMEOUT:-900} python3 -m pytest -q -p no:cacheprovider -ra --durations=12 \
    tests/test_examples.py tests/test_cli.py 2>&1 | tee "$OUT/pytest_examples.log" | tail -40
