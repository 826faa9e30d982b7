"""The op engine: the pattern/scheduler contract, the kernel skeletons, device-side per-call
state, the lean launch path, and ops (validated across ranks once, cached, graph-safe)."""
