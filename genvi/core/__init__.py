"""The ground floor, shared by every stage of the pipeline; imports nothing above it.

* `jaxpr`: the one module that touches JAX internals.
* `choices`: choice maps. `tracing`: user functions traced into cached jaxprs.
* `primitives`: what a traced program records at a random choice (`site_p`,
  `observe_p`, `sample_p`, plate markers).
* `addressing`: the address prefix of the code being traced; `dist(...) @ "x"`.
* `strategy`: the `Strategy` protocol sites carry, and its checks.
* `scopes`: the name scopes the smoothness check reads (density code,
  `gv.assume_continuous`).
* `validation`: `gv.validation`'s switch and its errors. `mistakes`: error wording.
"""
