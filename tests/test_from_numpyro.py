"""gv.from_numpyro: NumPyro models and guides run unchanged as genvi programs.

The log density of an adapted program equals NumPyro's own (`numpyro.infer.util.
log_density`) for every construct it runs; genvi's strategies on adapted sites are
unbiased against exact values; enumeration of an adapted HMM matches a numpy forward
algorithm; what genvi cannot run is refused in NumPyro's terms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as nd
import optax
import pytest
from numpyro import handlers as nh
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from numpyro.infer.util import log_density as numpyro_log_density

import genvi as gv
from genvi.interop.numpyro_effects import NumPyroError
from tests.estimates import biased_parts

N, B = 10, 4
X = jnp.linspace(-1.0, 1.0, N)
Y = 2.0 * X + 0.3


# ---- models written once in NumPyro, one construct each ---------------------------
def subsampled(x, y):
    w = numpyro.sample("w", nd.Normal(0.0, 1.0))
    s = numpyro.sample("s", nd.HalfNormal(1.0))
    with numpyro.plate("data", N, subsample_size=B) as idx:
        numpyro.sample("y", nd.Normal(w * x[idx], s), obs=y[idx])


def nested_plates(y):
    with numpyro.plate("groups", 3, dim=-2):
        a = numpyro.sample("a", nd.Normal(0.0, 1.0))
        with numpyro.plate("members", 4, dim=-1):
            b = numpyro.sample("b", nd.Normal(a, 1.0))
            numpyro.sample("y", nd.Normal(b, 1.0), obs=y)


def masked(y, keep):
    mu = numpyro.sample("mu", nd.Normal(0.0, 1.0))
    with numpyro.plate("d", 5), nh.mask(mask=keep):
        z = numpyro.sample("z", nd.Normal(mu, 1.0))
        numpyro.sample("y", nd.Normal(z, 1.0), obs=y)


def scaled(y):
    mu = numpyro.sample("mu", nd.Normal(0.0, 1.0))
    with nh.scale(scale=3.0):
        z = numpyro.sample("z", nd.Normal(mu, 1.0))
        numpyro.sample("y", nd.Normal(z, 1.0), obs=y)
    with nh.scale(scale=jnp.array([1.0, 2.0, 3.0])):   # per-datum weights
        numpyro.sample("y2", nd.Normal(mu, 1.0).expand([3]), obs=jnp.ones(3))


def statements():
    a = numpyro.sample("a", nd.Normal(0.0, 1.0))
    b = numpyro.sample("b", nd.Normal(a, 1.0))
    c = numpyro.sample("c", nd.Normal(b, 1.0))
    numpyro.deterministic("d", a + b)
    numpyro.factor("f", -0.5 * c**2)
    return c


def blocked():
    a = numpyro.sample("a", nd.Normal(0.0, 1.0))
    with nh.block(hide=["hidden"]):
        numpyro.sample("hidden", nd.Normal(a, 1.0), obs=2.0)
    numpyro.sample("seen", nd.Normal(a, 1.0), obs=1.0)


def scoped():
    a = numpyro.sample("a", nd.Normal(0.0, 1.0))
    with nh.scope(prefix="inner"):
        numpyro.sample("b", nd.Normal(a, 1.0))


def random_walk(ys):
    def step(z, y):
        z = numpyro.sample("z", nd.Normal(0.9 * z, 1.0))
        numpyro.sample("y", nd.Normal(z, 0.5), obs=y)
        return z, z
    scan(step, 0.0, ys)


def discrete(y):
    p = numpyro.sample("p", nd.Beta(2.0, 2.0))
    with numpyro.plate("d", 4):
        z = numpyro.sample("z", nd.Bernoulli(p))
        k = numpyro.sample("k", nd.Categorical(logits=jnp.zeros(3)))
        numpyro.sample("y", nd.Normal(z + k, 1.0), obs=y)


def multivariate():
    chol = numpyro.sample("L", nd.LKJCholesky(3, 2.0))
    numpyro.sample("x", nd.MultivariateNormal(jnp.zeros(3), scale_tril=chol))
    probs = numpyro.sample("probs", nd.Dirichlet(jnp.ones(3)))
    numpyro.sample("o", nd.Categorical(probs=probs), obs=1)


def with_params(y):
    loc = numpyro.param("loc", jnp.zeros(2))
    scale = numpyro.param("scale", jnp.ones(2), constraint=constraints.positive)
    w = numpyro.param("w", jnp.array([0.3, 0.7]), constraint=constraints.simplex)
    z = numpyro.sample("z", nd.Normal(loc, scale).to_event(1))
    numpyro.sample("y", nd.Normal(jnp.dot(w, z), 1.0), obs=y)


def counts(ys, totals):
    probs = numpyro.sample("probs", nd.Dirichlet(jnp.ones(3)))
    with numpyro.plate("n", ys.shape[0]):   # total_count: an array NumPyro keeps static
        numpyro.sample("y", nd.Multinomial(total_count=totals, probs=probs), obs=ys)


CASES = {
    "plate with subsampling": (subsampled, (X, Y), ()),
    "nested plates (dim=-2, dim=-1)": (nested_plates, (jnp.ones((3, 4)),), ()),
    "mask": (masked, (jnp.arange(5.0), jnp.array([True, False, True, True, False])), ()),
    "scale (static and per datum)": (scaled, (1.0,), ()),
    "condition, substitute, deterministic, factor": (
        nh.substitute(nh.condition(statements, {"b": 0.7}), {"a": 0.2}), (), ("a",)),
    "block": (blocked, (), ()),
    "scope": (scoped, (), ()),
    "contrib.control_flow.scan": (random_walk, (jnp.linspace(0.0, 1.0, 6),), ()),
    "discrete sites in a plate": (discrete, (jnp.arange(4.0),), ()),
    "multivariate and constrained supports": (multivariate, (), ()),
    "an observed multinomial with an array total_count": (
        counts, (jnp.array([[1.0, 2.0, 3.0], [0.0, 4.0, 1.0]]), jnp.array([6.0, 5.0])), ()),
}


def numpyro_values(model, args, seed=0):
    """The latent values and subsample indices of one NumPyro run of `model`."""
    trace = nh.trace(nh.seed(model, jax.random.key(seed))).get_trace(*args)
    values = {}
    for name, site in trace.items():
        subsampled_plate = (site["type"] == "plate" and site["args"][1] is not None
                            and site["args"][1] != site["args"][0])
        if (site["type"] == "sample" and not site["is_observed"]) or subsampled_plate:
            values[name] = site["value"]
    return values


@pytest.mark.parametrize("case", list(CASES))
def test_log_density_equals_numpyros(case):
    model, args, fixed = CASES[case]
    values = numpyro_values(model, args)
    want = numpyro_log_density(model, args, {}, values)[0]
    choices = gv.choices({k: v for k, v in values.items() if k not in fixed})
    got = gv.from_numpyro(model).log_density(choices, {}, *args)
    assert np.isclose(float(got), float(want), rtol=1e-5, atol=1e-4), (float(got), float(want))


def test_parameters_are_read_from_params_with_their_constraints():
    program = gv.from_numpyro(with_params)
    params = program.init(jax.random.key(0), 1.0)
    assert isinstance(params["scale"], gv.Constrained) and isinstance(params["w"], gv.Constrained)
    params = {"loc": jnp.array([0.5, -0.2]), "scale": gv.positive(jnp.array([0.7, 1.3])),
              "w": gv.simplex(jnp.array([0.4, 0.6]))}
    z = jnp.array([0.1, 0.4])
    got = program.log_density(gv.choices({"z": z}), params, 1.0)
    plain = {k: (v.value if isinstance(v, gv.Constrained) else v) for k, v in params.items()}
    want = numpyro_log_density(with_params, (1.0,), {}, {**plain, "z": z})[0]
    assert np.isclose(float(got), float(want), rtol=1e-5)

    def shifted():   # any constraint NumPyro bijects onto, as NumPyro stores it
        numpyro.param("g", 2.0, constraint=constraints.greater_than(1.0))
    g = gv.from_numpyro(shifted).init(jax.random.key(0))["g"]
    assert np.isclose(float(g.value), 2.0) and np.isclose(float(g.raw), 0.0, atol=1e-6)


def test_choices_are_laid_out_as_numpyros_trace():
    program = gv.from_numpyro(nested_plates)
    trace = program.simulate(jax.random.key(0), {}, jnp.ones((3, 4)))
    assert trace.choices["a"].shape == (3, 1) and trace.choices["b"].shape == (3, 4)
    steps = gv.from_numpyro(random_walk).simulate(jax.random.key(0), {}, jnp.zeros(6))
    assert steps.choices["z"].shape == (6,)
    inner = gv.from_numpyro(scoped).simulate(jax.random.key(0), {})
    assert inner.choices["inner", "b"].shape == ()
    assert gv.from_numpyro(statements).simulate(jax.random.key(0), {}).choices["d"].shape == ()


# ---- strategies on adapted sites against exact values ------------------------------
Y3 = jnp.array([-0.5, 0.4, 1.2])


def normal_model(y):
    with numpyro.plate("d", 3):
        z = numpyro.sample("z", nd.Normal(0.0, 1.0))
        numpyro.sample("y", nd.Normal(z, 1.0), obs=y)


def normal_guide(y):
    m = numpyro.param("m", jnp.array([0.1, -0.3, 0.5]))
    s = numpyro.param("s", jnp.array([0.8, 1.1, 0.6]), constraint=constraints.positive)
    with numpyro.plate("d", 3):
        numpyro.sample("z", nd.Normal(m, s))


def normal_elbo(params):
    """E_q[log p(y, z) − log q(z)] in closed form (per lane: a normal prior and
    likelihood, a normal guide)."""
    m, s = params["m"], gv.constrain(params)["s"]
    ez2 = m**2 + s**2
    log_prior = -0.5 * ez2 - 0.5 * math.log(2 * math.pi)
    log_lik = -0.5 * (Y3**2 - 2 * Y3 * m + ez2) - 0.5 * math.log(2 * math.pi)
    entropy = jnp.log(s) + 0.5 * math.log(2 * math.pi * math.e)
    return jnp.sum(log_prior + log_lik + entropy)


@pytest.mark.parametrize("strategy", [gv.REPARAM, gv.REINFORCE, gv.MVD, gv.AUTO],
                         ids=["REPARAM", "REINFORCE", "MVD", "AUTO"])
def test_continuous_strategies_in_a_plate_are_unbiased(strategy):
    guide = gv.from_numpyro(normal_guide, {"z": strategy})
    params = guide.init(jax.random.key(0), Y3)
    objective = gv.elbo(gv.from_numpyro(normal_model), guide)
    if strategy is gv.AUTO:
        objective = gv.tune(objective, params, Y3, key=jax.random.key(3)).apply(objective)
    assert biased_parts(objective, normal_elbo, params, Y3) == []


def coin_model(y):
    with numpyro.plate("d", 3):
        z = numpyro.sample("z", nd.Bernoulli(0.3))
        numpyro.sample("y", nd.Normal(2.0 * z - 1.0, 1.0), obs=y)


def coin_guide(y):
    logits = numpyro.param("logits", jnp.array([0.2, -0.4, 1.0]))
    with numpyro.plate("d", 3):
        numpyro.sample("z", nd.Bernoulli(logits=logits))


def coin_elbo(params):
    """The ELBO summed exactly over each lane's two values."""
    q1 = jax.nn.sigmoid(params["logits"])
    total = 0.0
    for z, q in ((1.0, q1), (0.0, 1.0 - q1)):
        log_p = (jnp.log(0.3) if z else jnp.log(0.7)) - 0.5 * (Y3 - (2 * z - 1)) ** 2 \
            - 0.5 * math.log(2 * math.pi)
        total = total + q * (log_p - jnp.log(q))
    return jnp.sum(total)


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.REINFORCE, gv.DisARM, gv.MVD, gv.SD,
                                      gv.RLOO(2), gv.SWOR(2), gv.REINFORCE.with_baseline(-3.0),
                                      gv.RELAX(lambda phi, z: phi * jnp.sum(z), 0.5)],
                         ids=["ENUM", "REINFORCE", "DisARM", "MVD", "SD", "RLOO(2)", "SWOR(2)",
                              "baseline", "RELAX"])
