"""Rank program for the launcher's tests (tests/test_launch_control.py): ``launch_probe.py MODE``.

* ``fail RANK CODE DIR``: the other ranks write their pid into DIR and sleep 120 s (printing the
  time a SIGTERM reaches them); once they all have, rank RANK exits with CODE (printing the time).
* ``sleep``: every rank prints its pid and ``ready``, then sleeps; on SIGINT/SIGTERM it prints what
  it got and exits 0.
* ``job``: init twice (a second context after the first closed), report the bootstrap,
  transport, the settings it was given and every listening TCP socket of this rank and of the
  launcher that is not on the loopback interface.
* ``marker PATH``: create PATH (shows whether a rank was started at all).
"""

import os
import signal
import sys
import time

mode, rank = sys.argv[1], int(os.environ.get("RANK", "0"))


def _listening_sockets(pid):
    """``(address, port)`` of TCP sockets process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    address, port = fields[1].split(":")
                    found.append((address, int(port, 16)))
    return found


def _loopback(address):
    if len(address) == 8:  # IPv4, little-endian hex: 0100007F is 127.0.0.1
        return address[-2:] == "7F"
    return address in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


if mode == "fail":
    folder = sys.argv[4]
    if rank == int(sys.argv[2]):
        others = int(os.environ["WORLD_SIZE"]) - 1
        while len(os.listdir(folder)) < others:
            time.sleep(0.01)
        print(f"rank {rank}: exiting with {sys.argv[3]} at {time.time():.3f}", flush=True)
        sys.exit(int(sys.argv[3]))

    def _stopped(signum, frame):
        print(f"rank {rank}: stopped at {time.time():.3f}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stopped)
    with open(os.path.join(folder, f"{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(folder, f"{rank}.tmp"), os.path.join(folder, f"{rank}.pid"))
    time.sleep(120)
elif mode == "sleep":
    def _got(signum, frame):
        print(f"got {signal.Signals(signum).name}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGINT, _got)
    signal.signal(signal.SIGTERM, _got)
    signal.signal(signal.SIGHUP, _got)
    print(f"pid {os.getpid()}", flush=True)
    print("ready", flush=True)
    time.sleep(120)
elif mode == "job":
    import iris_fw

    for attempt in range(2):
        with iris_fw.init(heap_size=1 << 20) as ctx:
            x = ctx.full((4,), float(ctx.rank))
            ctx.barrier()
            total = sum(float(ctx.peer_view(x, r)[0]) for r in range(ctx.world_size))
            assert total == sum(range(ctx.world_size)), total
            exposed = [s for pid in (os.getpid(), os.getppid()) for s in _listening_sockets(pid) if not _loopback(s[0])]
            print(f"attempt {attempt}: bootstrap={ctx.bootstrap.name} transport={ctx.transport.name} "
                  f"env={os.environ['IRIS_FW_BOOTSTRAP']},{os.environ['IRIS_FW_TRANSPORT']} exposed={exposed}", flush=True)
elif mode == "marker":
    open(sys.argv[2], "w").close()
else:
    sys.exit(f"unknown mode {mode}")
