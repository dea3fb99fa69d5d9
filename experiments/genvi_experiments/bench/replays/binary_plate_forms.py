"""`gv.DisARM`'s and `gv.RELAX`'s forms in a plate of latent vectors: which one the
default takes, and what each costs in variance and time.

Each of B datapoints has a latent vector of two bits that its likelihood reads
jointly (a `lax.cond` on one bit choosing how the other enters the mean). The guide
is a plate of Bernoulli vectors whose logits are affine in the datapoint. The rest of
the objective then couples each datapoint's two lanes, so the default (`gv.DisARM`)
pairs each datapoint's vector whole, one lane-local replay per datapoint;
`.whole_site()` pairs the plate's whole [B, 2] site at once, whose score term carries
every datapoint's noise; `.per_lane()` replays lane by lane (each lane's replay runs
its datapoint's likelihood again). `gv.RELAX`'s forms follow the same rule: by default
one replay baseline per datapoint (its vector at an independent draw), the papers'
form (no baseline) or one per lane; its surrogate is linear in a datapoint's relaxed
vector, at zero as a fit starts it. ENUM and RLOO(2) are printed beside them. Columns:
the total gradient variance over the guide's 4 parameters (from `--estimates`
estimates), the step time (interleaved, warm, median) and how `explain` says the
site's replays ran.

    python -m genvi_experiments.bench.replays.binary_plate_forms [--sizes 64 512]
        [--estimates 2000] [--rounds 15] [--record]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_samples, median


def linear(phi: dict, z: jax.Array) -> jax.Array:
    """RELAX's surrogate: linear in a datapoint's relaxed vector."""
    return jnp.dot(phi["w"], z) + phi["b"]


RELAX = gv.RELAX(linear, {"w": jnp.zeros(2), "b": jnp.float32(0.0)})
STRATEGIES = {"DisARM (default)": gv.DisARM, "DisARM.per_lane()": gv.DisARM.per_lane(),
              "DisARM.whole_site()": gv.DisARM.whole_site(), "RELAX (default)": RELAX,
              "RELAX.per_lane()": RELAX.per_lane(), "RELAX.whole_site()": RELAX.whole_site(),
              "ENUM": gv.ENUM, "RLOO(2)": gv.RLOO(2)}
PARAMS = {"a": jnp.array([0.4, -0.3]), "b": jnp.array([0.1, 0.2])}


def plate_elbo(strategy: gv.Strategy, size: int) -> gv.Expectation:
    """The ELBO of `size` datapoints, each with a latent vector read jointly."""
    @gv.gen
    def point(y):
        z = gv.bernoulli(logits=jnp.zeros(2)) @ "z"
        mean = jax.lax.cond(z[0], lambda: 2.0 * z[1] - 0.5, lambda: -1.0 - z[1] * 1.0)
        gv.observe(gv.normal(mean, 1.0), y)

    @gv.gen
    def model(params, y):
        gv.plate(point, size=size)(y) @ "data"

    @gv.gen
    def guide_point(params, y):
        gv.bernoulli(logits=params["a"] * y + params["b"], grad=strategy) @ "z"

    @gv.gen
    def guide(params, y):
        gv.plate(guide_point, size=size, in_axes=(None, 0))(params, y) @ "data"
    return gv.elbo(model, guide)


def measure(size: int, estimates: int, rounds: int) -> list[dict]:
    y = 2.0 * jnp.sin(jnp.arange(size, dtype=jnp.float32))
    keys = jax.random.split(jax.random.key(0), estimates)
    rows, steps = [], {}
    for name, strategy in STRATEGIES.items():
        objective = plate_elbo(strategy, size)
        grads = jax.jit(jax.vmap(lambda k, o=objective: o.grad_estimate(k, PARAMS, y)))(keys)
        variance = sum(float(np.var(np.asarray(g, np.float64), 0).sum())
                       for g in jax.tree_util.tree_leaves(grads))
        step = jax.jit(lambda k, o=objective: o.grad_estimate(k, PARAMS, y))
        jax.block_until_ready(step(keys[0]))
        steps[name] = lambda step=step: step(keys[0])
        (site,) = [r for r in objective.explain(PARAMS, y).sites if r["addr"] == "data/z"]
        rows.append({"size": size, "name": name, "variance": variance, "replays": site["replays"]})
    samples = interleaved_samples(steps, rounds=rounds, reps=5, warmup=1)
    for row in rows:
        row["ms"] = 1e3 * median(samples[row["name"]])
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--estimates", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--record", action="store_true",
                    help="write the table to docs/benchmarks/replays.md")
    args = ap.parse_args(argv)
    rows = [row for size in args.sizes for row in measure(size, args.estimates, args.rounds)]
    columns = ["datapoints", "strategy", "gradient variance (total)", "ms / step",
               "the site's replays (explain)"]
    table = [[str(r["size"]), r["name"], f"{r['variance']:.3g}", f"{r['ms']:.3f}", r["replays"]]
             for r in rows]
    print(describe_machine())
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for cells in table:
        print("| " + " | ".join(cells) + " |")
    if args.record:
        record("binary_plate_forms", command("replays.binary_plate_forms", argv), columns, table,
               note=f"{args.estimates} gradient estimates per row at fixed parameters; step "
                    "times interleaved, warm, median.")
    return rows


if __name__ == "__main__":
    main()
