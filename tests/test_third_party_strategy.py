"""A gradient strategy written outside genvi, with public names only, works like a
built-in one: antithetic REINFORCE for `gv.flip`.

Each lane draws u ~ U(0, 1) and takes x = [u < p] and its antithetic partner
x' = [1 − u < p] (both Bernoulli(p), negatively correlated). The gradient estimate is
½ f(x) ∂log p(x) + ½ f(x with this lane := x') ∂log p(x'), lane by lane: unbiased,
since x' has the law of x whatever the other lanes hold. The second half is a replay
of the rest of the objective (`plus_replays`), which genvi evaluates lane-locally in
a plate and Markov-locally in a scan where it can, as it does for MVD.

The strategy declares what it needs of a distribution once (`needs`), so every
distribution with `sample` and `lane_log_prob` supports it; genvi's own code names
it nowhere. It is checked against enumeration at a site, in a `gv.plate` and in a
`gv.scan`, with the mean of many independent estimates within 5 standard errors.
A strategy's dynamic operand that is not lane-shaped (`lane_operands`) reaches its
rule with the plates' axes only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from programs import flip_chain_expectation

F32 = jnp.float32
KEYS = jax.random.split(jax.random.key(7), 20_000)


class AntitheticReinforce(gv.Strategy):
    """½ [f(x) ∂log p(x) + f(x') ∂log p(x')] per lane, x' antithetic to x."""

    kind = "ANTITHETIC"
    needs = ("sample", "lane_log_prob")

    def jvp(self, dist, key, primals, tangents, k):
        (p,) = primals
        shape = jnp.shape(dist.sample(key, *primals))
        u = jax.random.uniform(key, shape)
        x, partner = u < p, (1.0 - u) < p
        if all(t is None for t in tangents):
            return k.dual(x)
        _, here = gv.dual.jvp(lambda *q: dist.lane_log_prob(x, *q), primals, tangents)
        _, there = gv.dual.jvp(lambda *q: dist.lane_log_prob(partner, *q), primals, tangents)
        here = jnp.broadcast_to(here, shape)
        there = jnp.broadcast_to(there, shape)
        return k.dual(x).plus(score=0.5 * jnp.sum(here)).plus_replays(
            partner[None], 0.5 * there[None])


ANTI = AntitheticReinforce()


def assert_unbiased(samples, exact, what):
    samples, exact = np.asarray(samples, np.float64), np.asarray(exact, np.float64)
    mean = samples.mean(0)
    se = samples.std(0, ddof=1) / math.sqrt(samples.shape[0])
    z = np.abs(mean - exact) / (se + 1e-9)
    assert np.all(z < 5), f"{what}: mean {mean}, exact {exact}, se {se}, z {z}"


def estimates(objective, *args):
    run = jax.jit(jax.vmap(lambda k: objective.value_and_grad_estimate(
        k, *args, argnums=tuple(range(len(args))))))
    return run(KEYS)


def test_supported_where_its_needs_are_met_and_refused_elsewhere():
    class NeedsMore(AntitheticReinforce):
        needs = ("sample", "lane_log_prob", "no_such_method")

    def program(strategy):
        @gv.gen
        def g():
            return gv.flip(0.5, grad=strategy) @ "b"
        return g

    program(ANTI).simulate(jax.random.key(0))
    with pytest.raises(ValueError, match=r"gv\.flip does not support the ANTITHETIC .*"
                                         r"no_such_method"):
        program(NeedsMore()).simulate(jax.random.key(0))


def test_unbiased_at_a_site():
    @gv.expectation
    def objective(t):
        b = gv.sample(gv.flip(jax.nn.sigmoid(t), grad=ANTI)).astype(F32)
        return jnp.sin(2.0 * b + t) ** 2

    def exact(t):
        p = jax.nn.sigmoid(t)
        return p * jnp.sin(2.0 + t) ** 2 + (1 - p) * jnp.sin(t) ** 2

    t = F32(0.4)
    values, (grads,) = estimates(objective, t)
    assert_unbiased(values, exact(t), "value")
    assert_unbiased(grads, jax.grad(exact)(t), "gradient")


