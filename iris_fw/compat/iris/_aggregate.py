"""``aggregate``: Triton's ``_aggregate`` whose ``@triton.jit`` methods also work under Triton's
interpreter — shared by the compat device API (:mod:`.tiles`) and Iris's trace events
(:mod:`.host.tracing.events`)."""

import functools

from triton.language.core import _aggregate

try:  # the type Triton's interpreter gives @triton.jit functions
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted
except ImportError:  # pragma: no cover - every supported Triton has it
    _Interpreted = ()


class _Method:
    """Binds an interpreted ``@triton.jit`` method to its aggregate instance."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, objtype=None):
        return self.fn if obj is None else functools.partial(self.fn, obj)


def aggregate(cls):
    """``triton.language.core._aggregate``, whose methods also work under Triton's interpreter:
    there ``@triton.jit`` gives an ``InterpretedFunction``, which the aggregate does not copy
    (methods) or bind (``self``); this does both, static methods staying unbound."""
    value = _aggregate(cls)
    for name, member in cls.__dict__.items():
        if isinstance(member, staticmethod) and isinstance(member.__func__, _Interpreted):
            setattr(value, name, member)
        elif isinstance(member, _Interpreted):
            setattr(value, name, _Method(member))
    return value
