"""The estimator lab (`gv.compare_estimators`) on three cases, printing its tables:

1. AIR's z_pres: REINFORCE, learned baseline, MVD, ENUM, hybrid (and SD when genvi
   has `gv.SD`), on a few canvases, at initialization (the baseline network's output
   bias set to the mean ELBO estimate, the fixed point its training heads for first).
2. A Gaussian-mixture plate: global means (REPARAM), one `categorical` assignment
   per datapoint inside `gv.vmap` with its own guide logits; REINFORCE, MVD, ENUM
   (+ SD); exact gradient from the closed-form ELBO.
3. The inhomogeneous random walk of Arya et al. 2022 (StochasticAD.jl's tutorial):
   X₀ = 0, step +1 with probability exp(−X/θ), else −1, for n steps; objective
   E[X_n²], `gv.scan` over steps; REINFORCE, REINFORCE with the constant baseline
   E[X_n²], MVD (+ SD); exact derivative by dynamic programming over positions.

    python -m genvi_experiments.bench.frontier.lab [--cases air gmm walk] [--figures DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.common.timing import describe_machine

# -- 1. AIR --------------------------------------------------------------------------


def air_case(images: int = 4, samples: int = 300, rounds: int = 5, seed: int = 0):
    """AIR's ELBO (minibatch mean over `images` canvases) per z_pres strategy."""
    from genvi_experiments.air.config import AIRConfig
    from genvi_experiments.air.data import make_canvases
    from genvi_experiments.air.estimators import ESTIMATORS, Estimator
    from genvi_experiments.air.model import AIRNets, air_programs

    cfg = AIRConfig()
    nets = AIRNets(cfg)
    data = jnp.asarray(make_canvases(train=images, test=1, seed=seed).train)
    params = nets.init(jax.random.key(seed), baseline=True)
    choices = {n: ESTIMATORS[n] for n in ("reinforce", "baseline", "mvd", "enum", "hybrid")}
    if hasattr(gv, "SD"):
        choices["sd"] = ESTIMATORS.get("sd") or Estimator(gv.elbo, lambda t, info: gv.SD)

    def make(est):
        model, guide = air_programs(cfg, nets, est.pres_grad, baseline=est.baseline)
        return gv.batch_mean(est.objective(model, guide))

    # the baseline's output bias at the mean ELBO, so that it centres f as a trained one
    # would (untrained, it outputs about 0 against an ELBO of a few hundred)
    elbo = make(ESTIMATORS["reinforce"])
    keys = jax.random.split(jax.random.key(seed + 1), 64)
    mean_elbo = float(jnp.mean(jax.jit(jax.vmap(lambda k: elbo.estimate(k, params, data)))(keys)))
    params["baseline"]["predict"]["dense1"]["bias"] = jnp.full((1,), mean_elbo)
    lab = gv.compare_estimators(choices, jax.random.key(seed + 2), params, data, make=make,
                                samples=samples, rounds=rounds,
                                leaves=["guide/predict", "guide/encode"])
    about = (f"AIR, {images} canvases of {cfg.canvas}×{cfg.canvas}, {cfg.steps} steps, "
             f"parameters at initialization (mean ELBO estimate {mean_elbo:.0f}); gradient "
             "of the guide's predict and encoder networks (the LSTM's 2.6M entries are "
             "left out to keep the case short; the model's gradient is pathwise, the "
             "same for all)")
    return lab, about, None


# -- 2. Gaussian-mixture plate ---------------------------------------------------------

GMM_K, GMM_D, GMM_PRIOR = 3, 2, 5.0


def gmm_data(n: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    centers = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, -1.0]])
    return jnp.asarray(centers[rng.integers(0, GMM_K, n)] + rng.normal(size=(n, GMM_D)),
                       jnp.float32)


@gv.gen
def gmm_point(means, x):
    z = gv.categorical(jnp.zeros(GMM_K)) @ "z"
    gv.observe(gv.normal(means[z], 1.0), x)


@gv.gen
def gmm_model(params, xs):
    means = gv.normal(jnp.zeros((GMM_K, GMM_D)), GMM_PRIOR) @ "means"
    gv.vmap(gmm_point, in_axes=(None, 0))(means, xs) @ "points"


def gmm_objective(strategy: gv.Strategy) -> gv.Expectation:
    """The ELBO with `strategy` at every datapoint's assignment."""
    @gv.gen
    def assign(logits):
        gv.categorical(logits, grad=strategy) @ "z"

    @gv.gen
    def guide(params, xs):
        gv.normal(params["loc"], jnp.exp(params["log_scale"]), grad=gv.REPARAM) @ "means"
        gv.vmap(assign)(params["logits"]) @ "points"

    return gv.elbo(gmm_model, guide)


