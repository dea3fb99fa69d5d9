"""Nested plates summed out in the model: genvi's `gv.enumeration()` beside NumPyro's
`TraceEnum_ELBO` (funsor, `max_plate_nesting=2`) on one model written in each: groups
(a plate of `--groups`) with a discrete class `a` each, whose members (a plate of
`--members` inside each group) have a discrete state `c` whose distribution depends
on the group's class, and a Gaussian observation per member around one of K = 3 means
(the continuous latents, under a mean-field normal guide: `gv.auto_normal`, NumPyro's
`AutoNormal`, both starting where NumPyro's starts).

Reports the warm time of a training step two ways (interleaved rounds, medians, ratio
to genvi): one jitted step per call, and inside a compiled loop of 200 steps (as
`gv.fit` and NumPyro's `SVI.run` run them, without the Python dispatch of a call,
about 0.05 ms for either library); and each method's value of the model's log
density at the true means minus the exact one (numpy: per group, a sum over its class
of products over its members of sums over their states).

    python -m genvi_experiments.bench.enumeration.plates [--groups 100] [--members 20]
        [--rounds 15] [--record]
"""

from __future__ import annotations

import argparse
from statistics import median

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.special import logsumexp
from scipy.stats import norm

import genvi as gv
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_samples, paired_ratio

K, SD = 3, 0.5
MEANS = np.array([-2.0, 0.0, 2.5])
ROWS = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]]))


