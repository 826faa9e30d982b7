#!/usr/bin/env bash
# The GPU proof on one GPU: ranks share it (IRIS_FW_SHARE_GPUS=1) under CUDA MPS, so their kernels
# run at the same time (without MPS they time-slice: a cross-rank wait advances once per slice).
# On a machine with as many GPUs as ranks the same steps run one rank per GPU, without MPS.
# Steps (STEPS, default "info suite"); logs in $OUT (default ./gpu-out), packed to at most 8 files:
#   info       machine, versions, `iris-fw info` (MPS state), and one shared job WITHOUT MPS to show
#              rank 0's one-time warning (run before MPS starts).
#   demo       the ring demo under MPS (NPROCS ranks, default 2).
#   suite      the whole test suite in partitions side by side (--iris-worlds: "1,other", "2", "3",
#              "4"; XDIST workers each, default 2), a wall time per partition, each failure's
#              test name and cause written as it happens (failures-*.log).
#   faults     the fault-injection matrix (tests/test_faults.py -m extended, FAULTS_K selects;
#              default: every launcher x fault in a collective and in set-up), 2 ranks.
#   debug      IRIS_FW_DEBUG=1 pointer checks (tests/test_failfast.py) at W = 2.
#   diag       scripts/diag_ccl_order.py at W = 2 and 3 (the sequences that were wrong on 2x H200).
#   nvshmem    the nvshmem transport at W = 2 (tests/test_nvshmem.py with IRIS_FW_TRANSPORT=nvshmem).
#   protocols  iris-fw bench protocols at W = 2 (round trip, all-reduce per algorithm, tile
#              all-reduce, all_reduce_rmsnorm; eager and graphs).
#   bench:NAME[@N],ARGS...  iris-fw bench NAME -n N (default NPROCS, else 2) ARGS.
#   tests:FILES,...     pytest FILES (comma separated) with the partitions' settings, -n XDIST.
#   launch:N,SCRIPT,ARGS...  `iris-fw launch -n N SCRIPT ARGS` (e.g. scripts/diag_llama.py).
#   py:SCRIPT,ARGS...   `python3 SCRIPT ARGS` (e.g. scripts/diag_mps_numerics.py).
#   STEPS="info suite" bash scripts/gpu_mps.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-info suite}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/mps.sh
. "$HERE/mps.sh"
export PYTHONUNBUFFERED=1 IRIS_FW_WAIT_TIMEOUT=${IRIS_FW_WAIT_TIMEOUT:-20}
# NVLink multicast stays off on the shared machines (NCCL NVLS, torch symmetric memory, NVSHMEM)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export IRIS_FW_MPIRUN=${IRIS_FW_MPIRUN:-$(command -v mpirun || true)}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # scripts/pytest_failure_log.py
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
rm -f "$OUT/install.log"
GPUS=$(nvidia-smi -L | wc -l)
# ranks share GPUs where the largest world size (RANKS, default 4) has more ranks than GPUs; with
# RANKS=2 on two GPUs every rank has its own GPU, no MPS (select the W = 2 tests: --iris-worlds=2)
if [ "$GPUS" -lt "${RANKS:-4}" ]; then export IRIS_FW_SHARE_GPUS=1; fi
PYTEST="python3 -m pytest -p no:cacheprovider -p pytest_failure_log -ra --tb=short --timeout ${TEST_LIMIT:-240}"

started=0
need_mps() {  # start MPS once, after the steps that must run without it
    # not in a pipeline: mps_start exports the pipe directory and sets the exit trap in this shell
    if [ $started = 0 ] && mps_needed; then mps_start > "$OUT/mps-start.txt" 2>&1; cat "$OUT/mps-start.txt"; fi
    started=1
}

