"""genvi beside NumPyro (and Pyro) on their own models: logistic regression and a
Gaussian mixture at dataset scale (`logreg`, `gmm`), NumPyro's examples run unchanged
through `gv.from_numpyro` (`from_numpyro`), stochastic volatility, horseshoe
regression, where the automatic guides start (`guide_starts`), eight schools under
NumPyro's guides and Pyro's coin: step times, and the ELBO each library's fit reaches.
Page: docs/benchmarks/peers.md.
"""