def data(groups: int, members: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    a = rng.random(groups) < 0.4
    c = np.stack([rng.choice(K, members, p=np.exp(ROWS[int(x)])) for x in a])
    return jnp.asarray(MEANS[c] + SD * rng.normal(size=c.shape), jnp.float32)


@gv.gen
def member(mu, a, y):
    c = gv.categorical(jnp.asarray(ROWS, jnp.float32)[a]) @ "c"
    gv.observe(gv.normal(mu[c], SD), y)


@gv.gen
def group(mu, y):
    a = gv.flip(0.4) @ "a"
    gv.vmap(member, in_axes=(None, None, 0))(mu, a.astype(jnp.int32), y) @ "members"


@gv.gen
def nested(params, y):
    mu = gv.normal(jnp.linspace(-1.0, 1.0, K), 3.0) @ "mu"
    gv.vmap(group, in_axes=(None, 0))(mu, y) @ "groups"


def numpyro_model(y):
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    mu = numpyro.sample("mu", dist.Normal(jnp.linspace(-1.0, 1.0, K), 3.0).to_event(1))
    with numpyro.plate("groups", y.shape[0], dim=-2):
        a = numpyro.sample("a", dist.Bernoulli(0.4), infer={"enumerate": "parallel"})
        with numpyro.plate("members", y.shape[1], dim=-1):
            c = numpyro.sample("c", dist.Categorical(logits=jnp.asarray(ROWS, jnp.float32)[
                a.astype(jnp.int32)]), infer={"enumerate": "parallel"})
            numpyro.sample("y", dist.Normal(mu[c], SD), obs=y)


def exact(y: jax.Array) -> float:
    """log p(y, mu = MEANS), float64."""
    y = np.asarray(y, np.float64)
    emit = norm.logpdf(y[..., None], MEANS, SD)                       # [G, M, K]
    per_class = [np.log(p) + logsumexp(ROWS[a] + emit, axis=-1).sum(-1)
                 for a, p in ((0, 0.6), (1, 0.4))]                    # [G] each
    prior = norm.logpdf(MEANS, np.linspace(-1.0, 1.0, K), 3.0).sum()
    return float(prior + logsumexp(np.stack(per_class), axis=0).sum())


LOOP = 200   # steps per call of the compiled loop


def steps(y: jax.Array, lr: float = 0.05) -> tuple[dict, dict, dict]:
    """({method: one warm step}, {method: `LOOP` warm steps in one compiled loop},
    {method: log density at the true means − exact})."""
    from numpyro import handlers  # noqa: PLC0415
    from numpyro.contrib.funsor import config_enumerate, enum  # noqa: PLC0415
    from numpyro.contrib.funsor import log_density as enum_log_density  # noqa: PLC0415
    from numpyro.infer import SVI, TraceEnum_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoNormal  # noqa: PLC0415

    key = jax.random.key(0)
    guide = AutoNormal(handlers.block(numpyro_model, hide=["a", "c"]))
    svi = SVI(numpyro_model, guide, optax.adam(lr), TraceEnum_ELBO(max_plate_nesting=2))
    state = [svi.init(key, y)]
    update = jax.jit(lambda st: svi.update(st, y)[0])
    start = guide.median(svi.get_params(state[0]))

    summed = gv.marginal(nested, keep=["mu"], algorithm=gv.enumeration())
    auto = gv.auto_normal(summed, init=gv.init_to_value(start))
    objective = gv.elbo(summed, auto)
    opt = optax.adam(lr)
    params = {"guide": auto.init(key, {}, y)}
    genvi_state = [params, opt.init(params)]

    @jax.jit
    def genvi_step(params, opt_state, k):
        grads = objective.grad_estimate(k, params, y)
        updates, opt_state = opt.update(jax.tree_util.tree_map(jnp.negative, grads),
                                        opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def one_genvi():
        genvi_state[0], genvi_state[1] = genvi_step(*genvi_state, key)
        return genvi_state[0]

    def one_numpyro():
        state[0] = update(state[0])
        return state[0]

    init, step = gv.training_step(objective, opt)
    looped = init(params, key)
    genvi_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (step(s, y)[0], None), s, None, length=LOOP)[0])
    numpyro_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (svi.update(s, y)[0], None), s, None, length=LOOP)[0])
    svi_state = state[0]
    loops = {"genvi enumeration": lambda: genvi_loop(looped),
             "NumPyro TraceEnum_ELBO": lambda: numpyro_loop(svi_state)}
    for f in (one_genvi, one_numpyro, *loops.values()):
        jax.block_until_ready(f())
    truth = exact(y)
    at_truth = {"mu": jnp.asarray(MEANS, jnp.float32)}
    genvi_value = float(summed.log_density(gv.choices(at_truth), {}, y))
    numpyro_value = float(enum_log_density(enum(config_enumerate(numpyro_model), -3), (y,),
                                           {}, at_truth)[0])
    return ({"genvi enumeration": one_genvi, "NumPyro TraceEnum_ELBO": one_numpyro}, loops,
            {"genvi enumeration": genvi_value - truth,
             "NumPyro TraceEnum_ELBO": numpyro_value - truth})


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--members", type=int, default=20)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/enumeration.md")
    a = p.parse_args(argv)
    print(describe_machine())
    y = data(a.groups, a.members)
    fns, loops, offsets = steps(y)
    per_call = interleaved_samples(fns, rounds=a.rounds, reps=5)
    in_loop = interleaved_samples(loops, rounds=a.rounds, reps=1)
    times = {k: median(v) for k, v in per_call.items()}
    looped = {k: median(v) / LOOP for k, v in in_loop.items()}
    base = "genvi enumeration"
    print(f"\nnested plates: {a.groups} groups × {a.members} members, K = {K}")
    print(f"{'method':<24} {'ms/call':>8} {'ratio':>6} {'ms/step, loop':>14} {'ratio':>6} "
          f"{'log p − exact':>14}")
    table = []
    for name in times:
        row = [name, f"{1e3 * times[name]:.3f}", f"{paired_ratio(per_call, name, base):.2f}",
               f"{1e3 * looped[name]:.3f}", f"{paired_ratio(in_loop, name, base):.2f}",
               f"{offsets[name]:.4f}"]
        print(f"{row[0]:<24} {row[1]:>8} {row[2]:>6} {row[3]:>14} {row[4]:>6} {row[5]:>14}")
        table.append(row)
    if a.record:
        record("enumeration_plates", command("enumeration.plates", argv),
               ["method", "ms / step, one call", "× genvi", "ms / step, compiled loop",
                "× genvi", "log p − exact"], table)
    return {"times": times, "offsets": offsets}


if __name__ == "__main__":
    main()
