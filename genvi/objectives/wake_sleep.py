"""Reweighted wake-sleep (Bornschein & Bengio 2015) and forward KL through SIR.

All phases are maximized objectives over the shared `(params, data...)` arguments;
sum them (`wake_model + wake_guide`) to train both with one optimizer. Samples are
drawn with stopped parameters, so guide sites need no particular strategy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.lax import stop_gradient
from jax.scipy.special import logsumexp

from genvi.adev.expectation import Expectation
from genvi.adev.program import ProgramExpectation
from genvi.adev.strategies import REINFORCE
from genvi.core.mistakes import checked_count
from genvi.core.program_mistakes import require_programs
from genvi.inference.importance import importance, normalize
from genvi.gen.language import GenFn


def _stopped_particles(model: GenFn, guide: GenFn, args: tuple, k: int):
    stopped = stop_gradient(args)

    def particle(_):
        z, log_q = guide.sim(*stopped)
        z = stop_gradient(z)
        return z, model.log_density(z, *args), stop_gradient(log_q)

    return jax.vmap(particle)(jnp.arange(k))


def wake_model(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """Wake phase for the model: log (1/K) Σ p(x, z_k)/q(z_k) with z_k ~ q held fixed;
    its gradient is Σ_k w̃_k ∂log p(x, z_k).

    Args:
        model: the model.
        guide: the guide.
        particles: K, the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # (gv.wake_model(m, q, 10) + gv.wake_guide(m, q, 10)).grad_estimate(key, params, x)
    """
    require_programs("gv.wake_model(model, guide, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.wake_model", what="guide particles")

    def body(*args):
        _, log_p, log_q = _stopped_particles(model, guide, args, k)
        return logsumexp(log_p - log_q) - math.log(k)

    return ProgramExpectation(body, name=f"wake_model({k})")


def wake_guide(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """Wake phase for the guide: Σ_k w̃_k log q(z_k) with self-normalized weights
    (an estimate of −KL(p(z|x) ‖ q) up to a constant); gradient Σ_k w̃_k ∂log q(z_k).

    Args:
        model: the model.
        guide: the guide.
        particles: K, the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.
    """
    require_programs("gv.wake_guide(model, guide, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.wake_guide", what="guide particles")

    def body(*args):
        z, log_p, log_q = _stopped_particles(model, guide, args, k)
        w = stop_gradient(jax.nn.softmax(log_p - log_q))
        log_q_live = jax.vmap(lambda zi: guide.log_density(zi, *args))(z)
        return jnp.sum(w * log_q_live)

    return ProgramExpectation(body, name=f"wake_guide({k})")


def sleep_guide(model: GenFn, guide: GenFn, particles: int = 1, data_argnum: int = 1) -> Expectation:
    """Sleep phase for the guide: E_{(z, x) ~ p}[log q(z | x)] with "dreamed" data.

    The model's observations are sampled instead of scored; argument `data_argnum`
    of the guide receives the dreamed data (the single observation's value, or a
    tuple of them in program order).

    Args:
        model: the model, whose observations are drawn.
        guide: the guide trained on the dreamed data.
        particles: dreams per estimate.
        data_argnum: the guide's argument that receives the dreamed data.

    Returns:
        an `Expectation` of `(params, *data)`, maximized.
    """
    require_programs("gv.sleep_guide(model, guide)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.sleep_guide", what="dreamed samples")

    def body(*args):
        def particle(_):
            z, observed, _ = model.dream(*stop_gradient(args))
            data = observed[0] if len(observed) == 1 else tuple(observed)
            dreamed = list(args)
            dreamed[data_argnum] = stop_gradient(data)
            guide.require_normalized("the guide of gv.sleep_guide (scored at dreamed data)",
                                     *dreamed)
            return guide.log_density(stop_gradient(z), *dreamed)

        return jnp.mean(jax.vmap(particle)(jnp.arange(k)))

    return ProgramExpectation(body, name=f"sleep_guide({k})")


def forward_kl_sir(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """Forward KL through SIR: log q(z) at z drawn by sampling-importance-resampling
    with the (stopped) guide as proposal; maximizing it minimizes an estimate of
    KL(p(z|x) ‖ q) (biased for finite K, consistent as K grows).

    Args:
        model: the model.
        guide: the guide, the (stopped) proposal.
        particles: K, the SIR particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.
    """
    require_programs("gv.forward_kl_sir(model, guide, particles)", model=model, guide=guide)
    # Parameters are stopped, so the resampling choice needs no enumeration.
    sir = normalize(model, importance(guide, checked_count(particles, "particles", "gv.forward_kl_sir",
                                                       what="guide particles"),
                                  resample=REINFORCE))

    def body(*args):
        z, _ = sir.sim(*stop_gradient(args))
        return guide.log_density(stop_gradient(z), *args)

    return ProgramExpectation(body, name=f"forward_kl_sir({particles})")
