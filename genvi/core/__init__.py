"""Core data structures shared by every stage of the pipeline: choice maps and the
one module (`jaxpr`) that touches JAX internals."""
