"""`gv.converged`: a noise-aware rule that stops `gv.fit` once the objective is flat.

The objective estimates a step records are noisy, so the rule compares *window means*
with their standard errors rather than single values. The finite estimates are cut
into consecutive windows of `window` steps (skipped non-finite steps do not count).
For each completed window k it computes the mean m_k and the standard error of the
mean s_k = sd_k / √window (sd_k the sample standard deviation inside the window), then
the change d_k = m_k − m_{k−1} and its standard error √(s_k² + s_{k−1}²). A window is
*flat* when |d_k| ≤ tolerance · √(s_k² + s_{k−1}²): the mean moved by no more than
noise explains. The fit stops after `patience` flat windows in a row, once at least
`min_steps` steps ran. A significant change either way (still improving, or getting
worse) resets the count.

The rule's state is a few scalars updated inside `gv.fit`'s compiled loop (the loop's
condition reads it, so a chunk stops at the very step the rule fires, whatever the
chunking); a resumed or continued run rebuilds it by replaying the recorded history,
so it stops where one uninterrupted run would.

Example:
    >>> import jax, jax.numpy as jnp, genvi as gv
    >>> from genvi.training.stopping import replay
    >>> rule = gv.converged(window=50, patience=2)
    >>> flat = jax.random.normal(jax.random.key(0), (150,))     # noise around 0
    >>> state = replay(rule, flat, jnp.ones(150, bool))
    >>> bool(rule.done(state)), rule.describe(state)[:25]
    (True, 'converged after 150 steps')
    >>> rising = flat + jnp.arange(150) / 10                      # still improving
    >>> bool(rule.done(replay(rule, rising, jnp.ones(150, bool))))
    False
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class ConvergenceState(NamedTuple):
    """`Converged`'s running statistics (all scalars; a pytree carried by the loop).

    `seen`: steps seen; `count`, `mean`, `m2`: the current window's Welford sums;
    `windows`: windows completed; `last_mean`, `last_var`: the previous window's mean
    and squared standard error; `flat`: flat windows in a row; `change`,
    `change_se`: the last window's change of mean and its standard error.

    Example:
        >>> import genvi as gv
        >>> gv.converged().init().windows.item()
        0
    """

    seen: jax.Array
    count: jax.Array  # type: ignore[assignment]  # a field that shadows tuple.count on purpose
    mean: jax.Array
    m2: jax.Array
    windows: jax.Array
    last_mean: jax.Array
    last_var: jax.Array
    flat: jax.Array
    change: jax.Array
    change_se: jax.Array


@dataclasses.dataclass(frozen=True)
class Converged:
    """The stopping rule `gv.converged(...)` builds (see `genvi/training/stopping.py`).

    A rule for `gv.fit(..., stop=...)` is an immutable, hashable object with
    `init() -> state`, `update(state, value, ok) -> state` (traced, once per step;
    `ok` is false for a skipped non-finite step), `done(state)` (a traced bool) and
    `describe(state)` (the reason, as text).

    Example:
        >>> import genvi as gv
        >>> gv.converged(window=200).window
        200
    """

    window: int = 100
    patience: int = 3
    tolerance: float = 2.0
    min_steps: int = 0

    def init(self) -> ConvergenceState:
        """The state before any step.

        Example:
            >>> import genvi as gv
            >>> gv.converged().init().seen.item()
            0
        """
        real, count = jnp.zeros((), jnp.asarray(0.0).dtype), jnp.zeros((), jnp.int32)
        return ConvergenceState(count, count, real, real, count, real, real, count, real, real)

    def update(self, state: ConvergenceState, value: jax.Array, ok: jax.Array) -> ConvergenceState:
        """The state after one step whose objective estimate is `value` (`ok`: the step
        counted, i.e. it was finite). Plain JAX: runs inside the compiled loop.

        Example:
            >>> import genvi as gv, jax.numpy as jnp
            >>> rule = gv.converged(window=2)
            >>> s = rule.update(rule.init(), jnp.float32(1.0), jnp.bool_(True))
            >>> int(s.count), float(s.mean)
            (1, 1.0)
        """
        value = jnp.where(ok, jnp.asarray(value, state.mean.dtype), 0.0)
        # Welford's update: no cancellation for objectives far from zero (e.g. -1e5 ± 1)
        count = state.count + ok.astype(jnp.int32)
        delta = value - state.mean
        mean = jnp.where(ok, state.mean + delta / jnp.maximum(count, 1), state.mean)
        m2 = jnp.where(ok, state.m2 + delta * (value - mean), state.m2)
        full = count >= self.window
        var = m2 / (self.window - 1) / self.window           # squared standard error
        change, change_se = mean - state.last_mean, jnp.sqrt(var + state.last_var)
        compared = full & (state.windows > 0)
        flat = jnp.abs(change) <= self.tolerance * change_se
        zero = jnp.zeros_like(mean)
        return ConvergenceState(
            seen=state.seen + 1,
            count=jnp.where(full, 0, count),
            mean=jnp.where(full, zero, mean),
            m2=jnp.where(full, zero, m2),
            windows=state.windows + full.astype(jnp.int32),
            last_mean=jnp.where(full, mean, state.last_mean),
            last_var=jnp.where(full, var, state.last_var),
            flat=jnp.where(compared, jnp.where(flat, state.flat + 1, 0), state.flat),
            change=jnp.where(compared, change, state.change),
            change_se=jnp.where(compared, change_se, state.change_se))

    def done(self, state: ConvergenceState) -> jax.Array:
        """Whether the fit stops now (a traced bool).

        Example:
            >>> import genvi as gv
            >>> bool(gv.converged().done(gv.converged().init()))
            False
        """
        return (state.flat >= self.patience) & (state.seen >= self.min_steps)

    def describe(self, state: ConvergenceState) -> str:
        """Why the fit stopped (for `FitResult.stopped`); call it when `done(state)`.

        Example:
            >>> import genvi as gv
            >>> gv.converged().describe(gv.converged().init())[:15]
            'converged after'
        """
        last = float(state.last_mean)
        return (f"converged after {int(state.seen)} steps: the mean objective of each of the "
                f"last {self.patience} windows of {self.window} steps moved by at most "
                f"{self.tolerance:g} standard errors from the window before (last window "
                f"mean {last:.6g}, change {float(state.change):+.3g} ± "
                f"{float(state.change_se):.3g})")


def converged(window: int = 100, patience: int = 3, tolerance: float = 2.0,
              min_steps: int = 0) -> Converged:
    """A noise-aware stopping rule for `gv.fit(..., stop=gv.converged(...))`.

    Stops once the mean objective of `patience` consecutive windows of `window` steps
    each moved by at most `tolerance` standard errors from the window before (see
    `genvi/training/stopping.py` for the exact statistic), and at least `min_steps`
    steps ran (e.g. the end of a warm-up or annealing schedule). Choose `window` long
    enough that the progress you care about over one window exceeds the noise of a
    window's mean: a rate so small that the objective creeps below that noise looks
    converged. Larger `tolerance` or `patience` stop later and more surely.

    Args:
        window: steps per window.
        patience: consecutive quiet windows required.
        tolerance: how far a window's mean may move, in standard errors.
        min_steps: steps before the rule may stop the fit.

    Returns:
        a `Converged` rule for `gv.fit(..., stop=...)`.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> @gv.expectation
        ... def e(m):
        ...     return -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 2.0) ** 2
        >>> result = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=20_000,
        ...                 key=jax.random.key(0), stop=gv.converged(), progress=False)
        >>> result.steps < 2000, result.stopped[:9], round(float(result.params), 1)
        (True, 'converged', 2.0)
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 2:
        raise ValueError(f"gv.converged: window={window!r} must be an int of at least 2 (a "
                         "window's standard error needs two steps; 50-500 is typical)")
    if isinstance(patience, bool) or not isinstance(patience, (int, np.integer)) or patience < 1:
        raise ValueError(f"gv.converged: patience={patience!r} must be a positive int (the "
                         "number of flat windows in a row that stops the fit)")
    if not isinstance(tolerance, (int, float, np.number)) or not math.isfinite(tolerance) \
            or tolerance <= 0:
        raise ValueError(f"gv.converged: tolerance={tolerance!r} must be a positive number "
                         "of standard errors (2.0 is typical)")
    if isinstance(min_steps, bool) or not isinstance(min_steps, (int, np.integer)) or min_steps < 0:
        raise ValueError(f"gv.converged: min_steps={min_steps!r} must be a non-negative int")
    return Converged(int(window), int(patience), float(tolerance), int(min_steps))


