"""The AIR estimators the paper compares, each chosen only by z_pres's gradient
strategy and the objective; the model and guide code never changes.

| name | objective | z_pres strategy |
|---|---|---|
| reinforce | ELBO | REINFORCE |
| baseline | ELBO | REINFORCE with a learned neural baseline |
| enum | ELBO | ENUM |
| mvd | ELBO | MVD |
| hybrid | ELBO | MVD for the first steps, ENUM for the last (`gv.switch`) |
| iwelbo_reinforce | IWELBO(2) | REINFORCE |
| iwelbo_mvd | IWELBO(2) | MVD |
| rws | reweighted wake-sleep, 10 particles | (samples are not differentiated) |
| sd | ELBO | SD (stochastic derivatives, one pruned alternative path per estimate) |

Inside `gv.scan`, genvi's ENUM for a flip enumerates each step's two values lane by
lane, which for a binary site is the same estimator as MVD (∂p · (f(1) − f(0))),
so `enum`, `mvd` and `hybrid` coincide in distribution; they are listed separately
because the paper does.

Example:
    >>> from genvi_experiments.air.estimators import ESTIMATORS
    >>> sorted(ESTIMATORS)[:3]
    ['baseline', 'enum', 'hybrid']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

import genvi as gv
from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.model import AIRNets, PresGrad, air_programs


@dataclass(frozen=True)
class Estimator:
    """An objective builder `(model, guide) -> Expectation` and z_pres's strategy."""

    objective: Callable[[gv.GenFn, gv.GenFn], gv.Expectation]
    pres_grad: PresGrad
    baseline: bool = False
    about: str = ""


def _fixed(strategy: gv.Strategy) -> PresGrad:
    return lambda t, info: strategy


def _learned_baseline(t, info):
    return gv.REINFORCE.with_baseline(info["value"])


def _hybrid(t, info):
    return gv.switch(jnp.asarray(t) >= 2, [gv.MVD, gv.ENUM])


def _rws(model, guide):
    return gv.wake_model(model, guide, 10) + gv.wake_guide(model, guide, 10)


ESTIMATORS: dict[str, Estimator] = {
    "reinforce": Estimator(gv.elbo, _fixed(gv.REINFORCE), about="ELBO, REINFORCE"),
    "baseline": Estimator(gv.elbo, _learned_baseline, baseline=True,
                          about="ELBO, REINFORCE with a neural baseline"),
    "enum": Estimator(gv.elbo, _fixed(gv.ENUM), about="ELBO, ENUM"),
    "mvd": Estimator(gv.elbo, _fixed(gv.MVD), about="ELBO, MVD"),
    "hybrid": Estimator(gv.elbo, _hybrid, about="ELBO, MVD then ENUM at the last step"),
    "iwelbo_reinforce": Estimator(lambda m, g: gv.iwelbo(m, g, particles=2),
                                  _fixed(gv.REINFORCE), about="IWELBO(2), REINFORCE"),
    "iwelbo_mvd": Estimator(lambda m, g: gv.iwelbo(m, g, particles=2), _fixed(gv.MVD),
                            about="IWELBO(2), MVD"),
    "rws": Estimator(_rws, _fixed(gv.REINFORCE), about="reweighted wake-sleep, 10 particles"),
    "sd": Estimator(gv.elbo, _fixed(gv.SD), about="ELBO, SD (stochastic derivatives, pruned)"),
}


def air_objective(cfg: AIRConfig, nets: AIRNets,
                  name: str) -> tuple[gv.Expectation, gv.GenFn, gv.GenFn]:
    """`(minibatch objective over (params, images [B, canvas, canvas]), model, guide)`
    for the estimator `name`."""
    if name not in ESTIMATORS:
        raise KeyError(f"unknown AIR estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    est = ESTIMATORS[name]
    model, guide = air_programs(cfg, nets, est.pres_grad, baseline=est.baseline)
    return gv.batch_mean(est.objective(model, guide)), model, guide


def count_objects(guide: gv.GenFn, params: dict, images: jax.Array, key: jax.Array) -> jax.Array:
    """The number of objects the guide infers in each image (one guide sample)."""
    keys = jax.random.split(key, images.shape[0])
    return jax.vmap(lambda k, x: jnp.sum(guide.simulate(k, params, x).retval))(keys, images)
