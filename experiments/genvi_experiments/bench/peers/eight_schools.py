"""Eight schools: NumPyro's own automatic guides (`AutoNormal`,
`AutoMultivariateNormal`) on `Trace_ELBO`, with the protocol of `genvi run
eight_schools` (20,000 Adam steps, learning rate 0.01 with cosine decay, 100,000
posterior draws), against the same NUTS reference. It shows what a Gaussian guide
trained on the ELBO reaches in another system: genvi's `auto_mvn` rows are to be
read beside these.

    python -m genvi_experiments.bench.peers.eight_schools [--steps 20000] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi_experiments.common.timing import describe_machine
from genvi_experiments.eight_schools import NUTS, SIGMA, Y, compare, summary


def numpyro_guide_draws(guide_name: str, steps: int, seed: int, n: int = 100_000) -> dict:
    """Fit NumPyro's `guide_name` autoguide on Trace_ELBO; `n` draws of μ, τ, θ."""
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.infer import SVI, Trace_ELBO, autoguide  # noqa: PLC0415

    def model(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(jnp.zeros(8), 1.0).to_event(1))
        numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma).to_event(1), obs=y)

    guide = getattr(autoguide, guide_name)(model)
    svi = SVI(model, guide, optax.adam(optax.cosine_decay_schedule(0.01, steps)), Trace_ELBO())
    result = svi.run(jax.random.key(seed), steps, Y, SIGMA, progress_bar=False)
    d = guide.sample_posterior(jax.random.key(seed + 1), result.params, sample_shape=(n,))
    return {"mu": np.asarray(d["mu"]), "tau": np.asarray(d["tau"]),
            "theta": np.asarray(d["mu"][:, None] + d["tau"][:, None] * d["theta_tilde"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    print(describe_machine())
    print("\n| NumPyro guide, Trace_ELBO | seed | μ mean ± sd | τ mean ± sd | max Δ mean vs NUTS | "
          "max Δ sd vs NUTS |\n|---|---|---|---|---|---|")
    print(f"| NUTS | | {NUTS['mu'][0]:.2f} ± {NUTS['mu'][1]:.2f} | "
          f"{NUTS['tau'][0]:.2f} ± {NUTS['tau'][1]:.2f} | | |")
    for name in ("AutoNormal", "AutoMultivariateNormal"):
        for seed in args.seeds:
            s = summary(numpyro_guide_draws(name, args.steps, seed))
            dm, ds = compare(s)
            print(f"| {name} | {seed} | {s['mu'][0]:.2f} ± {s['mu'][1]:.2f} | "
                  f"{s['tau'][0]:.2f} ± {s['tau'][1]:.2f} | {dm:.2f} | {ds:.0%} |", flush=True)


if __name__ == "__main__":
    main()
