"""Pyro's SVI-tutorial coin model: `gv.fit` against NumPyro's `SVI` + `Trace_ELBO`.

Beta(10, 10) prior on the coin's fairness, 6 heads and 4 tails, a Beta guide with
implicitly reparameterized gradients, Adam(5e-4), 2000 steps, both starting from
alpha = beta = 15 with log-parameterized (exp-constrained) parameters, as NumPyro's
positive constraint does. Reports first-call (compile) time, warm per-step time, and
the final ELBO (mean of 20000 estimates, same estimator for both) and posterior mean.

    python -m genvi_experiments.bench.peers.coin          (needs: pip install numpyro==0.22.0)
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from genvi_experiments.common.timing import describe_machine

DATA = jnp.array([1.0] * 6 + [0.0] * 4)
STEPS, LR, INIT = 2000, 5e-4, 15.0


@gv.gen
def model(params, data):
    fairness = gv.beta(10.0, 10.0) @ "f"
    gv.observe(gv.flip(jnp.broadcast_to(fairness, data.shape)), data)


@gv.gen
def guide(params, data):
    gv.beta(jnp.exp(params["log_alpha"]), jnp.exp(params["log_beta"]), grad=gv.REPARAM) @ "f"


ELBO = gv.elbo(model, guide)
START = {"log_alpha": jnp.log(INIT), "log_beta": jnp.log(INIT)}


OPTIMIZER = optax.adam(LR)


def genvi_run(steps: int):
    return gv.fit(ELBO, START, DATA, optimizer=OPTIMIZER, steps=steps,
                  key=jax.random.key(0), progress=False, chunk_size=steps).params


def numpyro_setup():
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.distributions import constraints  # noqa: PLC0415
    from numpyro.infer import SVI, Trace_ELBO  # noqa: PLC0415

    def np_model(data):
        f = numpyro.sample("f", dist.Beta(10.0, 10.0))
        with numpyro.plate("flips", data.shape[0]):
            numpyro.sample("obs", dist.Bernoulli(f), obs=data)

    def np_guide(data):
        a = numpyro.param("alpha_q", INIT, constraint=constraints.positive)
        b = numpyro.param("beta_q", INIT, constraint=constraints.positive)
        numpyro.sample("f", dist.Beta(a, b))

    svi = SVI(np_model, np_guide, numpyro.optim.Adam(LR), Trace_ELBO())
    return svi


def final_elbo(params) -> float:
    keys = jax.random.split(jax.random.key(123), 20000)
    return float(jnp.mean(jax.jit(jax.vmap(lambda k: ELBO.estimate(k, params, DATA)))(keys)))


def main(rounds: int = 7) -> None:
    print(f"# coin model, {describe_machine()}")
    t0 = time.perf_counter()
    jax.block_until_ready(genvi_run(STEPS))          # compiles
    genvi_first = time.perf_counter() - t0
    svi = numpyro_setup()
    update = jax.jit(svi.update)
    state0 = svi.init(jax.random.key(0), DATA)
    t0 = time.perf_counter()
    jax.block_until_ready(update(state0, DATA))        # compiles
    numpyro_first = time.perf_counter() - t0

    genvi_times, numpyro_times = [], []
    for _ in range(rounds):                            # interleaved, warm
        t0 = time.perf_counter()
        params = jax.block_until_ready(genvi_run(STEPS))
        genvi_times.append((time.perf_counter() - t0) / STEPS)
        state = state0
        t0 = time.perf_counter()
        for _ in range(STEPS):
            state, loss = update(state, DATA)
        jax.block_until_ready(loss)
        numpyro_times.append((time.perf_counter() - t0) / STEPS)
    p = svi.get_params(state)
    np_params = {"log_alpha": jnp.log(p["alpha_q"]), "log_beta": jnp.log(p["beta_q"])}
    ratios = sorted(g / n for g, n in zip(genvi_times, numpyro_times))

    def mean(q):
        a, b = jnp.exp(q["log_alpha"]), jnp.exp(q["log_beta"])
        return float(a / (a + b))

    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print("| system | first call (s) | warm step (µs) | final ELBO | posterior mean |")
    print("|---|---|---|---|---|")
    print(f"| genvi `gv.fit` | {genvi_first:.2f} | {med(genvi_times) * 1e6:.1f} | "
          f"{final_elbo(params):.3f} | {mean(params):.4f} |")
    print(f"| NumPyro `svi.update` (jit) | {numpyro_first:.2f} | {med(numpyro_times) * 1e6:.1f} | "
          f"{final_elbo(np_params):.3f} | {mean(np_params):.4f} |")
    print(f"\ngenvi / NumPyro per-step time (median of {rounds} interleaved rounds): "
          f"{ratios[len(ratios) // 2]:.3f}; exact posterior mean after all data: 16/30 = 0.5333")


if __name__ == "__main__":
    main()
