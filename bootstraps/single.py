"""The ``single`` bootstrap: one rank, no communication (chosen when no launcher is detected)."""

from __future__ import annotations

from iris_fw.bootstrap_base import Bootstrap, check_src


class SingleBootstrap(Bootstrap):
    """One rank: the program was not launched for several."""

    name = "single"
    priority = 1000

    def __init__(self, *, arrival_timeout: float | None = None):  # one rank: nobody to wait for
        self.rank, self.world_size = 0, 1
        self.local_rank, self.local_world_size = 0, 1

    @classmethod
    def detect(cls, environ):
        return True

    @classmethod
    def detected_because(cls, environ):
        return "no MPI or torchrun variables in the environment: one rank"

    def all_gather(self, obj):
        return [obj]

    def broadcast(self, obj, src):
        check_src(src, 1)
        return obj

    def barrier(self):
        pass

