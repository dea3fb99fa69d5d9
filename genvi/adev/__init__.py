"""ADEV: automatic differentiation of expected values.

`strategies` holds one rule per gradient strategy; `interpreter` turns an objective's
jaxpr into a forward-mode estimator (continuations resolved at trace time);
`expectation` wraps it as an `Expectation` whose reverse mode JAX derives by
linearizing and transposing that estimator."""
