"""`gv.diagnose`: did the fit work? Pareto-smoothed importance sampling of a fitted guide.

The guide's draws z ~ q are weighted by w = p(z, y) / q(z): log w is the model's log
density (observations included) minus the guide's. How heavy the right tail of w is says
whether q covers the posterior: ArviZ's PSIS (arviz-stats' `psislw` on ArviZ 1.x,
`arviz.psislw` on 0.x; Vehtari et al. 2024;
Yao et al. 2018 for VI) fits a generalized Pareto distribution to the largest weights
and reports its shape k̂. The same weights give the importance-sampling effective
sample size, an estimate of the log evidence log p(y), and importance-resampled
draws that correct the guide. Draws are vectorized (`jax.vmap`, chunked by
`jax.lax.map` with `batch_size`), with no Python loop over samples.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params, y):
    ...     z = gv.normal(0.0, 1.0) @ "z"
    ...     gv.observe(gv.normal(z, 1.0), y)
    >>> @gv.gen
    ... def guide(params, y):                    # the exact posterior N(y / 2, 1 / 2)
    ...     gv.normal(y / 2, 0.5 ** 0.5, grad=gv.REPARAM) @ "z"
    >>> report = gv.diagnose(model, guide, {}, 1.0, key=jax.random.key(0), num_samples=1000)
    >>> report.verdict
    'good'
"""

from __future__ import annotations

import math
import operator
import textwrap
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core.choices import ChoiceMap
from genvi.core.mistakes import check_key, is_count
from genvi.core.program_mistakes import require_programs
from genvi.gen.language import GenFn
from genvi.gen.sites import deterministic_of, without
from genvi.inference.arviz_versions import require_arviz

GOOD, CHECK = 0.5, 0.7  # k̂ thresholds of Vehtari et al. (2024), as ArviZ and loo use them


