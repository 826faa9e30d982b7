"""Rank 1 dies by SIGKILL mid-run (after set-up); the others wait in a barrier until the
launcher stops them. Used to show that no /dev/shm segment or mapping outlives the job."""
import os
import signal
import sys

import iris_fw

with iris_fw.init(heap_size=1 << 22) as ctx:
    x = ctx.ones(1000)
    ctx.barrier()
    if ctx.rank == 1:
        if len(sys.argv) > 1 and sys.argv[1] == "during-setup":
            # what a crash between creating and unlinking a segment would leave
            open(os.path.join("/dev/shm", os.environ.get("IRIS_FW_SHM_PREFIX", "iris_fw_") + "leftover"), "w").close()
        print("rank 1: killing myself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.barrier()