@gv.gen
def lane(p):
    return gv.flip(p, grad=ANTI) @ "b"


C = jnp.array([0.9, -0.4, 0.7, 0.3], F32)


def test_unbiased_in_a_plate():
    @gv.expectation
    def objective(p):
        cm, _ = gv.plate(lane, size=4).sim(p)
        return jnp.cos(jnp.sum(cm["b"].astype(F32) * C)) ** 2

    def exact(p):
        total = 0.0
        for bits in itertools.product([0.0, 1.0], repeat=4):
            b = jnp.array(bits)
            total = total + jnp.prod(jnp.where(b > 0, p, 1 - p)) * jnp.cos(jnp.sum(b * C)) ** 2
        return total

    p = jnp.array([0.2, 0.5, 0.7, 0.9], F32)
    values, (grads,) = estimates(objective, p)
    assert_unbiased(values, exact(p), "value")
    assert_unbiased(grads, jax.grad(exact)(p), "gradient")


@gv.gen
def chain_step(t, _):
    b = gv.flip(jax.nn.sigmoid(t), grad=ANTI) @ "b"
    return t + jnp.where(b, 0.5, -0.5), b


def test_unbiased_in_a_scan():
    weights = jnp.array([1.0, 0.5, -0.7], F32)

    @gv.expectation
    def objective(t):
        cs, _ = gv.scan(chain_step, length=3).sim(t, None)
        return jnp.sin(jnp.sum(cs["b"].astype(F32) * weights) + 0.3)

    def exact(t):
        return flip_chain_expectation(t, lambda path: jnp.sin(jnp.dot(path, weights) + 0.3))

    t = F32(0.3)
    values, (grads,) = estimates(objective, t)
    assert_unbiased(values, exact(t), "value")
    assert_unbiased(grads, jax.grad(exact)(t), "gradient")


def test_a_masked_site_refuses_a_hook_it_cannot_mask():
    """At a site in an untaken branch of a batched cond, the distribution's density
    hooks are masked; a method genvi does not know how to mask is refused by name
    rather than handed over unmasked (masked lanes would leak gradient)."""
    from genvi.core.primitives import Masked

    class Tilted(type(gv.flip)):
        name = "tilted"

        def my_terms(self, x, p):
            return jnp.ones_like(p)

    masked = Masked(Tilted(), jnp.array([True, False]))
    assert float(masked.log_prob(jnp.array([True, True]), jnp.array([0.5, 0.5]))) == pytest.approx(
        math.log(0.5))
    masked.sample(jax.random.key(0), jnp.array([0.5, 0.5]))  # mask-free: forwarded
    with pytest.raises(AttributeError, match=r"gv\.tilted\.my_terms .* masked site"):
        masked.my_terms


SEEN: list = []


@dataclasses.dataclass(frozen=True, eq=False)
class WithOperand(gv.Strategy):
    """REINFORCE carrying a dynamic operand `c`, noting the shape its rule receives;
    `lanes` says whether `c` is lane-shaped."""

    c: Any = None
    lanes: bool = True
    kind = "WITH_OPERAND"
    needs = ("sample", "lane_log_prob")

    def split(self):
        return dataclasses.replace(self, c=None), (self.c,)

    def join(self, operands, tangents=None):
        return dataclasses.replace(self, c=operands[0])

    def lane_operands(self, count):
        return (self.lanes,) * count

    def jvp(self, dist, key, primals, tangents, k):
        SEEN.append(jnp.shape(self.c))
        x = dist.sample(key, *primals)
        if all(t is None for t in tangents):
            return k.dual(x)
        _, score = gv.dual.jvp(lambda *q: jnp.sum(dist.lane_log_prob(x, *q)), primals, tangents)
        return k.dual(x).plus(score=score)


@pytest.mark.parametrize("lanes,seen", [(True, (3, 1)), (False, (3,))])
def test_an_operand_that_is_not_lane_shaped_gains_the_plates_axes_only(lanes, seen):
    # 3 datapoints, each a latent vector of 2: a lane-shaped operand is padded to
    # broadcast against the vector's lanes, one that is not keeps the plate's axis only
    @gv.expectation
    def objective(logits):
        def point(row):
            return gv.sample(gv.bernoulli(logits=row, grad=WithOperand(jnp.float32(1.0), lanes)))
        return jnp.sum(jax.vmap(point)(logits) * 1.0)
    SEEN.clear()
    objective.grad_estimate(jax.random.key(0), jnp.zeros((3, 2), F32))
    assert SEEN and all(shape == seen for shape in SEEN)