def test_discrete_strategies_in_a_plate_are_unbiased(strategy):
    guide = gv.from_numpyro(coin_guide, {"z": strategy})
    params = guide.init(jax.random.key(0), Y3)
    objective = gv.elbo(gv.from_numpyro(coin_model), guide)
    assert biased_parts(objective, coin_elbo, params, Y3) == []


def chain_model(ys):
    def step(z, y):
        z = numpyro.sample("z", nd.Bernoulli(jnp.where(z > 0, 0.8, 0.3)))
        numpyro.sample("y", nd.Normal(2.0 * z - 1.0, 1.0), obs=y)
        return z, None
    scan(step, 0, ys)


def chain_guide(ys):
    logits = numpyro.param("logits", jnp.array([0.5, -0.5, 0.2]))

    def step(carry, logit):
        numpyro.sample("z", nd.Bernoulli(logits=logit))
        return carry, None
    scan(step, 0, logits)


def chain_elbo(params):
    """The ELBO summed over the 8 paths of the three-step chain."""
    q1 = jax.nn.sigmoid(params["logits"])
    total = 0.0
    for path in np.ndindex(2, 2, 2):
        z = jnp.asarray(path, jnp.float32)
        q = jnp.prod(jnp.where(z > 0, q1, 1 - q1))
        prev = jnp.concatenate([jnp.zeros(1), z[:-1]])
        p1 = jnp.where(prev > 0, 0.8, 0.3)
        log_p = jnp.sum(jnp.log(jnp.where(z > 0, p1, 1 - p1)) - 0.5 * (Y3 - (2 * z - 1)) ** 2
                        - 0.5 * math.log(2 * math.pi))
        total = total + q * (log_p - jnp.log(q))
    return total


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.REINFORCE, gv.MVD],
                         ids=["ENUM", "REINFORCE", "MVD"])
