#!/usr/bin/env bash
# Issue 32 on one GPU (H100 or H200): the local kernels against the libraries, every
# measurement interleaved with its baseline in the same run, card named. The whole run stays
# within BUDGET seconds (default 480: under 9 minutes with the install): each step gets the
# smaller of its own limit and what is left, and is skipped below 30 s.
# Steps (STEPS, default "info gemm fd trace tests groups"); logs in $OUT (default ./gpu-out),
# packed to at most 8 files (summary.md, the tuning snippets, logs.tgz):
#   info    machine, versions, `ncu` present or not.
#   tests   tests/test_gemm.py (split-K against float64 at ragged shapes, graph replay with fresh
#           inputs), the flash-decode by_units and residency-guard tests, and the trace tests whose events come from
#           the compiled recording path (op events at W = 2, traced graph replay: two ranks on
#           the GPU under CUDA MPS, scripts/mps.sh), then MPS_TESTS (pytest files, e.g.
#           "tests/test_flash_decode.py"; MPS_K: their -k) at the worlds MPS_WORLDS (default
#           1,2; "other" selects the tests of no world size, e.g. tests/test_launcher.py's) — last: the sweeps check their candidates against torch themselves; before
#           groups, the least urgent.
#   gemm    scripts/tune_gemm.py: split-K / block / warps / stages candidates vs cuBLAS at
#           M 16, 64, 256 x N 8192 x K 4096, 8192, 14336, 28672 (CUDA graphs, interleaved);
#           gemm_tuning_rows.json = the best per shape as rows of iris_fw/tuning/gemm.json.
#   fd      scripts/tune_flash_decode.py: split count (items per program, split cap) x block_n x
#           warps x stages (x 2 programs per SM at B <= 4) vs torch SDPA at B 1, 2, 4, 8, 16 x S 4K,
#           16K, 64K; flash_decode_tuning_row.json (rewritten after each batch). FD_TIMEOUT
#           (default 360 s): the step's limit; the sweep starts no point in its last 60 s.
#           FD_ARGS: more arguments of the sweep, e.g. FD_ARGS="--points 1x4096 1x16384 1x65536
#           16x4096" (only those batch x tokens points).
#   fdrow   the row the fd step wrote ($OUT/flash_decode_tuning_row.json) made the device's row of
#           iris_fw/tuning/flash_decode.json in this checkout: the steps after it (fdcheck, the
#           tests) run on the row as it would be committed.
#   fdcheck scripts/tune_flash_decode.py --grid current (the table's row alone vs SDPA, a fresh
#           process) at every point, FDCHECK_ROUNDS rounds (default 16); logs in $OUT/check.
#           FDCHECK_ARGS: more arguments (e.g. "--layouts hnd nhd": also on SDPA's own tensors).
#   trace   scripts/trace_overhead.py at W = 1 (8192^3 bf16, gemm_all_scatter and all_gather_gemm,
#           every schedule, untraced vs traced interleaved; cases print as they finish).
#           TRACE_EXTRA="--comm-sms 16" also times the two-role schedules with 16 communication
#           programs (the default split gives them one at W = 1).
#   groups  scripts/tune_gemm.py --groups: GROUP_M 1, 4, 8, 16 at 256x8192x8192 and
#           8192x8192x8192 (time vs cuBLAS); with `ncu` on the machine also the L2 hit rate
#           (lts__t_sector_hit_rate.pct) of each GROUP_M's kernel at 8192^3; gemm_tile_order.json = the
#           'tile_order' entry of iris_fw/tuning/gemm.json (GROUP_M of the larger shapes).
#   bigtile scripts/tune_gemm.py --large: the estimate's configuration (the measured row where
#           one applies), 15 tile-kernel candidates (block 128x256x64 / 256x128x64 / 128x128x64 /
#           128x256x32, warps 4/8, stages 3-5, GROUP_M 8/16) and 12 of the persistent schedule
#           (flattened or not, stream-K tail 0/1/2 waves, epilogue in 1/2/4 pieces, 3-6 stages)
#           vs cuBLAS at 16384x14336x4096 and 8192x8192x8192 (BIGTILE_SHAPES; "taxonomy":
#           the taxonomy's six local GEMMs), CUDA graphs, interleaved; gemm_large_rows.json =
#           rows of iris_fw/tuning/gemm.json for the shapes where a candidate beat the estimate.
#           Not in the default STEPS: STEPS=bigtile BUDGET=300 bash scripts/gpu_kernels.sh
#   mpstests  MPS_TESTS alone (as in tests), under MPS.
#   ws      scripts/probe_warp_specialized.py at W = 1 (one rank): the warp_specialized scheduler's
#           Gluon kernel on each GEMM tile path against float64, and its time next to
#           fused_sequential (the Triton GEMM) and torch.matmul at 4096^3; ws.json.
#   fdstream  scripts/probe_fd_stream.py: the batch-1 KV read alone (no attention) on the plan's
#           grids and on balanced ones, by pointer loads and by TMA, 2-6 stages, beside SDPA and
#           the table's row, at 16K and 64K tokens; fd_stream.json.
#   fdclusters  scripts/probe_fd_clusters.py: per batch the row's plan with the splits' combine in
#           a thread-block cluster (the cluster it keeps) and how many clusters of 2-16 programs of
#           the row's tile the GPU holds at once (cuOccupancyMaxActiveClusters); fd_clusters.json.
#   fdspans scripts/probe_fd_program_spans.py at FDSPANS_POINTS (default 16384 65536; FDSPANS_ROW
#           as FDNCU_ROW): each program's start, attention and end from the kernel's own trace.
#   fdspread  scripts/probe_fd_sm_spread.py at FDSPREAD_POINTS (default "1x16384 1x65536 2x4096
#           2x16384 4x4096"), FDSPREAD_CALLS calls each (default 8): whether an SM, a GPC, a split or
#           a unit decides how long a work item streams (the GPC map from clustered launches).
#   fdncu   ncu on scripts/probe_fd_small_batch.py at FDNCU_POINTS (default B 1 x 4K and 16K
#           tokens; "4x16384" for B 4): flash-decode's split-KV kernel beside torch SDPA's kernels
#           (time, DRAM bytes and throughput, grid, registers, warps active) — why a small batch
#           trails SDPA. FDNCU_ROW: JSON fields replacing
#           the table's row, e.g. FDNCU_ROW='{"swap_ab": true, "programs_per_sm": 3,
#           "max_registers": 168, "items_per_program": 1, "max_splits": 64}'.
#   STEPS="gemm fd" OUT=/tmp/out bash scripts/gpu_kernels.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-info gemm fd trace tests groups}
BUDGET=${BUDGET:-480}
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-20}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
SUMMARY="$OUT/summary.md"
rc=0
limit() {  # the step's limit: the smaller of $1 and the budget left
    local left=$(( BUDGET - ($(date +%s) - START) ))
    echo $(( left < $1 ? left : $1 ))
}
mps_on() {  # ranks share the one GPU, MPS started (stopped by mps_stop, or at exit)
    [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && export IRIS_FW_SHARE_GPUS=1
    . scripts/mps.sh
    if mps_needed; then mps_start > "$OUT/mps-start.txt" 2>&1; fi
}
mps_tests() {  # MPS_TESTS (pytest files) -k MPS_K at the worlds MPS_WORLDS (default 1,2)
    timeout $(limit ${MPS_TESTS_TIMEOUT:-200}) python3 -m pytest -q -p no:cacheprovider -ra --timeout 150 \
        --iris-worlds=${MPS_WORLDS:-1,2} $MPS_TESTS ${MPS_K:+-k "$MPS_K"} > "$OUT/tests_mps.log" 2>&1
    local r=$?; rc=$(( rc | r ))
    { echo "MPS tests rc $r: $(tail -1 "$OUT/tests_mps.log")"; grep -E "^(FAILED|ERROR) " "$OUT/tests_mps.log" | cut -c1-250 | head; } | tee -a "$SUMMARY"
}
for step in $STEPS; do
    echo "== $step ($(date -u +%H:%M:%S), $(( $(date +%s) - START )) s into the run)" | tee -a "$SUMMARY"
    t0=$(date +%s)
    if [ "$step" != info ] && [ "$(limit 600)" -lt 30 ]; then
        echo "skipped: less than 30 s of the ${BUDGET} s budget left" | tee -a "$SUMMARY"; continue
    fi
    case $step in
    info)
        {
            date -u +%Y-%m-%dT%H:%MZ
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
            python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
            git rev-parse --short HEAD 2>/dev/null
            echo "ncu: $(command -v ncu || echo absent)"
        } 2>&1 | tee -a "$SUMMARY" ;;
    tests)
        timeout $(limit ${TESTS_TIMEOUT:-60}) python3 -m pytest -q -p no:cacheprovider -ra --timeout 120 tests/test_gemm.py \
            tests/test_flash_decode.py::test_tuning_by_units tests/test_flash_decode.py::test_residency_guard_on_gpu \
            > "$OUT/tests.log" 2>&1
        r=$?; rc=$(( rc | r )); { echo "rc $r: $(tail -1 "$OUT/tests.log")"; grep -E "^(FAILED|ERROR) " "$OUT/tests.log" | cut -c1-250 | head; } | tee -a "$SUMMARY"
        mps_on  # two ranks sharing the GPU run at the same time only under MPS
        timeout $(limit ${TRACE_TESTS_TIMEOUT:-90}) python3 -m pytest -q -p no:cacheprovider -ra --timeout 120 \
            tests/test_trace.py -k "test_op_events and not every or traced_graph_replay" > "$OUT/tests_trace.log" 2>&1
        r=$?; rc=$(( rc | r )); { echo "trace tests rc $r: $(tail -1 "$OUT/tests_trace.log")"; grep -E "^(FAILED|ERROR) " "$OUT/tests_trace.log" | cut -c1-250 | head; } | tee -a "$SUMMARY"
        [ -n "${MPS_TESTS:-}" ] && mps_tests
        declare -f mps_stop > /dev/null && mps_stop ;;
    fdclusters)
        timeout -k 10 $(limit 120) python3 scripts/probe_fd_clusters.py --out "$OUT" > "$OUT/fd_clusters.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"; tee -a "$SUMMARY" < "$OUT/fd_clusters.log" | tail -20 ;;
    mpstests)  # MPS_TESTS alone, the ranks sharing the GPU under MPS
        mps_on
        mps_tests
        declare -f mps_stop > /dev/null && mps_stop ;;
    gemm)
        timeout -k 10 $(limit ${GEMM_TIMEOUT:-170}) python3 scripts/tune_gemm.py --rounds ${GEMM_ROUNDS:-10} --out "$OUT" \
            > "$OUT/gemm.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"
        { grep -E "^\|" "$OUT/gemm.log"; grep -E "WRONG|Error" "$OUT/gemm.log" | head -10; } | tee -a "$SUMMARY" ;;
    fd)
        fd_limit=$(limit ${FD_TIMEOUT:-360})
        timeout -k 10 $fd_limit python3 scripts/tune_flash_decode.py --budget $(( fd_limit - 60 )) --out "$OUT" \
            ${FD_ARGS:-} > "$OUT/fd.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"
        { grep -E "^\||tuning row|^\[128|compiled in|not chosen" "$OUT/fd.log"; grep -E "WRONG|Error" "$OUT/fd.log" | head -10; } \
            | tee -a "$SUMMARY" ;;
    fdrow)
        python3 - "$OUT/flash_decode_tuning_row.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
