"""Compatibility layers that run programs written for other libraries on iris-fw."""
