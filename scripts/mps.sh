# CUDA MPS for GPU runs whose ranks share a GPU (sourced by scripts/gpu_*.sh).
#
# Ranks sharing a GPU without MPS time-slice: their kernels never run at the same time, so a
# wait for another rank advances once per time slice (signal round trip 4488 us on one H100)
# and a pass says little about ordering. Under MPS the ranks' kernels are co-resident (2.41 us;
# both in docs/performance.md).
#   mps_start   start a control daemon (pipe and log folders in a temporary folder) and export
#               CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY for every process started after
#               it; stopped at exit (trap). Needs the GPU's owner (root on the device machines).
#   mps_needed  true when the ranks of this run share a GPU: IRIS_FW_SHARE_GPUS=1 (or SHARE=1),
#               or fewer GPUs than MPS_RANKS (default 2).
#   mps_stop    quit the daemon (also run at exit).

mps_needed() {
    [ "${IRIS_FW_SHARE_GPUS:-0}" = 1 ] || [ "${SHARE:-0}" = 1 ] && return 0
    local gpus
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$gpus" -lt "${MPS_RANKS:-2}" ]
}

mps_stop() {
    if [ -n "${_MPS_DIR:-}" ]; then
        echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
        for _ in $(seq 50); do pgrep -f nvidia-cuda-mps > /dev/null || break; sleep 0.1; done
        [ -n "${OUT:-}" ] && [ -d "$_MPS_DIR/log" ] && cat "$_MPS_DIR"/log/*.log > "$OUT/mps.log" 2>/dev/null
        rm -rf "$_MPS_DIR"
        _MPS_DIR=
    fi
}

mps_start() {
    command -v nvidia-cuda-mps-control > /dev/null || { echo "mps: nvidia-cuda-mps-control not found"; return 1; }
    _MPS_DIR=$(mktemp -d /tmp/iris-fw-mps.XXXXXX)
    export CUDA_MPS_PIPE_DIRECTORY=$_MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$_MPS_DIR/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    trap mps_stop EXIT
    nvidia-cuda-mps-control -d || { echo "mps: the control daemon did not start"; return 1; }
    for _ in $(seq 50); do [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && break; sleep 0.1; done
    echo "mps: control daemon started (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
}