@dataclass(frozen=True, eq=False)  # arrays inside: compared by identity
class Diagnosis:
    """What `gv.diagnose` found; `print(report)` says what it means.

    Fields: `khat` (the Pareto shape of the weights p/q: < 0.5 good, 0.5–0.7 usable
    with care, > 0.7 unreliable; −inf when the weights are equal to floating-point
    precision, i.e. the guide is the posterior), `ess` (the effective sample size
    1 / Σ w̃ᵢ² of the Pareto-smoothed, normalized weights w̃), `num_samples`,
    `log_evidence` (log of the mean raw weight: the IWELBO with K = `num_samples`, a
    consistent estimate of log p(y), low by about `log_evidence_se`² / 2) and
    `log_evidence_se` (its delta-method standard error, sd(w) / (√N · mean(w)) from
    the same draws; like any variance estimate of heavy-tailed weights it is too
    small when k̂ > 0.5), `elbo` (the mean log weight; `log_evidence − elbo`
    estimates KL(q ‖ posterior)), `draws` (the guide's draws, a choice map stacked on
    a leading axis), `log_weights` (raw) and `smoothed_log_weights` (PSIS, normalized).

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.normal(0.0, 1.0) @ "z"
        >>> @gv.gen
        ... def guide(params):
        ...     gv.normal(0.0, 0.3, grad=gv.REPARAM) @ "z"    # far too narrow
        >>> report = gv.diagnose(model, guide, {}, key=jax.random.key(0), num_samples=2000)
        >>> report.verdict, report.khat > 0.7
        ('unreliable', True)
    """

    khat: float
    ess: float
    num_samples: int
    log_evidence: float
    log_evidence_se: float
    elbo: float
    draws: ChoiceMap = field(repr=False)
    log_weights: np.ndarray = field(repr=False)
    smoothed_log_weights: np.ndarray = field(repr=False)

    @property
    def verdict(self) -> str:
        """`"good"` (k̂ < 0.5), `"ok"` (0.5 ≤ k̂ ≤ 0.7: check) or `"unreliable"` (k̂ > 0.7).

        Example:
            >>> import numpy as np
            >>> from genvi.inference.diagnose import Diagnosis
            >>> Diagnosis(0.6, 10.0, 100, 0.0, 0.1, -0.1, None, np.zeros(1), np.zeros(1)).verdict
            'ok'
        """
        if not self.khat <= CHECK:  # NaN counts as unreliable
            return "unreliable"
        return "good" if self.khat < GOOD else "ok"

    def resample(self, key: jax.Array, n: int) -> ChoiceMap:
        """`n` draws picked from the guide's draws with replacement, each with
        probability its Pareto-smoothed weight: approximately the posterior when k̂ is
        small (at most about `ess` of them are distinct). A choice map stacked on a
        leading axis of `n`, like the guide's draws (`gv.to_arviz` takes it).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.normal(1.0, 1.0) @ "z"
            >>> @gv.gen
            ... def guide(params):
            ...     gv.normal(0.0, 2.0, grad=gv.REPARAM) @ "z"
            >>> report = gv.diagnose(model, guide, {}, key=jax.random.key(0), num_samples=4000)
            >>> draws = report.resample(jax.random.key(1), 2000)
            >>> draws["z"].shape, abs(float(draws["z"].mean()) - 1.0) < 0.15
            ((2000,), True)
        """
        check_key(key, "Diagnosis.resample")
        if not is_count(n):
            raise ValueError(f"Diagnosis.resample(key, n): n is the number of draws, a positive "
                             f"int; got {n!r}")
        w = np.exp(self.smoothed_log_weights - np.max(self.smoothed_log_weights))
        # inverse-CDF sampling (jax.random.choice): memory O(n + draws), unlike Gumbel-max
        picks = jax.random.choice(key, w.shape[0], shape=(operator.index(n),),
                                  p=jnp.asarray(w / w.sum()))
        return jax.tree_util.tree_map(lambda v: jnp.asarray(v)[picks], self.draws)

    def __str__(self) -> str:
        n = self.num_samples
        lines = [f"gv.diagnose: {n:,} draws from the guide, weighted by p(z, y) / q(z)",
                 f"  khat (Pareto shape of the weights) = {self.khat:.2f}: {self.verdict}",
                 f"  importance ESS = {self.ess:,.0f} of {n:,} draws (Pareto-smoothed weights)",
                 f"  log evidence (IWELBO, K = {n:,}) = {self.log_evidence:.3f} "
                 f"± {self.log_evidence_se:.3f}; ELBO = {self.elbo:.3f}"]
        if self.khat == -math.inf:
            advice = ("The weights are equal to floating-point precision: the guide is the "
                      "posterior (no tail to fit, hence khat = -inf).")
        elif self.verdict == "good":
            advice = ("Reliable: the guide covers the posterior, so its reweighted draws "
                      "(report.resample(key, n)) and the log evidence can be trusted. The "
                      "guide's own draws are only as close to the posterior as the ESS says: "
                      "well below the number of draws, use the reweighted ones.")
        elif self.verdict == "ok":
            advice = ("Usable, but check: the weights have a heavy tail, so the guide "
                      "misses some posterior mass. Prefer the reweighted draws "
                      "(report.resample(key, n)) to the guide's own, and confirm with more "
                      "draws, another key, or a better guide.")
        else:
            advice = ("Unreliable: the guide misses posterior mass (too narrow, or the "
                      "wrong shape), so neither its draws nor their reweighting can be "
                      "trusted, and the log evidence is too low. Try a richer guide family "
                      "(gv.auto_mvn or gv.auto_low_rank for gv.auto_normal, or a flow: "
                      "gv.auto_flow), more steps or a "
                      "decaying learning rate, or a mass-covering objective (gv.iwelbo, "
                      "gv.renyi); then diagnose again.")
        lines.append(textwrap.fill(advice, 88, initial_indent="  ", subsequent_indent="  "))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Diagnosis(khat={self.khat:.3f} ({self.verdict}), ess={self.ess:.1f}, "
                f"num_samples={self.num_samples}, log_evidence={self.log_evidence:.4f} "
                f"± {self.log_evidence_se:.4f}, elbo={self.elbo:.4f})")


def _log_weights(model: GenFn, guide: GenFn, full: tuple, keys: jax.Array,
                 batch_size: int | None) -> tuple[ChoiceMap, jax.Array, jax.Array]:
    """The guide's draws, their log weights log p − log q, and the size of the
    rounding error of each (from the magnitudes of log p and log q)."""
    derived = deterministic_of(guide, full)

    def one(k: jax.Array) -> tuple[ChoiceMap, jax.Array, jax.Array]:
        k_guide, k_model = jax.random.split(k)
        trace = guide.simulate(k_guide, *full)
        latents = without(trace.choices, derived)
        if getattr(model, "estimated_density", False):  # gv.marginal / gv.normalize
            # the programs that set estimated_density define it; GenFn does not
            log_p = model.estimate_log_density(  # type: ignore[attr-defined]
                k_model, latents, *full)
        else:
            log_p = model.log_density(latents, *full)
        log_q = trace.log_density
        rounding = jnp.finfo(jnp.result_type(log_p)).eps * (jnp.abs(log_p) + jnp.abs(log_q))
        return trace.choices, log_p - log_q, rounding
    if batch_size is None:  # all draws at once (lax.map without a batch would loop one by one)
        return jax.jit(jax.vmap(one))(keys)
    return jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=batch_size))(keys)


def _log_mean_exp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + math.log(float(np.mean(np.exp(x - top))))


