"""Code shared by experiments and benchmarks (networks, timing, data)."""
