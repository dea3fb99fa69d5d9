"""Attend-Infer-Repeat: the training step of every genvi estimator beside Pyro's
`TraceGraph_ELBO` and `TraceEnum_ELBO` (`step`, with the same model in Pyro in
`in_pyro`), on a CPU and a GPU, and where compiling that step goes (`compile`). The
estimator frontier on AIR's z_pres is `genvi_experiments.bench.frontier.air`.
Page: docs/benchmarks/air.md.
"""