got = json.load(open(sys.argv[1]))
path = "iris_fw/tuning/flash_decode.json"
table = json.load(open(path))
table["devices"][got["device"]] = [[got["row"][0], {**got["row"][1], "measured": got["measured"]}]]
with open(path, "w") as f:
    json.dump(table, f, indent=2, ensure_ascii=False)
    f.write("\n")
print(f"fdrow: {got['device']}'s row of {path} is now {json.dumps(got['row'])}")
PY
        ;;
    fdcheck)
        mkdir -p "$OUT/check"
        timeout -k 10 $(limit ${FDCHECK_TIMEOUT:-150}) python3 scripts/tune_flash_decode.py --grid current \
            --rounds ${FDCHECK_ROUNDS:-16} ${FDCHECK_ARGS:-} --out "$OUT/check" > "$OUT/check/fd.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"
        { grep -E "^\|" "$OUT/check/fd.log"; grep -E "WRONG|Error" "$OUT/check/fd.log" | head -10; } | tee -a "$SUMMARY" ;;
    trace)
        timeout -k 10 $(limit ${TRACE_TIMEOUT:-140}) python3 scripts/trace_overhead.py --patterns gemm_all_scatter all_gather_gemm \
            --iters 10 --rounds 3 --no-collectives ${TRACE_EXTRA:-} --out "$OUT/trace" > "$OUT/trace.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"
        grep -E "overhead|events" "$OUT/trace.log" | grep -v "^\[rank" | cut -c1-220 | tee -a "$SUMMARY"
        rm -rf "$OUT/trace/traces" ;;  # the traces themselves are large; overhead.json stays
    bigtile)
        timeout -k 10 $(limit ${BIGTILE_TIMEOUT:-240}) python3 scripts/tune_gemm.py --large --calls ${BIGTILE_CALLS:-5} \
            --rounds ${BIGTILE_ROUNDS:-20} ${BIGTILE_SHAPES:+--shapes $BIGTILE_SHAPES} --out "$OUT" > "$OUT/bigtile.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r"
        { grep -E "^\|" "$OUT/bigtile.log"; grep -E "WRONG|Error" "$OUT/bigtile.log" | head -10; } | tee -a "$SUMMARY" ;;
    groups)
        timeout -k 10 $(limit ${GROUPS_TIMEOUT:-60}) python3 scripts/tune_gemm.py --groups --rounds 10 --out "$OUT" \
            > "$OUT/groups.log" 2>&1
        r=$?; rc=$(( rc | r )); grep -E "^\||tile order|group_m" "$OUT/groups.log" | tee -a "$SUMMARY"
        if command -v ncu > /dev/null; then
            for spec in 8192,8192,8192; do
                for g in 1 4 8 16; do
                    [ "$(limit 60)" -lt 20 ] && { echo "ncu: budget spent" | tee -a "$SUMMARY"; break 2; }
                    # one call of the configuration at GROUP_M g, profiled (the matmul kernel only)
                    timeout $(limit 40) ncu --kernel-name regex:_matmul_kernel --launch-count 1 --launch-skip 2 \
                        --metrics lts__t_sector_hit_rate.pct,gpu__time_duration.sum --csv \
                        python3 -c "
