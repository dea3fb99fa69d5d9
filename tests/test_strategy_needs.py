"""Strategies declare what they need of a distribution; distributions declare what
they can do. Which strategies a distribution supports is derived, never listed: no
class in `genvi/distributions/` names a strategy, and each built-in distribution's
supported strategies follow from its capabilities (`scorable`, `reparameterized`,
`support`, `mvd_terms`, `sd_terms`) and each strategy's `needs`.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import pytest

import genvi as gv
from genvi.distributions.factor import FACTOR
from genvi.core.strategy import supported_kinds, supports

LIBRARY = pathlib.Path(__file__).resolve().parents[1] / "genvi"

EXPECTED = {  # what each built-in distribution supported when it listed names by hand
    "normal": ("REPARAM", "REINFORCE", "MVD"),
    "mv_normal_diag": ("REPARAM", "REINFORCE", "MVD"),
    "mv_normal": ("REPARAM", "REINFORCE"),
    "uniform": ("REPARAM",),
    "beta": ("REPARAM", "REINFORCE"),
    "gamma": ("REPARAM", "REINFORCE"),
    "dirichlet": ("REPARAM", "REINFORCE"),
    "lognormal": ("REPARAM", "REINFORCE"),
    "halfnormal": ("REPARAM", "REINFORCE"),
    "exponential": ("REPARAM", "REINFORCE"),
    "student_t": ("REPARAM", "REINFORCE"),
    "halfcauchy": ("REPARAM", "REINFORCE"),
    "laplace": ("REPARAM", "REINFORCE"),
    "flip": ("ENUM", "REINFORCE", "MVD", "DisARM", "SD"),
    "bernoulli": ("ENUM", "REINFORCE", "MVD", "DisARM", "SD"),
    "categorical": ("ENUM", "REINFORCE", "MVD", "SD"),
    "geometric": ("REINFORCE", "MVD", "SD"),
    "poisson": ("REINFORCE", "MVD", "SD"),
    "binomial": ("ENUM", "REINFORCE", "MVD", "SD"),   # 0..n, n static
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_supported_strategies_follow_from_capabilities(name):
    dist = getattr(gv, name)
    assert dist.strategies == EXPECTED[name]
    assert supported_kinds(dist) == EXPECTED[name]
    for kind in ("REPARAM", "ENUM", "REINFORCE", "MVD", "DisARM", "SD"):
        assert dist.supports(kind) == (kind in EXPECTED[name])


def test_a_factor_supports_no_strategy():
    assert FACTOR.strategies == ()


def test_no_distribution_names_a_strategy():
    named = []
    for path in sorted((LIBRARY / "distributions").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "attr", getattr(t, "id", None)) == "strategies"
                    for t in node.targets):
                named.append(f"{path.name}:{node.lineno}")
    assert not named, f"distributions list strategies by name: {named}"


def test_every_built_in_strategy_declares_its_needs():
    for s in (gv.REPARAM, gv.REINFORCE, gv.MVD, gv.ENUM, gv.SD, gv.RLOO(2),
              gv.REINFORCE.with_baseline(0.0)):
        assert s.needs, s


def test_a_new_distribution_gets_strategies_from_its_capabilities():
    class Coin(gv.Distribution):
        name = "coin"

        def sample(self, key, p):
            return gv.flip.sample(key, p)

        def lane_log_prob(self, x, p):
            return gv.flip.lane_log_prob(x, p)

        def support(self, p):
            return jnp.array([False, True])

    coin = Coin()
    assert coin.strategies == ("ENUM", "REINFORCE")
    assert supports(coin, gv.ENUM) and not supports(coin, gv.MVD)
    with pytest.raises(ValueError, match=r"gv\.coin does not support the MVD .*'b' \(it needs "
                                         r"mvd_terms of the distribution\); it supports: "
                                         r"gv\.ENUM, gv\.REINFORCE"):
        @gv.gen
        def g():
            return coin(0.3, grad=gv.MVD) @ "b"
        g.simulate(jax.random.key(0))


def test_a_distribution_whose_support_moves_is_refused_reinforce():
    with pytest.raises(ValueError, match=r"gv\.uniform does not support the REINFORCE .*"
                                         r"\(it needs scorable of the distribution\)"):
        @gv.gen
        def g():
            return gv.uniform(0.0, 1.0, grad=gv.REINFORCE) @ "u"
        g.simulate(jax.random.key(0))