def test_strategies_in_a_scan_are_unbiased(strategy):
    guide = gv.from_numpyro(chain_guide, {"z": strategy})
    params = guide.init(jax.random.key(0), Y3)
    objective = gv.elbo(gv.from_numpyro(chain_model), guide)
    assert biased_parts(objective, chain_elbo, params, Y3) == []


# ---- enumeration ----------------------------------------------------------------------
TRANSITION = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
MEANS = np.array([-1.0, 0.0, 2.0])


def hmm(ys):
    scale = numpyro.sample("scale", nd.HalfNormal(1.0))

    def step(z, y):
        z = numpyro.sample("z", nd.Categorical(probs=jnp.asarray(TRANSITION)[z]),
                           infer={"enumerate": "parallel"})
        numpyro.sample("y", nd.Normal(jnp.asarray(MEANS)[z], scale), obs=y)
        return z, None
    scan(step, 0, ys)


def forward_algorithm(ys, scale):
    alpha = np.eye(3)[0]
    for y in ys:
        alpha = (alpha @ TRANSITION) * np.exp(-0.5 * ((y - MEANS) / scale) ** 2) \
            / (scale * math.sqrt(2 * math.pi))
    return math.log(alpha.sum())


def test_enumerating_an_adapted_hmm_is_the_forward_algorithm():
    ys = np.array([-1.0, -0.5, 0.3, 2.1, 1.8, 0.1])
    marginal = gv.marginal(gv.from_numpyro(hmm), keep=["scale"],
                           algorithm=gv.enumeration())
    got = marginal.log_density(gv.choices({"scale": 0.7}), {}, jnp.asarray(ys))
    prior = math.log(2.0) - 0.5 * 0.7**2 - 0.5 * math.log(2 * math.pi)
    assert np.isclose(float(got), forward_algorithm(ys, 0.7) + prior, atol=1e-4)


