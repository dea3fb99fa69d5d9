"""Automatic guides and constrained parameters (see docs/auto_guides.md).

* `genvi.guides.discover`: a model's latent sites, found by running it.
* `genvi.guides.auto`: the `AutoGuide` base program, summaries.
* `genvi.guides.gaussian`: `auto_normal`, `auto_mvn`, `auto_low_rank`.
* `genvi.guides.delta`: `auto_delta`, point masses (MAP).
* `genvi.guides.flow`: `auto_flow`, an inverse autoregressive flow (flax).
* `genvi.guides.supports`: constrained supports as TFP bijectors.
* `genvi.guides.params`: `positive`, `unit_interval`, `interval`, `simplex`,
  `lower_cholesky` and `constrain`, for hand-written guides.
"""
