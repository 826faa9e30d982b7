#!/usr/bin/env bash
# Run on a GPU machine (the device tool): install iris-fw over the machine's torch/Triton and
# run `iris-fw bench` on every GPU; results (CSV, JSON, Markdown, PNG) are packed into
# $OUT/bench.tgz with the log. Extra arguments go to iris-fw bench.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpus.txt"
timeout ${BENCH_TIMEOUT:-540} python3 -m iris_fw.bench --out "$OUT/bench" "$@" 2>&1 | tee "$OUT/bench.log"
tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