# ---- training from the guide's own start ---------------------------------------------
def test_a_numpyro_guide_trains_from_its_own_initial_values():
    def model(y):
        mu = numpyro.sample("mu", nd.Normal(0.0, 1.0))
        numpyro.sample("y", nd.Normal(mu, 1.0), obs=y)

    def guide(y):
        m = numpyro.param("m", 0.0)
        s = numpyro.param("s", 0.5, constraint=constraints.positive)
        numpyro.sample("mu", nd.Normal(m, s), infer={"grad": gv.REPARAM})

    guide_ = gv.from_numpyro(guide)
    fit = gv.fit(gv.elbo(gv.from_numpyro(model), guide_), guide_.init(jax.random.key(0), 1.0),
                 1.0, optimizer=optax.adam(optax.cosine_decay_schedule(0.05, 1500)),
                 steps=1500, key=jax.random.key(1), progress=False)
    posterior = gv.constrain(fit.params)      # exactly N(0.5, 1/2)
    assert abs(float(posterior["m"]) - 0.5) < 0.05
    assert abs(float(posterior["s"]) - math.sqrt(0.5)) < 0.05


def test_an_automatic_guide_fits_an_adapted_model():
    def regression(x, y):
        w = numpyro.sample("w", nd.Normal(0.0, 1.0))
        s = numpyro.sample("s", nd.LogNormal(0.0, 1.0))
        with numpyro.plate("d", x.shape[0]):
            numpyro.sample("y", nd.Normal(w * x, s), obs=y)

    x = jnp.linspace(-1.0, 1.0, 50)
    y = 1.5 * x + 0.2 * jax.random.normal(jax.random.key(3), (50,))
    model = gv.from_numpyro(regression)
    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(0), {}, x, y)}
    fit = gv.fit(gv.elbo(model, auto), params, x, y, optimizer=optax.adam(0.05), steps=1500,
                 key=jax.random.key(1), progress=False)
    median = auto.median(fit.params)
    assert abs(float(median["w"]) - 1.5) < 0.15 and 0.1 < float(median["s"]) < 0.35
    draws = gv.predictive(model, auto, fit.params, 7)(jax.random.key(2), x, y)
    assert draws["y"].shape == (7, 50)


