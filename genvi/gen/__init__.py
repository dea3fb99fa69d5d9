"""The generative language: `@gv.gen` programs (`language`), combinators
(`combinators`, `plate`), and their meaning as handlers (`handlers`: simulate,
log_density, sim, generate, dream) run by one interpreter (`interpret`), with
validation's per-site checks (`site_checks`), queries of a traced program (`sites`)
and `gv.predictive`. It knows strategies only through `genvi.core.strategy`, and
nothing of the estimator (`genvi.adev`) above it."""
