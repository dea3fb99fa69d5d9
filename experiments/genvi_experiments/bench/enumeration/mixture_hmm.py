"""Discrete latents summed out in the model: genvi's `gv.enumeration()` beside the same
models with `grad=gv.ENUM` in the guide and beside NumPyro's `TraceEnum_ELBO`
(`infer={"enumerate": "parallel"}`, funsor), on a 1-d Gaussian mixture (K = 3,
full-data plate), a hidden Markov model (K = 3 states, `gv.scan` / NumPyro's
`contrib.control_flow.scan`) and a batch of sequences (`--sequences` of
`--steps-hmm` steps, `--states` states: a `gv.scan` in a `gv.vmap` / NumPyro's scan
in a plate; genvi's enumeration and NumPyro only).

Each method fits the continuous latents (mixture weights and means; transition rows
and emission means) with a mean-field normal guide (genvi's `gv.auto_normal`,
NumPyro's `AutoNormal`) and Adam. Reports the warm time of one jitted gradient step,
interleaved rounds, medians (ratios to genvi's enumeration); then, after
`--fit-steps` steps of each, the largest error of the fitted means (posterior means
of the guide) against the truth, components matched by sorting, every fit starting
where NumPyro's `AutoNormal` starts (`gv.init_to_value`); and each method's
log density at the true parameters minus the exact log marginal (a forward
algorithm in numpy).

On the models with a scan, NumPyro 0.22's `TraceEnum_ELBO` does not compute the log
marginal: its value differs from the exact one by hundreds or thousands of nats
(more than the log marginal of a one-state model), while NumPyro's own
`numpyro.contrib.funsor.log_density` of the enumerated model computes it exactly.
Those rows are reported three ways: `TraceEnum_ELBO` of the `scan` model (its speed,
on an objective that is not the ELBO), `TraceEnum_ELBO` of the same chain as a Python
loop under `numpyro.contrib.funsor.markov` ("markov loop": exact) and an ELBO step
built on the exact `log_density` ("NumPyro exact enumeration").

    python -m genvi_experiments.bench.enumeration.mixture_hmm [--points 1000] [--steps-hmm 100]
        [--fit-steps 2000] [--rounds 15] [--models mixture hmm sequences]
        [--sequences 50] [--states 5] [--record]

`--record` writes the summary table to docs/benchmarks/enumeration.md through
`genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_medians

K = 3
MIX_MEANS = np.array([-2.0, 0.5, 3.0])
MIX_WEIGHTS = np.array([0.3, 0.3, 0.4])
HMM_MEANS = np.array([-1.5, 0.5, 2.5])
STAY = 0.85
SD = 0.5


def mixture_data(n: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    z = rng.choice(K, size=n, p=MIX_WEIGHTS)
    return jnp.asarray(MIX_MEANS[z] + SD * rng.normal(size=n), jnp.float32)


def hmm_data(t: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    trans = sticky(K)
    z, out = 0, []
    for _ in range(t):
        z = rng.choice(K, p=trans[z])
        out.append(HMM_MEANS[z] + SD * rng.normal())
    return jnp.asarray(out, jnp.float32)


# -- genvi models ------------------------------------------------------------------------
@gv.gen
def point(mu, w, y):
    z = gv.categorical(jnp.log(w)) @ "z"
    gv.observe(gv.normal(mu[z], SD), y)


@gv.gen
def mixture(params, y):
    w = gv.dirichlet(jnp.ones(K)) @ "w"
    mu = gv.normal(jnp.linspace(-1.0, 1.0, K), 3.0) @ "mu"
    gv.vmap(point, in_axes=(None, None, 0))(mu, w, y) @ "data"


@gv.gen
def hmm_step(carry, y):
    z_prev, trans, means = carry
    z = gv.categorical(jnp.log(trans[z_prev])) @ "z"
    gv.observe(gv.normal(means[z], SD), y)
    return (z, trans, means), None


@gv.gen
def hmm(params, ys):
    trans = gv.dirichlet(jnp.ones((K, K)) + 2.0 * jnp.eye(K)) @ "trans"
    means = gv.normal(jnp.linspace(-1.0, 1.0, K), 3.0) @ "means"
    gv.scan(hmm_step)((0, trans, means), ys) @ "steps"


@gv.gen
def lane(logits):
    gv.categorical(logits, grad=gv.ENUM) @ "z"


@gv.gen
def guide_step(carry, logits):
    gv.categorical(logits, grad=gv.ENUM) @ "z"
    return carry, None


def genvi_methods(model, site: str, keep: list, means: str, data: jax.Array,
                  key: jax.Array, init=None) -> dict:
    """{name: (objective, start params, fitted means of params)} for enumeration in the
    model and ENUM in the guide (a categorical per datapoint / step, its own logits),
    the automatic guides starting by `init`."""
    enumerated = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    auto = gv.auto_normal(enumerated, init=init)
    local = gv.auto_normal(model, exclude=[site], init=init)

    @gv.gen
    def guide(params, y):
        local.inline(params, y)
        if site == "data/z":
            gv.vmap(lane)(params["logits"]) @ "data"
        else:
            gv.scan(guide_step)(0, params["logits"]) @ "steps"
    logits = jnp.zeros((len(data), K))
    return {
        "enumeration in the model": (gv.elbo(enumerated, auto),
                                     {"guide": auto.init(key, {}, data)},
                                     lambda p: auto.mean(p)[means]),
        "ENUM in the guide": (gv.elbo(model, guide),
                              {"guide": local.init(key, {}, data), "logits": logits},
                              lambda p: local.mean(p)[means]),
    }


def genvi_step(objective, lr: float, data: jax.Array):
    opt = optax.adam(lr)

    @jax.jit
    def step(params, state, key):
        grads = objective.grad_estimate(key, params, data)
        updates, state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), state, params)
        return optax.apply_updates(params, updates), state
    return opt, step


# -- NumPyro ----------------------------------------------------------------------------
# -- a batch of sequences ------------------------------------------------------------------
def sequence_means(states: int) -> np.ndarray:
    return np.linspace(-2.0 * (states - 1) / 2, 2.0 * (states - 1) / 2, states)


def sequences_data(sequences: int, steps: int, states: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    trans = sticky(states)
    means = sequence_means(states)
    out = np.zeros((sequences, steps))
    for b in range(sequences):
        z = 0
        for t in range(steps):
            z = rng.choice(states, p=trans[z])
            out[b, t] = means[z] + SD * rng.normal()
    return jnp.asarray(out, jnp.float32)


def sequences_model(states: int):
    @gv.gen
    def one_sequence(trans, means, ys):
        gv.scan(hmm_step)((0, trans, means), ys) @ "steps"

    @gv.gen
    def sequences(params, ys):
        trans = gv.dirichlet(jnp.ones((states, states)) + 2.0 * jnp.eye(states)) @ "trans"
        means = gv.normal(jnp.linspace(-1.0, 1.0, states), 3.0) @ "means"
        gv.vmap(one_sequence, in_axes=(None, None, 0))(trans, means, ys) @ "seqs"
    return sequences


def numpyro_model(kind: str, states: int, unrolled: bool = False):
    """NumPyro's model of `kind`: the mixture (a plate), the HMM (its `scan`) or the batch
    of sequences (a plate over the sequences inside the scan's step: NumPyro's `scan`
    refuses the other nesting). With `unrolled`, the chain is a Python loop under
    `numpyro.contrib.funsor.markov` (one site per step), the form in which
    `TraceEnum_ELBO` computes the log marginal exactly."""
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.contrib.control_flow import scan  # noqa: PLC0415
    from numpyro.contrib.funsor import markov  # noqa: PLC0415

    def mixture_model(y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
        mu = numpyro.sample("mu", dist.Normal(jnp.linspace(-1.0, 1.0, K), 3.0).to_event(1))
        with numpyro.plate("data", len(y)):
            z = numpyro.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            numpyro.sample("y", dist.Normal(mu[z], SD), obs=y)

    def chain_model(ys):
        trans = numpyro.sample("trans", dist.Dirichlet(
            jnp.ones((states, states)) + 2.0 * jnp.eye(states)).to_event(1))
        means = numpyro.sample("means", dist.Normal(jnp.linspace(-1.0, 1.0, states), 3.0)
                               .to_event(1))
        batch = ys.ndim == 2

        def transition(z_prev, y):
            with numpyro.plate("sequences", ys.shape[0], dim=-1) if batch else nullcontext():
                z = numpyro.sample("z", dist.Categorical(trans[z_prev]),
                                   infer={"enumerate": "parallel"})
                numpyro.sample("y", dist.Normal(means[z], SD), obs=y)
            return z, None
        init = jnp.zeros(ys.shape[0], jnp.int32) if batch else 0
        if not unrolled:
            scan(transition, init, ys.T if batch else ys)
            return
        z = init
        with numpyro.plate("sequences", ys.shape[0], dim=-1) if batch else nullcontext():
            for t in markov(range(ys.shape[-1])):
                z = numpyro.sample(f"z_{t}", dist.Categorical(trans[z]),
                                   infer={"enumerate": "parallel"})
                numpyro.sample(f"y_{t}", dist.Normal(means[z], SD), obs=ys[..., t])

    return mixture_model if kind == "mixture" else chain_model


def numpyro_methods(kind: str, data: jax.Array, lr: float, states: int, key: jax.Array
                    ) -> tuple[dict, dict]:
    """({name: (one step (state -> state), start state, fitted means of a state, log
    joint at given parameters)}, the guide's starting point {site: constrained value})
    for NumPyro's TraceEnum_ELBO and, on the scan models, an ELBO step on NumPyro's
    exact enumerated `log_density` (`numpyro.contrib.funsor`)."""
    import numpyro  # noqa: PLC0415
    from numpyro import handlers  # noqa: PLC0415
    from numpyro.contrib.funsor import config_enumerate, enum  # noqa: PLC0415
    from numpyro.contrib.funsor import log_density as enum_log_density  # noqa: PLC0415
    from numpyro.infer import SVI, TraceEnum_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoNormal  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415

    model = numpyro_model(kind, states)
    name = "mu" if kind == "mixture" else "means"
    guide = AutoNormal(handlers.block(model, hide=["z"]))
    elbo = TraceEnum_ELBO(max_plate_nesting=1)
    svi = SVI(model, guide, optax.adam(lr), elbo)

    def trace_enum_value(of_model) -> Callable[[dict], float]:
        """TraceEnum_ELBO's value of `of_model` with the continuous sites held at given
        values (a point-mass guide)."""
        def value(values: dict) -> float:
            def delta(y):
                for k, v in values.items():
                    numpyro.sample(k, dist.Delta(v, event_dim=jnp.ndim(v)))
            return -float(elbo.loss(key, {}, of_model, delta, data))
        return value

    first = svi.init(key, data)
    start_values = guide.median(svi.get_params(first))
    methods = {"NumPyro TraceEnum_ELBO": (
        jax.jit(lambda st: svi.update(st, data)[0]), first,
        lambda st: guide.median(svi.get_params(st))[name], trace_enum_value(model))}
    if kind == "mixture":
        return methods, start_values
    # The same chain as a Python loop under `markov`: TraceEnum_ELBO is exact there.
    unrolled = numpyro_model(kind, states, unrolled=True)
    svi_unrolled = SVI(unrolled, guide, optax.adam(lr), elbo)
    methods["NumPyro TraceEnum_ELBO, markov loop"] = (
        jax.jit(lambda st: svi_unrolled.update(st, data)[0]), svi_unrolled.init(key, data),
        lambda st: guide.median(svi_unrolled.get_params(st))[name],
        trace_enum_value(unrolled))
    enumerated = enum(config_enumerate(model), -2)

    def exact_elbo(params, k):
        traced = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), k))
        sites = traced.get_trace(data)
        values = {n: x["value"] for n, x in sites.items()
                  if x["type"] == "sample" and not x["is_observed"]}
        log_q = sum(jnp.sum(sites[n]["fn"].log_prob(v)) for n, v in values.items())
        log_p, _ = enum_log_density(enumerated, (data,), {}, values)
        return log_p - log_q

    opt = optax.adam(lr)

    @jax.jit
    def exact_step(st):
        params, opt_state, k = st
        k, sub = jax.random.split(k)
        grads = jax.grad(exact_elbo)(params, sub)
        updates, opt_state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), opt_state)
        return optax.apply_updates(params, updates), opt_state, k

    start = svi.get_params(svi.init(key, data))
    methods["NumPyro exact enumeration"] = (
        exact_step, (start, opt.init(start), key), lambda st: guide.median(st[0])[name],
        lambda values: float(enum_log_density(enumerated, (data,), {}, values)[0]))
    return methods, start_values


# -- exact log marginals at the true parameters --------------------------------------------
def exact_log_marginal(kind: str, data: jax.Array, weights: np.ndarray, means: np.ndarray,
                       trans: np.ndarray) -> float:
    """log p(data | parameters) by the forward algorithm (a mixture: one step), numpy."""
    y = np.asarray(data, np.float64)
    emission = -0.5 * ((y[..., None] - means) / SD) ** 2 - np.log(SD * np.sqrt(2 * np.pi))
    if kind == "mixture":
        return float(np.sum(np.logaddexp.reduce(np.log(weights) + emission, axis=-1)))
    emission = emission if emission.ndim == 3 else emission[None]    # [sequences, T, K]
    log_trans = np.log(trans)
    alpha = log_trans[0] + emission[:, 0]
    for t in range(1, emission.shape[1]):
        alpha = np.logaddexp.reduce(alpha[:, :, None] + log_trans, axis=1) + emission[:, t]
    return float(np.sum(np.logaddexp.reduce(alpha, axis=-1)))


def sticky(states: int) -> np.ndarray:
    return np.full((states, states), (1 - STAY) / (states - 1)) \
        + (STAY - (1 - STAY) / (states - 1)) * np.eye(states)


def max_error(fitted: jax.Array, truth: np.ndarray) -> float:
    return float(np.max(np.abs(np.sort(np.asarray(fitted)) - truth)))


def log_prior(kind: str, values: dict) -> float:
    """The priors' log density at `values` (the same in every method)."""
    import numpyro.distributions as dist  # noqa: PLC0415
    if kind == "mixture":
        return float(dist.Dirichlet(jnp.ones(K)).log_prob(values["w"])
                     + dist.Normal(jnp.linspace(-1.0, 1.0, K), 3.0).log_prob(values["mu"]).sum())
    states = values["means"].shape[0]
    return float(dist.Dirichlet(jnp.ones((states, states)) + 2.0 * jnp.eye(states))
                 .log_prob(values["trans"]).sum()
                 + dist.Normal(jnp.linspace(-1.0, 1.0, states), 3.0).log_prob(values["means"]).sum())


def run(kind: str, data: jax.Array, truth: np.ndarray, fit_steps: int, rounds: int,
        lr: float = 0.05, states: int = K) -> dict:
    """{method: (seconds per step, max |fitted mean − truth|, log joint at the true
    parameters − exact)}."""
    key = jax.random.key(0)
    true_values = ({"w": jnp.asarray(MIX_WEIGHTS, jnp.float32),
                    "mu": jnp.asarray(MIX_MEANS, jnp.float32)} if kind == "mixture" else
                   {"trans": jnp.asarray(sticky(states), jnp.float32),
                    "means": jnp.asarray(truth, jnp.float32)})
    exact = log_prior(kind, true_values) + exact_log_marginal(
        kind, data, MIX_WEIGHTS, np.asarray(truth), sticky(states))
    numpyro_rows, start = numpyro_methods(kind, data, lr, states, key)
    init = gv.init_to_value(start)  # every fit starts where NumPyro's guide starts
    if kind == "sequences":
        summed = gv.marginal(sequences_model(states), keep=["trans", "means"],
                             algorithm=gv.enumeration())
        auto = gv.auto_normal(summed, init=init)
        methods = {"enumeration in the model": (gv.elbo(summed, auto),
                                                {"guide": auto.init(key, {}, data)},
                                                lambda p: auto.mean(p)["means"])}
    else:
        model, site, keep = ((mixture, "data/z", ["w", "mu"]) if kind == "mixture"
                             else (hmm, "steps/z", ["trans", "means"]))
        methods = genvi_methods(model, site, keep, keep[1], data, key, init)
        summed = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    genvi_value = float(summed.log_density(gv.choices(true_values), {}, data))
    steps, results = {}, {}
    for name, (objective, params, fitted) in methods.items():
        opt, step = genvi_step(objective, lr, data)
        state = [params, opt.init(params)]
        jax.block_until_ready(step(*state, key))

        def one(step=step, state=state):
            state[0], state[1] = step(state[0], state[1], key)
            return state[0]
        steps[name] = one
        fit = gv.fit(objective, params, data, optimizer=optax.adam(lr), steps=fit_steps,
                     key=jax.random.key(1), progress=False)
        value = genvi_value - exact if name == "enumeration in the model" else float("nan")
        results[name] = (max_error(fitted(fit.params), truth), value)
    for name, (step, start, fitted, value) in numpyro_rows.items():
        state = [start]
        jax.block_until_ready(step(start))

        def one(step=step, state=state):
            state[0] = step(state[0])
            return state[0]
        steps[name] = one
        st = start
        for _ in range(fit_steps):
            st = step(st)
        results[name] = (max_error(fitted(st), truth), value(true_values) - exact)
    times = interleaved_medians(steps, rounds=rounds, reps=5)
    return {name: (times[name],) + results[name] for name in steps}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=1000)
    p.add_argument("--steps-hmm", type=int, default=100)
    p.add_argument("--fit-steps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--models", nargs="+", choices=["mixture", "hmm", "sequences"],
                   default=["mixture", "hmm", "sequences"])
    p.add_argument("--sequences", type=int, default=50)
    p.add_argument("--states", type=int, default=5)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/enumeration.md")
    a = p.parse_args(argv)
    print(describe_machine())
    out, table = {}, []
    for kind in a.models:
        if kind == "sequences":
            data = sequences_data(a.sequences, a.steps_hmm, a.states)
            truth = sequence_means(a.states)
        else:
            data, truth = ((mixture_data(a.points), MIX_MEANS) if kind == "mixture"
                           else (hmm_data(a.steps_hmm), HMM_MEANS))
        rows = run(kind, data, truth, a.fit_steps, a.rounds,
                   states=a.states if kind == "sequences" else K)
        base = rows["enumeration in the model"][0]
        size = {"mixture": f"mixture, {a.points} points", "hmm": f"HMM, {a.steps_hmm} steps",
                "sequences": f"{a.sequences} sequences × {a.steps_hmm} steps, {a.states} "
                             "states"}[kind]
        print(f"\n{size}, {a.fit_steps} fit steps")
        print(f"{'method':<28} {'ms/step':>8} {'ratio':>6} {'max |mean error|':>17} "
              f"{'log p − exact':>14}")
        for name, (t, err, off) in rows.items():
            shown = "" if np.isnan(off) else f"{off:14.2f}"
            print(f"{name:<28} {1e3 * t:8.3f} {t / base:6.2f} {err:17.3f} {shown:>14}")
        out[kind] = rows
        table += [[size if i == 0 else "", name, f"{1e3 * t:.3f}", f"{t / base:.2f}",
                   f"{err:.3f}", "" if np.isnan(off) else f"{off:,.2f}"]
                  for i, (name, (t, err, off)) in enumerate(rows.items())]
    if a.record:
        record("enumeration", command("enumeration.mixture_hmm", argv),
               ["model", "method", "ms / step", "× genvi", "max error of means",
                "log p − exact"], table)
    return out


if __name__ == "__main__":
    main()