# ---- refusals in NumPyro's terms -------------------------------------------------------
def test_what_cannot_run_is_refused_naming_the_site():
    def sequential():
        numpyro.sample("z", nd.Bernoulli(0.5), infer={"enumerate": "sequential"})

    def traced_scale(s):
        with nh.scale(scale=s):
            numpyro.sample("z", nd.Normal(0.0, 1.0))

    def guide():   # an initial value outside its constraint
        numpyro.param("g", 0.5, constraint=constraints.greater_than(1.0))

    def mask_around_scan(ys):
        with nh.mask(mask=True):
            random_walk(ys)

    key = jax.random.key(0)
    with pytest.raises(NumPyroError, match="'z'.*sequential"):
        gv.from_numpyro(sequential).simulate(key, {})
    with pytest.raises(NumPyroError, match="'z'.*scale"):
        gv.from_numpyro(traced_scale).simulate(key, {}, 2.0)
    with pytest.raises(NumPyroError, match="'g'.*outside its constraint"):
        gv.from_numpyro(guide).init(key)
    with pytest.raises(NumPyroError, match="mask around contrib.control_flow.scan"):
        gv.from_numpyro(mask_around_scan).simulate(key, {}, jnp.zeros(3))
    with pytest.raises(KeyError, match="program.init"):
        gv.from_numpyro(with_params).simulate(key, {}, 1.0)
    with pytest.raises(TypeError, match="parameters first"):
        gv.from_numpyro(normal_model).simulate(key, Y3)
    with pytest.raises(KeyError, match="'zz'"):
        gv.from_numpyro(normal_guide, {"zz": gv.REPARAM}).simulate(
            key, gv.from_numpyro(normal_guide).init(key, Y3), Y3)
    with pytest.raises(ValueError, match=r"'z' \(numpyro's Normal\).*infer=\{'grad'"):
        gv.elbo(gv.from_numpyro(normal_model), gv.from_numpyro(normal_guide)).grad_estimate(
            key, gv.from_numpyro(normal_guide).init(key, Y3), Y3)


def test_without_numpyro_the_message_says_how_to_install_it(monkeypatch):
    import sys

    import genvi.interop
    monkeypatch.delattr(genvi.interop, "numpyro_program", raising=False)
    for name in [m for m in sys.modules if m == "numpyro" or m.startswith("numpyro.")
                 or m == "genvi.interop.numpyro_program"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "numpyro", None)
    with pytest.raises(ModuleNotFoundError, match=r"genvi\[numpyro\]"):
        gv.from_numpyro(lambda: None)


def test_an_automatic_guide_over_numpyro_sites_is_numpyros_autonormal_family():
    """A simplex site is reached by NumPyro's stick-breaking (`biject_to`), so the guide's
    density at a value is the normal density of its unconstrained preimage less
    NumPyro's log-Jacobian, in the measure of NumPyro's Dirichlet."""
    from numpyro.distributions.transforms import biject_to

    def model():
        numpyro.sample("p", nd.Dirichlet(jnp.array([2.0, 3.0, 4.0])))

    auto = gv.auto_normal(gv.from_numpyro(model))
    params = {"guide": auto.init(jax.random.key(0), {})}
    y = jnp.array([0.2, 0.3, 0.5])
    t = biject_to(constraints.simplex)
    u = t.inv(y)
    loc = params["guide"]["loc"]["p"]
    scale = params["guide"]["scale"]["p"].value
    want = jnp.sum(nd.Normal(loc, scale).log_prob(u)) - t.log_abs_det_jacobian(u, y)
    got = auto.log_density(gv.choices({"p": y}), params)
    assert np.isclose(float(got), float(want), atol=1e-4)


