"""Benchmarks: the harness behind ``iris-fw bench`` (:mod:`iris_fw.bench.harness`) and the
built-in benchmark plugins (:mod:`iris_fw.bench.primitives`, :mod:`iris_fw.bench.taxonomy`),
which register through the ``iris_fw`` entry-point group like a third party's."""

from .harness import (
    GiB,
    KiB,
    MiB,
    BenchOptions,
    Rotation,
    environment,
    fmt_bytes,
    main,
    markdown_table,
    measure_interleaved,
    measure_us,
    parse_size,
    parse_sizes,
    replot,
    size_sweep,
    write_results,
)

__all__ = [
    "GiB",
    "KiB",
    "MiB",
    "BenchOptions",
    "Rotation",
    "environment",
    "fmt_bytes",
    "main",
    "markdown_table",
    "measure_interleaved",
    "measure_us",
    "parse_size",
    "parse_sizes",
    "replot",
    "size_sweep",
    "write_results",
]
