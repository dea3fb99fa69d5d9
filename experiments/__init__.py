"""genvi experiments: shared code in `experiments.common`, benchmarks in `experiments.bench`."""