def test_plates_and_scans_get_lane_local_and_markov_local_replays():
    """A site in a NumPyro plate is a plate of lanes, one in a NumPyro scan a chain of
    steps: ENUM's replays stay O(lanes) and O(steps), as on gv.plate and gv.scan."""
    plate = gv.from_numpyro(coin_guide, {"z": gv.ENUM})
    shown = str(gv.elbo(gv.from_numpyro(coin_model), plate).explain(
        plate.init(jax.random.key(0), Y3), Y3))
    assert "3 lanes: lane-local" in shown
    chain = gv.from_numpyro(chain_guide, {"z": gv.ENUM})
    shown = str(gv.elbo(gv.from_numpyro(chain_model), chain).explain(
        chain.init(jax.random.key(0), Y3), Y3))
    assert "3 steps × 1 lane: Markov-local" in shown


def test_validation_names_the_users_line_not_numpyros():
    def counts():
        rate = numpyro.sample("rate", nd.Gamma(2.0, 1.0))
        numpyro.sample("y", nd.Poisson(rate), obs=-1.0)   # not a count

    with gv.validation(), pytest.raises(gv.InvalidParameters) as caught:
        gv.from_numpyro(counts).log_density(gv.choices({"rate": 1.0}), {})
    message = str(caught.value)
    assert "numpyro's Poisson" in message and "test_from_numpyro.py" in message
    assert "primitives.py" not in message


# -- NumPyro's autoguides and parameters ------------------------------------------------

