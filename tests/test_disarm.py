"""`gv.DisARM` (Dong, Mnih and Tucker 2020) at flip and Bernoulli sites in its three
forms (the default, `.per_lane()` and `.whole_site()`, one partner for the whole
site), and which form the default takes (lane by lane where the replays are
lane-local, whole-site where the rest couples the lanes): value and gradient
against exact enumeration, 2·10⁴ estimates each, within 5 standard errors, at a single
site, at coupled sites, at one site's coupled lanes, in a plate (lane-local), under
`gv.batch_mean` (a latent vector per datapoint), in a plate of latent vectors and an
IWELBO's particles (one partner per datapoint or particle) and in a scan
(Markov-local); the same
sample size fails a variant whose partner is drawn independently (no antithetic
coupling) and one without the σ(|α|) weighting; its variance against REINFORCE with RLOO(2),
which also evaluates the rest of the objective twice; refusals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from binary_cases import (FLIP_PLATE_LOGITS, FLIP_PLATE_Y, GUIDE, THETA, XS, coupled_lanes,
                          datapoint_elbos, exact_coupled_lanes, exact_flip_plate_elbo,
                          exact_latent_vector_iwelbo, exact_markov_chain, exact_single_flip,
                          flip_plate_guide, flip_plate_model, latent_vector_iwelbo,
                          latent_vector_plate_elbo, latent_vector_programs, markov_chain, sig,
                          single_flip)
from estimates import N, biased_parts, exact_by_enumeration, moments, within
from genvi.adev import dual as d


FORMS = (gv.DisARM, gv.DisARM.per_lane(), gv.DisARM.whole_site())
EACH_FORM = pytest.mark.parametrize("strategy", FORMS, ids=repr)


@EACH_FORM
def test_single_site_value_and_gradient_are_unbiased(strategy):
    v, v_se, g, g_se, _ = moments(single_flip(strategy), THETA)
    value, grad = exact_single_flip(THETA)
    assert within(v, v_se, value) and within(g, g_se, grad), (v, g, value, grad)


@EACH_FORM
def test_bernoulli_logits_at_coupled_sites(strategy):
    @gv.expectation
    def f(theta):
        a = gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=strategy))
        b = gv.sample(gv.bernoulli(logits=theta / 2 + 1.5 * a - 0.5, grad=strategy))
        return (2.0 * a - b + 0.5) ** 2 + theta * b

    def value_of(th, z):
        a, b = z
        pa = sig(th) if a else 1 - sig(th)
        qb = sig(th / 2 + 1.5 * a - 0.5)
        return [pa, qb if b else 1 - qb], (2 * a - b + 0.5) ** 2 + th * b
    v, v_se, g, g_se, _ = moments(f, THETA)
    value, grad = exact_by_enumeration(value_of, THETA, 2)
    assert within(v, v_se, value) and within(g, g_se, grad), (v, g, value, grad)


@EACH_FORM
def test_coupled_lanes_of_one_site_are_unbiased(strategy):
    v, v_se, g, g_se, _ = moments(coupled_lanes(strategy), THETA)
    value, grad = exact_coupled_lanes(THETA)
    assert within(v, v_se, value) and within(g, g_se, grad), (v, g, value, grad)


def test_an_elbo_with_a_plate_guide_is_unbiased():
    obj = gv.elbo(flip_plate_model, flip_plate_guide(gv.DisARM))
    logits, y = FLIP_PLATE_LOGITS, FLIP_PLATE_Y
    keys = jax.random.split(jax.random.key(5), N)
    v, g = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, logits, y)))(keys)
    v, g = np.asarray(v, np.float64), np.asarray(g, np.float64)  # g: [N, lanes]
    assert within(v.mean(), v.std() / math.sqrt(N), float(exact_flip_plate_elbo(logits)))
    assert within(g.mean(0), g.std(0) / math.sqrt(N),
                  np.asarray(jax.grad(exact_flip_plate_elbo)(logits)))


W = jnp.array([[1.5, -1.0, 0.5], [-0.5, 2.0, 1.0]])  # 3 binary latents -> 2-D observations


def latent_vector_elbo(strategy):
    """The binary VAE's shape: one latent vector per datapoint read by a decoder, the
    batch mean of ELBOs."""
    return gv.batch_mean(gv.elbo(*latent_vector_programs(strategy)))


def test_whole_site_pairs_per_datapoint_under_batch_mean():
    def exact(params):
        return jnp.mean(datapoint_elbos(params))
    for strategy in FORMS:
        assert biased_parts(latent_vector_elbo(strategy), exact, GUIDE, XS, seed=7) == [], strategy


def test_in_a_plate_of_latent_vectors_the_default_pairs_each_datapoint_whole():
    # the decoder couples a datapoint's lanes, not the datapoints: the default flips
    # each datapoint's vector to its partner with the others kept (one lane-local
    # replay per datapoint), unbiased, and not the whole site's form
    def exact(params):
        return jnp.sum(datapoint_elbos(params))
    obj = latent_vector_plate_elbo(gv.DisARM)
    assert "1 × 3 lanes: lane-local" in str(obj.explain(GUIDE, XS))
    key = jax.random.key(2)
    whole = latent_vector_plate_elbo(gv.DisARM.whole_site()).grad_estimate(key, GUIDE, XS)
    assert not np.array_equal(obj.grad_estimate(key, GUIDE, XS)["A"], whole["A"])
    assert biased_parts(obj, exact, GUIDE, XS, seed=8) == []


def test_in_an_iwelbo_the_default_pairs_each_particle_whole():
    # the particles are the site's batch axis, and they meet only in the log-mean-exp:
    # each particle's vector flips to its partner, the other particles kept
    obj = latent_vector_iwelbo(gv.DisARM)
    assert "1 × 2 lanes: lane-local" in str(obj.explain(GUIDE, XS[0]))
    assert biased_parts(obj, exact_latent_vector_iwelbo, GUIDE, XS[0], seed=1) == []


def test_the_default_form_follows_what_lane_by_lane_replays_cost():
    # a decoder reading the latent vector: a lane's replay runs it again, so the
    # default takes the whole-site form: the same estimate as `.whole_site()`'s
    key = jax.random.key(3)
    vae = {s: latent_vector_elbo(s) for s in FORMS}
    grads = {s: vae[s].grad_estimate(key, GUIDE, XS) for s in FORMS}
    for leaf in ("A", "c"):
        np.testing.assert_array_equal(grads[gv.DisARM][leaf], grads[gv.DisARM.whole_site()][leaf])
    # deciding traced the lane-by-lane replays under eval_shape: nothing of them is left
    program = {s: str(jax.make_jaxpr(lambda p, s=s: vae[s].grad_estimate(key, p, XS))(GUIDE))
               for s in (gv.DisARM, gv.DisARM.whole_site())}
    assert program[gv.DisARM] == program[gv.DisARM.whole_site()]
    assert "the rest couples the lanes" in str(vae[gv.DisARM].explain(GUIDE, XS))
    assert "lane-local" in str(vae[gv.DisARM.per_lane()].explain(GUIDE, XS))
    # five lanes reduced to numbers before they meet: lane by lane, as `.per_lane()`
    plate = {s: coupled_lanes(s) for s in FORMS}
    grads = {s: plate[s].grad_estimate(key, THETA) for s in FORMS}
    assert grads[gv.DisARM] == grads[gv.DisARM.per_lane()] != grads[gv.DisARM.whole_site()]
    assert "1 × 5 lanes: lane-local" in str(plate[gv.DisARM].explain(THETA))


@EACH_FORM
def test_in_a_scan_markov_chain_is_unbiased(strategy):
    v, v_se, g, g_se, _ = moments(markov_chain(strategy), THETA)
    value, grad = exact_markov_chain(THETA)
    assert within(v, v_se, value) and within(g, g_se, grad), (v, g, value, grad)


class IndependentPartner(gv.Strategy):
    """DisARM's weights with the partner drawn independently of b: not antithetic,
    so biased (its mean weighs f(1) − f(0) by σ(|α|) σ(1 − σ) instead of σ(1 − σ))."""

    kind, needs = "IndependentPartner", ("sample", "lane_log_prob", "binary")

    def jvp(self, dist, key, primals, tangents, k):
        b = dist.sample(key, *primals)
        one, zero = jnp.ones(b.shape, b.dtype), jnp.zeros(b.shape, b.dtype)
        alpha, dalpha = d.jvp(lambda *p: dist.lane_log_prob(one, *p) - dist.lane_log_prob(zero, *p),
                              primals, tangents)
        partner = dist.sample(jax.random.fold_in(key, 1), *primals)
        differ = b != partner
        sign = jnp.where(partner, -1.0, 1.0)
        w = jnp.where(differ, 0.5 * sign * jax.nn.sigmoid(jnp.abs(alpha)) * dalpha, 0.0)
        return k.dual(b).plus(score=jnp.sum(w)).plus_replays(partner[None], -w[None], differ[None])


def test_the_sample_size_fails_a_variant_without_antithetic_coupling():
    _, _, g, g_se, _ = moments(single_flip(IndependentPartner()), THETA)
    _, grad = exact_single_flip(THETA)
    assert not within(g, g_se, grad), "the test is too weak to see the missing coupling"


class AntitheticPair(gv.Strategy):
    """DisARM written out in the test: u given the sampler's b, the antithetic partner
    b̃ = 1[1 − u < σ(α)], and the weight ½ (−1)^b̃ 1[b ≠ b̃] σ(|α|) ∂α on f(b) − f(b̃);
    `weighted=False` leaves σ(|α|) out (biased: its mean weighs f(1) − f(0) by
    σ(1 − σ) / σ(|α|) instead of σ(1 − σ))."""

    needs = ("sample", "lane_log_prob", "binary")

    def __init__(self, weighted: bool):
        self.weighted, self.kind = weighted, f"AntitheticPair{int(weighted)}"

    def jvp(self, dist, key, primals, tangents, k):
        b = dist.sample(key, *primals)
        one, zero = jnp.ones(b.shape, b.dtype), jnp.zeros(b.shape, b.dtype)
        alpha, dalpha = d.jvp(lambda *p: dist.lane_log_prob(one, *p) - dist.lane_log_prob(zero, *p),
                              primals, tangents)
        p = jax.nn.sigmoid(alpha)
        v = jax.random.uniform(jax.random.fold_in(key, 1), b.shape)
        u = jnp.where(b, v * p, p + v * (1 - p))  # uniform given b = 1[u < p]
        partner = (1 - u < p).astype(b.dtype)
        differ = b != partner
        sign = jnp.where(partner, -1.0, 1.0)
        scale = jax.nn.sigmoid(jnp.abs(alpha)) if self.weighted else 1.0
        w = jnp.where(differ, 0.5 * sign * scale * dalpha, 0.0)
        return k.dual(b).plus(score=jnp.sum(w)).plus_replays(partner[None], -w[None], differ[None])


def test_the_sample_size_fails_a_variant_without_antithetic_weighting():
    _, grad = exact_single_flip(THETA)
    _, _, g, g_se, _ = moments(single_flip(AntitheticPair(weighted=True)), THETA)
    assert within(g, g_se, grad), "the written-out DisARM should be unbiased"
    _, _, g, g_se, _ = moments(single_flip(AntitheticPair(weighted=False)), THETA)
    assert not within(g, g_se, grad), "the test is too weak to see the missing weighting"


def test_variance_below_reinforce_with_rloo2_at_equal_evaluations():
    # both evaluate the rest of the objective twice per lane
    _, _, g_disarm, _, var_disarm = moments(coupled_lanes(gv.DisARM), THETA, seed=3)
    _, _, g_rloo, _, var_rloo = moments(coupled_lanes(gv.RLOO(2)), THETA, seed=3)
    assert var_disarm < var_rloo, (var_disarm, var_rloo)
    _, grad = exact_coupled_lanes(THETA)
    assert g_disarm == pytest.approx(grad, abs=0.05) and g_rloo == pytest.approx(grad, abs=0.1)


@EACH_FORM
def test_masked_lanes_of_a_batched_cond_weigh_nothing(strategy):
    @gv.expectation
    def f(theta):
        def lane(on):
            return jax.lax.cond(
                on, lambda: gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=strategy)) * 1.0,
                lambda: jnp.asarray(0.5))
        x = jax.vmap(lane)(jnp.array([True, False, True]))
        return jnp.sum((3.0 * x - 1.0) ** 2)
    p = sig(THETA)
    v, v_se, g, g_se, _ = moments(f, THETA)
    # two live lanes of (3z − 1)², one constant lane ((3 · 0.5 − 1)² = 0.25)
    assert within(v, v_se, 2 * (4 * p + (1 - p)) + 0.25)
    assert within(g, g_se, 2 * 3 * p * (1 - p))


def test_whole_site_evaluates_the_rest_twice():
    obj = coupled_lanes(gv.DisARM.whole_site())
    text = str(obj.explain(THETA))
    assert "gv.DisARM.whole_site()" in text and "1 replay of the rest of the objective" in text


def test_refusals():
    @gv.gen
    def categorical():
        gv.categorical(jnp.zeros(3), grad=gv.DisARM) @ "c"
    with pytest.raises(ValueError, match=r"gv.categorical does not support the DisARM gradient "
                                         r"strategy at address 'c' \(it needs binary"):
        categorical.simulate(jax.random.key(0))

    @gv.gen
    def normal():
        gv.normal(0.0, 1.0, grad=gv.DisARM) @ "x"
    with pytest.raises(ValueError, match=r"gv.normal does not support the DisARM"):
        normal.simulate(jax.random.key(0))
    assert "DisARM" in gv.flip.strategies and "DisARM" in gv.bernoulli.strategies


def test_variance_below_rloo2_on_the_binary_vae_at_its_initial_parameters():
    # equal evaluations: both replay the decoder once per latent dimension (gv.DisARM
    # itself takes the paper's whole-site form here: two evaluations)
    from genvi_experiments.bench.frontier.discrete_vae import make_vae
    from genvi_experiments.bench.frontier.harness import measure
    from genvi_experiments.common.data import binarize, load_images
    x = jnp.asarray(binarize(jax.random.key(1), load_images().train[:16]))
    lab = measure(make_vae("binary", x.shape[-1]), x, samples=1000, rounds=1, strategies=["DisARM-per-lane", "RLOO(2)"])
    total = {a: sum(lab.variance[a][f] for f in lab.leaves) for a in lab.labels}
    assert total["DisARM-per-lane"] < total["RLOO(2)"], total
    assert not lab.flagged
