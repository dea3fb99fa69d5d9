"""Gradient strategies: one module per strategy, each a small rule that uses only the
protocol (`genvi.core.strategy.Strategy`) and registers itself; `gv.switch` is in
`genvi.adev.switch`.

A strategy turns a sampling site into a piece of a forward-mode estimator. Its rule
reads like a JAX JVP rule with a continuation::

    rule(dist, key, primals, tangents, k) -> k.dual(value, value_tangent).plus(...)

* `primals`, `tangents`: the distribution's parameters and their tangents (`None`
  is a symbolic zero).
* `k`, the continuation (the rest of the program after the site):
  `k.dual(v, dv)` continues with value `v`; `.plus(score=s, tangent=d)` adds
  `s × (final result) + d` to the final tangent (REINFORCE's score term, MVD's
  difference terms). `k.pure(v)` is the final *value* of the rest of the program
  with the site's value replaced by `v` (an unbiased estimate; used by MVD and
  ENUM). Where `k.can_branch`, `k.dual_map(vs)` evaluates the whole dual
  continuation at each of several values (exact enumeration).

Every rule is linear in the tangents and draws no randomness that depends on them,
so JAX can linearize and transpose the estimator into reverse mode.

Example: a new strategy is one class::

    class ScoreOnly(gv.Strategy):
        kind, needs = "REINFORCE", ("sample", "lane_log_prob", "scorable")
        def jvp(self, dist, key, primals, tangents, k):
            x = dist.sample(key, *primals)
            _, score = gv.dual.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
            return k.dual(x).plus(score=score)
"""

from genvi.adev.strategies.reparam import REPARAM, Reparam
from genvi.adev.strategies.enum import ENUM, Enumerate
from genvi.adev.strategies.reinforce import REINFORCE, Reinforce, ReinforceBaseline, decaying_average
from genvi.adev.strategies.mvd import MVD, MeasureValued
from genvi.adev.strategies.rloo import RLOO
from genvi.adev.strategies.sd import SD, StochasticDerivative
from genvi.adev.strategies.disarm import AntitheticBinary, DisARM
from genvi.adev.strategies.swor import SWOR
from genvi.adev.strategies.relax import RELAX

# Strategies without settings are values (gv.MVD); those with settings are classes,
# called (gv.RLOO(4)). Each value's class is named for what it computes.
__all__ = ["AntitheticBinary", "DisARM", "ENUM", "Enumerate", "MVD", "MeasureValued",
           "REINFORCE", "RELAX", "REPARAM", "RLOO", "Reinforce", "ReinforceBaseline", "Reparam",
           "SD", "SWOR", "StochasticDerivative", "decaying_average"]