def gmm_exact_elbo(params: dict, xs: jax.Array) -> jax.Array:
    """The ELBO in closed form (Gaussian expectations and categorical sums)."""
    m, s = params["loc"], jnp.exp(params["log_scale"])
    q, logq = jax.nn.softmax(params["logits"]), jax.nn.log_softmax(params["logits"])
    sq = jnp.sum((xs[:, None, :] - m[None]) ** 2, -1) + jnp.sum(s ** 2, -1)[None]
    half_log_2pi = 0.5 * jnp.log(2 * jnp.pi)
    lik = jnp.sum(q * (-0.5 * sq - GMM_D * half_log_2pi))
    prior = jnp.sum(-0.5 * (m ** 2 + s ** 2) / GMM_PRIOR ** 2 - jnp.log(GMM_PRIOR) - half_log_2pi)
    entropy = jnp.sum(jnp.log(s) + half_log_2pi + 0.5) - jnp.sum(q * logq)
    return lik + prior - xs.shape[0] * jnp.log(GMM_K) + entropy


def gmm_case(n: int = 50, samples: int = 1000, rounds: int = 10, seed: int = 0):
    xs = gmm_data(n, seed)
    rng = np.random.default_rng(seed + 1)
    params = {"loc": jnp.asarray(rng.normal(size=(GMM_K, GMM_D)), jnp.float32),
              "log_scale": jnp.full((GMM_K, GMM_D), -1.0),
              "logits": jnp.asarray(rng.normal(size=(n, GMM_K)), jnp.float32)}
    choices = {"REINFORCE": gv.REINFORCE, "MVD": gv.MVD, "ENUM": gv.ENUM}
    if hasattr(gv, "SD"):
        choices["SD"] = gv.SD
    lab = gv.compare_estimators(choices, jax.random.key(seed), params, xs, make=gmm_objective,
                                samples=samples, rounds=rounds,
                                exact=jax.grad(gmm_exact_elbo)(params, xs))
    about = (f"Gaussian mixture, K={GMM_K} clusters in {GMM_D} dimensions, {n} datapoints; "
             "exact gradient from the closed-form ELBO")
    return lab, about, None


# -- 3. The random walk of Arya et al. 2022 --------------------------------------------


def walk_objective(strategy: gv.Strategy, steps: int) -> gv.Expectation:
    """E[X_n²] for the walk X₀ = 0, X_{t+1} = X_t ± 1, up with probability exp(−X_t/θ)."""
    @gv.gen
    def step(carry, _):
        x, theta = carry
        up = gv.flip(jnp.exp(-x / theta), grad=strategy) @ "up"
        return (x + jnp.where(up, 1.0, -1.0), theta), None

    walk = gv.scan(step, length=steps)

    @gv.expectation
    def squared_end(theta):
        choices, _ = walk.sim((jnp.zeros(()), theta))
        return jnp.sum(jnp.where(choices["up"], 1.0, -1.0)) ** 2

    return squared_end


def walk_exact(theta: float, steps: int) -> tuple[float, float]:
    """(E[X_n²], d/dθ E[X_n²]) by forward-mode dynamic programming over positions
    0..n (float64): the walk never goes below 0, since it steps up surely at 0."""
    xs = np.arange(steps + 1.0)
    q = np.exp(-xs / theta)
    dq = q * xs / theta ** 2
    pi, dpi = np.eye(steps + 1)[0], np.zeros(steps + 1)
    for _ in range(steps):
        new, dnew = np.zeros_like(pi), np.zeros_like(pi)
        new[1:] += (pi * q)[:-1]
        dnew[1:] += (dpi * q + pi * dq)[:-1]
        new[:-1] += (pi * (1 - q))[1:]
        dnew[:-1] += (dpi * (1 - q) - pi * dq)[1:]
        pi, dpi = new, dnew
    return float(pi @ xs ** 2), float(dpi @ xs ** 2)


def walk_case(steps: int = 100, theta: float = 50.0, samples: int = 2000, rounds: int = 10,
              seed: int = 0):
    value, derivative = walk_exact(theta, steps)
    choices = {"REINFORCE": gv.REINFORCE,
               "REINFORCE + baseline E f": gv.REINFORCE.with_baseline(value),
               "MVD": gv.MVD}
    if hasattr(gv, "SD"):
        choices["SD"] = gv.SD
    lab = gv.compare_estimators(choices, jax.random.key(seed), theta,
                                make=lambda s: walk_objective(s, steps), samples=samples,
                                rounds=rounds, exact=derivative)
    about = (f"random walk (Arya et al. 2022), n={steps} steps, θ={theta:g}: E[X_n²] = "
             f"{value:.2f}, exact d/dθ = {derivative:.4f}")
    return lab, about, None


CASES = {"air": air_case, "gmm": gmm_case, "walk": walk_case}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--figures", default=None, help="save each case's figure in this folder")
    args = ap.parse_args(argv)
    print(f"# Estimator lab, {describe_machine()}, SD {'present' if hasattr(gv, 'SD') else 'absent'}")
    out = {}
    for name in args.cases:
        t0 = time.perf_counter()
        lab, about, shown = CASES[name]()
        print(f"\n## {name}: {about} ({time.perf_counter() - t0:.0f} s)\n")
        print(lab.table(leaves=shown))
        if args.figures:
            lab.plot(os.path.join(args.figures, f"estimator_lab_{name}.png"), leaves=shown,
                     title=name)
        out[name] = lab
    return out


if __name__ == "__main__":
    main()
