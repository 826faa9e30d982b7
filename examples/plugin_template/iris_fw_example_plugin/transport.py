"""A transport: ``private_shm``, host shared memory under this plugin's own segment names.

A transport allocates this rank's symmetric heap and maps every peer's (see
:class:`iris_fw.transport_base.Transport`). This one reuses the built-in ``host_shm`` and changes
only the prefix of its ``/dev/shm`` segment names; a new transport would implement ``__init__``
(allocate, exchange handles through the bootstrap, map), ``wrap``, ``synchronize`` and
``close``. Select it with ``iris_fw.init(transport="private_shm")`` or
``IRIS_FW_TRANSPORT=private_shm``.
"""

from iris_fw.transports.host_shm import HostShmTransport


class PrivateShmTransport(HostShmTransport):
    """host_shm with segments named after this plugin."""

    name = "private_shm"
    shm_prefix = "iris_fw_example_"
