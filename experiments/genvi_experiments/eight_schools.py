"""Eight schools (Rubin 1981; Gelman et al., BDA §5.5) with automatic guides, beside
NUTS: `gv.auto_normal` and `gv.auto_mvn` trained on the ELBO, and `gv.auto_mvn`
trained on objectives from mode-seeking to mass-covering: Rényi(α = 0.5, K),
IWELBO(K) and the wake-phase inclusive KL (`gv.wake_guide`). Each guide's posterior
is reported twice: the guide's own draws, and the same draws reweighted by
p(z, y) / q(z) (self-normalized Pareto-smoothed importance sampling, with its effective
sample size), which is the posterior an IWELBO-trained guide stands for and corrects the
ELBO's underestimate of the group scale τ. `gv.diagnose` reports on each fitted guide:
the Pareto shape k̂ of its weights (< 0.5 good, > 0.7 unreliable) and its verdict.

A last row is the best `auto_mvn` can do under the ELBO: its exact optimum, found by
L-BFGS on the ELBO estimated with 50,000 fixed draws of the noise (common random
numbers make it a smooth deterministic function of the parameters). How far that
optimum is from NUTS is the family's and the divergence's error, not the optimizer's.

Model (non-centred): μ ~ N(0, 5), τ ~ HalfCauchy(5), θ̃ⱼ ~ N(0, 1), θⱼ = μ + τ θ̃ⱼ,
yⱼ ~ N(θⱼ, σⱼ). τ > 0 is handled by the auto guides' support bijector (softplus or
exp, with its Jacobian). Reference: NumPyro's NUTS on the same model, 25,000 draws after
2,000 warm-up (target acceptance 0.95, no divergences, effective sample sizes 28,658
for μ and 18,469 for τ), run once on 2026-11-23 and kept in `NUTS` below.

    genvi run eight_schools [--steps 20000] [--particles 20] [--optimum-draws 50000]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.common.data import positive_int
from genvi_experiments.common.figures import pyplot, save_figure
from genvi.cli import ShowDefaults, announce

Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
# NumPyro NUTS (see the module docstring): posterior mean and standard deviation
NUTS = {
    "mu": (4.385, 3.351),
    "tau": (3.647, 3.328),
    "theta": ([6.221, 4.929, 3.900, 4.737, 3.604, 4.061, 6.338, 4.896],
              [5.657, 4.685, 5.374, 4.801, 4.674, 4.860, 5.078, 5.354]),
}


def half_cauchy(scale: float):
    """HalfCauchy(scale) from TensorFlow Probability (a positive support)."""
    from tensorflow_probability.substrates.jax import distributions as tfd  # noqa: PLC0415
    return gv.from_tfp(tfd.HalfCauchy)(loc=0.0, scale=scale)


@gv.gen
def schools(params, y, sigma):
    mu = gv.normal(0.0, 5.0) @ "mu"
    tau = half_cauchy(5.0) @ "tau"
    theta_tilde = gv.mv_normal_diag(jnp.zeros(8), jnp.ones(8)) @ "theta_tilde"
    gv.observe(gv.mv_normal_diag(mu + tau * theta_tilde, sigma), y, name="y")


def fit(guide_maker, objective_maker, steps: int, key: jax.Array, n: int = 100_000) -> dict:
    """Train an automatic guide; return `n` draws of μ, τ and θ from it and their
    self-normalized importance weights p(z, y) / q(z) (the posterior that IWELBO's
    guide stands for is the guide reweighted, not the guide itself)."""
    guide = guide_maker(schools)
    params = {"guide": guide.init(jax.random.key(0), {}, Y, SIGMA)}
    result = gv.fit(objective_maker(schools, guide), params, Y, SIGMA, steps=steps, key=key,
                    optimizer=optax.adam(optax.cosine_decay_schedule(0.01, steps)),
                    progress=False)
    return posterior_draws(guide, result.params, jax.random.fold_in(key, 1), n)


def elbo_optimum(guide_maker, key: jax.Array, draws: int, iterations: int = 60,
                 n: int = 100_000) -> dict:
    """The guide family's exact ELBO optimum: L-BFGS on the mean of `draws` ELBO
    estimates with fixed keys (every site reparameterized, so the mean is a smooth
    function of the parameters and ADEV's gradient is its exact gradient); returns
    `n` draws as `fit` does."""
    guide = guide_maker(schools)
    elbo = gv.elbo(schools, guide)
    keys = jax.random.split(key, draws)

    def value_and_grad(params):
        values, grads = jax.vmap(lambda k: elbo.value_and_grad_estimate(k, params, Y, SIGMA))(keys)
        neg = lambda a: -jnp.mean(a, 0)  # noqa: E731
        return neg(values), jax.tree_util.tree_map(neg, grads)

    def loss(params):
        return -jnp.mean(jax.vmap(lambda k: elbo.estimate(k, params, Y, SIGMA))(keys))

    opt = optax.lbfgs()

    @jax.jit
    def step(params, state):
        value, grad = value_and_grad(params)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    params = {"guide": guide.init(jax.random.key(0), {}, Y, SIGMA)}
    state = opt.init(params)
    for i in range(iterations):   # a few hundred host-side L-BFGS steps, each one jitted call
        params, state = step(params, state)
        if i == 0 or (i + 1) % 10 == 0 or i + 1 == iterations:  # the first one compiles
            announce(f"  L-BFGS iteration {i + 1} of {iterations}: ELBO "
                     f"{-float(optax.tree_utils.tree_get(state, 'value')):.3f}")
    return posterior_draws(guide, params, jax.random.fold_in(key, 1), n)


def posterior_draws(guide, params, key: jax.Array, n: int) -> dict:
    """`n` draws of μ, τ, θ from the guide, their self-normalized Pareto-smoothed
    weights p / q, and `gv.diagnose`'s report on the guide (k̂, ESS, log evidence)."""
    report = gv.diagnose(schools, guide, params, Y, SIGMA, key=key, num_samples=n)
    choices = report.draws
    mu, tau = choices["mu"], choices["tau"]
    theta = mu[:, None] + tau[:, None] * choices["theta_tilde"]
    w = np.exp(report.smoothed_log_weights)
    return {"draws": {"mu": np.asarray(mu), "tau": np.asarray(tau), "theta": np.asarray(theta)},
            "weights": w / w.sum(), "diagnosis": report}


def summary(draws: dict, weights: np.ndarray | None = None) -> dict:
    """Mean and standard deviation of each variable (weighted when weights are given)."""
    w = np.full(len(draws["mu"]), 1.0 / len(draws["mu"])) if weights is None else weights
    out = {}
    for k, v in draws.items():
        m = np.tensordot(w, v, axes=1)
        out[k] = (m, np.sqrt(np.maximum(np.tensordot(w, (v - m) ** 2, axes=1), 0.0)))
    return out


def compare(s: dict) -> tuple[float, float]:
    """Largest |mean − NUTS mean| and largest |sd / NUTS sd − 1| over μ, τ, θ."""
    dm, ds = 0.0, 0.0
    for k, (m, sd) in NUTS.items():
        dm = max(dm, float(np.max(np.abs(s[k][0] - np.asarray(m)))))
        ds = max(ds, float(np.max(np.abs(s[k][1] / np.asarray(sd) - 1.0))))
    return dm, ds


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run eight_schools", description=__doc__,
                                 formatter_class=ShowDefaults)
    ap.add_argument("--steps", type=positive_int, default=20000,
                    help="Adam steps for each trained guide (a cosine-decayed rate from 0.01)")
    ap.add_argument("--particles", type=positive_int, default=20, help="K of IWELBO(K)")
    ap.add_argument("--optimum-draws", type=positive_int, default=50_000,
                    help="common random numbers for auto_mvn's exact ELBO optimum")
    ap.add_argument("--optimum-iterations", type=positive_int, default=60,
                    help="L-BFGS iterations for the exact ELBO optimum (40 converge)")
    ap.add_argument("--seed", type=int, default=0,
                    help="random seed of the training runs and of the posterior draws")
    ap.add_argument("--out", default="out/eight_schools",
                    help="folder for results.md and the per-school figure theta.png")
    args = ap.parse_args(argv)
    key = jax.random.key(args.seed)
    k = args.particles
    train = lambda guide_maker, objective_maker: lambda key: fit(  # noqa: E731
        guide_maker, objective_maker, args.steps, key)
    runs = {"auto_normal, ELBO": train(gv.auto_normal, gv.elbo),
            "auto_mvn, ELBO": train(gv.auto_mvn, gv.elbo),
            f"auto_mvn, Rényi(0.5, {k})": train(gv.auto_mvn, lambda m, g: gv.renyi(m, g, 0.5, k)),
            f"auto_mvn, IWELBO({k})": train(gv.auto_mvn, lambda m, g: gv.iwelbo(m, g, particles=k)),
            f"auto_mvn, inclusive KL (wake_guide({k}))": train(
                gv.auto_mvn, lambda m, g: gv.wake_guide(m, g, k)),
            "auto_mvn, exact ELBO optimum": lambda key: elbo_optimum(
                gv.auto_mvn, key, args.optimum_draws, args.optimum_iterations)}
    lines = ["| guide, objective | posterior from | μ mean ± sd | τ mean ± sd | max Δ mean vs NUTS | "
             "max Δ sd vs NUTS | importance ESS | khat | time (s) |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| NUTS (NumPyro) | 25,000 draws | {NUTS['mu'][0]:.2f} ± {NUTS['mu'][1]:.2f} | "
             f"{NUTS['tau'][0]:.2f} ± {NUTS['tau'][1]:.2f} | | | | | |"]
    print("\n".join(lines), flush=True)
    results, diagnoses = {}, []
    for i, (name, make) in enumerate(runs.items()):
        t0 = time.perf_counter()
        announce(f"[{i + 1}/{len(runs)}] {name}: compiling, then " + (
            f"{args.optimum_iterations} L-BFGS iterations on {args.optimum_draws:,} fixed draws"
            if "optimum" in name else f"{args.steps} Adam steps") + "; 100,000 draws to reweight")
        run = make(jax.random.fold_in(key, i))
        seconds = time.perf_counter() - t0
        report = run["diagnosis"]  # gv.diagnose of the fitted guide (100,000 draws)
        ess, khat = report.ess, report.khat
        diagnoses.append(f"### {name}\n\n```\n{report}\n```")
        for source, weights in (("the guide", None), ("the guide, reweighted", run["weights"])):
            s = summary(run["draws"], weights)
            dm, ds = compare(s)
            results[f"{name} ({source})"] = {"summary": s, "max_mean_diff": dm, "max_sd_rel": ds,
                                             "ess": ess, "khat": khat}
            lines.append(f"| {name} | {source} | {s['mu'][0]:.2f} ± {s['mu'][1]:.2f} | "
                         f"{s['tau'][0]:.2f} ± {s['tau'][1]:.2f} | {dm:.2f} | {ds:.0%} | "
                         f"{ess:,.0f} of 100,000 | {khat:.2f} | {seconds:.1f} |")
            print(lines[-1], flush=True)
    # did each fit work? gv.diagnose's verdict on each guide, in words
    lines += ["", "## gv.diagnose of each fitted guide", ""] + diagnoses
    print("\n".join(lines[-len(diagnoses) - 3:]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(results, os.path.join(args.out, "theta.png"))
    return results


def plot(results: dict, path: str) -> str:
    """θⱼ posterior means ± sd per school: NUTS and each guide."""
    fig, ax = pyplot().subplots(figsize=(7, 3.2))
    x = np.arange(8)
    m, sd = map(np.asarray, NUTS["theta"])
    ax.errorbar(x - 0.2, m, sd, fmt="o", color="k", label="NUTS")
    for j, (name, r) in enumerate(results.items()):
        tm, ts = r["summary"]["theta"]
        ax.errorbar(x - 0.1 + 0.06 * j, tm, ts, fmt=".", label=name)
    ax.set_xlabel("school"), ax.set_ylabel("θ (mean ± sd)"), ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
