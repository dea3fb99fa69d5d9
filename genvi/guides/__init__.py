"""Automatic guides and constrained parameters (see docs/auto_guides.md).

* `genvi.guides.auto`: site discovery, the `AutoGuide` base program, summaries.
* `genvi.guides.gaussian`: `auto_normal`, `auto_mvn`, `auto_low_rank`, `auto_delta`.
* `genvi.guides.flow`: `auto_flow`, an inverse autoregressive flow (flax).
* `genvi.guides.supports`: constrained supports as TFP bijectors.
* `genvi.guides.params`: `positive`, `unit_interval`, `interval`, `simplex`,
  `lower_cholesky` and `constrain`, for hand-written guides.
"""
