"""Iris's ``iris.host.logging``: the same logger and names as ``iris.logging``
(``logger``, ``set_logger_level``, ``IrisFormatter``, ``DEBUG`` …), and ``_log_rank``."""

from .logging import (DEBUG, ERROR, INFO, WARNING, IrisFormatter, _log_rank, log_with_rank, logger,  # noqa: F401
                      set_logger_level)

__all__ = ["DEBUG", "ERROR", "INFO", "IrisFormatter", "WARNING", "logger", "set_logger_level"]
