"""Side-by-side benchmarks: run `python -m genvi_experiments.bench.<name>`."""
