"""ADEV: automatic differentiation of expected values.

`interpreter` turns an objective's jaxpr into a forward-mode estimator: a walk on the
core's typed hooks (`genvi.core.walk`) in which each site's strategy (one module per
strategy in `strategies`; `switch` chooses among them) receives the rest of the
objective as a continuation (`continuation`: `SiteContinuation`, the public
`gv.Continuation`), resolved at trace time; replays a rule asks for are evaluated by
the replay engine (`genvi.replays`). `expectation` and `program` wrap it as an
`Expectation` whose reverse mode JAX derives by linearizing and transposing that
estimator; `placeholders` resolves placeholder strategies (`gv.AUTO`) before a run.
`smoothness` refuses a pathwise strategy's value at a discontinuity,
`variance_training` a parameter trained for two ends, `explain` observes runs (a
`RunObserver`) and `cost` counts their work. `gv.sample` is in `sample`."""
