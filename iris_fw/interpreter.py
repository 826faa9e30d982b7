"""Whether Triton kernels run in Triton's CPU interpreter: the one decision ``import iris_fw``
takes (:func:`choose`), and the question every layer asks (:func:`interpreting`).

A leaf module (it imports only :mod:`iris_fw.env`, and that one lazily), so the device
primitives and the launcher can ask without importing the package root.
"""

import os as _os

_TRUE = ("1", "true", "True")


def interpreting(environ=_os.environ) -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter."""
    return environ.get("TRITON_INTERPRET", "0") in _TRUE


def choose(environ=_os.environ) -> None:
    """Set ``TRITON_INTERPRET=1`` in ``environ`` when it is unset and either
    ``IRIS_FW_TRANSPORT=host_shm`` is asked for or (``auto``) no GPU is visible."""
    if "TRITON_INTERPRET" in environ:
        return
    from . import env

    forced = env.get("IRIS_FW_TRANSPORT", environ)
    if forced == "host_shm":
        environ["TRITON_INTERPRET"] = "1"
    elif forced == "auto":
        import torch

        if not torch.cuda.is_available():
            environ["TRITON_INTERPRET"] = "1"
