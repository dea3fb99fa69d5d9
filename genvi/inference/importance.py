"""Programs whose densities are estimated: `gv.marginal` and `gv.normalize`.

Both take an importance-sampling algorithm, `gv.importance(proposal, particles)`.
Inside objectives their `log_density` is the log of an unbiased estimate of the
density, and their `sim` returns a sample with the log of an unbiased estimate of the
reciprocal density (conditional importance sampling), as in the appendix of the
programmable-VI paper. Particles are vectorized with `vmap`; proposals are programs
with their own parameters, and a `marginal` may be another marginal's proposal.
Outside objectives, `simulate(key, ...)` and `estimate_log_density(key, ...)` run the
same estimators for their values.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.adev.interpreter import sample_outputs
from genvi.adev.sample import sample
from genvi.adev.strategies import ENUM
from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.mistakes import check_key, checked_count
from genvi.core.program_mistakes import require_program
from genvi.core.strategy import Strategy
from genvi.core.tracing import IN_OBJECTIVE, PLAIN, trace_cached
from genvi.core.validation import entry_point
from genvi.distributions.discrete import Categorical
from genvi.gen.language import GenFn, Trace


@dataclass(frozen=True)
class Importance:
    """Importance sampling with `particles` draws from `proposal` (None: the
    program's own prior); `resample` is the gradient strategy of SIR's resampling
    choice (used by `gv.normalize`)."""

    proposal: GenFn | None = None
    particles: int = 1
    resample: Strategy = ENUM

    def marginal(self, g: GenFn, keep: Sequence) -> "Marginal":
        """`g`'s marginal over `keep`, estimated by this algorithm (`gv.marginal`)."""
        return Marginal(g, keep, self)


def importance(proposal: GenFn | None = None, particles: int = 1,
               resample: Strategy = ENUM) -> Importance:
    """An importance-sampling algorithm for `gv.marginal` / `gv.normalize`.

    Args:
        proposal: the generative function proposing the auxiliary choices; the prior
            when None.
        particles: the number of importance particles.
        resample: the strategy of the resampling choice in `gv.normalize`.

    Returns:
        an `Importance`, the `algorithm` of `gv.marginal` or `gv.normalize`.

    Example:
        >>> import genvi as gv
        >>> alg = gv.importance(particles=5)          # propose from the prior
        >>> alg.particles
        5
    """
    require_program(proposal, "proposal (None: the program's own prior)",
                    "gv.importance(proposal, particles)", optional=True)
    k = checked_count(particles, "particles", "gv.importance", what="proposal particles")
    return Importance(proposal, k, resample)


def _log_mean_exp(log_w: jax.Array) -> jax.Array:
    return logsumexp(log_w) - math.log(log_w.shape[0])


def _particles(n: int, fn) -> Any:
    """`n` independent evaluations of `fn()` as one vectorized computation."""
    return jax.vmap(lambda _: fn())(jnp.arange(n))


def _plain(fn, key: jax.Array, args: tuple, cache: dict) -> Any:
    """Run objective-style code `fn(*args)` for its values (sites just sample)."""
    def context():
        stack = contextlib.ExitStack()
        stack.enter_context(IN_OBJECTIVE.set())
        stack.enter_context(PLAIN.set())
        return stack
    traced, dyn = trace_cached(cache, fn, args, context)
    outs = sample_outputs(traced.closed, key, dyn)
    return jax.tree_util.tree_unflatten(traced.out_tree, outs)


class _Estimated(GenFn):
    """Shared behaviour of programs whose densities are estimated."""

    estimated_density = True

    def body(self, *args):
        raise TypeError(f"{self.name} has an estimated density: use it as a model or guide "
                        "(its sim / log_density), not as a sub-program call.")

    @entry_point
    def simulate(self, key: jax.Array, *args: Any) -> Trace:
        """A sample and, as `log_density`, the log of `sim`'s density estimate."""
        check_key(key, f"{self.name}.simulate")
        chosen, log_w = _plain(lambda *a: self.sim(*a), key, args, self._traces)
        return Trace(chosen, log_w, None)

    @entry_point
    def estimate_log_density(self, key: jax.Array, choices: Any, *args: Any) -> jax.Array:
        """Outside objectives: the log of an unbiased density estimate."""
        check_key(key, f"{self.name}.estimate_log_density")
        return _plain(lambda c, *a: self.log_density(c, *a), key, (to_choices(choices),) + args,
                      self._traces)

    def require_normalized(self, role: str, *args: Any) -> None:
        """Estimated programs are normalized by construction (see `GenFn`)."""

    def _require_objective(self, what: str) -> None:
        if not IN_OBJECTIVE:
            raise RuntimeError(
                f"{self.name}.{what} is an estimate that draws random choices: call it inside "
                f"an @gv.expectation objective, or use {self.name}.estimate_log_density(key, ...) "
                "/ .simulate(key, ...) outside one.")


class Marginal(_Estimated):
    def __init__(self, g: GenFn, keep: Sequence, algorithm: Importance):
        super().__init__()
        self.g, self.alg = g, algorithm
        self.keep = [tuple(k) if isinstance(k, tuple) else (k,) for k in keep]
        self.name = f"marginal({g.name})"

    def _is_kept(self, path: tuple) -> bool:
        return any(path[:len(k)] == k for k in self.keep)

    def kept_sites_program(self) -> tuple[GenFn, Any]:
        """(the program whose sites automatic guides discover, which of them are kept)."""
        return self.g, self._is_kept

    def _split(self, cm: ChoiceMap) -> tuple[ChoiceMap, ChoiceMap]:
        flat = cm.flat()
        return (ChoiceMap({p: v for p, v in flat.items() if self._is_kept(p)}),
                ChoiceMap({p: v for p, v in flat.items() if not self._is_kept(p)}))

    def _fresh_log_weight(self, kept: ChoiceMap, args: tuple) -> jax.Array:
        q = self.alg.proposal
        if q is None:
            return self.g.generate(kept, *args)[1]
        aux, log_q = q.sim(kept, *args)
        return self.g.log_density(kept | aux, *args) - log_q

    def sim(self, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """`(kept choices, log ŵ)` with 1/ŵ unbiased for 1/p(kept)."""
        self._require_objective("sim")
        full, log_joint = self.g.sim(*args)
        kept, aux = self._split(full)
        q = self.alg.proposal
        if q is None:
            log_w0 = self.g.partial_log_density(full, kept.paths(), *args)
        else:
            log_w0 = log_joint - q.log_density(aux, kept, *args)
        log_w = log_w0[None]
        if self.alg.particles > 1:
            fresh = _particles(self.alg.particles - 1, lambda: self._fresh_log_weight(kept, args))
            log_w = jnp.concatenate([log_w, fresh])
        return kept, _log_mean_exp(log_w)

    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """Log of an unbiased estimate of the marginal density of `choices`."""
        self._require_objective("log_density")
        kept = to_choices(choices)
        return _log_mean_exp(_particles(self.alg.particles,
                                        lambda: self._fresh_log_weight(kept, args)))


class Normalize(_Estimated):
    def __init__(self, g: GenFn, algorithm: Importance):
        super().__init__()
        self.g, self.alg = g, algorithm
        self.name = f"normalize({g.name})"

    def _particle(self, args: tuple) -> tuple[ChoiceMap, jax.Array, jax.Array]:
        q = self.alg.proposal
        if q is None:
            x, log_w = self.g.generate(ChoiceMap(), *args)
            return x, self.g.log_density(x, *args), log_w
        x, log_q = q.sim(*args)
        log_p = self.g.log_density(x, *args)
        return x, log_p, log_p - log_q

    def _log_weight_of(self, x: ChoiceMap, log_p: jax.Array, args: tuple) -> jax.Array:
        q = self.alg.proposal
        if q is None:
            return self.g.partial_log_density(x, (), *args)
        return log_p - q.log_density(x, *args)

    def sim(self, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """Sampling-importance-resampling: `(x_j, log p(x_j) − log Ẑ)`."""
        self._require_objective("sim")
        xs, log_ps, log_ws = _particles(self.alg.particles, lambda: self._particle(args))
        j = sample(Categorical()(log_ws, grad=self.alg.resample), name="resample")
        x = jax.tree_util.tree_map(lambda a: a[j], xs)
        return x, log_ps[j] - _log_mean_exp(log_ws)

    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """Conditional SIR: log of an unbiased estimate of the SIR output density."""
        self._require_objective("log_density")
        x = to_choices(choices)
        log_p = self.g.log_density(x, *args)
        log_w = self._log_weight_of(x, log_p, args)[None]
        if self.alg.particles > 1:
            _, _, fresh = _particles(self.alg.particles - 1, lambda: self._particle(args))
            log_w = jnp.concatenate([log_w, fresh])
        return log_p - _log_mean_exp(log_w)


def marginal(g: GenFn, keep: Sequence, algorithm: Any = None) -> Marginal:
    """`g`'s marginal over the addresses in `keep`; its other choices are auxiliary
    and marginalized by `algorithm`: `gv.importance()` (the default, from the prior;
    its proposal takes `(kept_choices, *args)`), or `gv.enumeration()`, which sums
    discrete auxiliary sites exactly (`genvi.inference.enumeration`).

    Args:
        g: the generative function.
        keep: the addresses whose marginal is kept.
        algorithm: `gv.importance(...)` (the default) or `gv.enumeration()`.

    Returns:
        a `Marginal`, a generative function whose density is an unbiased estimate (exact
        under enumeration).

    Example (a hierarchical guide, for HVI / IWHVI / DIWHVI):
        >>> import genvi as gv, jax.numpy as jnp
        >>> @gv.gen
        ... def joint(p, z_obs):
        ...     u = gv.uniform(0.0, 1.0, grad=gv.REPARAM) @ "u"
        ...     gv.normal(jnp.cos(6.28 * u), 0.3, grad=gv.REPARAM) @ "x"
        >>> @gv.gen
        ... def reverse(kept, p, z_obs):
        ...     gv.uniform(0.0, 1.0, grad=gv.REPARAM) @ "u"
        >>> guide = gv.marginal(joint, keep=["x"], algorithm=gv.importance(reverse, particles=5))
        >>> # gv.elbo(model, guide): IWHVI(5); gv.iwelbo(model, guide, particles=5): DIWHVI
    """
    require_program(g, "program", "gv.marginal(g, keep, algorithm)")
    algorithm = algorithm or importance()
    if not hasattr(algorithm, "marginal"):  # each algorithm builds its marginal
        raise TypeError(f"gv.marginal: algorithm={algorithm!r} is not an algorithm; use "
                        "gv.importance(proposal, particles) or gv.enumeration()")
    return algorithm.marginal(g, keep)


def normalize(g: GenFn, algorithm: Importance | None = None) -> Normalize:
    """The distribution of sampling-importance-resampling targeting `g`'s normalized
    posterior (its density, observations included, divided by the evidence); the
    proposal takes `g`'s arguments.

    Args:
        g: the unnormalized generative function (a model with observations).
        algorithm: `gv.importance(...)`; from the prior by default.

    Returns:
        a `Normalize`, a generative function to use as a guide or proposal.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def posterior(y):
        ...     z = gv.normal(0.0, 1.0, grad=gv.REPARAM) @ "z"
        ...     gv.observe(gv.normal(z, 1.0), y)
        >>> sir = gv.normalize(posterior, gv.importance(particles=10))
    """
    require_program(g, "program", "gv.normalize(g, algorithm)")
    return Normalize(g, algorithm or importance())
