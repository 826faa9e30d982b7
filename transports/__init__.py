"""Built-in transports (installed as ``iris_fw.transports``): ``gpu_ipc`` and ``host_shm``."""
