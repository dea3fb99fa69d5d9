"""Sequential Monte Carlo objectives: the log of a particle filter's evidence
estimate, whose resampling choices are sampling sites with a gradient strategy.

A state-space model is a step program `model_step(params, state, y_t) -> new_state`
(latent sites plus a `gv.observe` of `y_t`); a proposal step
`proposal_step(params, state, y_t)` samples the same latent addresses. Time steps run
in `jax.lax.scan`, particles in `vmap`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.lax import stop_gradient
from jax.scipy.special import logsumexp

from genvi.adev.expectation import Expectation
from genvi.adev.program import ProgramExpectation
from genvi.adev.strategies import REINFORCE
from genvi.core.mistakes import checked_count
from genvi.core.program_mistakes import require_programs
from genvi.core.strategy import Strategy
from genvi.distributions.discrete import Categorical
from genvi.gen.language import GenFn
from genvi.adev.sample import sample


def _particle_filter(model_step: GenFn, proposal_step: GenFn, init: Any, k: int,
                     resample: Strategy, keep_resampling_terms: bool):
    def body(params, ys):
        states = jax.tree_util.tree_map(lambda s: jnp.broadcast_to(s, (k,) + jnp.shape(s)), init)

        def step(carry, y):
            states, log_z = carry

            def particle(state):
                x, log_q = proposal_step.sim(params, state, y)
                log_p, new_state = model_step.assess(x, params, state, y)
                return new_state, log_p - log_q

            new_states, log_w = jax.vmap(particle)(states)
            log_z = log_z + logsumexp(log_w) - math.log(k)
            logits = log_w if keep_resampling_terms else stop_gradient(log_w)
            ancestors = jax.vmap(lambda _: sample(Categorical()(logits, grad=resample),
                                                  name="resample"))(jnp.arange(k))
            states = jax.tree_util.tree_map(lambda s: s[ancestors], new_states)
            return (states, log_z), None

        (_, log_z), _ = jax.lax.scan(step, (states, jnp.zeros(())), ys)
        return log_z

    return body


def smc(model_step: GenFn, proposal_step: GenFn, init: Any, particles: int,
        resample: Strategy = REINFORCE) -> Expectation:
    """E[log Ẑ] for a bootstrap-style particle filter with multinomial resampling
    at every step; `exp(log Ẑ)` is unbiased for p(y_1:T), so this lower-bounds
    log p(y_1:T). Its gradient estimator is unbiased for the objective's gradient:
    the resampling choices carry the strategy `resample` (REINFORCE, MVD or ENUM),
    like any other site. Arguments: `(params, ys)` with time on the leading axis of ys.

    Args:
        model_step: the model's step `(params, state, y) -> state`.
        proposal_step: the proposal's step, called like `model_step`.
        init: the particles' initial state.
        particles: the number of particles (≥ 1).
        resample: the strategy of the resampling choices.

    Returns:
        an `Expectation` of `(params, ys)`, maximized.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> @gv.gen
        ... def step(params, x, y):
        ...     x = gv.normal(0.9 * x, 1.0) @ "x"
        ...     gv.observe(gv.normal(x, 0.5), y)
        ...     return x
        >>> @gv.gen
        ... def prop(params, x, y):
        ...     gv.normal(params["a"] * x, 1.0, grad=gv.REPARAM) @ "x"
        >>> objective = gv.smc(step, prop, init=jnp.array(0.0), particles=8)
    """
    require_programs("gv.smc(model_step, proposal_step, init, particles)",
                     model_step=model_step, proposal_step=proposal_step)
    k = checked_count(particles, "particles", "gv.smc", what="particles per step")
    return ProgramExpectation(_particle_filter(model_step, proposal_step, init, k, resample, True),
                              name=f"smc({k})")


def fivo(model_step: GenFn, proposal_step: GenFn, init: Any, particles: int) -> Expectation:
    """The SMC objective with the resampling gradient terms dropped, as FIVO
    (Maddison et al. 2017) does. BIASED: its gradient estimator is not unbiased for
    the gradient of E[log Ẑ] (it has lower variance). Use `gv.smc` for the
    unbiased estimator.

    Args:
        model_step: the model's step `(params, state, y) -> state`.
        proposal_step: the proposal's step, called like `model_step`.
        init: the particles' initial state.
        particles: the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, ys)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # gv.fivo(step, prop, init=0.0, particles=8).grad_estimate(key, params, ys)
    """
    require_programs("gv.fivo(model_step, proposal_step, init, particles)",
                     model_step=model_step, proposal_step=proposal_step)
    k = checked_count(particles, "particles", "gv.fivo", what="particles per step")
    return ProgramExpectation(_particle_filter(model_step, proposal_step, init, k, REINFORCE, False),
                              name=f"fivo_biased({k})")
