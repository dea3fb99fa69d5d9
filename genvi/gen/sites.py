"""What a program's jaxpr says about its sites, and the layout of its choices.

* `site_addresses`, `site_strategies`, `first_observation`, `deterministic_addresses`,
  `auxiliary_addresses`: queries of a traced program (nested bodies included).
* `site_layouts`, `to_user_layout`, `to_interpreter_layout`: the interpreter stacks
  a scan's choices first and a vmap's after; users see batch axes in the order the
  combinators nest (`gv.vmap` of `gv.scan` gives (batch, steps, ...)).

Example:
    >>> import genvi as gv
    >>> from genvi.gen.sites import site_addresses
    >>> @gv.gen
    ... def g():
    ...     gv.normal(0.0, 1.0) @ "x"
    >>> site_addresses(g.jaxpr())
    {('x',)}
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.choices import ChoiceMap
from genvi.core.primitives import SiteEqn, observe_p, site_p
from genvi.distributions.factor import DETERMINISTIC


def first_observation(jaxpr: Any) -> Any:
    """The first `gv.observe` (or `gv.factor`) equation of a program's jaxpr (nested
    bodies included), or None: what makes a program unnormalized (`gv.deterministic`
    does not)."""
    return next((eqn for eqn, _ in jx.equations(jaxpr) if eqn.primitive is observe_p
                 and SiteEqn.of(eqn).dist is not DETERMINISTIC), None)


def deterministic_addresses(jaxpr: Any) -> set:
    """The addresses of a program's `gv.deterministic` values (nested bodies included)."""
    views = (SiteEqn.of(eqn) for eqn, _ in jx.equations(jaxpr) if eqn.primitive is observe_p)
    return {view.addr for view in views if view.dist is DETERMINISTIC}


def deterministic_of(program: Any, args: tuple) -> set:
    """`deterministic_addresses` of a program on `args` (none for a program that is
    not traced to a jaxpr, such as `gv.normalize`)."""
    jaxpr = getattr(program, "jaxpr", None)
    return set() if jaxpr is None else deterministic_addresses(jaxpr(*args))


def without(choices: ChoiceMap, addresses: set) -> ChoiceMap:
    """`choices` less `addresses`: a guide's draws less its `gv.deterministic` values,
    before the model (which does not have them) scores the draws."""
    if not addresses:
        return choices
    return ChoiceMap({a: v for a, v in choices.flat().items() if a not in addresses})


def site_addresses(jaxpr: Any) -> set:
    """Every address a jaxpr (and its nested bodies) may sample."""
    return {SiteEqn.of(eqn).addr for eqn, _ in jx.equations(jaxpr) if eqn.primitive is site_p}


def auxiliary_addresses(jaxpr: Any) -> set:
    """The addresses of a program's auxiliary sites: scored in its density, not among
    its choices (a NumPyro autoguide's joint latent, `infer={"is_auxiliary": True}`)."""
    return {site.addr for site in (SiteEqn.of(eqn) for eqn, _ in jx.equations(jaxpr)
                                   if eqn.primitive is site_p) if site.auxiliary}


def site_strategies(jaxpr: Any) -> dict:
    """{address: strategy (None if none)} of every site of a program's jaxpr."""
    sites = (SiteEqn.of(eqn) for eqn, _ in jx.equations(jaxpr) if eqn.primitive is site_p)
    return {site.addr: site.strategy for site in sites}


def site_layouts(jaxpr: Any) -> dict:
    """{address: (combinator nest, number of enclosing scan equations)} of every site
    (named observations too)."""
    sites = ((SiteEqn.of(eqn), scans) for eqn, scans in jx.equations(jaxpr)
             if eqn.primitive in (site_p, observe_p))
    return {site.addr: (site.nest, scans) for site, scans in sites if site.addr}


def _permutation(nest: tuple, depth: int) -> list | None:
    """Axis order taking the interpreter's layout (scan axes, then vmap axes) to the
    nesting order of the combinators, or None when it is already that (or unknown:
    scans not made by gv.scan)."""
    if nest.count("scan") != depth or "scan" not in nest or "vmap" not in nest:
        return None
    scans, vmaps = iter(range(depth)), iter(range(depth, len(nest)))
    perm = [next(scans) if kind == "scan" else next(vmaps) for kind in nest]
    return None if perm == sorted(perm) else perm


def to_user_layout(choices: dict, layouts: dict) -> dict:
    """Choices with batch axes in the order the combinators nest (`gv.vmap` of
    `gv.scan` gives (batch, steps, ...), as its return value does)."""
    out = {}
    for addr, v in choices.items():
        perm = _permutation(*layouts[addr]) if addr in layouts else None
        out[addr] = v if perm is None else jnp.transpose(v, perm + list(range(len(perm), v.ndim)))
    return out


def to_interpreter_layout(choices: dict, layouts: dict) -> dict:
    """The inverse of `to_user_layout`."""
    out = {}
    for addr, v in choices.items():
        perm = _permutation(*layouts[addr]) if addr in layouts else None
        if perm is not None:
            inverse = [perm.index(i) for i in range(len(perm))]
            v = jnp.transpose(v, inverse + list(range(len(perm), jnp.ndim(v))))
        out[addr] = v
    return out
