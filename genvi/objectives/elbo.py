"""ELBO and IWELBO as expectations over a guide's `sim` and a model's `log_density`.

Model and guide take the same arguments. HVI, IWHVI and DIWHVI are these objectives
applied to a `gv.marginal` guide."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.adev.expectation import Expectation
from genvi.adev.program import ProgramExpectation
from genvi.core.mistakes import checked_count
from genvi.core.program_mistakes import require_programs
from genvi.gen.language import GenFn


def _log_weight(model: GenFn, guide: GenFn, args: tuple) -> jax.Array:
    choices, log_q = guide.sim(*args)
    return model.log_density(choices, *args) - log_q


def particle_log_weights(model: GenFn, guide: GenFn, args: tuple, k: int) -> jax.Array:
    """log p(x, z_k) − log q(z_k) for `k` guide particles, vectorized (inside objectives)."""
    return jax.vmap(lambda _: _log_weight(model, guide, args))(jnp.arange(k))


def elbo(model: GenFn, guide: GenFn) -> Expectation:
    """E_q[log p(x, z) − log q(z)], maximized.

    Args:
        model: the model.
        guide: the guide, called with the model's arguments.

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def model(m, y):
        ...     z = gv.normal(0.0, 1.0) @ "z"
        ...     gv.observe(gv.normal(z, 1.0), y)
        >>> @gv.gen
        ... def guide(m, y):
        ...     gv.normal(m, 0.7, grad=gv.REPARAM) @ "z"
        >>> objective = gv.elbo(model, guide)   # objective.grad_estimate(key, m, y)
    """
    require_programs("gv.elbo(model, guide)", model=model, guide=guide)
    return ProgramExpectation(lambda *args: _log_weight(model, guide, args), name="elbo")


def iwelbo(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """E[log (1/K) Σ_k p(x, z_k) / q(z_k)] with K guide particles, maximized.

    Particles are vectorized with `vmap` (one site with K lanes), never unrolled.

    Args:
        model: the model.
        guide: the guide.
        particles: K, the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # gv.iwelbo(model, guide, particles=8).grad_estimate(key, params, data)
    """
    require_programs("gv.iwelbo(model, guide, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.iwelbo", what="guide particles")

    def body(*args):
        return logsumexp(particle_log_weights(model, guide, args, k)) - math.log(k)

    return ProgramExpectation(body, name=f"iwelbo({k})")


def renyi(model: GenFn, guide: GenFn, alpha: float, particles: int) -> Expectation:
    """The Rényi-α variational bound with K particles (Li & Turner 2016):
    E[1/(1−α) log (1/K) Σ_k w_k^(1−α)], maximized. α = 0 is IWELBO; α → 1 the ELBO.
    For 0 ≤ α < 1 it lower-bounds log p(x) and increases as α decreases.

    Args:
        model: the model.
        guide: the guide.
        alpha: α, in [0, 1).
        particles: K, the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # gv.renyi(model, guide, alpha=0.5, particles=8).grad_estimate(key, params, data)
    """
    require_programs("gv.renyi(model, guide, alpha, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.renyi", what="guide particles")
    a = float(alpha)
    if a == 1.0:
        return ProgramExpectation(lambda *args: jnp.mean(particle_log_weights(model, guide, args, k)),
                                  name=f"renyi(1, {k})")

    def body(*args):
        log_w = particle_log_weights(model, guide, args, k)
        return (logsumexp((1 - a) * log_w) - math.log(k)) / (1 - a)

    return ProgramExpectation(body, name=f"renyi({a}, {k})")
