"""Inference constructs used inside models and guides: `gv.importance`, `gv.marginal`
and `gv.normalize` (programs whose densities are estimated). They run the estimator's
interpreter for their values, so they sit above `genvi.adev`."""
