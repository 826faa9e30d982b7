"""Iris's ``iris.experimental`` is its Gluon backend (``iris_gluon``: kernels in AMD's Gluon
dialect of Triton). iris-fw has no Gluon counterpart, so importing it fails, saying so."""

raise ImportError("iris.experimental (Iris's Gluon backend) is not provided by iris-fw's Iris compatibility layer: "
                  "Gluon kernels target AMD's Triton dialect; use the Triton API (iris.load/…, iris.DeviceContext)")
