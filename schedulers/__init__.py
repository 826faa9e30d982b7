"""Built-in scheduler plugins (installed as ``iris_fw.schedulers``)."""
