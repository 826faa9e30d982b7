"""Built-in pattern plugins (installed as ``iris_fw.plugins``)."""
