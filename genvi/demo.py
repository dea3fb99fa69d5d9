"""A short end-to-end variational inference run whose answer you can check.

Model: the mean of some noisy measurements, μ ~ N(0, 1), yᵢ ~ N(μ, 0.5), and
whether a coin is loaded, loaded ~ flip(0.5), heads ~ flip(0.8 if loaded else 0.5).
The guide is mean-field: a normal for μ with REPARAM gradients and a flip for
`loaded` with exact enumeration (ENUM). ELBO ascent with Adam; the script prints
the learned posterior next to the exact one (conjugate formulas and enumeration),
and the final ELBO next to the exact log evidence. Before fitting it says which model
it fits: the program in words and its sites (`describe()`).

    genvi run demo            (or: python -m genvi.demo)

Example:
    >>> from genvi import demo
    >>> demo.describe().splitlines()[0]
    'genvi demo: variational inference on a model whose exact posterior is known.'
"""

from __future__ import annotations

import argparse
import math
import os
import time

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from genvi.cli import ShowDefaults, announce
from genvi.core.address import Address

Y = jnp.array([1.2, 0.7, 1.9, 1.4, 0.8])
NOISE = 0.5
HEADS = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])


@gv.gen
def model(params, y, heads):
    mu = gv.normal(0.0, 1.0) @ "mu"
    gv.observe(gv.normal(mu, NOISE), y)
    loaded = gv.flip(0.5) @ "loaded"
    gv.observe(gv.flip(jnp.where(loaded, 0.8, 0.5)), heads)


@gv.gen
def guide(params, y, heads):
    gv.normal(params["m"], jnp.exp(params["log_s"]), grad=gv.REPARAM) @ "mu"
    gv.flip(jax.nn.sigmoid(params["logit"]), grad=gv.ENUM) @ "loaded"


def describe() -> str:
    """What the demo fits, printed before fitting: the model in words, its latent sites
    (read from a trace of `model`, so they are the program's own addresses) and the
    guide.

    Example:
        >>> from genvi.demo import describe
        >>> print(describe())  # doctest: +ELLIPSIS
        genvi demo: ...
        The model (genvi.demo.model), in words:
          mu ~ Normal(0, 1) ...
        Its latent sites, from a trace of the model: "mu" (float32, continuous) and "loaded" (bool, discrete)...
    """
    trace = model.simulate(jax.random.key(0), {}, Y, HEADS)
    sites = " and ".join(
        f'"{Address(path)}" ({value.dtype}, '
        f'{"continuous" if jnp.issubdtype(value.dtype, jnp.floating) else "discrete"})'
        for path, value in trace.choices.flat().items())
    observed = ", ".join(f"{v:g}" for v in Y.tolist())
    words = [("mu ~ Normal(0, 1)", f"the mean of {Y.size} noisy measurements"),
             (f"y[i] ~ Normal(mu, {NOISE}), i = 1..{Y.size}", f"observed: {observed}"),
             ("loaded ~ Flip(0.5)", "whether a coin is loaded"),
             (f"heads[j] ~ Flip(0.8 if loaded else 0.5), j = 1..{HEADS.size}",
              f"observed: {int(HEADS.sum())} heads in {HEADS.size} flips")]
    return "\n".join([
        "genvi demo: variational inference on a model whose exact posterior is known.",
        "The model (genvi.demo.model), in words:",
        *(f"  {left:<52}{right}" for left, right in words),
        f"Its latent sites, from a trace of the model: {sites}; y and heads are observed.",
        'The guide (genvi.demo.guide), mean-field: "mu" ~ Normal(m, exp(log_s)) with REPARAM '
        'gradients, "loaded" ~ Flip(sigmoid(logit)) summed exactly (ENUM).'])


def exact_posterior(y, heads):
    precision = 1.0 + y.size / NOISE ** 2
    mean = (jnp.sum(y) / NOISE ** 2) / precision
    k, n = float(jnp.sum(heads)), heads.size
    like_loaded, like_fair = 0.8 ** k * 0.2 ** (n - k), 0.5 ** n
    p_loaded = like_loaded / (like_loaded + like_fair)
    cov = NOISE ** 2 * jnp.eye(y.size) + jnp.ones((y.size, y.size))
    log_evidence = float(jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros(y.size), cov)
                         + math.log(0.5 * like_loaded + 0.5 * like_fair))
    return float(mean), float(1.0 / math.sqrt(precision)), p_loaded, log_evidence


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run demo", description=__doc__.split("\nExample:")[0],
                                 formatter_class=ShowDefaults)
    ap.add_argument("--steps", type=int, default=2000,
                    help="Adam steps of ELBO ascent (a cosine-decayed rate from 0.05)")
    ap.add_argument("--out", default=None, help="folder for results.md and the curve PNG")
    args = ap.parse_args(argv)
    print(describe() + "\n", flush=True)
    announce(f"fitting: compiling, then {args.steps} Adam steps of ELBO ascent with gv.fit")
    objective = gv.elbo(model, guide)
    params = {"m": jnp.array(0.0), "log_s": jnp.array(0.0), "logit": jnp.array(0.0)}
    t0 = time.perf_counter()
    result = gv.fit(objective, params, Y, HEADS, steps=args.steps, key=jax.random.key(0),
                    optimizer=optax.adam(optax.cosine_decay_schedule(0.05, args.steps)))
    params = result.params
    seconds = time.perf_counter() - t0
    mean, sd, p_loaded, log_evidence = exact_posterior(Y, HEADS)
    learned = (float(params["m"]), float(jnp.exp(params["log_s"])),
               float(jax.nn.sigmoid(params["logit"])))
    announce("estimating the final ELBO: compiling, then 4000 estimates")
    elbo = float(jnp.mean(jax.vmap(lambda k: objective.estimate(k, params, Y, HEADS))(
        jax.random.split(jax.random.key(1), 4000))))
    rows = [("posterior mean of mu", learned[0], mean), ("posterior sd of mu", learned[1], sd),
            ("P(coin loaded | flips)", learned[2], p_loaded),
            ("ELBO (mean of 4000)", elbo, log_evidence)]
    print(f"genvi demo: ELBO ascent with gv.fit, {args.steps} Adam steps in {seconds:.1f} s\n")
    print(f"{'':28}{'learned':>10}{'exact':>10}")
    for name, got, want in rows:
        print(f"{name:28}{got:10.3f}{want:10.3f}")
    print("\nThe guide family contains the exact posterior, so the ELBO reaches log p(data).")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write("| quantity | learned | exact |\n|---|---|---|\n")
            # a "|" inside a cell would split it: markdown's escape is "\|"
            f.writelines(f"| {n.replace('|', chr(92) + '|')} | {g:.3f} | {w:.3f} |\n"
                         for n, g, w in rows)
        # the curve needs matplotlib, the experiments extra: the README's first command
        # installs the library alone, and runs this demo
        try:
            gv.plot_history(result.history, os.path.join(args.out, "objective.png"),
                            "demo: ELBO")
        except ImportError as missing:
            print(f"wrote {args.out}/results.md; no objective.png ({missing})")
        else:
            print(f"wrote {args.out}/results.md and objective.png")
    return {"learned": learned, "exact": (mean, sd, p_loaded), "elbo": elbo,
            "log_evidence": log_evidence}


if __name__ == "__main__":
    main()
