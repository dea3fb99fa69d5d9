"""IWELBO with lower-variance gradient estimators: VIMCO and DReG.

Both are written as ordinary objective programs: the value is the IWELBO estimate,
and a zero-valued surrogate term `s − stop_gradient(s)` reshapes what ADEV
differentiates — so they compose with every other objective and with `batch_mean`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.lax import stop_gradient
from jax.scipy.special import logsumexp

from genvi.adev.expectation import Expectation
from genvi.adev.program import ProgramExpectation
from genvi.core.mistakes import checked_count
from genvi.core.program_mistakes import require_programs
from genvi.gen.language import GenFn


def require_strategies(objective: str, guide: GenFn, args: tuple, declaration: str,
                       shown: str, why: str) -> None:
    """Refuse, at trace time, a guide site whose strategy does not make `declaration`
    (`"pathwise"` or `"score_function"`, a `gv.Strategy` attribute) true: an
    objective's prerequisite. The message names the address and the fix (`shown`, the
    strategy to use, e.g. `"gv.REPARAM"`)."""
    if guide.estimated_density:
        raise TypeError(f"{objective} needs a guide with a tractable density (a @gv.gen program "
                        f"or a combinator of one); got {guide.name}. {why}")
    for addr, strategy in guide.site_strategies(*args).items():
        inner = getattr(strategy, "strategies", (strategy,))
        if not all(getattr(s, declaration, False) for s in inner):
            raise ValueError(
                f"{objective} needs grad={shown} at every guide site, but the site {addr!r} of "
                f"{guide.name} has grad={strategy!r}. {why} Use grad={shown} at {addr!r}, or "
                "gv.iwelbo, which is unbiased for every strategy.")


def _zero_valued(surrogate: jax.Array) -> jax.Array:
    """Value 0, derivative that of `surrogate`."""
    return surrogate - stop_gradient(surrogate)


def _leave_one_out(log_w: jax.Array) -> jax.Array:
    """L_{−i}: log mean of the weights with w_i replaced by the geometric mean of
    the others (VIMCO's per-particle baseline; independent of particle i)."""
    k = log_w.shape[0]
    others_mean = (jnp.sum(log_w) - log_w) / (k - 1)
    replaced = jnp.where(jnp.eye(k, dtype=bool), others_mean[:, None], log_w[None, :])
    return logsumexp(replaced, axis=1) - math.log(k)


def vimco(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """IWELBO(K) whose score-function gradient uses VIMCO's leave-one-out control
    variates (Mnih & Rezende 2016): Σ_i ∂log q(z_i) (L − L_{−i}) + pathwise terms.

    Requires REINFORCE guide sites (with or without a baseline), checked when its
    gradient is traced (its value is right for any strategy): its control variates correct the score-function term, which pathwise
    (REPARAM) or exact (ENUM, MVD) sites do not have. Unbiased: L_{−i} does not
    depend on z_i.

    Args:
        model: the model.
        guide: the guide; its sites REINFORCE.
        particles: K, the number of particles (≥ 2).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # gv.vimco(model, guide, particles=5).grad_estimate(key, params, data)
    """
    require_programs("gv.vimco(model, guide, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.vimco", minimum=2,
                      what="guide particles: leave-one-out baselines need two")

    def requires(*args):
        require_strategies("gv.vimco", guide, args, "score_function", "gv.REINFORCE",
                           "Its leave-one-out baselines correct the score-function term.")

    def body(*args):
        def particle(_):
            choices, log_q = guide.sim(*args)
            return model.log_density(choices, *args) - log_q, log_q

        log_w, log_q = jax.vmap(particle)(jnp.arange(k))
        baseline = stop_gradient(_leave_one_out(log_w))
        # REINFORCE contributes L · Σ ∂log q(z_i); this term removes Σ L_{−i} ∂log q(z_i).
        return logsumexp(log_w) - math.log(k) - jnp.sum(baseline * _zero_valued(log_q))

    return ProgramExpectation(body, name=f"vimco({k})", requires=requires)


def dreg(model: GenFn, guide: GenFn, particles: int) -> Expectation:
    """IWELBO(K) with doubly-reparameterized gradients (Tucker et al. 2019); at K = 1
    this is sticking-the-landing (Roeder et al. 2017).

    Guide gradients: Σ_k w̃_k² ∂(log p(x, z_k) − log q_stop(z_k)) through z_k only
    (q's parameters stopped); model gradients: Σ_k w̃_k ∂log p(x, z_k). Requires
    REPARAM at every guide site, checked when its gradient is traced (the estimator differentiates
    through z_k). With the exact posterior as guide the gradient is exactly zero.

    Args:
        model: the model.
        guide: the guide; every site REPARAM.
        particles: K, the number of particles (≥ 1).

    Returns:
        an `Expectation` of `(params, *data)`, maximized.

    Example:
        >>> import genvi as gv
        >>> # gv.dreg(model, guide, particles=8).grad_estimate(key, params, data)
    """
    require_programs("gv.dreg(model, guide, particles)", model=model, guide=guide)
    k = checked_count(particles, "particles", "gv.dreg", what="guide particles")

    def requires(*args):
        require_strategies("gv.dreg", guide, args, "pathwise", "gv.REPARAM",
                           "It differentiates through the guide's samples.")

    def body(*args):
        stopped = stop_gradient(args)

        def particle(_):
            z, _ = guide.sim(*args)
            z_fixed = stop_gradient(z)
            through_z = model.log_density(z, *stopped) - guide.log_density(z, *stopped)
            model_term = model.log_density(z_fixed, *args)
            log_w = model_term - guide.log_density(z_fixed, *args)
            return log_w, through_z, model_term

        log_w, through_z, model_term = jax.vmap(particle)(jnp.arange(k))
        w = stop_gradient(jax.nn.softmax(log_w))
        value = stop_gradient(logsumexp(log_w) - math.log(k))
        return (value + _zero_valued(jnp.sum(w ** 2 * through_z))
                + _zero_valued(jnp.sum(w * model_term)))

    return ProgramExpectation(body, name=f"dreg({k})", requires=requires)
