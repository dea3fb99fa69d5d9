"""genvi's experiments (`genvi run NAME`, each registered as an entry point that names a
record in `genvi_experiments.registry`), shared code in `genvi_experiments.common`,
benchmarks in `genvi_experiments.bench`. Importing this package imports nothing else,
so `genvi list` stays instant."""
