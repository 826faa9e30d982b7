"""The ``torch`` bootstrap: torch.distributed, for programs run under ``torchrun`` (reuses an
initialized default process group or creates one from torchrun's variables)."""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import time
import weakref

from iris_fw.bootstrap_base import DEFAULT_TIMEOUT_S, Bootstrap, check_src
from iris_fw.errors import IrisError, PeerFailure

_TORCHRUN_VARS = ("TORCHELASTIC_RUN_ID",)
_TORCH_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchBootstrap(Bootstrap):
    """torch.distributed. Reuses the default process group if one is initialized, else
    creates one from the environment (``env://``: torchrun's variables). Collectives run on
    a gloo group: the default group itself when its backend is gloo, else a gloo subgroup."""

    name = "torch"
    priority = 10
    #: Open torch bootstraps of this process: the one that created the default process group
    #: hands that duty (destroying it) to another open one when it closes first (contexts made
    #: and dropped in any order share the group).
    _open: "weakref.WeakSet[TorchBootstrap]" = weakref.WeakSet()

    @classmethod
    def available(cls):
        try:
            import torch.distributed as dist
        except ImportError as exc:  # pragma: no cover - torch always has it on Linux
            return False, f"torch.distributed cannot be imported: {exc}"
        if not dist.is_available():
            return False, "this torch build has no torch.distributed"
        return True, ""

    @classmethod
    def detect(cls, environ):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return True
        return any(v in environ for v in _TORCHRUN_VARS) or all(v in environ for v in _TORCH_ENV_VARS)

    @classmethod
    def detected_because(cls, environ):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return "torch.distributed is initialized"
        return "torchrun's variables: " + ", ".join(v for v in (*_TORCHRUN_VARS, *_TORCH_ENV_VARS) if v in environ)

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, *, arrival_timeout: float | None = None):
        import torch.distributed as dist

        self._dist = dist
        self._owns_default = False
        self._broken = False
        self._abandoned = False
        self._store, self._abort_key = None, None
        timeout = datetime.timedelta(seconds=timeout_s)
        if not dist.is_initialized():
            missing = [v for v in _TORCH_ENV_VARS if v not in os.environ]
            if missing:
                raise IrisError(
                    "bootstrap 'torch' needs an initialized torch.distributed or torchrun's "
                    f"environment; missing: {', '.join(missing)}"
                )
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store = self._arrive(rank, world, arrival_timeout)
            dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world, timeout=timeout)
            self._owns_default = True
        else:
            try:
                self._store = dist.distributed_c10d._get_default_store()
            except Exception:  # a private helper: without it, no abort announcements
                self._store = None
        self._group = None
        if dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        TorchBootstrap._open.add(self)
        if self._store is not None and self._abort_key is None:  # a reused group: count inits as _arrive does
            gen = self._store.add(f"{self._key_prefix()}reused/{self._dist.get_rank()}", 1)
            self._abort_key = f"{self._key_prefix()}reused/{gen}/abort"
        if "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
            self.local_rank = int(os.environ["LOCAL_RANK"])
            self.local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
        else:
            self._set_local_ranks()

    # ---- arrival ----------------------------------------------------------------------------------
    @staticmethod
    def _key_prefix() -> str:
        """Store keys of iris-fw under torchrun's run and restart (the agent's store outlives
        a restart) or the launcher's port."""
        run = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT", "")
        return f"iris_fw/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def _arrive(self, rank: int, world: int, arrival_timeout: float | None):
        """The rendezvous store (the launcher's agent store — torchrun's, ``iris-fw launch``'s
        — else hosted by rank 0, as ``env://`` does), and every rank's arrival in it within
        ``arrival_timeout`` seconds: each rank posts its process description; a rank that does
        not post in time is named. Returns the store for the default group."""
        from iris_fw.watchdog import arrival_timeout as default_arrival, liveness_timeout, process_info

        bound = arrival_timeout if arrival_timeout is not None else default_arrival(liveness_timeout())
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
        try:
            store = self._dist.TCPStore(addr, port, world_size=None if agent else world,
                                        is_master=(rank == 0 and not agent),
                                        timeout=datetime.timedelta(seconds=bound), wait_for_workers=False,
                                        multi_tenant=True)
        except RuntimeError as exc:
            raise PeerFailure(
                f"rank {rank}: rank 0, which hosts the rendezvous at {addr}:{port}, did not arrive at "
                f"iris_fw.init within {bound:g} s (IRIS_FW_ARRIVAL_TIMEOUT): {exc}", 0) from None
        prefix = self._key_prefix()
        gen = store.add(f"{prefix}gen/{rank}", 1)  # this rank's n-th init: every rank counts alike
        keys = [f"{prefix}{gen}/arrived/{r}" for r in range(world)]
        store.set(keys[rank], pickle.dumps(process_info()))
        deadline = time.monotonic() + bound
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise PeerFailure(
                    f"rank {rank}: rank(s) {missing} of {world} did not arrive at iris_fw.init within {bound:g} s "
                    "(IRIS_FW_ARRIVAL_TIMEOUT; they exited or hang before it, or were started late)", missing[0])
            time.sleep(0.02)
        self.processes = [pickle.loads(store.get(k)) for k in keys]
        store.set_timeout(datetime.timedelta(seconds=DEFAULT_TIMEOUT_S))
        self._store, self._abort_key = store, f"{prefix}{gen}/abort"
        # the group's keys under this init's prefix: a previous group's (a context closed and
        # created again) are never read
        return self._dist.PrefixStore(f"{prefix}{gen}/group", store)

    # ---- collectives ------------------------------------------------------------------------------
    def _run(self, work, what: str) -> None:
        try:
            self._poll(work.is_completed, what)
        except BaseException:  # a lost peer (PeerFailure), KeyboardInterrupt, ...
            self._abandoned = True  # a collective still in flight: the group cannot be torn down
            raise
        try:
            work.wait()
            return
        except RuntimeError as exc:
            cause = exc
        error = self._failed(what, cause)
        raise error from (None if isinstance(error, PeerFailure) else cause)

    def _check_peers(self, what: str) -> None:
        if self._store is not None and self._abort_key is not None:
            try:
                announced = self._store.check([self._abort_key])
            except Exception:  # the store is gone with its host (rank 0): the watchdog will say
                return
            if announced:
                reason = self._store.get(self._abort_key).decode(errors="replace")
                raise PeerFailure(f"rank {self.rank} during the bootstrap's {what}: {reason}")

    def all_gather(self, obj):
        import torch

        data = pickle.dumps(obj)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._run(self._dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64),
                                        group=self._group, async_op=True), "all_gather")
        counts = [int(n) for n in sizes]
        buf = torch.zeros(max(counts), dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty_like(buf) for _ in range(self.world_size)]
        self._run(self._dist.all_gather(out, buf, group=self._group, async_op=True), "all_gather")
        return [pickle.loads(t[:n].numpy().tobytes()) for t, n in zip(out, counts)]

    def broadcast(self, obj, src):
        import torch

        check_src(src, self.world_size)
        src_global = src if self._group is None else self._dist.get_global_rank(self._group, src)
        data = pickle.dumps(obj) if self.rank == src else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self._run(self._dist.broadcast(size, src=src_global, group=self._group, async_op=True), "broadcast")
        buf = torch.zeros(int(size), dtype=torch.uint8)
        if self.rank == src:
            buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._run(self._dist.broadcast(buf, src=src_global, group=self._group, async_op=True), "broadcast")
        return obj if self.rank == src else pickle.loads(buf.numpy().tobytes())

    def barrier(self):
        self._run(self._dist.barrier(group=self._group, async_op=True), "barrier")

    def abort(self, reason):
        """Announce ``reason`` in the rendezvous store (the others' waits raise it), then tear
        down the groups this bootstrap created."""
        if self._store is not None and self._abort_key is not None:
            try:
                self._store.set(self._abort_key, reason)
            except Exception:
                pass
        print(f"iris_fw: {reason}; aborting", file=sys.stderr, flush=True)
        self._broken = True
        self.close()

    def close(self):
        """Destroy the groups this bootstrap created — or abort them when a peer is lost or
        this rank aborts (destroying a gloo group waits for every peer: a stopped one would
        hold it for the whole timeout). The default group, when another torch bootstrap of
        this process is still open, is left to that one (contexts made and dropped in any order
        share it)."""
        TorchBootstrap._open.discard(self)
        if self._abandoned:  # gloo would wait for the lost peer: leave the group to process exit
            self._group, self._owns_default = None, False
            return
        broken = self._broken or (self.liveness is not None and bool(self.liveness.lost))
        end = self._abort_group if broken else self._dist.destroy_process_group
        if self._group is not None:
            end(self._group)
            self._group = None
        if self._owns_default and self._dist.is_initialized():
            heir = next(iter(TorchBootstrap._open), None)
            if heir is not None:
                heir._owns_default = True
            else:
                end()
            self._owns_default = False

    def _abort_group(self, group=None) -> None:
        abort = getattr(self._dist.distributed_c10d, "_abort_process_group", None)
        if abort is None:  # an older torch: leave the group to process exit rather than wait
            return
        try:
            abort(group)
        except Exception:
            pass