# -- a third-party pathwise strategy, written from docs/extending.md -----------------


class Pathwise(gv.Strategy):
    """The pathwise derivative through a differentiable sampler, declared `pathwise`:
    genvi then checks that the drawn value reaches no discontinuity, as for REPARAM."""

    kind = "MY_PATHWISE"
    needs = ("sample", "reparameterized")
    pathwise = True

    def jvp(self, dist, key, primals, tangents, k: gv.Continuation) -> gv.Continued:
        x, dx = gv.dual.jvp(lambda *p: dist.sample(key, *p), primals, tangents)
        return k.dual(x, dx)


def test_a_pathwise_strategy_is_unbiased_at_a_site():
    # d/dm E[x²], x ~ N(m, 1) = 2m
    @gv.expectation
    def square(m):
        return gv.sample(gv.normal(m, 1.0, grad=Pathwise())) ** 2

    values, (grads,) = estimates(square, F32(0.7))
    assert_unbiased(values, 0.7**2 + 1.0, "value")
    assert_unbiased(grads, 2 * 0.7, "gradient")


@pytest.mark.parametrize("strategy", [gv.REPARAM, Pathwise()], ids=["REPARAM", "third-party"])
def test_a_pathwise_strategy_is_refused_at_a_discontinuity_as_reparam_is(strategy):
    @gv.expectation
    def step(m):
        x = gv.sample(gv.normal(m, 1.0, grad=strategy), name="x")
        return jnp.where(x > 0, 1.0, 0.0)

    with pytest.raises(gv.DiscontinuityError, match=(
            rf"drawn with a pathwise strategy at 'x' \(gv.normal, grad={strategy!r}\) "
            r"reaches a discontinuity: `select_n`")):
        step.grad_estimate(jax.random.key(0), 0.0)


def test_a_strategy_that_is_not_pathwise_is_not_checked_for_discontinuities():
    class NotDeclared(Pathwise):   # the same rule, undeclared: genvi trusts the declaration
        pathwise = False

    @gv.expectation
    def step(m):
        return jnp.where(gv.sample(gv.normal(m, 1.0, grad=NotDeclared())) > 0, 1.0, 0.0)

    assert float(step.grad_estimate(jax.random.key(0), 0.0)) == 0.0


def test_the_interpreter_continuation_implements_the_public_protocol():
    seen = []

    class Look(Pathwise):
        def jvp(self, dist, key, primals, tangents, k):
            seen.append(k)
            return super().jvp(dist, key, primals, tangents, k)

    gv.expectation(lambda m: gv.sample(gv.normal(m, 1.0, grad=Look()))).grad_estimate(
        jax.random.key(0), 0.0)
    (k,) = seen
    assert isinstance(k, gv.Continuation)
    # every public member of the interpreter's continuation is part of the protocol
    public = {n for n in dir(type(k)) if not n.startswith("_")}
    protocol = {n for n in dir(gv.Continuation) if not n.startswith("_")} | {"can_branch"}
    assert public <= protocol, public - protocol
    assert isinstance(k.dual(jnp.zeros(())), gv.Continued)


def test_auto_and_tuning_read_declarations_not_names():
    from genvi.auto import choices as auto

    class MyScore(AntitheticReinforce):     # a score-function strategy of another name
        kind = "MINE"
        score_function = True

    assert gv.RLOO(2).score_function and gv.REINFORCE.score_function
    assert not any(s.score_function for s in (gv.REPARAM, gv.MVD, gv.ENUM, gv.SD, gv.DisARM))
    assert gv.REPARAM.pathwise and not MyScore.pathwise
    assert gv.switch(jnp.int32(0), [gv.REPARAM, gv.REINFORCE]).pathwise
    assert auto.candidates(gv.flip) == (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD)
