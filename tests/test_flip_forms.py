"""`gv.flip` and `gv.bernoulli`: one law, each taking the other parameterization by
keyword (`probs=` / `logits=`, as NumPyro). Both forms score and sample alike, a
strategy on either is unbiased against the exact gradient, a call with no or two
parameterizations is refused, and a positional `gv.bernoulli(x)` (logits, as before)
warns that it will be read as a probability."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

LOGITS = jnp.array([-1.5, 0.0, 2.0])
PROBS = jax.nn.sigmoid(LOGITS)
X = jnp.array([True, False, True])


@pytest.mark.parametrize("call", [
    lambda: gv.flip(PROBS), lambda: gv.flip(probs=PROBS), lambda: gv.flip(logits=LOGITS),
    lambda: gv.bernoulli(logits=LOGITS), lambda: gv.bernoulli(probs=PROBS)])
def test_every_form_scores_and_samples_the_same_law(call):
    c = call()
    log_p = c.dist.log_prob(X, *c.params)
    assert float(log_p) == pytest.approx(float(jnp.sum(jnp.where(X, jnp.log(PROBS),
                                                                 jnp.log1p(-PROBS)))), rel=1e-5)
    draws = jax.vmap(lambda k: c.dist.sample(k, *c.params))(jax.random.split(jax.random.key(0),
                                                                             20_000))
    mean, se = draws.mean(0), np.sqrt(PROBS * (1 - PROBS) / 20_000)
    assert np.all(np.abs(np.asarray(mean) - np.asarray(PROBS)) < 5 * se)


def test_the_keyword_forms_are_the_other_distribution():
    assert gv.flip(logits=0.0).dist is gv.bernoulli and gv.bernoulli(probs=0.5).dist is gv.flip
    assert gv.flip(0.3, grad=gv.ENUM).strategy is gv.ENUM
    assert gv.flip(logits=0.3, grad=gv.MVD).strategy is gv.MVD


@pytest.mark.parametrize("strategy", [gv.REINFORCE, gv.MVD], ids=["REINFORCE", "MVD"])
def test_a_strategy_on_the_logits_form_of_flip_is_unbiased(strategy):
    # d/dl E[f(b)], b ~ Bernoulli(σ(l)), f(1) = 1, f(0) = 3: σ'(l) (f(1) − f(0))
    @gv.expectation
    def e(logits):
        b = gv.sample(gv.flip(logits=logits, grad=strategy))
        return jnp.sum(jnp.where(b, 1.0, 3.0))

    keys = jax.random.split(jax.random.key(1), 20_000)
    grads = np.asarray(jax.jit(jax.vmap(lambda k: e.grad_estimate(k, LOGITS)))(keys), np.float64)
    exact = np.asarray(PROBS * (1 - PROBS) * -2.0, np.float64)
    se = grads.std(0, ddof=1) / math.sqrt(len(keys))
    assert np.all(np.abs(grads.mean(0) - exact) < 5 * se + 1e-7), (grads.mean(0), exact, se)


@pytest.mark.parametrize("call,message", [
    (lambda: gv.flip(), r"gv.flip takes one parameterization.*got none"),
    (lambda: gv.flip(0.3, logits=1.0), r"got positional, logits"),
    (lambda: gv.flip(probs=0.3, logits=1.0), r"got probs, logits"),
    (lambda: gv.bernoulli(probs=0.3, logits=1.0), r"gv.bernoulli takes one parameterization"),
    (lambda: gv.flip(0.1, 0.2), r"with 2 positional values"),
])
def test_none_or_two_parameterizations_are_refused(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_a_positional_bernoulli_is_logits_and_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = gv.bernoulli(LOGITS)
    assert c.dist is gv.bernoulli and c.params[0] is not None
    assert any(issubclass(w.category, DeprecationWarning) and "logits=x" in str(w.message)
               for w in caught)
    assert caught[0].filename == __file__   # it names the user's line
