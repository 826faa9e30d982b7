"""Iris's ``iris.host.logging.logging``: the names of :mod:`iris_fw.compat.iris.logging` (one
logger, ``"iris"``) and Iris's ``_log_rank``."""

from __future__ import annotations

from ...logging import DEBUG, ERROR, INFO, WARNING, IrisFormatter, log_with_rank, logger, set_logger_level  # noqa: F401


def _log_rank(level: int, message: str, *args, rank: int | None = None, num_ranks: int | None = None) -> None:
    """``message % args`` at ``level``, tagged ``[rank/num_ranks]`` when ``rank`` is given."""
    if not logger.isEnabledFor(level):
        return
    text = message % args if args else message
    if rank is None:
        logger.log(level, text)
    else:
        log_with_rank(level, text, rank, num_ranks if num_ranks is not None else "?")
