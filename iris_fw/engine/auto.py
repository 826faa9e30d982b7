"""Tuning tables as data: which scheduler, SM split and configuration measured fastest for a
pattern at a shape, keyed by device name (:mod:`iris_fw.devinfo`) and world size. The table is
``iris_fw/tuning/auto.json``; benchmarks produce the rows (docs/performance.md)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
import torch

from .. import devinfo
from .. import tuning as tables


@dataclass(frozen=True)
class Choice:
    """A tuned choice: ``scheduler`` name, ``comm_sms`` (None: the scheduler's default), and the
    pattern's config as keyword arguments (None: the pattern's default)."""

    scheduler: str
    comm_sms: int | None = None
    config: dict | None = None


@functools.lru_cache(maxsize=None)
def table() -> dict:
    """The parsed ``auto.json``."""
    return tables.load("auto")


def lookup(pattern, signature: tuple, ctx) -> Choice:
    """The tuned :class:`Choice` for ``pattern`` at ``signature`` on ``ctx``'s device and world
    size (rows are for the input dtypes the table lists: the signature's dtype), else the
    pattern's default scheduler — on one rank ``defaults.one_rank`` first, then
    ``defaults.patterns`` —, else the default for its kind."""
    data = table()
    dtype = next((x for x in signature if isinstance(x, torch.dtype)), None)
    dtype_name = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else None
    if ctx.device.type == "cuda" and dtype_name in data["dtypes"]:
        rows = (data["devices"].get(devinfo.info(ctx.device).name, {})
                .get(str(ctx.world_size), {}).get(pattern.name, []))
        key = list(pattern.tuning_key(signature, ctx.world_size))
        for row in rows:
            if row["key"] == key:
                return Choice(row["scheduler"], row.get("comm_sms"), row.get("config"))
    defaults = data["defaults"]
    by_pattern = ((defaults.get("one_rank", {}).get(pattern.name) if ctx.world_size == 1 else None)
                  or defaults.get("patterns", {}).get(pattern.name))
    return Choice(by_pattern or defaults["comm_first" if pattern.comm_first else "compute_first"])
