"""`gv.enumeration()` on a batch of sequences: a `gv.scan` inside `gv.vmap` or a
subsampled `gv.plate`, every sequence summed by the forward algorithm in one pass.
Log densities against a numpy forward algorithm per sequence (summed, and scaled in a
subsampled plate) to 1e-4; sequences of different lengths (their padded steps' data
masked); gradients against `jax.grad` of a hand-written forward algorithm; a fit
that recovers the transition matrix and the means."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp
from scipy.stats import dirichlet, norm

import genvi as gv

K, SD = 3, 0.5
PRIOR = np.ones((K, K)) + 2.0 * np.eye(K)
TRANS = np.array([[0.8, 0.1, 0.1], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]], np.float32)
MEANS = np.array([-1.0, 0.2, 1.5], np.float32)
rng = np.random.default_rng(0)
YS = rng.normal(size=(4, 6)).astype(np.float32)


@gv.gen
def hmm_step(carry, y):
    z_prev, trans, means = carry
    z = gv.categorical(jnp.log(trans[z_prev])) @ "z"
    gv.observe(gv.normal(means[z], SD), y)
    return (z, trans, means), None


@gv.gen
def sequence(trans, means, ys):
    gv.scan(hmm_step)((0, trans, means), ys) @ "steps"


def batch_of(plate_size=None):
    each = (gv.vmap(sequence, in_axes=(None, None, 0)) if plate_size is None
            else gv.plate(sequence, plate_size, in_axes=(None, None, 0)))

    @gv.gen
    def model(params, ys):
        trans = gv.dirichlet(jnp.asarray(PRIOR, jnp.float32)) @ "trans"
        means = gv.normal(jnp.linspace(-1.0, 1.0, K), 3.0) @ "means"
        each(trans, means, ys) @ "seqs"
    return model


def numpy_forward(trans, means, y):
    alpha = np.log(trans[0]) + norm.logpdf(y[0], means, SD)
    for yt in y[1:]:
        alpha = logsumexp(alpha[:, None] + np.log(trans), axis=0) + norm.logpdf(yt, means, SD)
    return logsumexp(alpha)


def numpy_prior(trans, means):
    trans = trans.astype(np.float64)
    rows = sum(dirichlet.logpdf(r / r.sum(), a) for r, a in zip(trans, PRIOR))
    return rows + norm.logpdf(means, np.linspace(-1, 1, K), 3.0).sum()


def log_density(model, trans, means, ys):
    m = gv.marginal(model, keep=["trans", "means"], algorithm=gv.enumeration())
    return m.log_density(gv.choices({"trans": trans, "means": means}), {}, jnp.asarray(ys))


def test_each_sequence_is_summed_by_the_forward_algorithm():
    got = log_density(batch_of(), TRANS, MEANS, YS)
    exact = numpy_prior(TRANS, MEANS) + sum(numpy_forward(TRANS, MEANS, y) for y in YS)
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_a_subsampled_plate_of_sequences_is_scaled():
    got = log_density(batch_of(plate_size=12), TRANS, MEANS, YS)   # 4 of 12 sequences
    exact = numpy_prior(TRANS, MEANS) + 3.0 * sum(numpy_forward(TRANS, MEANS, y) for y in YS)
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_gradients_match_a_hand_written_forward_algorithm():
    def forward(trans, means, y):
        emit = jax.scipy.stats.norm.logpdf(y[:, None], means, SD)         # [T, K]
        alpha = jnp.log(trans[0]) + emit[0]

        def step(alpha, e):
            return jax.scipy.special.logsumexp(alpha[:, None] + jnp.log(trans), 0) + e, None
        alpha, _ = jax.lax.scan(step, alpha, emit[1:])
        return jax.scipy.special.logsumexp(alpha)

    def by_hand(trans, means):
        prior = sum(jax.scipy.stats.dirichlet.logpdf(trans[i], jnp.asarray(PRIOR[i], jnp.float32))
                    for i in range(K))
        prior = prior + jnp.sum(jax.scipy.stats.norm.logpdf(means, jnp.linspace(-1.0, 1.0, K), 3.0))
        return prior + jnp.sum(jax.vmap(lambda y: forward(trans, means, y))(jnp.asarray(YS)))

    model = batch_of()
    want = jax.grad(by_hand, argnums=(0, 1))(jnp.asarray(TRANS), jnp.asarray(MEANS))
    got = jax.grad(lambda t, m: log_density(model, t, m, YS), argnums=(0, 1))(
        jnp.asarray(TRANS), jnp.asarray(MEANS))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-4, atol=1e-4)
    # along the simplex only: the model's categorical normalizes its rows (log_softmax)
    # and the hand-written one takes them as they are, so the two differ by a constant
    # per row, a direction in which no transition matrix moves
    on_simplex = [np.asarray(g) - np.asarray(g).mean(1, keepdims=True) for g in (got[0], want[0])]
    np.testing.assert_allclose(*on_simplex, rtol=1e-4, atol=1e-4)


@gv.gen
def masked_step(carry, inputs):
    z_prev, trans, means = carry
    y, valid = inputs
    z = gv.categorical(jnp.log(trans[z_prev])) @ "z"
    # a padded step's datum is not scored; its state is summed out like any other
    gv.factor(jnp.where(valid, gv.normal.log_prob(y, means[z], SD), 0.0))
    return (z, trans, means), None


@gv.gen
def padded_sequence(trans, means, ys, valid):
    gv.scan(masked_step)((0, trans, means), (ys, valid)) @ "steps"


@gv.gen
def padded_batch(params, ys, valid):
    trans = gv.dirichlet(jnp.asarray(PRIOR, jnp.float32)) @ "trans"
    means = gv.normal(jnp.linspace(-1.0, 1.0, K), 3.0) @ "means"
    gv.vmap(padded_sequence, in_axes=(None, None, 0, 0))(trans, means, ys, valid) @ "seqs"


def test_sequences_of_different_lengths():
    lengths = np.array([6, 2, 4, 1])
    valid = np.arange(6)[None, :] < lengths[:, None]
    m = gv.marginal(padded_batch, keep=["trans", "means"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"trans": TRANS, "means": MEANS}), {}, jnp.asarray(YS),
                        jnp.asarray(valid))
    exact = numpy_prior(TRANS, MEANS) + sum(numpy_forward(TRANS, MEANS, y[:n])
                                            for y, n in zip(YS, lengths))
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_a_fit_recovers_the_transitions_and_means():
    true_trans = np.array([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.1, 0.1, 0.8]])
    true_means = np.array([-2.0, 0.0, 2.0])
    data_rng = np.random.default_rng(1)
    seqs, length = 30, 60
    z = np.zeros((seqs, length), int)
    for b in range(seqs):
        state = 0
        for t in range(length):
            state = data_rng.choice(K, p=true_trans[state])
            z[b, t] = state
    ys = jnp.asarray(true_means[z] + SD * data_rng.normal(size=z.shape), jnp.float32)
    model = batch_of()
    m = gv.marginal(model, keep=["trans", "means"], algorithm=gv.enumeration())
    auto = gv.auto_normal(m)
    start = {"guide": auto.init(jax.random.key(0), {}, ys)}
    fit = gv.fit(gv.elbo(m, auto), start, ys, optimizer=optax.adam(0.05), steps=800,
                 key=jax.random.key(1), progress=False)
    fitted = auto.mean(fit.params)
    order = np.argsort(np.asarray(fitted["means"]))
    np.testing.assert_allclose(np.asarray(fitted["means"])[order], true_means, atol=0.1)
    np.testing.assert_allclose(np.asarray(fitted["trans"])[np.ix_(order, order)], true_trans,
                               atol=0.06)


# -- two chains in one scan (a factorial HMM), one sequence and a batch ------------------
TA = np.array([[0.9, 0.1], [0.2, 0.8]], np.float32)
TB = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]], np.float32)
MA, MB = np.array([-1.0, 1.0], np.float32), np.array([0.0, 0.5, 2.0], np.float32)


@gv.gen
def two_chains(carry, y):
    a_prev, b_prev, shift = carry
    a = gv.categorical(jnp.log(jnp.asarray(TA))[a_prev]) @ "a"
    b = gv.categorical(jnp.log(jnp.asarray(TB))[b_prev]) @ "b"
    gv.observe(gv.normal(jnp.asarray(MA)[a] + jnp.asarray(MB)[b] + shift, 0.7), y)
    return (a, b, shift), None


@gv.gen
def factorial_sequence(shift, ys):
    gv.scan(two_chains)((0, 0, shift), ys) @ "steps"


@gv.gen
def factorial(params, ys):
    shift = gv.normal(0.0, 1.0) @ "shift"
    factorial_sequence(shift, ys) @ "seq"


@gv.gen
def factorial_batch(params, ys):
    shift = gv.normal(0.0, 1.0) @ "shift"
    gv.vmap(factorial_sequence, in_axes=(None, 0))(shift, ys) @ "seqs"


def numpy_factorial(shift, y):
    states = [(a, b) for a in range(2) for b in range(3)]

    def emit(yt):
        return np.array([norm.logpdf(yt, MA[a] + MB[b] + shift, 0.7) for a, b in states])
    log_trans = np.array([[np.log(TA[u[0], v[0]]) + np.log(TB[u[1], v[1]]) for v in states]
                          for u in states])
    alpha = log_trans[0] + emit(y[0])            # from (0, 0)
    for yt in y[1:]:
        alpha = logsumexp(alpha[:, None] + log_trans, axis=0) + emit(yt)
    return logsumexp(alpha)


def test_two_chains_in_one_scan_are_summed_jointly():
    ys = rng.normal(size=7).astype(np.float32)
    m = gv.marginal(factorial, keep=["shift"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"shift": 0.3}), {}, jnp.asarray(ys))
    assert float(got) == pytest.approx(norm.logpdf(0.3) + numpy_factorial(0.3, ys), abs=1e-4)
    m = gv.marginal(factorial_batch, keep=["shift"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"shift": 0.3}), {}, jnp.asarray(YS))
    exact = norm.logpdf(0.3) + sum(numpy_factorial(0.3, y) for y in YS)
    assert float(got) == pytest.approx(exact, abs=1e-4)


# -- refusals name the site and say what would make the sum exact ------------------------
def refused(model, keep, *args, match):
    m = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    with pytest.raises(ValueError, match=match):
        m.log_density(gv.choices({k: 0.0 for k in keep}), {}, *args)


def test_sequences_that_share_a_running_count_are_refused():
    @gv.gen
    def counting(count, y):
        z = gv.flip(0.5) @ "z"
        count = count + z
        gv.observe(gv.normal(count, 1.0), y)
        return count, None

    @gv.gen
    def seq(ys):
        gv.scan(counting)(0.0, ys) @ "steps"

    @gv.gen
    def model(params, ys):
        gv.normal(0.0, 1.0) @ "mu"
        gv.vmap(seq)(ys) @ "seqs"
    refused(model, ["mu"], jnp.zeros((3, 4)), match=r"'seqs/steps/z'.*remembers more than the "
            r"last steps' discrete values.*carry the step's discrete values")


def test_chains_that_no_observation_reads_sum_to_one():
    @gv.gen
    def step(prev, y):
        z = gv.flip(0.5) @ "z"
        return z, None

    @gv.gen
    def seq(ys):
        gv.scan(step)(False, ys) @ "steps"

    @gv.gen
    def model(params, ys):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.vmap(seq)(ys) @ "seqs"
        gv.factor(0.0 * mu)
    m = gv.marginal(model, keep=["mu"], algorithm=gv.enumeration())
    # a chain that no observation reads sums to one: the marginal is the prior's
    got = m.log_density(gv.choices({"mu": 0.5}), {}, jnp.zeros((3, 4)))
    assert float(got) == pytest.approx(norm.logpdf(0.5), abs=1e-5)


def test_a_long_chain_in_blocks_gives_the_same_sum_and_gradient(monkeypatch):
    from genvi.inference.enumeration import time as chain_algebra

    def value_and_grad():
        return jax.value_and_grad(lambda m: log_density(batch_of(), TRANS, m, YS))(
            jnp.asarray(MEANS))
    kept = value_and_grad()
    monkeypatch.setattr(chain_algebra, "FACTORS_BUDGET", 0)   # blocks of BLOCK steps
    monkeypatch.setattr(chain_algebra, "BLOCK", 2)            # 5 steps: 3 blocks, one padded
    blocked = value_and_grad()
    assert float(blocked[0]) == pytest.approx(float(kept[0]), abs=1e-4)
    np.testing.assert_allclose(np.asarray(blocked[1]), np.asarray(kept[1]), rtol=1e-4, atol=1e-4)
