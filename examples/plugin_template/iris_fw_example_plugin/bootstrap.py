"""A bootstrap: ``filestore``, ranks meet through a file (torch's ``FileStore``) instead of a
process group or MPI.

A bootstrap moves small Python objects between ranks at set-up time (all-gather, broadcast,
barrier; contract: :class:`iris_fw.bootstrap_base.Bootstrap`). This one is chosen when
``IRIS_FW_EXAMPLE_FILESTORE`` names the store's file — a path every rank can reach and that no
earlier job used — and takes ``RANK`` and ``WORLD_SIZE`` from the environment (as
``iris-fw launch`` and torchrun set them). Its ``priority`` puts it before the built-ins, so the
variable alone selects it; ``init(bootstrap="filestore")`` does too. Every wait is bounded.
"""

from __future__ import annotations

import datetime
import os
import pickle

from iris_fw.bootstrap_base import DEFAULT_TIMEOUT_S, Bootstrap
from iris_fw.errors import IrisError

VARIABLE = "IRIS_FW_EXAMPLE_FILESTORE"


class FileStoreBootstrap(Bootstrap):
    """All-gather, broadcast and barrier as keys in a ``torch.distributed.FileStore``."""

    name = "filestore"
    priority = 5  # asked before the built-ins (torch: 10, mpi: 20); it detects only its variable

    @classmethod
    def available(cls):
        import torch.distributed as dist

        if not dist.is_available():
            return False, "this torch build has no torch.distributed (FileStore)"
        return True, ""

    @classmethod
    def detect(cls, environ):
        return bool(environ.get(VARIABLE))

    @classmethod
    def detected_because(cls, environ):  # what `iris-fw info` and the iris_fw logger say
        return f"{VARIABLE}={environ.get(VARIABLE)}"

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, *, arrival_timeout: float | None = None):
        """The constructor of the contract (``Bootstrap.__init__``). Every store read is bounded by
        ``timeout_s``; arrival is bounded by the shorter of it and ``arrival_timeout``."""
        import torch.distributed as dist

        missing = [v for v in (VARIABLE, "RANK", "WORLD_SIZE") if not os.environ.get(v)]
        if missing:
            raise IrisError(f"bootstrap 'filestore' needs the environment variables {', '.join(missing)}")
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self._store = dist.FileStore(os.environ[VARIABLE], self.world_size)
        arrival = timeout_s if arrival_timeout is None else min(timeout_s, arrival_timeout)
        self._store.set_timeout(datetime.timedelta(seconds=arrival))  # every get is bounded
        self._round = 0
        self._set_local_ranks()  # local ranks from the host names of all ranks (everyone arrived)
        self._store.set_timeout(datetime.timedelta(seconds=timeout_s))

    def _next_key(self) -> str:
        self._round += 1
        # Every rank finished round k - 1 before anyone could start round k + 1 (it needed this
        # rank's round-k key), so this rank's key of round k - 1 is read by everyone: drop it.
        if self._round > 2:
            self._store.delete_key(f"{self._round - 2}/{self.rank}")
        return f"{self._round}/{self.rank}"

    def all_gather(self, obj):
        self._store.set(self._next_key(), pickle.dumps(obj))
        return [pickle.loads(self._store.get(f"{self._round}/{r}")) for r in range(self.world_size)]

    def broadcast(self, obj, src):
        if not isinstance(src, int) or not 0 <= src < self.world_size:
            raise ValueError(f"src must be a rank in [0, {self.world_size}), got {src!r}")
        return self.all_gather(obj if self.rank == src else None)[src]

    def barrier(self):
        self.all_gather(None)

    def close(self):
        # The last rank to release its FileStore removes the file.
        self._store = None
