"""Tuning tables as data (``iris_fw/tuning/*.json``) and their one loader.

Every table has one envelope, checked when it is loaded (:func:`load`)::

    {"_doc": "what the table decides, how rows are read, where they come from",
     "_source": "...",                        # optional notes: any key starting with "_"
     "defaults": {selector: rows},            # selector: a device type ("cuda", "cpu") or an entry name
     "devices": {device name: rows | {world size: {entry name: rows}}}}

A device name (:func:`iris_fw.devinfo.info`) overrides the defaults (:func:`device_rows`). Rows
are ``[bound, value]`` pairs read by :func:`bounded` — the first row whose bound holds (``null``:
any) applies — except ``auto.json``'s, which match a pattern's tuning key exactly
(:mod:`iris_fw.engine.auto`). Tables: ``auto`` (op schedulers and configs), ``ccl``
(algorithm order of ``algorithm="auto"``), ``flash_decode`` (launch configurations), ``gemm``
(measured GEMM tiles and tile orders), ``moe`` (dispatch mode), ``moe_gemm`` (the fused expert GEMMs' tiles). Benchmarks produce the rows
(docs/performance.md).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from ..errors import IrisError

#: The tables of this package (file ``<name>.json``).
TABLES = ("auto", "ccl", "flash_decode", "gemm", "moe", "moe_gemm")
_REQUIRED = {"_doc": str, "defaults": dict, "devices": dict}


class TuningTableError(IrisError):
    """A tuning table that does not follow the envelope (names the file and the key)."""


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The parsed ``iris_fw/tuning/<name>.json``, its envelope checked (:func:`check`)."""
    if name not in TABLES:
        raise TuningTableError(f"no tuning table {name!r}; the tables are {', '.join(TABLES)}")
    data = json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text())
    check(name, data)
    return data


def check(name: str, data: Any) -> None:
    """Raise :class:`TuningTableError` unless ``data`` has the envelope (``_doc``, ``defaults``,
    ``devices``; notes under ``_`` keys are strings) and its bound rows are ``[bound, value]``
    with ``bound`` null or a non-negative int."""
    where = f"iris_fw/tuning/{name}.json"
    if not isinstance(data, dict):
        raise TuningTableError(f"{where}: expected a JSON object, got {type(data).__name__}")
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise TuningTableError(f"{where}: {key!r} must be a {kind.__name__}, got {data.get(key)!r:.60}")
    for key, value in data.items():
        if key.startswith("_") and not isinstance(value, str):
            raise TuningTableError(f"{where}: note {key!r} must be a string")
    if name != "auto":  # auto.json's rows match tuning keys, not bounds
        for path, rows in _row_lists(data["defaults"], "defaults") + _row_lists(data["devices"], "devices"):
            for row in rows:
                if not (isinstance(row, list) and len(row) == 2
                        and (row[0] is None or (isinstance(row[0], int) and not isinstance(row[0], bool) and row[0] >= 0))):
                    raise TuningTableError(f"{where}: {path}: a row must be [bound (null or int >= 0), value], got {row!r:.80}")


#: Keys of a row's value that are notes, not fields: what measured the row.
NOTES = ("measured",)


def fields(value: dict) -> dict:
    """A row's value without its notes (:data:`NOTES`): the keyword arguments of the
    configuration it describes."""
    return {key: v for key, v in value.items() if key not in NOTES}


def _row_lists(node: Any, path: str) -> list:
    if isinstance(node, list):
        return [(path, node)]
    if isinstance(node, dict):
        return [item for key, child in node.items() for item in _row_lists(child, f"{path}.{key}")]
    return []


def device_rows(data: dict, device_name: str, device_type: str, *, world_size: int | None = None,
                entry: str | None = None) -> list | None:
    """The rows for a device: ``devices[device_name]`` (then ``[str(world_size)]`` and
    ``[entry]`` where given) when present, else ``defaults[entry]`` (an entry name) or
    ``defaults[device_type]`` (``"cpu"``, or ``"cuda"`` for every GPU); None where neither has
    rows."""
    rows: Any = data["devices"].get(device_name)
    if rows is not None and world_size is not None:
        rows = rows.get(str(world_size))
    if rows is not None and entry is not None:
        rows = rows.get(entry)
    if rows:
        return rows
    return data["defaults"].get(entry if entry is not None else ("cpu" if device_type == "cpu" else "cuda"))


def bounded(rows: list, value: int) -> Any:
    """The value of the first row ``[bound, value]`` whose bound holds (``value <= bound``;
    ``null``: any), else the last row's."""
    for bound, chosen in rows:
        if bound is None or value <= bound:
            return chosen
    return rows[-1][1]