import torch, iris_fw
from dataclasses import replace
from iris_fw.gemm import default_config, matmul
m, n, k = $spec
a = torch.randn(m, k, device='cuda', dtype=torch.bfloat16); b = torch.randn(k, n, device='cuda', dtype=torch.bfloat16)
cfg = replace(default_config(m, n, k, a.dtype, a.device, split=True), group_m=$g)
for _ in range(4): matmul(a, b, config=cfg)
torch.cuda.synchronize()" > "$OUT/ncu_${spec//,/x}_g$g.csv" 2>&1
                    echo "ncu $spec GROUP_M $g: $(grep -E "lts__t_sector_hit_rate|gpu__time_duration" "$OUT/ncu_${spec//,/x}_g$g.csv" \
                        | awk -F'","' '{print $(NF-2)"="$NF}' | tr -d '"' | tr '\n' ' ')" | tee -a "$SUMMARY"
                done
            done
        else
            echo "ncu absent: no L2 hit rates (time only)" | tee -a "$SUMMARY"
        fi ;;
    ws)
        IRIS_FW_BOOTSTRAP=single timeout -k 10 $(limit ${WS_TIMEOUT:-120}) python3 scripts/probe_warp_specialized.py \
            "$OUT/ws.json" > "$OUT/ws.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r" | tee -a "$SUMMARY"
        grep -E 'us_|error' "$OUT/ws.log" | cut -c1-300 | tee -a "$SUMMARY" ;;
    fdstream)
        timeout -k 10 $(limit ${FDSTREAM_TIMEOUT:-150}) python3 scripts/probe_fd_stream.py --out "$OUT" > "$OUT/fdstream.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r" | tee -a "$SUMMARY"
        grep -E "^\||WRONG|Error" "$OUT/fdstream.log" | cut -c1-250 | tee -a "$SUMMARY" ;;
    fdspans)
        for s in ${FDSPANS_POINTS:-16384 65536}; do
            timeout -k 10 $(limit 60) python3 scripts/probe_fd_program_spans.py $s "${FDSPANS_ROW:-}" > "$OUT/fdspans_$s.log" 2>&1
            r=$?; rc=$(( rc | r )); echo "spans S $s: rc $r" | tee -a "$SUMMARY"
            grep -v "^\[" "$OUT/fdspans_$s.log" | tail -12 | tee -a "$SUMMARY"
        done ;;
    fdspread)
        timeout -k 10 $(limit 150) python3 scripts/probe_fd_sm_spread.py --points ${FDSPREAD_POINTS:-1x16384 1x65536 \
            2x4096 2x16384 4x4096} --calls ${FDSPREAD_CALLS:-8} > "$OUT/sm_spread.log" 2>&1
        r=$?; rc=$(( rc | r )); echo "rc $r" | tee -a "$SUMMARY"
        grep -v "^  |\|^  {\|^\s*$" "$OUT/sm_spread.log" | cut -c1-300 | tee -a "$SUMMARY" ;;
    fdncu)
        # flash-decode's split-KV kernel beside SDPA's kernels at batch 1 (the gap of the fd step):
        # time, DRAM bytes and throughput, grid and occupancy of the last round's kernels
        if command -v ncu > /dev/null; then
            for s in ${FDNCU_POINTS:-${FDNCU_TOKENS:-4096 16384}}; do  # (FDNCU_TOKENS: the old name)
                # FDNCU_ARGS: what ncu collects instead of these metrics (e.g. "--section
                # WarpStateStats --section SpeedOfLight": the stall reasons)
                timeout $(limit 60) ncu --csv --launch-skip ${FDNCU_SKIP:-0} ${FDNCU_ARGS:---metrics \
gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__occupancy_limit_shared_mem} \
                    python3 scripts/probe_fd_small_batch.py $s "${FDNCU_ROW:-}" > "$OUT/fdncu_$s.csv" 2>&1
                echo "ncu B x S $s: rc $?" | tee -a "$SUMMARY"
                grep -E "max \|fd|FlashDecode" "$OUT/fdncu_$s.csv" | tee -a "$SUMMARY"
                python3 - "$OUT/fdncu_$s.csv" <<'PY' | tee -a "$SUMMARY"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
last = collections.OrderedDict()
for r in body:  # the last call of each kernel name
    last.setdefault(r[ix["Kernel Name"]][:60], {})
    last[r[ix["Kernel Name"]][:60]][r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for name, m in last.items():
    print(f"  {name}: " + ", ".join(f"{k.split('__')[1]}={v}" for k, v in sorted(m.items())))
PY
            done
        else
            echo "ncu absent" | tee -a "$SUMMARY"
        fi ;;
    *) echo "unknown step $step"; rc=1 ;;
    esac
    echo "   ($(( $(date +%s) - t0 )) s)" | tee -a "$SUMMARY"
done
# at most 8 files come back: summary and tuning snippets stay outside, the rest packed
keep="summary.md ws.json gemm_tuning_rows.json flash_decode_tuning_row.json gemm_tile_order.json gemm_large_rows.json"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz $(for f in $keep; do echo --exclude=./$f; done) ./* \
    && find . -mindepth 1 ! -name logs.tgz $(for f in $keep; do echo ! -name $f; done) -delete)
ls -la "$OUT"
exit $rc
