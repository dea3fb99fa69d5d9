"""The smoothness check: a REPARAM value may reach only continuous uses.

REPARAM differentiates the sampler pathwise, which is unbiased only when the rest of
the objective is continuous (and a.e. differentiable) in the drawn value: the
programmable-VI paper's λ_ADEV type system refuses a reparameterized value that
flows into a discontinuity. `check(closed, differentiated)` is that discipline as a
dataflow analysis of an objective's traced jaxpr, run once per trace and set of
differentiated inputs. Each value is tracked for what it depends on:

* a REPARAM draw (a `sample_p` site with a REPARAM strategy), and
* the differentiated parameters (directly, or through a REPARAM site's parameters);

a jump is biased only where it depends on both (the draw's law moves with the
parameters, so the jump's location does): `1(x > 0) · θ` with x's law free of θ is
fine, `1(x > 0)` with x ~ N(θ, 1), or `1(u < θ)` with u ~ U(0, 1), is not. Such a
value reaching `floor`/`ceil`/`round`/`sign`/`rem`, an integer cast,
`argmax`/`argmin`/`argsort`, or a comparison of it (a *step*) reaching anything that
turns it back into a value (a `select_n` predicate, a `cond`/`switch` index, a
`while` predicate, a float cast, an index, a distribution's parameter) is refused with
an error that names the site, the primitive, the user's source line and the fixes.
`estimate` (nothing differentiated) is never refused.

Not uses: code inside a distribution's log density (its support checks; genvi
computes densities under the `genvi_density` name scope), guards (`is_finite`, and
`==` / `!=` of a continuous value, e.g. `jnp.where(s == 0, 1.0, s)` or `isnan`: their
answer changes on a set of probability zero, which moves no mass), code
whose result is never used, functions with a user-defined derivative (`custom_jvp`,
`custom_vjp`: their rule is the user's statement), and code under
`gv.assume_continuous()`, the documented opt-out.

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.expectation
    ... def step(mu):
    ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM), name="x")
    ...     return jnp.where(x > 0, 1.0, 0.0)
    >>> try:
    ...     step.grad_estimate(jax.random.key(0), 0.0)
    ... except gv.DiscontinuityError as e:
    ...     print(str(e).splitlines()[0])  # doctest: +ELLIPSIS
    the value drawn with a pathwise strategy at 'x' (gv.normal, grad=gv.REPARAM) reaches a discontinuity: `select_n` (jnp.where / lax.select) chooses by a comparison of it (`gt` at ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


from genvi.core import jaxpr as jx
from genvi.core.primitives import SAMPLES, SiteEqn, sample_p
from genvi.core.rules import (COMPARISONS, CONVERT_ELEMENT_TYPE, EQUALITIES, IS_FINITE, LOGIC,
                              SELECT_N, SORT, STEP_FUNCTIONS)
from genvi.core.walk import Hooks, scan_fixed_point, walk, while_fixed_point
from genvi.core.scopes import CONTINUOUS_SCOPE, DENSITY_SCOPE
from genvi.core.address import Address


class DiscontinuityError(ValueError):
    """A value drawn with a pathwise strategy (`Strategy.pathwise`, as `gv.REPARAM`)
    reaches a discontinuous use (see `gv.assume_continuous`)."""


# -- the rules: which primitives are discontinuous, which make steps -----------------

_STEP_FUNCTIONS = {  # how a user writes each of `STEP_FUNCTIONS` (the messages)
    "floor": "jnp.floor", "ceil": "jnp.ceil", "round": "jnp.round", "sign": "jnp.sign",
    "rem": "jnp.mod / %", "nextafter": "jnp.nextafter", "argmax": "jnp.argmax",
    "argmin": "jnp.argmin",
}
_WHAT = {"select_n": "jnp.where / lax.select", "cond": "lax.cond / lax.switch",
         "while": "a while loop's predicate", "convert_element_type": "a cast to float",
         "gather": "an index", "dynamic_slice": "an index",
         "dynamic_update_slice": "an index", "scatter": "an index",
         "scatter-add": "an index", "genvi_sample": "a distribution's parameter"}


@dataclass(frozen=True)
class _Taint:
    """What a variable depends on: a REPARAM draw (`site`, for messages), the
    differentiated parameters (`param`), and whether it is a *step* (`step`: the
    comparison that made it) of a value depending on both.

    Only that conjunction is biased: a jump in a draw that does not move with the
    parameters (`1(x > 0) · θ` with x's law free of θ) or a jump in the parameters
    alone (a deterministic function, differentiable a.e.) keeps REPARAM unbiased."""

    site: str | None = None
    dist: str | None = None
    param: bool = False
    step: Any = None
    step_at: Any = None  # the equation whose source line shows the step (see `_analyze`)

    @property
    def is_step(self) -> bool:
        return self.step is not None

    @property
    def moves(self) -> bool:
        """A function of a REPARAM draw whose law moves with the parameters."""
        return self.site is not None and self.param

    def smooth(self) -> "_Taint":
        return _Taint(self.site, self.dist, self.param)

    def stepped(self, eqn: Any, at: Any) -> "_Taint":
        return _Taint(self.site, self.dist, self.param, eqn, at or eqn)


def _merge(taints: list) -> "_Taint | None":
    taints = [t for t in taints if t is not None]
    if not taints:
        return None
    drawn = next((t for t in taints if t.site is not None), taints[0])
    step = next((t for t in taints if t.is_step), None)
    return _Taint(drawn.site, drawn.dist, any(t.param for t in taints),
                  step and step.step, step and step.step_at)


_PARAM = _Taint(param=True)


def check(closed: Any, differentiated: Sequence[bool]) -> None:
    """Raise `DiscontinuityError` if a REPARAM value whose law moves with the
    `differentiated` inputs of the objective `closed` (a closed jaxpr; one flag per
    input) reaches a discontinuous use; otherwise return None."""
    jaxpr = closed.jaxpr
    _analyze(jaxpr, [_PARAM if d else None for d in differentiated], False)


def _analyze(jaxpr: Any, in_taints: list, trusted: bool, at: Any = None) -> list:
    """Propagate taints through `jaxpr`; returns the outputs' taints. `trusted`: the
    code is under a density or assume_continuous scope (no refusals). `at`: the call
    equation whose source line messages show (a jitted helper's body, e.g.
    `jnp.where`'s, is cached with the line of its first caller)."""
    env: dict = dict.fromkeys(jaxpr.constvars)  # constants carry no taint
    env.update(zip(jaxpr.invars, in_taints))
    live = jx.live_equations(jaxpr, kept=SAMPLES)   # a site is live: it draws
    return walk(jaxpr, env, _Taints(trusted, live, at), literal=lambda _: None)


def _scoped(eqn: Any) -> bool:
    stack = jx.name_stack(eqn)
    return DENSITY_SCOPE in stack or CONTINUOUS_SCOPE in stack


class _Taints(Hooks):
    """One walk of the analysis: each equation's outputs' taints from its operands'.
    `live[i]`: whether equation i is live (refusals are made only there); `trusted`
    and `at` as `_analyze`'s. Every control-flow equation is walked into (its hooks)
    but a custom derivative, taken as continuous (its rule is the user's word)."""

    rules = {sample_p: lambda self, i, eqn, ins: [
        _sample_taint(eqn, ins, self.trusts(eqn), self.live[i], self.at)]}

    def __init__(self, trusted: bool, live: Sequence[bool], at: Any):
        self.trusted, self.live, self.at = trusted, live, at

    def trusts(self, eqn: Any) -> bool:
        return self.trusted or _scoped(eqn)

    def interprets(self, eqn: Any, ins: list) -> bool:
        return bool(jx.sub_jaxprs(eqn))

    def _walker(self, eqn: Any) -> Any:
        trusted = self.trusts(eqn)
        return lambda jaxpr, ins: _analyze(jaxpr, ins, trusted, self.at)

    def call(self, i: int, view: jx.CallEqn, ins: list) -> list:
        return _analyze(view.body.jaxpr, ins, self.trusts(view.eqn), self.at or view.eqn)

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> list:
        if _decides(ins[0]) and self.live[i] and not self.trusts(view.eqn):
            _refuse(view.eqn, ins[0], self.at)
        outs = [self._walker(view.eqn)(b.jaxpr, ins[1:]) for b in view.branches]
        return [_merge([ins[0]] + list(col)) for col in zip(*outs)]

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> list:
        return scan_fixed_point(view, ins, self._walker(view.eqn), _join)

    def while_(self, i: int, view: jx.WhileEqn, ins: list) -> list:
        carry, pred = while_fixed_point(view, ins, self._walker(view.eqn), _join)
        if _decides(pred) and self.live[i] and not self.trusts(view.eqn):
            _refuse(view.eqn, pred, self.at)
        return carry

    def custom(self, i: int, view: jx.CustomEqn, ins: list) -> list:
        return self.unsupported(i, view.eqn, ins)

    def unsupported(self, i: int, eqn: Any, ins: list) -> list:
        merged = _merge(ins)
        return [None if merged is None else merged.smooth()] * len(eqn.outvars)

    def other(self, i: int, eqn: Any, ins: list) -> list:
        prim, n_out, at = eqn.primitive, len(eqn.outvars), self.at
        live = self.live[i]
        merged = _merge(ins)
        if merged is None:
            return [None] * n_out
        if self.trusts(eqn):
            return [merged.smooth()] * n_out
        if prim is IS_FINITE or (prim in EQUALITIES and not merged.is_step):
            # a guard (x == c, isnan, isinf): its answer changes on a set of probability
            # zero for a continuous draw, so it moves no mass with the parameters
            return [None] * n_out
        if prim in COMPARISONS:
            return [merged.stepped(eqn, at) if merged.moves or merged.is_step else merged] * n_out
        if prim is SELECT_N:
            if _decides(ins[0]) and live:
                _refuse(eqn, ins[0], at)
            cases = _merge(ins[1:])
            return [None if cases is None else cases.smooth()]
        if prim in STEP_FUNCTIONS or _argsort(eqn, ins) or _to_integer(eqn):
            if merged.moves and live:
                _refuse(eqn, merged, at)
            return [merged] * n_out
        if merged.is_step:
            if prim in LOGIC or not any(jx.is_float_aval(v.aval) for v in eqn.outvars):
                return [merged] * n_out  # still a step: logic, integer arithmetic
            if live:
                _refuse(eqn, merged, at)
        return [merged.smooth()] * n_out


def _decides(t: "_Taint | None") -> bool:
    """Whether a predicate or index jumps with a draw that moves with the parameters."""
    return t is not None and (t.is_step or t.moves)


def _sample_taint(eqn: Any, ins: list, trusted: bool, live: bool, at: Any) -> "_Taint | None":
    site = SiteEqn.of(eqn)
    n = site.n_params
    params = _merge(ins[:n])
    if params is not None and params.is_step and live and not trusted:
        _refuse(eqn, params, at)
    if not getattr(site.strategy, "pathwise", False):
        return None  # a fresh draw: its dependence on the parameters is a score term
    where = repr(str(Address(site.addr))) if site.addr else "an unnamed gv.sample"
    return _Taint(where, f"gv.{site.dist.name}, grad={site.strategy!r}",
                  params is not None and params.param)


def _join(a: "_Taint | None", b: "_Taint | None") -> "_Taint | None":
    return _merge([a, b])


def _argsort(eqn: Any, ins: list) -> bool:
    """A sort that carries other operands along a sorted key: argsort's indices."""
    return eqn.primitive is SORT and len(eqn.invars) > jx.sort_keys(eqn)


def _to_integer(eqn: Any) -> bool:
    """A cast of a float to an integer or boolean type."""
    if eqn.primitive is not CONVERT_ELEMENT_TYPE:
        return False
    return jx.is_float_aval(eqn.invars[0].aval) and not jx.is_float_aval(eqn.outvars[0].aval)


def _refuse(eqn: Any, taint: _Taint, at: Any) -> None:
    name = jx.name_of(eqn)
    what = _WHAT.get(name, _STEP_FUNCTIONS.get(name, ""))
    shown = f"`{name}`" + (f" ({what})" if what else "")
    if taint.is_step and taint.step is not eqn:
        how = (f"{shown} chooses by a comparison of it (`{jx.name_of(taint.step)}` at "
               f"{jx.source_line(taint.step_at)})")
    else:
        how = f"{shown} is a step function of it"
    raise DiscontinuityError(
        f"the value drawn with a pathwise strategy at {taint.site} ({taint.dist}) reaches a "
        "discontinuity: "
        f"{how}\n  at {jx.source_line(at or eqn)}\n"
        "A pathwise gradient (through the drawn value, as gv.REPARAM's) misses the jump, so "
        "it would be biased (e.g. zero for E[1(x > 0)]). Fixes:\n"
        f"  * give the site at {taint.site} a strategy that does not differentiate through the "
        "value: grad=gv.REINFORCE (or gv.MVD where the distribution supports it);\n"
        "  * replace the discontinuity by a smooth relaxation (e.g. jax.nn.sigmoid(x / t) for "
        "x > 0);\n"
        "  * if the code is continuous in the value after all (e.g. jnp.where(x > 0, x, 0)), "
        "or its jump does not move with the parameters, wrap it in "
        "`with gv.assume_continuous():`.")
