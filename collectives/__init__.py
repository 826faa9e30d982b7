"""Built-in collective-algorithm plugins of :mod:`iris_fw.ccl` (installed as ``iris_fw.collectives``)."""