def regression(X, Y=None):
    w = numpyro.sample("w", nd.Normal(jnp.zeros(3), 1.0).to_event(1))
    s = numpyro.sample("s", nd.HalfNormal(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("Y", nd.Normal(X @ w, s), obs=Y)


REG_X = jax.random.normal(jax.random.key(1), (20, 3))
REG_Y = REG_X @ jnp.array([1.0, -1.0, 0.5]) + 0.3 * jax.random.normal(jax.random.key(2), (20,))
AUTOGUIDES = ["AutoNormal", "AutoDiagonalNormal", "AutoMultivariateNormal",
              "AutoLowRankMultivariateNormal", "AutoLaplaceApproximation"]


@pytest.mark.parametrize("name", AUTOGUIDES)
def test_numpyros_autoguides_estimate_numpyros_elbo(name):
    """Each autoguide runs as a genvi guide (an auxiliary joint latent is scored in q
    only; NumPyro's own constraints, ScaledUnitLowerCholesky included), and genvi's
    ELBO at its initial parameters has the mean of NumPyro's Trace_ELBO there."""
    from numpyro.infer import Trace_ELBO, autoguide
    from numpyro.infer.initialization import init_to_mean

    guide = getattr(autoguide, name)(regression, init_loc_fn=init_to_mean)
    model, q = gv.from_numpyro(regression), gv.from_numpyro(guide, strategies=gv.REPARAM)
    params = q.init(jax.random.key(0), REG_X, REG_Y)
    keys = jax.random.split(jax.random.key(3), 4000)
    ours = np.asarray(jax.jit(jax.vmap(lambda k: gv.elbo(model, q).estimate(
        k, params, REG_X, REG_Y)))(keys), np.float64)
    constrained = gv.constrain(params)
    theirs = -np.asarray(jax.jit(jax.vmap(lambda k: Trace_ELBO().loss(
        k, constrained, regression, guide, REG_X, REG_Y)))(keys), np.float64)
    se = math.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert abs(ours.mean() - theirs.mean()) <= 5 * se + 1e-4, (ours.mean(), theirs.mean(), se)
    # and it trains under gv.iwelbo and gv.fit
    assert np.isfinite(float(gv.iwelbo(model, q, 4).estimate(jax.random.key(4), params,
                                                             REG_X, REG_Y)))
    fit = gv.fit(gv.elbo(model, q), params, REG_X, REG_Y, optimizer=optax.adam(0.02),
                 steps=300, key=jax.random.key(5), progress=False)
    assert fit.history["objective"][-50:].mean() > fit.history["objective"][:50].mean()


def test_an_auxiliary_site_is_not_a_choice_and_scoring_it_at_choices_is_refused():
    from numpyro.infer import autoguide

    guide = autoguide.AutoDiagonalNormal(regression)
    q = gv.from_numpyro(guide, strategies=gv.REPARAM)
    params = q.init(jax.random.key(0), REG_X, REG_Y)
    trace = q.simulate(jax.random.key(1), params, REG_X, REG_Y)
    assert sorted(trace.choices.flat()) == [("s",), ("w",)]
    with pytest.raises(ValueError, match="'_auto_latent'.*auxiliary site"):
        q.log_density(trace.choices, params, REG_X, REG_Y)


def softplus_guide(y):
    s = numpyro.param("s", 0.3, constraint=constraints.softplus_positive)
    numpyro.sample("z", nd.Delta(s))


def halfnormal_model(y):
    z = numpyro.sample("z", nd.HalfNormal(1.0))
    numpyro.sample("y", nd.Normal(z, 0.5), obs=y)


def test_parameters_are_stored_as_numpyro_stores_them_so_adam_follows_numpyros_path():
    """A softplus_positive parameter stays softplus (NumPyro's biject_to), so 100 Adam
    steps on a deterministic ELBO (a Delta guide) end where NumPyro's SVI ends; stored
    as a log they would not (1.593 against 1.583)."""
    from numpyro.infer import SVI, Trace_ELBO

    svi = SVI(halfnormal_model, softplus_guide, optax.adam(0.05), Trace_ELBO())
    state = svi.init(jax.random.key(0), 2.0)
    for _ in range(100):
        state, _ = svi.update(state, 2.0)
    q = gv.from_numpyro(softplus_guide, strategies=gv.REPARAM)
    fit = gv.fit(gv.elbo(gv.from_numpyro(halfnormal_model), q),
                 q.init(jax.random.key(0), 2.0), 2.0, optimizer=optax.adam(0.05), steps=100,
                 key=jax.random.key(0), progress=False)
    np.testing.assert_allclose(float(gv.constrain(fit.params)["s"]),
                               float(svi.get_params(state)["s"]), rtol=1e-5)


def test_an_autonormals_parameters_are_numpyros_unconstrained_values():
    from numpyro.infer import SVI, Trace_ELBO, autoguide
    from numpyro.infer.initialization import init_to_mean

    guide = autoguide.AutoNormal(regression, init_loc_fn=init_to_mean)
    svi = SVI(regression, guide, optax.adam(0.01), Trace_ELBO())
    unconstrained = svi.optim.get_params(svi.init(jax.random.key(0), REG_X, REG_Y).optim_state)
    params = gv.from_numpyro(guide).init(jax.random.key(0), REG_X, REG_Y)
    assert sorted(params) == sorted(unconstrained)
    for name, value in params.items():
        raw = value.raw if isinstance(value, gv.Constrained) else value
        np.testing.assert_allclose(np.asarray(raw), np.asarray(unconstrained[name]), rtol=1e-6)


def test_an_autoguide_run_before_init_says_to_init_it():
    from numpyro.infer import autoguide

    q = gv.from_numpyro(autoguide.AutoNormal(regression), strategies=gv.REPARAM)
    with pytest.raises(NumPyroError, match=r"before it knows the model's sites.*program.init"):
        q.simulate(jax.random.key(0), {}, REG_X, REG_Y)


# -- numpyro.prng_key(): randomness without a density (dropout) ---------------------------

def dropout_model(x, y):
    w = numpyro.param("w", jnp.array([1.0, -0.5, 0.3]))
    keep = jax.random.bernoulli(numpyro.prng_key(), 0.5, (3,))   # dropout on w * x
    h = jnp.sum(jnp.where(keep, w * x, 0.0)) / 0.5
    z = numpyro.sample("z", nd.Normal(0.0, 1.0))
    numpyro.sample("y", nd.Normal(z + h, 1.0), obs=y)


def shifted_guide(x, y):
    m = numpyro.param("m", 0.2)
    s = jnp.where(jax.random.bernoulli(numpyro.prng_key(), 0.5), 0.1, -0.1)
    numpyro.sample("z", nd.Normal(m + s, 1.0))


def test_prng_key_draws_randomness_the_objective_averages_over():
    """Dropout in the model and a random shift in the guide, both from
    numpyro.prng_key(): genvi's ELBO and its gradient are unbiased for the ELBO
    averaged over that randomness (exact: 8 masks × 2 shifts, Gaussian z)."""
    import itertools

    x, y = jnp.array([0.5, 1.0, -1.5]), 0.7
    masks = jnp.array(list(itertools.product([0.0, 1.0], repeat=3)))

    def exact(params):
        h = jnp.sum(masks * params["w"] * x, axis=1) / 0.5                 # [8]
        def at(s):
            mean = params["m"] + s
            return jnp.mean(-0.5 * ((y - mean - h) ** 2 + 1.0)
                            - 0.5 * (mean ** 2 + 1.0) + 0.5 - 0.5 * math.log(2 * math.pi))
        return 0.5 * (at(0.1) + at(-0.1))

    model = gv.from_numpyro(dropout_model)
    guide = gv.from_numpyro(shifted_guide, strategies=gv.REPARAM)
    params = {**model.init(jax.random.key(0), x, y), **guide.init(jax.random.key(0), x, y)}
    assert biased_parts(gv.elbo(model, guide), exact, params, x, y) == []
    trace = guide.simulate(jax.random.key(1), params, x, y)
    assert sorted(trace.choices.flat()) == [("z",)]   # the key is not a choice
    with pytest.raises(ValueError, match="numpyro.prng_key.*inside an objective"):
        model.log_density(gv.choices({"z": 0.0}), params, x, y)


def test_predictive_at_new_inputs_draws_the_observation_given_none():
    """NumPyro's Predictive(model, guide=..., params=...)(key, X_new, None): the site
    observed in training is drawn from the model given the guide's latents."""
    from numpyro.infer import Predictive, autoguide
    from numpyro.infer.initialization import init_to_mean

    guide = autoguide.AutoNormal(regression, init_loc_fn=init_to_mean)
    model, q = gv.from_numpyro(regression), gv.from_numpyro(guide, strategies=gv.REPARAM)
    params = q.init(jax.random.key(0), REG_X, REG_Y)
    new_x = REG_X[:4] + 1.0
    ours = gv.predictive(model, q, params, 4000)(jax.random.key(1), new_x, None)
    theirs = Predictive(regression, guide=guide, params=gv.constrain(params),
                        num_samples=4000)(jax.random.key(2), new_x, None)
    assert ours["Y"].shape == theirs["Y"].shape == (4000, 4)
    se = np.sqrt(ours["Y"].var(0) / 4000 + theirs["Y"].var(0) / 4000)
    assert np.all(np.abs(ours["Y"].mean(0) - theirs["Y"].mean(0)) <= 5 * se), (
        ours["Y"].mean(0), theirs["Y"].mean(0), se)


def padded_hmm(ys, valid, whole_step):
    """`hmm` with padded steps: `handlers.mask` around the whole step (state included),
    or around the observation only."""
    import contextlib

    scale = numpyro.sample("scale", nd.HalfNormal(1.0))

    def step(z, inputs):
        y, ok = inputs
        with nh.mask(mask=ok) if whole_step else contextlib.nullcontext():
            z = numpyro.sample("z", nd.Categorical(probs=jnp.asarray(TRANSITION)[z]),
                               infer={"enumerate": "parallel"})
            with nh.mask(mask=ok):
                numpyro.sample("y", nd.Normal(jnp.asarray(MEANS)[z], scale), obs=y)
        return z, None
    scan(step, 0, (ys, valid))


@pytest.mark.parametrize("whole_step", [True, False])
def test_a_padded_step_adds_log_h_only_where_the_mask_covers_its_state(whole_step):
    ys = np.array([-1.0, -0.5, 0.3, 2.1, 0.0, 0.0])
    valid = np.array([True, True, True, True, False, False])
    program = gv.from_numpyro(lambda ys, valid: padded_hmm(ys, valid, whole_step))
    marginal = gv.marginal(program, keep=["scale"], algorithm=gv.enumeration())
    got = float(marginal.log_density(gv.choices({"scale": 0.7}), {}, jnp.asarray(ys),
                                     jnp.asarray(valid)))
    prior = math.log(2.0) - 0.5 * 0.7**2 - 0.5 * math.log(2 * math.pi)
    exact = forward_algorithm(ys[:4], 0.7) + prior
    padded = 2 * math.log(len(MEANS)) if whole_step else 0.0
    assert np.isclose(got, exact + padded, atol=1e-4), (got, exact, padded)
