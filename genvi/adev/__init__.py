"""ADEV: automatic differentiation of expected values.

`strategies` holds one module per gradient strategy (`switch` chooses among them); `interpreter` turns an objective's jaxpr into a forward-mode estimator
(continuations resolved at trace time, `continuation`), replaying the objective where
a rule asks (`replay`, `pending`; lane by lane in `lanes`, `lane_rules`, `lane_scan`);
`expectation` wraps it as an `Expectation` whose reverse mode JAX derives by
linearizing and transposing that estimator. `smoothness` checks REPARAM's uses and
`explain` reports what the interpreter did. `gv.sample` is in `sample`."""