def replay(rule: Converged, values: np.ndarray, ok: np.ndarray) -> ConvergenceState:
    """The rule's state after the recorded steps (`history["objective"]` and the steps
    not skipped), so a resumed or continued fit stops where one long run would.

    Example:
        >>> import jax.numpy as jnp, genvi as gv
        >>> from genvi.training.stopping import replay
        >>> int(replay(gv.converged(), jnp.zeros(250), jnp.ones(250, bool)).windows)
        2
    """
    state = rule.init()
    return _replay(rule, state, jnp.asarray(values, state.mean.dtype), jnp.asarray(ok, bool))


@functools.partial(jax.jit, static_argnums=0)
def _replay(rule, state, values, ok):
    return jax.lax.scan(lambda s, x: (rule.update(s, *x), None), state, (values, ok))[0]


def check_rule(stop: Any) -> None:
    """A stopping rule has the methods the loop calls and is hashable (it is part of
    the compiled program's identity)."""
    if stop is None:
        return
    missing = [m for m in ("init", "update", "done", "describe") if not callable(getattr(stop, m, None))]
    try:
        hash(stop)
    except TypeError:
        missing.append("__hash__")
    if missing:
        raise TypeError(f"gv.fit: stop must be a stopping rule such as gv.converged(window=100, "
                        f"patience=3); got {stop!r}, which lacks {', '.join(missing)}")
