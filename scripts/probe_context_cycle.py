"""Create and drop Iris-compat contexts in a loop, as Iris's tests do (one ``iris.iris()`` per
test, dropped with ``del``), and report what a cycle costs and whether anything accumulates.

Run on every rank of a job::

    iris-fw launch -n 2 scripts/probe_context_cycle.py --cycles 1000            # 2 GPUs (or 2 CPU ranks)
    torchrun --nproc-per-node 2 scripts/probe_context_cycle.py --cycles 1000

Per cycle: ``shmem = iris.iris(heap)`` (collective; it also closes the context dropped in the
previous cycle), one small allocation, ``shmem.barrier()``, ``del shmem``. Reported per rank
(one JSON line each, ``PROBE {...}``): create ms (median, p90, max) — the whole ``iris.iris()``
call, including closing the previous context —, the cost of an explicit collective
``ctx.close()`` for comparison, and counters taken after the warm-up and after the last cycle
(once the last dropped context is closed too): open file descriptors, threads, lines of
``/proc/self/maps`` (all, and those of GPU driver devices — IPC mappings of peers' heaps show
there), mappings of /dev/shm segments and (at the end) segments of this job left in
/dev/shm, and on GPUs the device memory in use
(``cudaMemGetInfo``). Exit status 1 if a counter grew by more than ``--slack`` (the maps and
threads of lazily started runtime helpers) — nothing else may grow.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time

import iris_fw  # noqa: F401  (first: decides interpreter vs. GPU)
import torch

import iris_fw.compat.iris as iris
from iris_fw.compat.iris import host as _host


def counters(prefix: str, device: torch.device) -> dict:
    """What would grow if contexts leaked."""
    with open("/proc/self/maps") as f:
        maps = f.readlines()
    out = {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "maps": len(maps),
        "driver_maps": sum(1 for line in maps if any(k in line for k in ("/dev/nvidia", "/dev/kfd", "/dev/dri"))),
        "shm_maps": sum(1 for line in maps if "/dev/shm/" + prefix in line),
        "shm_segments": sum(1 for n in os.listdir("/dev/shm") if prefix and n.startswith(prefix)),
        "open_contexts": sum(1 for ctx in _host._open.values() if not ctx.closed),
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out["gpu_used_mib"] = (total - free) >> 20
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--heap", type=int, default=1 << 20, help="heap bytes per rank (default 1 MiB)")
    parser.add_argument("--slack", type=int, default=4, help="growth tolerated in fds/threads/maps")
    args = parser.parse_args(argv)
    prefix = os.environ.get("IRIS_FW_SHM_PREFIX", "iris_fw_")

    device = []

    def cycle() -> float:
        t0 = time.perf_counter()
        shmem = iris.iris(args.heap)
        elapsed = time.perf_counter() - t0
        device[:] = [shmem.get_device()]
        x = shmem.zeros(256, dtype=torch.float32)
        shmem.barrier()
        del shmem, x
        return elapsed * 1e3

    for _ in range(max(1, args.warmup)):
        cycle()
    gc.collect()
    before = counters(prefix, device[0])
    create_ms = [cycle() for _ in range(args.cycles)]
    # the last dropped context is closed by the next iris.iris(): make one, and close it explicitly
    shmem = iris.iris(args.heap)
    t0 = time.perf_counter()
    shmem.ctx.close()
    close_ms = (time.perf_counter() - t0) * 1e3
    rank, world = shmem.cur_rank, shmem.num_ranks
    del shmem
    gc.collect()
    after = counters(prefix, device[0])
    slack = {"fds": args.slack, "threads": args.slack, "os_threads": args.slack, "maps": args.slack,
             "driver_maps": args.slack}
    grown = {k: after[k] - before[k] for k in before if after[k] - before[k] > slack.get(k, 0)}
    if after["shm_segments"]:  # every rank has closed: none of this job's segments may remain
        grown["shm_segments"] = after["shm_segments"]
    ordered = sorted(create_ms)
    report = {
        "rank": rank, "world": world, "device": "cpu" if iris_fw.interpreting() else torch.cuda.get_device_name(),
        "heap_bytes": args.heap, "cycles": args.cycles,
        "create_ms_median": round(statistics.median(create_ms), 3),
        "create_ms_p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "create_ms_max": round(ordered[-1], 3), "explicit_close_ms": round(close_ms, 3),
        "before": before, "after": after, "grown": grown,
    }
    print("PROBE " + json.dumps(report), flush=True)
    if rank == 0:
        print(f"{world} ranks, {args.cycles} create/drop cycles of a {args.heap} B heap on {report['device']}: "
              f"create {report['create_ms_median']} ms median ({report['create_ms_p90']} p90, "
              f"{report['create_ms_max']} max), collective close {report['explicit_close_ms']} ms; "
              f"{'nothing accumulated' if not grown else 'GREW: ' + json.dumps(grown)}", flush=True)
    return 1 if grown else 0


if __name__ == "__main__":
    sys.exit(main())
