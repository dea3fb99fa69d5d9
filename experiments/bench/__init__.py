"""Side-by-side benchmarks: run `python -m experiments.bench.<name>`."""
