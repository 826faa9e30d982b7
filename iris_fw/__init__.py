"""iris-fw: fine-grained multi-GPU programming in Python + Triton.

Each rank owns a symmetric heap; Triton device functions (:mod:`iris_fw.device`) load,
store and atomically update a peer's heap from inside a kernel.

Importing this package decides, once, whether Triton kernels are interpreted: when
``TRITON_INTERPRET`` is unset and either ``IRIS_FW_TRANSPORT=host_shm`` is asked for or no
GPU is visible, it sets ``TRITON_INTERPRET=1`` so that kernels defined afterwards (ours and
yours) run on the CPU with the ``host_shm`` transport. Triton reads the variable when a
kernel is decorated, so import ``iris_fw`` before defining kernels, or set the variable
yourself. Nothing else happens at import.
"""

from .interpreter import choose as _choose_interpreter
from .interpreter import interpreting

_choose_interpreter()

from .context import Context, init  # noqa: E402
from .errors import (CallMismatch, CollectiveMismatch, HeapOutOfMemory, IrisError, NotOnHeapError,  # noqa: E402
                     PeerFailure, SymmetryError, WaitTimeout)

__version__ = "0.1.0"

__all__ = [
    "CallMismatch",
    "CollectiveMismatch",
    "Context",
    "HeapOutOfMemory",
    "IrisError",
    "NotOnHeapError",
    "PeerFailure",
    "SymmetryError",
    "WaitTimeout",
    "init",
    "interpreting",
    "__version__",
]
