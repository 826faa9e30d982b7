"""Iris's logging (``iris.logger``, ``iris.set_logger_level``, ``iris.DEBUG`` …,
``iris.logging.IrisFormatter``) on Python's ``logging``.

As in Iris, importing the compat layer configures the logger named ``"iris"`` once: level
``INFO`` (or ``IRIS_LOG_LEVEL`` = ``DEBUG``/``INFO``/``WARNING``/``ERROR``) and, if it has no
handler yet, one ``StreamHandler`` with :class:`IrisFormatter`. Records carrying
``iris_rank``/``iris_num_ranks`` (the host object's ``debug``/``info``/… set them) read
``[Iris] [rank/num_ranks] message``; others ``[Iris] message``.

Why at import (one of the two things the compat layer does then, :mod:`iris_fw.compat.state` says):
Iris's ``import iris`` does it (``iris/host/logging/logging.py`` configures the logger at module
level), and Iris programs log through ``iris.logger`` without configuring it, before any
``iris.iris()``. ``iris.logger.info(...)`` is a plain ``logging`` call the compat layer never
sees, so a configuration on first use would leave those records to ``logging``'s last-resort
handler (INFO dropped, no ``[Iris]`` prefix). tests/test_iris_conformance_host.py::test_logging
checks that the handler is there after the import alone.
"""

from __future__ import annotations

import logging as _logging
import os

DEBUG = _logging.DEBUG
INFO = _logging.INFO
WARNING = _logging.WARNING
ERROR = _logging.ERROR

_LEVELS = {"DEBUG": DEBUG, "INFO": INFO, "WARNING": WARNING, "ERROR": ERROR}


class IrisFormatter(_logging.Formatter):
    """``[Iris] [rank/num_ranks] message``, or ``[Iris] message`` without rank information."""

    def format(self, record: _logging.LogRecord) -> str:
        text = f"[Iris] {record.getMessage()}"
        rank = getattr(record, "iris_rank", None)
        if rank is not None:
            text = f"[Iris] [{rank}/{getattr(record, 'iris_num_ranks', '?')}] {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


#: The ``"iris"`` logger (``iris.logger``).
logger = _logging.getLogger("iris")


def _configure(environ=os.environ) -> None:
    """Iris's start-up configuration of :data:`logger` (level and one console handler)."""
    level = environ.get("IRIS_LOG_LEVEL", "").strip().upper()
    logger.setLevel(_LEVELS.get(level, INFO))
    if not logger.handlers:
        handler = _logging.StreamHandler()
        handler.setFormatter(IrisFormatter())
        logger.addHandler(handler)


def set_logger_level(level: int) -> None:
    """Set the level of Iris's logger (``iris.DEBUG``, ``iris.INFO``, ``iris.WARNING``,
    ``iris.ERROR``, or any ``logging`` level)."""
    logger.setLevel(level)


def log_with_rank(level: int, message: str, rank: int, num_ranks: int) -> None:
    """Emit ``message`` at ``level`` with ``iris_rank``/``iris_num_ranks`` set on the record
    (what Iris's host methods ``debug``/``info``/``warning``/``error`` do)."""
    if logger.isEnabledFor(level):
        record = logger.makeRecord(logger.name, level, "", 0, message, (), None)
        record.iris_rank = rank
        record.iris_num_ranks = num_ranks
        logger.handle(record)


_configure()
