#!/usr/bin/env bash
# The nvshmem transport on ONE GPU (1 H100 or 1 H200), about 4 minutes at most. Logs under $OUT
# (default ./gpu-out): facts.txt, summary.txt and logs.tgz (every step's log and JSON).
#   1 facts    versions, the GPU, the NVSHMEM installations, `iris-fw info` / `iris-fw plugins` on nvshmem
#   2 W=1      scripts/probe_nvshmem.py with IRIS_FW_NVSHMEM_CALLS=auto (NVSHMEM_CALLS=0: loads/stores)
#              and =all (NVSHMEM_CALLS=2: NVSHMEM device calls): put/get of 8/16/32/64-bit elements,
#              int/float add, max, xchg, cas, a signal ring, each against a torch reference; then put/get
#              bandwidth (1 and 64 MiB) and the ring's round time
#   3 W=2      two PEs on the one GPU (IRIS_FW_SHARE_GPUS=1: NVSHMEM's multiple-processes-per-GPU mode,
#              no MPS), the same checks (no timing: the two ranks time-slice the GPU); if NVSHMEM refuses,
#              summary.txt says so with its message
#   4 summary  one table, calls=auto against calls=all
# The call path links NVSHMEM's device bitcode with Triton's LLVM: Triton 3.6 cannot read NVSHMEM 3.8's
# (docs/nvshmem.md), so calls=all uses a carried NVSHMEM 3.4.5 when there is one: .whl/nvshmem345-min.tar.xz
# (its lib/ files: host library, device bitcode, bootstrap plugins) or .whl/nvidia_nvshmem_cu13-3.4.5-*.whl.
# Without either, calls=all runs with the machine's NVSHMEM and, on Triton 3.6, fails with the parse error.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/logs"
# ranks sharing a GPU run at once only under CUDA MPS (scripts/mps.sh; stopped at exit)
. "$(dirname "$0")/mps.sh"
if mps_needed; then mps_start; fi
T0=$(date +%s)
BUDGET=${BUDGET:-220}  # seconds for the whole script; later steps are skipped when it runs out
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-20}
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/logs/install.log" 2>&1 \
    || { cat "$OUT/logs/install.log"; exit 1; }

echo "== 1 facts"
CALL_HOME=""
if [ -f .whl/nvshmem345-min.tar.xz ]; then
    mkdir -p /tmp/iris_fw_nvshmem345 && tar -xJf .whl/nvshmem345-min.tar.xz -C /tmp/iris_fw_nvshmem345 \
        && CALL_HOME=/tmp/iris_fw_nvshmem345/nvidia/nvshmem
else
    for wheel in .whl/nvidia_nvshmem_cu13-3.4.5-*.whl; do
        [ -f "$wheel" ] || continue
        mkdir -p /tmp/iris_fw_nvshmem345 && python3 -m zipfile -e "$wheel" /tmp/iris_fw_nvshmem345 \
            && CALL_HOME=/tmp/iris_fw_nvshmem345/nvidia/nvshmem
    done
fi
export CALL_HOME
{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo "MPS started by this script (ranks share the GPU)"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    python3 - <<'EOF'
import os
from iris_fw import nvshmem as nv
print("machine NVSHMEM:", nv.describe({}))
if os.environ.get("CALL_HOME"):
    print("carried NVSHMEM:", nv.describe({nv.ENV_HOME: os.environ["CALL_HOME"]}))
EOF
    IRIS_FW_TRANSPORT=nvshmem iris-fw info > "$OUT/logs/info.txt" 2>&1
    echo "iris-fw info (exit $?):"; grep -E "^  (torch|triton) |nvshmem|gpus|cuda:" "$OUT/logs/info.txt"
    echo "iris-fw plugins:"; iris-fw plugins 2>&1 | grep -E "nvshmem|gpu_ipc"
} > "$OUT/facts.txt" 2>&1
cat "$OUT/facts.txt"
echo "NVSHMEM for the call path: ${CALL_HOME:-the machine installation}; $(elapsed) s so far"

probe() {  # name world_size calls limit_s [--time]: one iris-fw launch of the probe
    local name=$1 world=$2 calls=$3 limit=$4
    shift 4
    local lim=$(( limit < $(left) ? limit : $(left) ))
    if [ "$lim" -lt 20 ]; then
        echo "-- $name: skipped (time budget spent)" | tee "$OUT/logs/$name.log"
        return
    fi
    (
        export IRIS_FW_TRANSPORT=nvshmem IRIS_FW_NVSHMEM_CALLS=$calls
        [ "$world" -gt 1 ] && export IRIS_FW_SHARE_GPUS=1
        [ "$calls" = all ] && [ -n "$CALL_HOME" ] && export IRIS_FW_NVSHMEM_HOME=$CALL_HOME
        timeout $(( lim + 10 )) iris-fw launch -n "$world" --timeout "$lim" scripts/probe_nvshmem.py \
            --out "$OUT/logs/$name.json" "$@" > "$OUT/logs/$name.log" 2>&1
        echo "-- $name: exit $? after $(elapsed) s"
    )
    grep -E "Error|error:|NVSHMEM|WARN" "$OUT/logs/$name.log" | grep -v '^\[rank 0\] {' | sort | uniq -c | head -8
}

echo "== 2 one PE (W=1)"
probe w1_auto 1 auto 60 --time
probe w1_all 1 all 120 --time
echo "== 3 two PEs on the one GPU (W=2, IRIS_FW_SHARE_GPUS=1)"
probe w2_auto 2 auto 50
probe w2_all 2 all 60

echo "== 4 summary"
python3 - "$OUT/logs" > "$OUT/summary.txt" 2>&1 <<'EOF'
import json, os, re, sys
logs = sys.argv[1]
runs = {}
for name in ("w1_auto", "w1_all", "w2_auto", "w2_all"):
    path = os.path.join(logs, name + ".json")
    if os.path.exists(path):
        runs[name] = json.load(open(path))
        continue
    text = open(os.path.join(logs, name + ".log")).read() if os.path.exists(os.path.join(logs, name + ".log")) else ""
    why = [l for l in text.splitlines() if re.search(r"IrisError|Error:|error|skipped|refus|not supported", l)]
    runs[name] = {"failed": (why[-1] if why else text.strip().splitlines()[-1:] or ["no log"])[:400]}
for name, r in runs.items():
    if "failed" in r:
        print(f"{name}: NO RESULT: {r['failed']}")
        continue
    checks = ", ".join(f"{c} {'ok' if v['ok'] else 'FAILED ' + json.dumps(v['failures'])[:300]}" for c, v in r["checks"].items())
    print(f"{name}: W={r['world_size']} NVSHMEM {r['nvshmem_version']} on {r['device']}, call mode {r['call_mode']}, "
          f"init {r['init_s']} s, total {r['total_s']} s: {checks}")
keys = sorted({k for r in runs.values() for k in r.get("timing", {})})
if keys:
    print("\n| W=1, peer = itself | calls=auto (load/store) | calls=all (NVSHMEM calls) |\n|---|---|---|")
    for k in keys:
        print(f"| {k} | {runs['w1_auto'].get('timing', {}).get(k, '-')} | {runs['w1_all'].get('timing', {}).get(k, '-')} |")
w2 = [runs[n] for n in ("w2_auto", "w2_all")]
if all("failed" in r for r in w2):
    print("\nW=2 on one GPU: NVSHMEM did not run two PEs on this GPU (see above and logs/w2_*.log)")
EOF
cat "$OUT/summary.txt"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
echo "done in $(elapsed) s; $OUT: $(ls "$OUT" | tr '\n' ' ')"
