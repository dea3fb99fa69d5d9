"""The generative language: `@gv.gen` programs, combinators, and the `simulate`,
`log_density` and `sim` transformations."""
