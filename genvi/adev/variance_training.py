"""The check that a learned baseline or surrogate trains parameters of its own.

A strategy whose `trains_operands` is set (`gv.RELAX`'s `phi`, a learned
`gv.REINFORCE.with_baseline`; `Strategy.trained_operands` says which operands, so a
`gv.switch` among strategies says it of each) puts on its operands' tangents the gradient of the
estimator's variance (−½ ∂|ĝ|²), not of the objective: the step that ascends the
objective descends the variance in them. That is unbiased only where the parameters
those operands read do not also reach the objective. One that does (a REBAR surrogate
reading the decoder's weights without `jax.lax.stop_gradient`, a baseline network
sharing the encoder's layers) would be trained on the sum, a biased gradient of the
objective, with no sign of it in the numbers.

`check(closed, differentiated, names)` finds such parameters by a dataflow analysis
of the objective's traced jaxpr, once per trace and set of differentiated inputs
(beside the smoothness check), and raises `VarianceTrainingError` naming the site,
the parameter and the fix. Each value is tracked for the differentiated inputs its
tangent can depend on (a bit set):

* integer and boolean values carry none;
* `stop_gradient`, `floor`, `ceil`, `round` and `sign` cut (their derivative is zero);
* a continuous site's value carries its distribution's parameters' (a discrete one's
  none);
* a strategy's operands reach only the strategy.

A parameter reaches the objective where it reaches the objective's value or any
site's distribution (whose score terms move with it).

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> def surrogate(phi, z):
    ...     return phi["w"] * jnp.sum(z)
    >>> @gv.expectation
    ... def e(params):
    ...     phi = {"w": params["theta"]}            # the site's own logit: trained twice
    ...     x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(surrogate, phi)), name="x")
    ...     return jnp.where(x, 1.0, 3.0)
    >>> try:
    ...     e.grad_estimate(jax.random.key(0), {"theta": 0.3})
    ... except gv.VarianceTrainingError as err:
    ...     print(str(err).splitlines()[0])
    gv.RELAX(surrogate, phi) at 'x' (gv.bernoulli) trains params['theta'] for its variance, and the objective depends on it too
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

from genvi.core import jaxpr as jx
from genvi.core.primitives import SiteEqn, sample_p
from genvi.core.rules import ZERO_DERIVATIVE
from genvi.core.strategy import Strategy
from genvi.core.walk import Hooks, scan_fixed_point, walk, while_fixed_point
from genvi.core.address import Address


class VarianceTrainingError(ValueError):
    """A learned baseline's or surrogate's operands read a parameter that the objective
    also depends on, so its variance gradient would bias the objective's."""


def check(closed: Any, differentiated: Sequence[bool], names: Sequence[str]) -> None:
    """Raise `VarianceTrainingError` if a differentiated input of the objective
    `closed` (one flag per input; `names` for messages) reaches both the operands a
    strategy trains for its variance and the objective; otherwise return None."""
    masks = [1 << i if d else 0 for i, d in enumerate(differentiated)]
    if not any(masks):
        return
    analysis = _Reach()
    reached = _union(analysis.run(closed.jaxpr, masks)) | analysis.laws
    for eqn, trained in analysis.trained.values():
        both = trained & reached
        if both:
            _refuse(SiteEqn.of(eqn), [n for i, n in enumerate(names) if both >> i & 1])


class _Reach(Hooks):
    """The dataflow: each variable's bit set of the differentiated inputs its tangent
    can depend on. `trained` collects, per site whose strategy trains its operands (by
    id: the equation and its bit set), what those read, and `laws` what any site's
    distribution reads. Every control-flow equation is walked into (its hooks)."""

    rules = {sample_p: lambda self, i, eqn, ins: [self.site(eqn, ins)],
             # their derivative is zero: they cut
             **{p: lambda self, i, eqn, ins: [0] * len(eqn.outvars) for p in ZERO_DERIVATIVE}}

    def __init__(self) -> None:
        self.trained: dict = {}
        self.laws = 0

    def run(self, jaxpr: Any, in_masks: list) -> list:
        env: dict = dict.fromkeys(jaxpr.constvars, 0)  # constants: no input
        env.update(zip(jaxpr.invars, in_masks))
        return walk(jaxpr, env, self, literal=lambda _: 0)

    def __call__(self, i: int, eqn: Any, ins: list) -> list:
        outs = super().__call__(i, eqn, ins)
        # an integer or boolean value has no tangent
        return [m if jx.is_float_aval(v.aval) else 0 for m, v in zip(outs, eqn.outvars)]

    def interprets(self, eqn: Any, ins: list) -> bool:
        return bool(jx.sub_jaxprs(eqn))

    def other(self, i: int, eqn: Any, ins: list) -> list:
        return [_union(ins)] * len(eqn.outvars)

    unsupported = other

    def call(self, i: int, view: jx.CallEqn, ins: list) -> list:
        return self.run(view.body.jaxpr, ins)

    custom = call   # a custom derivative's body: what its rule differentiates, at most

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> list:
        index, operands = view.split(ins)
        outs = [self.run(b.jaxpr, operands) for b in view.branches]
        return [index | _union(col) for col in zip(*outs)]

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> list:
        return scan_fixed_point(view, ins, self.run, operator.or_)

    def while_(self, i: int, view: jx.WhileEqn, ins: list) -> list:
        carry, pred = while_fixed_point(view, ins, self.run, operator.or_)
        return [c | pred for c in carry]

    def site(self, eqn: Any, ins: list) -> int:
        site = SiteEqn.of(eqn)
        law = _union(ins[:site.n_params])
        self.laws |= law
        operands = ins[site.n_params:len(ins) - site.masked]
        if operands and isinstance(site.strategy, Strategy):
            flags = site.strategy.trained_operands(len(operands))
            trained = _union([m for m, t in zip(operands, flags) if t])
            _, before = self.trained.get(id(eqn), (eqn, 0))
            self.trained[id(eqn)] = (eqn, before | trained)
        return law


def _union(masks: Sequence[int]) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def _refuse(site: SiteEqn, parameters: list) -> None:
    where = repr(str(Address(site.addr))) if site.addr else "an unnamed gv.sample"
    shown = ", ".join(parameters)
    raise VarianceTrainingError(
        f"{site.strategy!r} at {where} ({site.dist.label}) trains {shown} for its variance, "
        f"and the objective depends on {'it' if len(parameters) == 1 else 'them'} too\n"
        "The strategy adds the gradient of its estimator's variance to the tangents of what "
        "its operands read, so a parameter the objective also reads would be trained on the "
        "sum: a biased gradient of the objective. Fixes:\n"
        "  * pass what the objective also uses behind jax.lax.stop_gradient (a REBAR "
        "surrogate reading the model's parameters: phi = {'model': "
        "jax.lax.stop_gradient(params['model']), 'eta': params['eta']});\n"
        "  * give the surrogate or baseline parameters of its own, used nowhere else.")
