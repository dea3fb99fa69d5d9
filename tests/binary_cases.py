"""Objectives over flip sites with their exact values and θ-derivatives, shared by the
statistical tests of the binary estimators (DisARM, RELAX, RLOO): one site with a score
part and a pathwise part, one site's five lanes coupled through their sum, and a Markov
chain of flips in a `jax.lax.scan`, a plate of flips each observed through a normal,
and a plate of latent vectors each read by a decoder. Each takes the site's strategy;
its exact twin enumerates every joint value (`estimates.exact_by_enumeration`,
`exact_flip_plate_elbo`, `datapoint_elbos`)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from estimates import exact_by_enumeration

THETA = 0.4  # where every test measures
C = np.array([1.0, -2.0, 0.5, 3.0, -1.0])  # per-lane weights of `coupled_lanes`
T = 4  # steps of `markov_chain`


def sig(x):
    return 1 / (1 + np.exp(-x))


def single_flip_value(theta, z):
    """(3z − 1)² + θ z: a score part and a pathwise part."""
    return (3.0 * z - 1.0) ** 2 + theta * z


def single_flip(strategy: gv.Strategy) -> gv.Expectation:
    """E[(3z − 1)² + θ z], z ~ flip(σ(θ))."""
    @gv.expectation
    def f(theta):
        return single_flip_value(theta, gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=strategy)))
    return f


def exact_single_flip(theta: float) -> tuple[float, float]:
    return exact_by_enumeration(
        lambda th, z: ([sig(th) if z[0] else 1 - sig(th)], single_flip_value(th, z[0])), theta, 1)


def coupled_lanes(strategy: gv.Strategy, offset: float = 0.0) -> gv.Expectation:
    """Five lanes of one flip site, coupled through (Σ z)² as well as summed through C·z,
    plus `offset`."""
    @gv.expectation
    def f(theta):
        z = gv.sample(gv.flip(jax.nn.sigmoid(theta + jnp.arange(5.0) / 4), grad=strategy))
        return jnp.sum(jnp.asarray(C) * z) + 0.3 * jnp.sum(z) ** 2 + offset
    return f


def exact_coupled_lanes(theta: float, offset: float = 0.0) -> tuple[float, float]:
    def value_of(th, z):
        q = sig(th + np.arange(5.0) / 4)
        return np.where(z == 1, q, 1 - q), C @ z + 0.3 * z.sum() ** 2 + offset
    return exact_by_enumeration(value_of, theta, 5)


def markov_chain(strategy: gv.Strategy) -> gv.Expectation:
    """T flips in a scan, each step's probability reading the last step's draw, each
    step's cost reading both."""
    @gv.expectation
    def f(theta):
        def step(prev, t):
            z = gv.sample(gv.flip(jax.nn.sigmoid(theta + 1.2 * prev - 0.3 * t), grad=strategy))
            z = z * 1.0
            return z, (2.0 * z - prev) ** 2 + theta * z
        _, costs = jax.lax.scan(step, 0.0, jnp.arange(float(T)))
        return jnp.sum(costs)
    return f


def exact_markov_chain(theta: float) -> tuple[float, float]:
    def value_of(th, z):
        probs, total, prev = [], 0.0, 0.0
        for t in range(T):
            q = sig(th + 1.2 * prev - 0.3 * t)
            probs.append(q if z[t] else 1 - q)
            total += (2 * z[t] - prev) ** 2 + th * z[t]
            prev = z[t]
        return probs, total
    return exact_by_enumeration(value_of, theta, T)


W1 = jnp.asarray(np.random.default_rng(0).normal(size=(32, 3)), jnp.float32)
W2 = jnp.asarray(np.random.default_rng(1).normal(size=(2, 32)) / 4, jnp.float32)


FLIP_PLATE_Y = jnp.array([2.1, -1.5, 0.3, -2.4])  # the four datapoints of `flip_plate_model`
FLIP_PLATE_LOGITS = jnp.array([0.3, -0.2, 0.1, 0.5])  # where `flip_plate_guide` is measured


@gv.gen
def _flip_point(y):
    z = gv.flip(0.3) @ "z"
    gv.observe(gv.normal(jnp.where(z, 2.0, -2.0), 1.0), y)


@gv.gen
def flip_plate_model(params, y):
    """A plate of flips (prior 0.3), each datapoint y ~ N(±2, 1); `params` (the guide's)
    unused."""
    gv.vmap(_flip_point)(y) @ "data"


def flip_plate_guide(strategy: gv.Strategy) -> gv.GenFn:
    """`flip_plate_model`'s mean-field guide: a flip of probability σ(logits[i]) per
    datapoint, `strategy` at each."""
    @gv.gen
    def lane(logit):
        gv.flip(jax.nn.sigmoid(logit), grad=strategy) @ "z"

    @gv.gen
    def guide(logits, y):
        gv.vmap(lane)(logits) @ "data"
    return guide


