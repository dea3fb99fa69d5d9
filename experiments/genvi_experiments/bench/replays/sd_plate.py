"""`gv.SD` (stochastic derivatives with pruning) on a non-separable plate of flips.

1. Step time of a jitted `grad_estimate` on f = sin(Σ_i c_i x_i), x_i ~ flip(p_i),
   4,000 lanes with one parameter each: SD (primal + one replay) against REINFORCE
   (no replay) and MVD (one replay per lane), interleaved, warm, median; the ratio
   SD / REINFORCE is the median of per-round ratios. Bar: SD ≤ 3× REINFORCE.
2. Variance of the gradient estimate on the 30-lane version of the same program:
   the mean over the 30 entries of the per-entry variance, from 20,000 estimates.

    python -m genvi_experiments.bench.replays.sd_plate
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.common.timing import (
    compile_time,
    describe_machine,
    interleaved_samples,
    median,
    paired_ratio,
)

STRATEGIES = {"SD": gv.SD, "REINFORCE": gv.REINFORCE, "MVD": gv.MVD}


def plate(strategy: gv.Strategy, lanes: int, shared: bool = False,
          offset: float = 0.0) -> gv.Expectation:
    """f = offset + sin(Σ c_i x_i); `p` per lane, or one θ with p_i = σ(θ + a_i)."""
    c = jnp.linspace(-1.0, 1.5, lanes) * (30.0 / lanes) ** 0.5  # Σ c_i x_i of order 1
    a = jnp.linspace(-2.0, 2.0, lanes)

    @gv.expectation
    def objective(p):
        p = jax.nn.sigmoid(p + a) if shared else p
        x = gv.sample(gv.flip(p, grad=strategy)).astype(jnp.float32)
        return offset + jnp.sin(jnp.sum(c * x))
    return objective


def step_times(lanes: int = 4000, rounds: int = 15) -> dict:
    p = jnp.linspace(0.05, 0.95, lanes)
    key = jax.random.key(0)
    fns, compile_s = {}, {}
    for name, s in STRATEGIES.items():
        obj = plate(s, lanes)
        compile_s[name] = compile_time(lambda obj=obj: obj.grad_estimate(key, p))
        fns[name] = lambda obj=obj: obj.grad_estimate(key, p)
    samples = interleaved_samples(fns, rounds=rounds, reps=5, warmup=1)
    return {"median_ms": {k: 1e3 * median(v) for k, v in samples.items()},
            "compile_s": compile_s,
            "sd_over_reinforce": paired_ratio(samples, "SD", "REINFORCE"),
            "mvd_over_reinforce": paired_ratio(samples, "MVD", "REINFORCE")}


def variances(lanes: int = 30, n: int = 20000, shared: bool = False, offset: float = 0.0) -> dict:
    p = jnp.float32(0.3) if shared else jnp.linspace(0.05, 0.95, lanes)
    keys = jax.random.split(jax.random.key(1), n)
    out = {}
    for name, s in STRATEGIES.items():
        obj = plate(s, lanes, shared, offset)
        g = np.asarray(jax.jit(jax.vmap(lambda k, obj=obj: obj.grad_estimate(k, p)))(keys))
        g = g.reshape(n, -1)
        out[name] = {"mean_var": float(g.var(0).mean()), "mean_abs_grad": float(np.abs(g.mean(0)).mean())}
    return out


def main() -> None:
    print(describe_machine())
    t = step_times()
    v, vs, vo = variances(), variances(shared=True), variances(offset=10.0)
    print("\n| strategy | step, 4,000 lanes (ms) | × REINFORCE | compile (s) | "
          "variance, 30 lanes, 30 parameters (mean per entry) | variance, 30 lanes, 1 shared "
          "parameter | variance, 30 parameters, f + 10 |")
    print("|---|---|---|---|---|---|---|")
    for name in STRATEGIES:
        ratio = {"SD": t["sd_over_reinforce"], "MVD": t["mvd_over_reinforce"]}.get(name, 1.0)
        print(f"| {name} | {t['median_ms'][name]:.3f} | {ratio:.2f} | {t['compile_s'][name]:.2f} | "
              f"{v[name]['mean_var']:.4g} | {vs[name]['mean_var']:.4g} | {vo[name]['mean_var']:.4g} |")
    print(f"\nmean |gradient| per entry: {v['SD']['mean_abs_grad']:.4g} (30 parameters), "
          f"{vs['SD']['mean_abs_grad']:.4g} (shared)")
    for label, w in (("30 parameters", v), ("shared parameter", vs), ("f + 10", vo)):
        print(f"{label}: SD / MVD variance {w['SD']['mean_var'] / w['MVD']['mean_var']:.2f}, "
              f"SD / REINFORCE variance {w['SD']['mean_var'] / w['REINFORCE']['mean_var']:.3f}")
    print(f"bar SD <= 3x REINFORCE: {'met' if t['sd_over_reinforce'] <= 3 else 'NOT met'}")


if __name__ == "__main__":
    main()