def diagnose(model: GenFn, guide: GenFn, params: Any, *args: Any, key: jax.Array,
             num_samples: int = 4000, batch_size: int | None = None) -> Diagnosis:
    """Check a fitted guide against the model: `num_samples` draws z ~ q, weighted by
    p(z, y) / q(z), give the Pareto shape k̂ of the weights (ArviZ's PSIS), the
    importance ESS, the log evidence with its standard error, and `resample(key, n)`
    (see `Diagnosis`). `print(report)` says what the numbers mean.

    Model and guide are called as `(params, *args)`, as `gv.fit` and `gv.predictive`
    call them (an automatic guide reads its own entry of `params`). Pass the whole
    dataset: with a minibatch, a `gv.plate` scales its lanes, and the weights are
    those of another posterior. A model whose density is estimated (`gv.marginal`)
    is weighted by its unbiased density estimate, so the weights stay unbiased for the
    evidence (with extra variance, which k̂ includes). `batch_size` bounds memory:
    draws are evaluated `batch_size` at a time (`jax.lax.map`), all at once by
    default. Needs ArviZ (`pip install 'genvi[arviz]'`).

    Args:
        model: the model, called as `(params, *args)`.
        guide: the fitted guide.
        params: the fitted parameters.
        *args: the model's other arguments: the whole dataset.
        key: the randomness of the draws.
        num_samples: the number of importance draws.
        batch_size: draws evaluated at a time, bounding memory (optional).

    Returns:
        a `Diagnosis`: k̂, the ESS, the log evidence and its standard error, `resample`.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params, y):
        ...     z = gv.normal(0.0, 1.0) @ "z"
        ...     gv.observe(gv.normal(z, 1.0), y)
        >>> @gv.gen
        ... def guide(params, y):
        ...     gv.normal(params["m"], 1.0, grad=gv.REPARAM) @ "z"
        >>> report = gv.diagnose(model, guide, {"m": 0.5}, 1.0, key=jax.random.key(0),
        ...                      num_samples=1000)
        >>> print(report)  # doctest: +ELLIPSIS
        gv.diagnose: 1,000 draws from the guide, weighted by p(z, y) / q(z)
          khat (Pareto shape of the weights) = ...: good
        ...
    """
    az = require_arviz("gv.diagnose")
    require_programs("gv.diagnose(model, guide, params, *args, key=...)", model=model,
                     guide=guide)
    check_key(key, "gv.diagnose")
    if not is_count(num_samples, minimum=2):
        raise ValueError(f"gv.diagnose: num_samples is an int of at least 2 (thousands for a "
                         f"reliable khat); got {num_samples!r}")
    if batch_size is not None and not is_count(batch_size):
        raise ValueError(f"gv.diagnose: batch_size is a positive int or None; got {batch_size!r}")
    n = operator.index(num_samples)
    log_w: jax.Array | np.ndarray  # JAX's, then a NumPy float64 copy
    draws, log_w, rounding = _log_weights(model, guide, (params,) + args,
                                          jax.random.split(key, n), batch_size)
    log_w = np.asarray(log_w, np.float64)
    if log_w.shape != (n,):
        raise ValueError(f"gv.diagnose: the log weights have shape {log_w.shape}, not one per "
                      "draw: the model's log density should be a scalar")
    if np.isnan(log_w).any() or np.isposinf(log_w).any() or np.isneginf(log_w).all():
        bad = np.isnan(log_w) if np.isnan(log_w).any() else np.isinf(log_w)
        what = "NaN" if np.isnan(log_w).any() else "+inf" if np.isposinf(log_w).any() else "-inf"
        raise ValueError(
            f"gv.diagnose: {int(bad.sum()):,} of {n:,} log weights log p(z, y) − log q(z) are "
            f"{what}: the guide proposes values "
            "where the model's density is zero or undefined (outside its support), or the "
            "guide's own density is zero or NaN. Check that the guide's sites have the model's "
            "supports (the automatic guides do) and that the parameters are finite.")
    if np.ptp(log_w) <= 8.0 * float(np.max(rounding)):
        # equal weights up to rounding: no tail to fit (ArviZ would report inf)
        khat, smoothed = -math.inf, np.full(n, -math.log(n))
    else:
        with np.errstate(over="ignore"):  # ArviZ's GPD fit: overflowing terms get weight 0
            smoothed, khat = az.psislw(log_w)
    smoothed = np.asarray(smoothed, np.float64)
    w = np.exp(smoothed - np.max(smoothed))
    w /= np.sum(w)
    log_z = _log_mean_exp(log_w)
    ratio = np.exp(log_w - log_z)  # w / mean(w)
    finite = log_w[np.isfinite(log_w)]
    return Diagnosis(khat=khat, ess=float(1.0 / np.sum(w ** 2)), num_samples=n,
                     log_evidence=log_z,
                     log_evidence_se=float(np.std(ratio, ddof=1) / math.sqrt(n)),
                     elbo=float(np.mean(finite)) if finite.size == n else -math.inf,
                     draws=draws, log_weights=log_w, smoothed_log_weights=smoothed)