def exact_flip_plate_elbo(logits: jax.Array, y: jax.Array = FLIP_PLATE_Y) -> jax.Array:
    """The ELBO of `flip_plate_model` under `flip_plate_guide` at `logits`: a sum over
    the datapoints, each summed over z in {0, 1} (differentiable in `logits`)."""
    q = jax.nn.sigmoid(logits)

    def term(z, qz):
        log_joint = (jnp.log(jnp.where(z, 0.3, 0.7))
                     + jax.scipy.stats.norm.logpdf(y, jnp.where(z, 2.0, -2.0), 1.0))
        return qz * (log_joint - jnp.log(qz))
    return jnp.sum(term(True, q) + term(False, 1 - q))


def decoder(z):  # the binary VAE's decoder at toy size: every output reads every lane
    return W2 @ jnp.tanh(W1 @ z - 0.5)


XS = jnp.array([[1.0, 0.5], [-0.3, 2.0], [0.8, -1.2]])  # three datapoints
# the guide's parameters at which the latent-vector tests measure: logits A x + c
GUIDE = {"A": jnp.array([[0.4, -0.2], [0.1, 0.3], [-0.5, 0.2]]), "c": jnp.array([0.2, -0.1, 0.3])}


def datapoint_elbos(params):
    """Each datapoint's exact ELBO, Σ_z q(z) (log p(z, x) − log q(z)), by enumeration."""
    zs = jnp.array(list(itertools.product([0.0, 1.0], repeat=3)))

    def one(x):
        logits = params["A"] @ x + params["c"]
        log_q = jnp.sum(zs * jax.nn.log_sigmoid(logits) + (1 - zs) * jax.nn.log_sigmoid(-logits), 1)
        log_p = 3 * jnp.log(0.5) + jnp.sum(jax.scipy.stats.norm.logpdf(x, jax.vmap(decoder)(zs), 1.0), 1)
        return jnp.sum(jnp.exp(log_q) * (log_p - log_q))
    return jax.vmap(one)(XS)


def latent_vector_programs(strategy):
    """`(model, guide)` of one datapoint x whose three binary latents `decoder` reads
    jointly; the guide's logits are affine in x (`GUIDE`), with `strategy`."""
    @gv.gen
    def model(params, x):
        z = gv.bernoulli(logits=jnp.zeros(3)) @ "z"
        gv.observe(gv.normal(decoder(z * 1.0), 1.0), x)

    @gv.gen
    def guide(params, x):
        gv.bernoulli(logits=params["A"] @ x + params["c"], grad=strategy) @ "z"
    return model, guide


def latent_vector_plate_elbo(strategy):
    """The binary VAE's shape at toy size, as a plate: `latent_vector_programs` at each
    datapoint of `XS`; the ELBO of all datapoints, one site of shape [datapoints, 3],
    exactly `sum(datapoint_elbos(params))`."""
    model_point, guide_point = latent_vector_programs(strategy)

    @gv.gen
    def model(params, xs):
        gv.plate(model_point, size=len(XS), in_axes=(None, 0))(params, xs) @ "data"

    @gv.gen
    def guide(params, xs):
        gv.plate(guide_point, size=len(XS), in_axes=(None, 0))(params, xs) @ "data"
    return gv.elbo(model, guide)


def latent_vector_iwelbo(strategy, particles: int = 2):
    """The IWELBO of `latent_vector_programs` with `particles` particles (at `XS[0]` in
    the tests): the site's leading axis is the particles' `vmap` (its batch axis), and
    the particles meet in the log-mean-exp."""
    return gv.iwelbo(*latent_vector_programs(strategy), particles)


def exact_latent_vector_iwelbo(params, particles: int = 2):
    """`latent_vector_iwelbo`'s exact value: every particle's latent vector enumerated."""
    x = XS[0]
    zs = jnp.array(list(itertools.product([0.0, 1.0], repeat=3)))
    logits = params["A"] @ x + params["c"]
    log_q = jnp.sum(zs * jax.nn.log_sigmoid(logits) + (1 - zs) * jax.nn.log_sigmoid(-logits), 1)
    log_p = 3 * jnp.log(0.5) + jnp.sum(jax.scipy.stats.norm.logpdf(x, jax.vmap(decoder)(zs), 1.0), 1)
    tuples = jnp.array(list(itertools.product(range(len(zs)), repeat=particles)))
    log_w = (log_p - log_q)[tuples]
    return jnp.sum(jnp.exp(jnp.sum(log_q[tuples], 1))
                   * (jax.scipy.special.logsumexp(log_w, 1) - jnp.log(particles)))

