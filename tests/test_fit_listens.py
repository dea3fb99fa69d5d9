"""gv.fit that listens: it stops on a noise-aware convergence rule and says why,
continues a previous FitResult as one uninterrupted run, passes the loss to optax
transformations that take one (reduce_on_plateau), and feeds step-dependent arguments
(annealing) through gv.schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from genvi.training.stopping import replay
from programs import guide, model

ELBO = gv.elbo(model, guide)
START = {"m": jnp.array(0.0), "s": jnp.array(0.0)}


def same(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- stopping ----------------------------------------------------------------------

def test_early_stops_a_converged_problem_in_far_fewer_steps_whatever_the_chunking():
    # 32 copies of the datapoint: each step averages 32 independent estimates
    averaged = gv.batch_mean(ELBO, in_axes=(None, 0))
    adam, rule = optax.adam(0.02), gv.converged(window=100, patience=3)
    runs = [gv.fit(averaged, START, jnp.ones(32), optimizer=adam, steps=50_000,
                   key=jax.random.key(0), stop=rule, chunk_size=size, progress=False)
            for size in (1000, 64)]
    res = runs[0]
    assert 400 <= res.steps < 5_000
    assert res.stopped.startswith(f"converged after {res.steps} steps")
    assert res.history["objective"].shape == (res.steps,)
    assert abs(float(res.params["m"]) - 0.5) < 0.1            # the posterior: mean y / 2,
    assert abs(float(jnp.exp(res.params["s"])) - np.sqrt(0.5)) < 0.05   # sd sqrt(1 / 2)
    log_evidence = -0.5 * np.log(2 * np.pi * 2) - 0.25
    assert abs(np.mean(res.history["objective"][-100:]) - log_evidence) < 0.02
    assert runs[1].steps == res.steps                          # stopped inside a chunk
    same(runs[1].params, res.params)


def test_a_fit_still_improving_runs_all_its_steps():
    @gv.expectation
    def far(m):   # improves by far more than its noise over every window
        return -(gv.sample(gv.normal(m, 0.1, grad=gv.REPARAM)) - 100.0) ** 2

    res = gv.fit(far, 0.0, optimizer=optax.sgd(1e-4), steps=2000, key=jax.random.key(1),
                 stop=gv.converged(), progress=False)
    assert res.steps == 2000 and res.stopped == "ran all 2000 steps"


def test_the_rule_ignores_the_objectives_offset_and_scale():
    noise = jax.random.normal(jax.random.key(2), (2000,))
    drift = noise + jnp.arange(2000) / 300.0     # a slow rise the noise hides per window
    rule, ok = gv.converged(window=50, patience=4), jnp.ones(2000, bool)
    for values in (noise, drift):
        a, b = replay(rule, values, ok), replay(rule, 1e5 + 300.0 * values, ok)
        assert int(a.flat) == int(b.flat) and int(a.windows) == int(b.windows) == 40
    # skipped (non-finite) steps do not count
    skipped = replay(rule, noise.at[::2].set(jnp.nan), jnp.arange(2000) % 2 == 1)
    assert int(skipped.windows) == 20 and np.isfinite(float(skipped.last_mean))


def test_a_continued_or_resumed_run_stops_where_one_run_stops(tmp_path):
    adam, rule = optax.adam(0.05), gv.converged(window=100, patience=3)

    def fit(params, steps, **kw):
        return gv.fit(ELBO, params, 1.0, optimizer=adam, steps=steps, stop=rule,
                      progress=False, **kw)
    whole = fit(START, 50_000, key=jax.random.key(0))
    half = fit(START, whole.steps // 2, key=jax.random.key(0))
    assert half.stopped == f"ran all {whole.steps // 2} steps"
    rest = fit(half, 50_000)
    assert rest.steps == whole.steps and rest.stopped == whole.stopped
    same(rest.params, whole.params)
    # a checkpointed run saves where it stops; run again, it resumes there and stops
    directory = str(tmp_path / "ckpt")
    first = fit(START, 50_000, key=jax.random.key(0),
                checkpoints=gv.Checkpoints(directory, every=1000))
    assert gv.training.checkpoints.latest_step(directory) == whole.steps
    again = fit(START, 50_000, key=jax.random.key(0),
                checkpoints=gv.Checkpoints(directory, every=1000))
    assert first.steps == again.steps == whole.steps and again.stopped == whole.stopped
    same(again.params, whole.params)


# -- continuing ----------------------------------------------------------------------

@gv.expectation
def annealed(p, y, beta):
    """The ELBO of the conjugate pair with its KL term weighted by beta."""
    q = gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM)
    z = gv.sample(q)
    return gv.normal(z, 1.0).log_prob(y) - beta * (q.log_prob(z) - gv.normal(0.0, 1.0).log_prob(z))


ANNEALED = gv.batch_mean(annealed, in_axes=(None, 0, None))
DATA = jnp.linspace(-1.0, 3.0, 40)
BETA = gv.schedule(optax.linear_schedule(0.1, 1.0, 400))


def test_300_plus_300_steps_equal_one_600_step_run():
    # a decaying learning rate, minibatches and an annealed argument all follow the step
    adam = optax.adam(optax.cosine_decay_schedule(0.05, 600))

    def fit(params, steps, **kw):
        return gv.fit(ANNEALED, params, DATA, BETA, optimizer=adam, steps=steps,
                      batch_size=8, progress=False, **kw)
    whole = fit(START, 600, key=jax.random.key(3))
    first = fit(START, 300, key=jax.random.key(3))
    second = fit(first, 300)
    assert (second.steps, second.stopped) == (600, "ran all 600 steps")
    same(second.params, whole.params)
    same(second.state, whole.state)
    np.testing.assert_array_equal(second.history["objective"], whole.history["objective"])
    assert abs(float(whole.params["m"]) - 0.5) < 0.1
    # a new key: the same step count, fresh randomness for the new steps
    other = fit(first, 300, key=jax.random.key(4))
    assert other.steps == 600
    assert not np.array_equal(other.history["objective"][300:], whole.history["objective"][300:])


def test_continuing_with_another_optimizer_is_refused():
    first = gv.fit(ELBO, START, 1.0, optimizer=optax.adam(0.05), steps=5,
                   key=jax.random.key(0), progress=False)
    with pytest.raises(ValueError, match="Pass the same optimizer"):
        gv.fit(ELBO, first, 1.0, optimizer=optax.sgd(0.05), steps=5, progress=False)


# -- the objective's value for optax ---------------------------------------------------

def test_reduce_on_plateau_lowers_its_scale_on_a_plateau_only():
    @gv.expectation
    def bowl(m):   # flat at m = 1, with noise of the order of its value there
        return -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 1.0) ** 2

    opt = optax.chain(optax.adam(0.1),
                      optax.contrib.reduce_on_plateau(factor=0.5, patience=3,
                                                      accumulation_size=50))
    climbing = gv.fit(bowl, -20.0, optimizer=opt, steps=250, key=jax.random.key(5),
                      progress=False)
    # the loss (−objective) fell every 50 steps: no plateau yet (the sign is right)
    assert float(optax.tree_utils.tree_get(climbing.state, "scale")) == 1.0
    plateau = gv.fit(bowl, climbing, optimizer=opt, steps=1500, progress=False)
    assert float(optax.tree_utils.tree_get(plateau.state, "scale")) <= 0.25
    assert abs(float(plateau.params) - 1.0) < 0.1


# -- step-dependent arguments ------------------------------------------------------------

def test_a_scheduled_argument_takes_its_value_at_each_step():
    @gv.expectation
    def kl_term(p, ys, beta):
        # −beta · KL(normal(p, 1) ‖ normal(0, 1)), exact; the sample keeps it an objective
        x = gv.sample(gv.normal(p, 1.0, grad=gv.REPARAM))
        return -beta * 0.5 * p ** 2 + 0.0 * x + 0.0 * jnp.sum(ys)

    beta = gv.schedule(lambda step: jnp.minimum(1.0, step / 100.0))
    ys = jnp.arange(8.0)    # minibatched; beta is not
    res = gv.fit(kl_term, 1.0, ys, beta, optimizer=optax.sgd(0.0), steps=150,
                 key=jax.random.key(6), batch_size=4, chunk_size=40,
                 evaluate=gv.Evaluation(kl_term, ys, beta, every=50, estimates=2),
                 progress=False)
    steps = np.arange(150)
    np.testing.assert_allclose(res.history["objective"], -0.5 * np.minimum(1.0, steps / 100.0),
                               rtol=1e-6)
    np.testing.assert_allclose(res.history["eval"], [-0.25, -0.5, -0.5], rtol=1e-6)


def test_kl_annealing_reaches_the_posterior():
    beta = gv.schedule(optax.linear_schedule(0.0, 1.0, 1000))
    res = gv.fit(ANNEALED, START, jnp.full(16, 1.0), beta,
                 optimizer=optax.adam(optax.cosine_decay_schedule(0.05, 2500)), steps=2500,
                 key=jax.random.key(7), progress=False)
    # beta = 1 for the last 1500 steps: the ELBO's optimum, the exact posterior
    assert abs(float(res.params["m"]) - 0.5) < 0.05
    assert abs(float(jnp.exp(res.params["s"])) - np.sqrt(0.5)) < 0.05


# -- mistakes ------------------------------------------------------------------------------

def test_mistakes_get_clear_errors():
    kw = dict(optimizer=optax.adam(0.1), steps=5, progress=False)
    with pytest.raises(TypeError, match="stop must be a stopping rule such as gv.converged"):
        gv.fit(ELBO, START, 1.0, key=jax.random.key(0), stop=True, **kw)
    with pytest.raises(ValueError, match="window=1 must be an int of at least 2"):
        gv.converged(window=1)
    with pytest.raises(TypeError, match="gv.schedule: expected a function of the step"):
        gv.schedule(0.5)
    python_if = gv.schedule(lambda step: 1.0 if step < 10 else 0.5)
    with pytest.raises(TypeError, match="data argument 1 is gv.schedule.*jnp operations"):
        gv.fit(ELBO, START, 1.0, python_if, key=jax.random.key(0), **kw)
    with pytest.raises(TypeError, match="pass key=jax.random.key"):
        gv.fit(ELBO, START, 1.0, **kw)
    with pytest.raises(gv.NonFiniteError) as info:
        gv.fit(ELBO, START, jnp.nan, key=jax.random.key(0), **kw)
    assert info.value.result.steps == 0 and "not finite" in info.value.result.stopped