for step in $STEPS; do
    name=${step%%:*}
    args=""
    [ "$name" != "$step" ] && args=${step#*:}
    IFS=, read -r -a parts <<< "$args"
    echo "== $name ${parts[*]:-} ($(date -u +%H:%M:%S))"
    t0=$(date +%s)
    case $name in
    info)
        {
            date -u +%Y-%m-%dT%H:%MZ
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
            python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
            git rev-parse --short HEAD 2>/dev/null
            env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS|IRIS_FW_SHARE_GPUS)='
        } > "$OUT/machine.txt" 2>&1
        cat "$OUT/machine.txt"
        if [ $started = 0 ]; then
            echo "-- a shared job without MPS (rank 0 must warn once):"
            python3 -m iris_fw info 2>&1 | grep -i "mps"
            timeout 120 python3 -m iris_fw launch -n 2 examples/ring_exchange.py > "$OUT/no_mps.log" 2>&1
            echo "rc $?; warnings: $(grep -c "without CUDA MPS" "$OUT/no_mps.log")"; grep -m1 "without CUDA MPS" "$OUT/no_mps.log" | cut -c1-400
        fi
        need_mps
        python3 -m iris_fw info 2>&1 | grep -i "mps" | tee -a "$OUT/machine.txt"
        for pct in 100 50 5; do  # what a capped MPS client is told about the SMs
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct python3 -c "import torch; print('MPS share $pct %: torch sees', torch.cuda.get_device_properties(0).multi_processor_count, 'SMs')"
        done | tee -a "$OUT/machine.txt"
        timeout 120 python3 -m iris_fw launch -n 2 examples/ring_exchange.py > "$OUT/with_mps.log" 2>&1
        echo "with MPS: rc $?; warnings: $(grep -c "without CUDA MPS" "$OUT/with_mps.log")"; tail -3 "$OUT/with_mps.log" ;;
    demo)
        need_mps
        timeout 120 python3 -m iris_fw launch -n ${NPROCS:-2} examples/ring_exchange.py > "$OUT/demo.log" 2>&1
        echo "ring demo under MPS: rc $?"; grep -v "^\[rank [0-9]\] \[rank" "$OUT/demo.log" | tail -3 | cut -c1-300 ;;
    suite)
        need_mps
        # every rank of the partitions running at once gets an equal share of the SMs (MPS caps
        # each client): uncapped, a rank's spinning kernel can fill the GPU and starve the rank it
        # waits for. ~18 ranks at once (xdist workers x world sizes): 5 % (6 SMs of an H100) each.
        export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${SUITE_MPS_PERCENT:-5}
        pids=()
        for part in ${PARTS:-1,other 2 3 4}; do
            tag=w${part//,/_}
            (
                s=$(date +%s)
                IRIS_FW_FAILURE_LOG="$OUT/failures-$tag.log" timeout ${SUITE_TIMEOUT:-540} $PYTEST -v -n ${XDIST:-2} \
                    --iris-worlds="$part" "${parts[@]}" > "$OUT/suite-$tag.log" 2>&1
                echo "partition $part: rc $? in $(( $(date +%s) - s )) s: $(tail -1 "$OUT/suite-$tag.log")" > "$OUT/time-$tag.txt"
            ) &
            pids+=($!)
        done
        wait "${pids[@]}"
        cat "$OUT"/time-*.txt | tee "$OUT/suite-times.txt"; rm -f "$OUT"/time-*.txt
        cat "$OUT"/failures-*.log 2>/dev/null | grep "^=====" | cut -c1-200 | head -60 ;;
    faults)
        need_mps
        IRIS_FW_FAULT_REPORT="$OUT/faults.tsv" IRIS_FW_FAILURE_LOG="$OUT/failures-faults.log" timeout ${FAULTS_TIMEOUT:-540} $PYTEST -q -n ${XDIST_FAULTS:-4} -m extended \
            tests/test_faults.py -k "${FAULTS_K:-matrix and (ccl or setup)}" > "$OUT/faults.log" 2>&1
        tail -1 "$OUT/faults.log"; grep -E "^FAILED" "$OUT/faults.log" | cut -c1-250 | head -20
        [ -f "$OUT/faults.tsv" ] && sort -t$'\t' -k5 -n -r "$OUT/faults.tsv" | head -5 | cut -c1-200 ;;
    debug)
        need_mps
        IRIS_FW_DEBUG=1 IRIS_FW_FAILURE_LOG="$OUT/failures-debug.log" timeout 400 $PYTEST -q tests/test_failfast.py \
            > "$OUT/debug.log" 2>&1
        tail -1 "$OUT/debug.log"; grep -E "^FAILED" "$OUT/debug.log" | cut -c1-250 ;;
    diag)
        need_mps
        for n in 2 3; do
            timeout 240 python3 -m iris_fw launch --no-tag-output -n $n scripts/diag_ccl_order.py 2>&1 | grep -v "^\[rank" \
                | sed 's/(uint8.*//' > "$OUT/diag$n.log"
            echo "W=$n: $(grep -c " 0 wrong" "$OUT/diag$n.log") calls right; wrong:"; grep -v " 0 wrong" "$OUT/diag$n.log" | head -10
        done ;;
    nvshmem)
        need_mps
        IRIS_FW_TRANSPORT=nvshmem IRIS_FW_FAILURE_LOG="$OUT/failures-nvshmem.log" timeout 400 $PYTEST -q \
            tests/test_nvshmem.py tests/test_signal.py -k "w1 or w2 or nvshmem" > "$OUT/nvshmem.log" 2>&1
        tail -1 "$OUT/nvshmem.log"; grep -E "^FAILED" "$OUT/nvshmem.log" | cut -c1-250 | head ;;
    protocols)
        need_mps
        timeout ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench -n ${NPROCS:-2} --out "$OUT/bench-protocols" protocols \
            "${parts[@]}" > "$OUT/protocols.log" 2>&1
        grep -v "^\[rank" "$OUT/protocols.log" | grep -v "^|" | tail -40 ;;
    bench)
        need_mps
        bench=${parts[0]%%@*}; nprocs=${NPROCS:-2}   # bench:NAME@N,ARGS: N ranks for this one
        out=bench-$bench
        # (@N: its own files, so that bench:host@1 and bench:host@2 in one STEPS keep both)
        [ "$bench" != "${parts[0]}" ] && nprocs=${parts[0]#*@} && out=bench-$bench-n$nprocs
        timeout ${BENCH_TIMEOUT:-300} python3 -m iris_fw.bench -n $nprocs --out "$OUT/$out" "$bench" \
            "${parts[@]:1}" > "$OUT/$out.log" 2>&1
        grep -v "^\[rank" "$OUT/$out.log" | grep -v "^|" | tail -30 ;;
    py)       # py:SCRIPT,ARGS...  a plain python3 program under MPS
        need_mps
        log="$OUT/py-$(basename "${parts[0]}" .py)-$t0.log"
        timeout ${LAUNCH_TIMEOUT:-300} python3 "${parts[@]}" > "$log" 2>&1
        echo "rc $?"; tail -${LAUNCH_TAIL:-20} "$log" | cut -c1-400 ;;
    launch)   # launch:N,SCRIPT,ARGS...  one job of N ranks under MPS (IRIS_FW_SHARE_GPUS as set above)
        need_mps
        log="$OUT/launch-$(basename "${parts[1]}" .py)-n${parts[0]}-$t0.log"
        timeout ${LAUNCH_TIMEOUT:-300} python3 -m iris_fw launch -n "${parts[0]}" "${parts[@]:1}" > "$log" 2>&1
        echo "rc $?"; grep -v "^\[rank [0-9]*\] *$" "$log" | tail -${LAUNCH_TAIL:-12} | cut -c1-400 ;;
    tests)
        need_mps
        # the suite's share: XDIST workers' pools of up to 4 ranks run at once, and MPS caps a
        # client's SMs without reserving any (100 / ranks per GPU each would oversubscribe it:
        # run 29's W = 4 wg_specialized WaitTimeout)
        export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${SUITE_MPS_PERCENT:-5}
        IRIS_FW_FAILURE_LOG="$OUT/failures-tests.log" timeout ${TESTS_TIMEOUT:-540} $PYTEST -v -n ${XDIST:-2} "${parts[@]}" \
            > "$OUT/tests.log" 2>&1
        grep -E " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/tests.log" | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
        grep -E "^(FAILED|ERROR) " "$OUT/tests.log" | cut -c1-250 | head -30; tail -1 "$OUT/tests.log" ;;
    *) echo "unknown step $name" ;;
    esac
    echo "   ($(( $(date +%s) - t0 )) s)"
    unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE  # a step's share stays with that step
done
mps_stop

# at most 8 files come back: pack the logs (the summary files stay outside)
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
    (cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=machine.txt --exclude=suite-times.txt ./* \
        && find . -mindepth 1 ! -name logs.tgz ! -name machine.txt ! -name suite-times.txt -delete)
fi
ls "$OUT"
