"""Flax networks inside genvi programs: a small VAE whose encoder and decoder are
Flax linen modules (parameters from `module.init`) or Flax NNX modules (split into a
static graphdef and a state pytree), trained with `gv.fit` and `gv.batch_mean(gv.elbo)`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import genvi as gv

D, L, N, H = 16, 2, 256, 16   # data dim, latent dim, data points, hidden units


def make_data() -> jax.Array:
    """16-dim binary vectors: one of 2 prototype patterns, each bit flipped w.p. 0.1."""
    rng = np.random.default_rng(0)
    protos = np.stack([np.arange(D) % 2, np.arange(D) < D // 2]).astype(np.float32)
    flips = rng.random((N, D)) < 0.1
    return jnp.asarray(np.abs(protos[rng.integers(0, 2, N)] - flips), jnp.float32)


X = make_data()


def mean_elbo(objective, params, n=32):
    """Mean of `n` estimates of the minibatch-mean ELBO over the whole data set."""
    keys = jax.random.split(jax.random.key(1234), n)
    return float(jnp.mean(jax.vmap(lambda k: objective.estimate(k, params, X))(keys)))


def assert_same_tree(grads, params):
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(params)):
        assert g.shape == p.shape and g.dtype == p.dtype
        assert bool(jnp.all(jnp.isfinite(g)))


# -- Flax linen ---------------------------------------------------------------------

class MLP(nn.Module):
    hidden: int
    out: int

    @nn.compact
    def __call__(self, x):
        h = jnp.tanh(nn.Dense(self.hidden, name="hidden")(x))
        return nn.Dense(self.out, name="out")(h)


encoder, decoder = MLP(H, 2 * L), MLP(H, D)


@gv.gen
def linen_model(params, x):
    z = gv.mv_normal_diag(jnp.zeros(L), jnp.ones(L)) @ "z"
    gv.observe(gv.bernoulli(logits=decoder.apply(params["dec"], z)), x)


@gv.gen
def linen_guide(params, x):
    h = encoder.apply(params["enc"], x)
    gv.mv_normal_diag(h[:L], jnp.exp(h[L:]), grad=gv.REPARAM) @ "z"


linen_objective = gv.batch_mean(gv.elbo(linen_model, linen_guide), in_axes=(None, 0))


def linen_init(seed=0):
    k_enc, k_dec = jax.random.split(jax.random.key(seed))
    return {"enc": encoder.init(k_enc, jnp.zeros(D)), "dec": decoder.init(k_dec, jnp.zeros(L))}


def test_linen_gradient_has_the_parameter_structure():
    params = linen_init()
    value, grads = linen_objective.value_and_grad_estimate(jax.random.key(1), params, X[:8])
    assert value.shape == () and bool(jnp.isfinite(value))
    assert_same_tree(grads, params)
    # every layer gets a gradient
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads))


def test_linen_vae_trains_with_fit():
    params = linen_init()
    before = mean_elbo(linen_objective, params)
    result = gv.fit(linen_objective, params, X, optimizer=optax.adam(1e-2), steps=400,
                    key=jax.random.key(2), batch_size=32, progress=False)
    after = mean_elbo(linen_objective, result.params)
    assert result.history["objective"].shape == (400,)
    assert np.all(np.isfinite(result.history["objective"]))
    assert jax.tree_util.tree_structure(result.params) == jax.tree_util.tree_structure(params)
    # init ≈ -12.6 nats; the bit-flip entropy alone is 16 * H(0.1) ≈ 5.2 nats
    assert after > before + 4.0, (before, after)
    assert after > -8.0, after
    # the trained decoder reconstructs: the encoder mean of a prototype decodes to it
    protos = jnp.stack([jnp.arange(D) % 2, jnp.arange(D) < D // 2]).astype(jnp.float32)
    mu = encoder.apply(result.params["enc"], protos)[:, :L]
    recon = decoder.apply(result.params["dec"], mu) > 0
    assert float(jnp.mean(recon == protos.astype(bool))) > 0.9


def handwritten_elbo(params, key, x):
    """The reparameterized single-sample ELBO of one data point, written directly in JAX."""
    h = encoder.apply(params["enc"], x)
    mu, log_scale = h[:L], h[L:]
    eps = jax.random.normal(key, (L,))
    z = mu + jnp.exp(log_scale) * eps
    logits = decoder.apply(params["dec"], z)
    log_lik = jnp.sum(x * jax.nn.log_sigmoid(logits) + (1 - x) * jax.nn.log_sigmoid(-logits))
    log_prior = jnp.sum(-0.5 * z ** 2 - 0.5 * jnp.log(2 * jnp.pi))
    log_q = jnp.sum(-0.5 * eps ** 2 - log_scale - 0.5 * jnp.log(2 * jnp.pi))
    return log_lik + log_prior - log_q


def test_linen_gradient_is_unbiased_against_handwritten_jax():
    """genvi splits keys its own way, so compare means over many keys: genvi's
    minibatch-mean gradient against the mean of hand-written per-datapoint gradients."""
    params = linen_init(seed=3)
    xs = X[:8]
    n = 4000
    keys = jax.random.split(jax.random.key(5), n)
    g_genvi = jax.jit(jax.vmap(lambda k: linen_objective.grad_estimate(k, params, xs)))(keys)

    def hand(k):
        ks = jax.random.split(k, xs.shape[0])
        per_point = jax.vmap(jax.grad(handwritten_elbo), in_axes=(None, 0, 0))(params, ks, xs)
        return jax.tree_util.tree_map(lambda g: jnp.mean(g, 0), per_point)

    g_hand = jax.jit(jax.vmap(hand))(jax.random.split(jax.random.key(6), n))
    for leaf in [("enc", "params", "hidden", "kernel"), ("enc", "params", "out", "bias"),
                 ("dec", "params", "out", "bias")]:
        a, b = g_genvi, g_hand
        for k in leaf:
            a, b = a[k], b[k]
        a, b = np.asarray(a, np.float64).reshape(n, -1), np.asarray(b, np.float64).reshape(n, -1)
        # entries with no gradient at all (input bits that are 0 in every x) agree exactly
        live = b.std(0) > 0
        np.testing.assert_array_equal(a[:, ~live], b[:, ~live])
        a, b = a[:, live], b[:, live]
        se = np.sqrt(a.var(0) / n + b.var(0) / n)
        z = np.abs(a.mean(0) - b.mean(0)) / se
        assert np.all(z < 5.0), (leaf, z.max())
        # same estimator up to keys: the spreads agree too
        ratio = a.std(0) / b.std(0)
        assert np.all((ratio > 0.85) & (ratio < 1.15)), (leaf, ratio)


# -- Flax NNX -----------------------------------------------------------------------

class NnxMLP(nnx.Module):
    def __init__(self, din, hidden, dout, *, rngs):
        self.hidden = nnx.Linear(din, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))


class NnxVAE(nnx.Module):
    def __init__(self, *, rngs):
        self.encoder = NnxMLP(D, H, 2 * L, rngs=rngs)
        self.decoder = NnxMLP(L, H, D, rngs=rngs)


GRAPHDEF, NNX_STATE = nnx.split(NnxVAE(rngs=nnx.Rngs(0)))   # graphdef: static, closed over


@gv.gen
def nnx_model(state, x):
    z = gv.mv_normal_diag(jnp.zeros(L), jnp.ones(L)) @ "z"
    vae = nnx.merge(GRAPHDEF, state)
    gv.observe(gv.bernoulli(logits=vae.decoder(z)), x)


@gv.gen
def nnx_guide(state, x):
    h = nnx.merge(GRAPHDEF, state).encoder(x)
    gv.mv_normal_diag(h[:L], jnp.exp(h[L:]), grad=gv.REPARAM) @ "z"


nnx_objective = gv.batch_mean(gv.elbo(nnx_model, nnx_guide), in_axes=(None, 0))


def test_nnx_gradient_has_the_state_structure():
    value, grads = nnx_objective.value_and_grad_estimate(jax.random.key(1), NNX_STATE, X[:8])
    assert bool(jnp.isfinite(value))
    assert isinstance(grads, nnx.State)
    assert_same_tree(grads, NNX_STATE)
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads))


def test_nnx_vae_trains_with_fit_and_merges_back():
    before = mean_elbo(nnx_objective, NNX_STATE)
    result = gv.fit(nnx_objective, NNX_STATE, X, optimizer=optax.adam(1e-2), steps=400,
                    key=jax.random.key(2), batch_size=32, progress=False)
    after = mean_elbo(nnx_objective, result.params)
    assert np.all(np.isfinite(result.history["objective"]))
    assert isinstance(result.params, nnx.State)
    assert jax.tree_util.tree_structure(result.params) == jax.tree_util.tree_structure(NNX_STATE)
    assert after > before + 4.0, (before, after)
    assert after > -8.0, after
    # the trained state merges back into a working module with the trained weights
    vae = nnx.merge(GRAPHDEF, result.params)
    assert isinstance(vae, NnxVAE)
    np.testing.assert_array_equal(vae.decoder.out.bias[...],
                                  result.params["decoder"]["out"]["bias"][...])
    assert not np.allclose(vae.decoder.out.bias[...], NNX_STATE["decoder"]["out"]["bias"][...])
    protos = jnp.stack([jnp.arange(D) % 2, jnp.arange(D) < D // 2]).astype(jnp.float32)
    recon = vae.decoder(vae.encoder(protos)[:, :L]) > 0
    assert recon.shape == (2, D)
    assert float(jnp.mean(recon == protos.astype(bool))) > 0.9
    # ...and splitting it again gives the same state back
    _, again = nnx.split(vae)
    for a, b in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(result.params)):
        np.testing.assert_array_equal(a, b)


def test_nnx_and_linen_agree_on_a_shared_network():
    """The same weights as a linen module and as an NNX module give the same ELBO
    estimate and gradient for the same key (genvi sees only the arrays)."""
    params = linen_init(seed=7)
    state = jax.tree_util.tree_map(lambda a: a, NNX_STATE)  # a fresh copy, then load
    for ours, theirs in [("encoder", "enc"), ("decoder", "dec")]:
        for layer in ("hidden", "out"):
            for name in ("kernel", "bias"):
                state[ours][layer][name] = state[ours][layer][name].replace(
                    params[theirs]["params"][layer][name])
    key = jax.random.key(11)
    v_linen, g_linen = linen_objective.value_and_grad_estimate(key, params, X[:8])
    v_nnx, g_nnx = nnx_objective.value_and_grad_estimate(key, state, X[:8])
    np.testing.assert_allclose(v_linen, v_nnx, rtol=1e-5)
    for ours, theirs in [("encoder", "enc"), ("decoder", "dec")]:
        for layer in ("hidden", "out"):
            for name in ("kernel", "bias"):
                np.testing.assert_allclose(g_linen[theirs]["params"][layer][name],
                                           g_nnx[ours][layer][name][...], rtol=1e-4, atol=1e-6)


# -- mixed pytrees and optax tree tools ----------------------------------------------

def test_mixed_pytree_with_optax_multi_transform_freezes_a_network():
    """Parameters are any pytree: a linen network next to a plain array, with
    `optax.multi_transform` freezing the encoder while the decoder and the array train."""
    base = linen_init(seed=4)
    mixed = {"enc": base["enc"], "dec": base["dec"], "log_temp": jnp.array(0.0)}

    @gv.gen
    def tempered_model(p, x):
        z = gv.mv_normal_diag(jnp.zeros(L), jnp.ones(L)) @ "z"
        gv.observe(gv.bernoulli(logits=decoder.apply(p["dec"], z) * jnp.exp(p["log_temp"])), x)

    objective = gv.batch_mean(gv.elbo(tempered_model, linen_guide), in_axes=(None, 0))
    labels = {"enc": jax.tree_util.tree_map(lambda _: "frozen", mixed["enc"]),
              "dec": jax.tree_util.tree_map(lambda _: "train", mixed["dec"]),
              "log_temp": "train"}
    opt = optax.multi_transform({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()},
                                labels)
    result = gv.fit(objective, mixed, X, optimizer=opt, steps=100, batch_size=32,
                    key=jax.random.key(8), progress=False)
    assert jax.tree_util.tree_structure(result.params) == jax.tree_util.tree_structure(mixed)
    for a, b in zip(jax.tree_util.tree_leaves(result.params["enc"]),
                    jax.tree_util.tree_leaves(mixed["enc"])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree_util.tree_leaves(result.params["dec"]),
                    jax.tree_util.tree_leaves(mixed["dec"])):
        assert not np.allclose(a, b)
    assert float(result.params["log_temp"]) != 0.0
    h = result.history["objective"]
    assert np.mean(h[-20:]) > np.mean(h[:20]) + 1.0


def test_nnx_filtered_split_keeps_non_params_static():
    """`nnx.split(module, nnx.Param, ...)`: only the Params are differentiated and
    trained; the rest is closed over with the graphdef and merged back in."""

    class Shift(nnx.Variable):
        pass

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(D, 1, rngs=rngs)
            self.shift = Shift(jnp.array(2.0))

        def __call__(self, x):
            return self.lin(x)[0] + self.shift[...]

    graphdef, params, rest = nnx.split(Net(nnx.Rngs(1)), nnx.Param, ...)

    @gv.gen
    def model(p, x):
        z = gv.normal(0.0, 1.0) @ "z"
        gv.observe(gv.normal(z, 0.5), jnp.mean(x))

    @gv.gen
    def guide(p, x):
        gv.normal(nnx.merge(graphdef, p, rest)(x), 0.5, grad=gv.REPARAM) @ "z"

    objective = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))
    grads = objective.grad_estimate(jax.random.key(0), params, X[:8])
    assert_same_tree(grads, params)
    opt = optax.adam(optax.cosine_decay_schedule(0.05, 500))
    result = gv.fit(objective, params, X, optimizer=opt, steps=500, batch_size=32,
                    key=jax.random.key(1), progress=False)
    net = nnx.merge(graphdef, result.params, rest)
    assert float(net.shift[...]) == 2.0
    # on average over the data, the guide mean reaches the posterior mean 0.8 * mean(x)
    # (prior N(0, 1), noise 0.5), starting from about 2 (the shift)
    before = jnp.mean(jax.vmap(nnx.merge(graphdef, params, rest))(X))
    after = jnp.mean(jax.vmap(net)(X))
    target = 0.8 * jnp.mean(X)
    assert abs(float(before - target)) > 1.0
    assert abs(float(after - target)) < 0.05, (float(after), float(target))


def test_nnx_module_passed_directly_as_a_pytree():
    """In Flax 0.12 an NNX module is itself a pytree: it can be the parameter argument
    as is, and `gv.fit` returns a trained module."""
    net = NnxMLP(D, H, 2 * L, rngs=nnx.Rngs(2))

    @gv.gen
    def guide(enc, x):
        h = enc(x)
        gv.mv_normal_diag(h[:L], jnp.exp(h[L:]), grad=gv.REPARAM) @ "z"

    @gv.gen
    def model(enc, x):   # a fixed decoder, closed over (not trained)
        z = gv.mv_normal_diag(jnp.zeros(L), jnp.ones(L)) @ "z"
        gv.observe(gv.bernoulli(logits=nnx.merge(GRAPHDEF, NNX_STATE).decoder(z)), x)

    objective = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))
    grads = objective.grad_estimate(jax.random.key(0), net, X[:8])
    assert isinstance(grads, NnxMLP)
    assert_same_tree(grads, net)
    result = gv.fit(objective, net, X, optimizer=optax.adam(1e-2), steps=100, batch_size=32,
                    key=jax.random.key(1), progress=False)
    assert isinstance(result.params, NnxMLP)
    assert result.params(X[0]).shape == (2 * L,)
    h = result.history["objective"]
    assert np.mean(h[-20:]) > np.mean(h[:20])
