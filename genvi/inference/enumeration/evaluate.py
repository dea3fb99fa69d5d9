"""The one evaluator of enumeration: a traced log density on arrays and tracked values
(`Same`, the replay engine's `Local`, the chain stage's markers), its sum of arrays'
sums kept apart as `Terms`, for the factor and chain stages to read which sites each
term depends on. Lanes that couple, a branch chosen by a site, or a sum over lanes used
other than added up raise `NotSummable`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: jnp.sum(x * 2.0) + 1.0)(jnp.ones(3))
    >>> (out,) = evaluate(closed, [jnp.ones(3)], lazy=True)
    >>> [(jnp.shape(leaf), float(c)) for leaf, c in out.leaves]
    [((3,), 1.0), ((), 1.0)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.rules import ADD, DIV, NEG, REDUCE_SUM, SCALE, SUB, TO_SCALAR
from genvi.core.walk import Hooks, env_of, walk
from genvi.inference.enumeration.same import Same, lazy_broadcast, same_rule
from genvi.inference.enumeration.sites import NotSummable
from genvi.replays.engine import Local, Perturbed, Tracked, is_tracked, rule_for

_SCORE_EACH = ("score each lane inside the gv.vmap/gv.plate body (gv.observe, gv.factor) "
               "instead of using their sum")


@dataclass
class Terms(Tracked):
    """A scalar kept as a sum: Σ_i `coeff_i` · Σ(entries of `leaf_i`)."""

    leaves: tuple   # (leaf, coeff) pairs
    dtype: Any

    def total(self, where: str) -> Any:
        """The sum itself (used other than additively at `where`)."""
        parts = []
        for leaf, coeff in self.leaves:
            if isinstance(leaf, Same) and leaf.plain:
                leaf = leaf.materialized()
            if is_tracked(leaf):
                raise NotSummable(f"a sum over lanes is used by {where}, so the log density "
                                  "is not a sum of per-lane terms; " + _SCORE_EACH)
            parts.append(jnp.sum(leaf) * coeff)
        return jnp.asarray(sum(parts), self.dtype)


def term_leaves(out: Any) -> tuple:
    """The (leaf, coefficient) pairs of a density kept as `Terms`."""
    leaves = _scalar_leaves(out)
    if leaves is None:
        raise NotSummable("the log density keeps their lanes apart")
    return leaves


def whole(x: Any) -> Any:
    """A lane-tracked value (`Same`, `Local`) as the array it stands for."""
    if isinstance(x, Same):
        return x.materialized() if x.plain else x.local().base
    return x.base if isinstance(x, Local) else x


def evaluate(closed: Any, inputs: list, lazy: bool = False,
             evaluator: "Evaluator | None" = None) -> list:
    """Evaluate a closed jaxpr on arrays and tracked values by `evaluator` (default: an
    `Evaluator`, which refuses equations on markers it does not know). Broadcasts that
    do not depend on the sites are held once (`Same`), and broadcast at the end unless
    `lazy`."""
    outs = walk(closed.jaxpr, env_of(closed, inputs), evaluator or Evaluator())
    if lazy:
        return outs
    return [x.materialized() if isinstance(x, Same) and x.plain else x for x in outs]


def _reaches_site(ins: list) -> bool:
    """Whether an operand depends on a summed site (more than a value held once)."""
    return any(is_tracked(x) and not (isinstance(x, Same) and x.plain) for x in ins)


class Evaluator(Hooks):
    """The evaluator's rule on `genvi.core.walk`: sums kept as `Terms`, plain calls
    opened (their sums are terms), a custom derivative's call opened only where a site
    reaches it (its rule stays with it otherwise), every other equation through
    `Same`'s rules and the replay engine's lane rules. What replaces an equation keeps
    its source line and name scopes (the smoothness check reads a log density's
    support tests by them).

    A stage that tracks markers of its own (the chain stage's steps) subclasses it:
    `markers(eqn, ins)` answers an equation on them (None: not one it knows), and
    `scan_sites(view, ins)` a scan that reads them."""

    def __call__(self, i: int, eqn: Any, ins: list) -> Any:
        if any(isinstance(x, Terms) for x in ins):
            out = _terms_rule(eqn, ins)
            if out is not None:
                return [out]
            ins = [x.total(_at(eqn)) if isinstance(x, Terms) else x for x in ins]
        return super().__call__(i, eqn, ins)

    def interprets(self, eqn: Any, ins: list) -> bool:
        return bool(jx.sub_jaxprs(eqn))

    def markers(self, eqn: Any, ins: list) -> list | None:
        return None

    def scan_sites(self, view: jx.ScanEqn, ins: list) -> list | None:
        return self.markers(view.eqn, ins)

    def _opened(self, view: jx.CallEqn, ins: list) -> list:
        with jx.emitted_as(view.eqn):
            return evaluate(view.body, ins, lazy=True, evaluator=self)

    def call(self, i: int, view: jx.CallEqn, ins: list) -> list:
        if len(view.body.jaxpr.invars) == len(ins):
            return self._opened(view, ins)
        return self.unsupported(i, view.eqn, ins)

    def custom(self, i: int, view: jx.CustomEqn, ins: list) -> list:
        if _reaches_site(ins) and len(view.body.jaxpr.invars) == len(ins):
            return self._opened(view, ins)
        return self.unsupported(i, view.eqn, ins)

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> list:
        return self._general(view.eqn, ins, lambda eqn, raw: self.scan_sites(view, raw),
                             control=True)

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> list:
        return self.unsupported(i, view.eqn, ins)

    def while_(self, i: int, view: jx.WhileEqn, ins: list) -> list:
        return self.unsupported(i, view.eqn, ins)

    def unsupported(self, i: int, eqn: Any, ins: list) -> list:
        """Control flow whose branches or steps are not summed lane by lane: evaluated
        whole where no summed site reaches it, refused where one does."""
        return self._general(eqn, ins, self.markers, control=True)

    def other(self, i: int, eqn: Any, ins: list) -> list:
        aval = eqn.outvars[0].aval if eqn.outvars else None
        if eqn.primitive is REDUCE_SUM and aval is not None and aval.shape == ():
            if jx.is_float_aval(aval):
                return [Terms(((ins[0], 1.0),), aval.dtype)]
            x = ins[0]
            if (isinstance(x, (Local, Same)) and not getattr(x, "plain", False)
                    and set(x.axes) & set(jx.reduced_axes(eqn))):
                raise NotSummable(f"their lanes are summed at {_at(eqn)} and the sum is used "
                                  "other than added to the log density: " + _SCORE_EACH)
        return self._general(eqn, ins, self.markers, control=False)

    def _general(self, eqn: Any, ins: list, markers: Callable, control: bool) -> list:
        if not any(is_tracked(x) for x in ins):
            return lazy_broadcast(eqn, ins) or jx.eval_eqn(eqn, ins)
        site = _reaches_site(ins)
        with jx.emitted_as(eqn):
            raw = ins
            if any(isinstance(x, Same) for x in ins):
                outs = same_rule(eqn, ins)
                if outs is not None:
                    return outs
                ins = [x.materialized() if isinstance(x, Same) else x for x in ins]
                if not site:
                    return jx.eval_eqn(eqn, ins)
            # the markers' rules read the operands as they came (a scan's first step
            # reads its initial carry unbroadcast)
            outs = markers(eqn, raw)
            if outs is None:
                if control:
                    raise NotSummable(
                        f"a {jx.name_of(eqn)} at {jx.source_line(eqn)} depends on them; a "
                        "branch or loop chosen by a summed site is not summed lane by lane: "
                        "select values with jnp.where instead, or keep the site")
                rule = rule_for(eqn)
                outs = None if rule is None else rule(eqn, ins)
        if outs is None or any(isinstance(x, Perturbed) for x in outs):
            raise NotSummable(f"their lanes couple at {_at(eqn)}; the log density must be a sum "
                              "of one term per lane, each depending on that lane's discrete "
                              "values only: compute each lane's terms inside the "
                              "gv.vmap/gv.plate body and let the plate add them")
        return outs


def _at(eqn: Any) -> str:
    return f"`{jx.name_of(eqn)}` ({jx.source_line(eqn)})"


def _scalar_leaves(x: Any) -> tuple | None:
    if isinstance(x, Terms):
        return x.leaves
    shape = x.shape if isinstance(x, Same) else jnp.shape(x.base if isinstance(x, Local) else x)
    return ((x, 1.0),) if shape == () else None


def _terms_rule(eqn: Any, ins: list) -> Terms | None:
    """Adding, subtracting, negating, scaling by a constant (a product or a quotient) and
    passing a scalar on keep a `Terms` a sum."""
    aval = eqn.outvars[0].aval
    if aval.shape != ():
        return None
    prim = eqn.primitive
    if prim in ADD or prim in SUB:
        a, b = (_scalar_leaves(x) for x in ins)
        if a is None or b is None:
            return None
        if prim in SUB:
            b = tuple((leaf, -c) for leaf, c in b)
        return Terms(a + b, aval.dtype)
    if prim in NEG:
        return Terms(tuple((leaf, -c) for leaf, c in ins[0].leaves), aval.dtype)
    if prim in SCALE:  # a product or a quotient by a constant
        a, b = ins
        if prim not in DIV and not isinstance(a, Terms):
            a, b = b, a
        if not isinstance(a, Terms) or is_tracked(b) or jnp.ndim(b) != 0:
            return None
        return Terms(tuple((leaf, c / b if prim in DIV else c * b) for leaf, c in a.leaves),
                     aval.dtype)
    if prim in TO_SCALAR and len(ins) == 1:
        return Terms(ins[0].leaves, aval.dtype)
    return None
