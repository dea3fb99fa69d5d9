"""genvi's primitives: what a traced program records at each random choice.

* `site_p`    – a sampling site `dist(...) @ "addr"` in a generative program.
* `observe_p` – `gv.observe(dist(...), value)` in a generative program.
* `sample_p`  – a sampling site inside an objective (`gv.sample`, or a site that
  `g.sim` turned into one); the ADEV interpreter gives it its gradient strategy.

Operands are the distribution's parameters followed by the strategy's dynamic
operands (e.g. a baseline value); the distribution, the static part of the strategy
and the address are static parameters. Under `jax.vmap` a site stays one site whose
parameters gain a leading axis (a product of independent components).
"""

from __future__ import annotations

from typing import Any

import jax

from genvi.core import jaxpr as jx


def _sample_aval(*avals, dist, n_params, **_):
    params = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals[:n_params]]
    out = jax.eval_shape(lambda *p: dist.sample(jax.random.key(0), *p), *params)
    return jx.shaped(out.shape, out.dtype)


def _observe_aval(*avals, **_):
    return []


site_p = jx.make_primitive("genvi_site", _sample_aval)
observe_p = jx.make_primitive("genvi_observe", _observe_aval, multiple_results=True)
sample_p = jx.make_primitive("genvi_sample", _sample_aval)
def _site_event_ndims(*, dist, n_params, **_):
    return tuple(dist.param_event_ndims) + (0,) * (n_params - len(dist.param_event_ndims))


def _observe_event_ndims(*, dist, n_params, **_):
    return (dist.value_event_ndim,) + _site_event_ndims(dist=dist, n_params=n_params)


jx.register_batching_by_broadcasting(site_p, _site_event_ndims)
jx.register_batching_by_broadcasting(sample_p, _site_event_ndims)
jx.register_batching_by_broadcasting(observe_p, _observe_event_ndims)

SITES = frozenset({site_p, observe_p})
SAMPLES = frozenset({sample_p})


def bind_site(prim: Any, dist: Any, params: tuple, strategy: Any, addr: tuple) -> Any:
    """Bind a sampling primitive for `dist(*params)` with `strategy` at `addr`."""
    static, operands = (None, ()) if strategy is None else strategy.split()
    return prim.bind(*params, *operands, dist=dist, strategy=static, addr=addr,
                     n_params=len(params))


def site_parts(eqn: Any, invals: list, tangents: list | None = None) -> tuple:
    """(dist, params, strategy joined with its operands, addr) of a site equation."""
    p = eqn.params
    n = p["n_params"]
    strategy = p["strategy"]
    if strategy is not None:
        strategy = strategy.join(tuple(invals[n:]),
                                 None if tangents is None else tuple(tangents[n:]))
    return p["dist"], tuple(invals[:n]), strategy, p["addr"]
