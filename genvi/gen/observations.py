"""`gv.observe`, `gv.factor` and `gv.deterministic`: the statements that score a
program's data, and the one that records a derived quantity.

`gv.observe` and `gv.factor` multiply the program's density (an observation by a
distribution's density at a value, a factor by exp of a log weight) and record no
choice; a program that uses either is unnormalized, a model rather than a guide.
`gv.deterministic` changes no density: it names a value computed from the choices so
that `simulate` and `gv.predictive` return it.

Example:
    >>> import genvi as gv
    >>> @gv.gen
    ... def model(y):
    ...     mu = gv.normal(0.0, 1.0) @ "mu"
    ...     gv.observe(gv.normal(mu, 1.0), y)
    >>> round(float(model.log_density(gv.choices({"mu": 0.0}), 0.0)), 4)
    -1.8379
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.addressing import check_address, current_prefix, nesting
from genvi.core.primitives import bind_observe
from genvi.distributions.base import DistCall
from genvi.distributions.factor import DETERMINISTIC, FACTOR


def observe(call: DistCall, value: Any, *, name: str | None = None) -> None:
    """Multiply the program's density by `call`'s density at `value`.

    `name` labels the observation with an address (under the enclosing sub-program
    prefixes, stacked by `gv.vmap` / `gv.plate` / `gv.scan` like a choice) so that
    `gv.predictive` can return draws of it. It changes nothing else: the observation
    is scored, not recorded among `simulate`'s choices, and `log_density` does not
    read it. Unnamed observations are never returned by `gv.predictive`. A named
    observation's `value` may be None (new inputs without data): `gv.predictive`
    draws it; scoring it (`simulate`, `log_density`, objectives) is an error.

    Args:
        call: a distribution call, e.g. `gv.normal(mu, 1.0)`.
        value: the observed value (None only for a named observation `gv.predictive`
            draws).
        name: an address for `gv.predictive` to return draws at (optional).

    Returns:
        None.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def model(y):
        ...     mu = gv.normal(0.0, 1.0) @ "mu"
        ...     gv.observe(gv.normal(mu, 1.0), y, name="y")
    """
    prefix = current_prefix("gv.observe")
    if not isinstance(call, DistCall):
        raise TypeError(f"gv.observe needs a distribution call such as gv.normal(0, 1); got {call!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"gv.observe(gv.{call.dist.name}(...), value, name=...): a name is a "
                        f"string address such as name=\"y\"; got {name!r} "
                        f"({type(name).__name__})")
    if name is not None:
        check_address(name)  # no "/": it separates the parts of a nested address
    missing = value is None
    if missing and name is None:
        raise TypeError(f"gv.observe(gv.{call.dist.name}(...), None): an observation needs a "
                        "value to score. Only a named observation may be None, for gv.predictive "
                        "to draw it: gv.observe(dist, None, name=\"y\").")
    if missing:  # a placeholder of the distribution's shape (never scored)
        out = jax.eval_shape(lambda *p: call.dist.sample(jax.random.key(0), *p), *call.params)
        value = jnp.zeros(out.shape, out.dtype)
    value = jnp.asarray(value)
    addr = None if name is None else prefix + (name,)
    bind_observe(call.dist, value, call.params, addr=addr, nest=nesting(), missing=missing)


def factor(log_weight: Any) -> None:
    """Multiply the program's density by exp(`log_weight`) (Pyro's `factor`).

    A program with a factor is unnormalized, as one that observes is: use it as a
    model, not as a guide. Inside `gv.plate`/`gv.vmap` a factor of shape [lanes] is one
    weight per lane (scaled like an observation in a subsampled plate).

    Args:
        log_weight: the log of the weight: a scalar, or one per lane inside a plate.

    Returns:
        None.

    Example (a soft constraint that z stays near 1):
        >>> import genvi as gv, jax.numpy as jnp
        >>> @gv.gen
        ... def model():
        ...     z = gv.normal(0.0, 1.0) @ "z"
        ...     gv.factor(-0.5 * (z - 1.0) ** 2 / 0.1)
        >>> round(float(model.log_density(gv.choices({"z": 1.0}))), 4)
        -1.4189
    """
    current_prefix("gv.factor")
    if isinstance(log_weight, DistCall):
        raise TypeError(f"gv.factor takes a log weight (an array), not a distribution call "
                        f"{log_weight!r}; to score a value under a distribution use "
                        "gv.observe(dist(...), value)")
    log_weight = jnp.asarray(log_weight)
    if not jnp.issubdtype(log_weight.dtype, jnp.floating):
        log_weight = log_weight.astype(jnp.result_type(float))
    bind_observe(FACTOR, jnp.zeros(log_weight.shape, log_weight.dtype), (log_weight,),
                 nest=nesting())


def deterministic(name: str, value: Any) -> Any:
    """Record `value`, a quantity computed from the program's choices, at the address
    `name` (under the enclosing prefixes, stacked by `gv.vmap` / `gv.plate` /
    `gv.scan` like a choice); returns `value` (NumPyro's `deterministic`).

    It changes neither the program's density nor any gradient, and a guide may hold
    one (it does not make a program unnormalized). `g.simulate(...).choices` and
    `gv.predictive` (and so `gv.to_arviz`'s posterior) hold its value; `log_density`
    accepts choices that hold it and recomputes it rather than reading it; inside
    objectives (`g.sim`) it is not returned, and costs nothing once compiled.

    Args:
        name: the address to record the value at.
        value: the value, a pytree of arrays.

    Returns:
        `value`, unchanged.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model():
        ...     log_s = gv.normal(0.0, 1.0) @ "log_s"
        ...     gv.deterministic("s", jax.numpy.exp(log_s))
        >>> tr = model.simulate(jax.random.key(0))
        >>> bool(tr.choices["s"] == jax.numpy.exp(tr.choices["log_s"]))
        True
        >>> float(model.log_density(tr.choices)) == float(tr.log_density)
        True
    """
    prefix = current_prefix("gv.deterministic")
    if not isinstance(name, str):
        raise TypeError(f"gv.deterministic(name, value): the name comes first, a string address "
                        f"such as gv.deterministic(\"s\", value); got {name!r} "
                        f"({type(name).__name__})")
    check_address(name)
    if isinstance(value, DistCall):
        raise TypeError(f"gv.deterministic({name!r}, ...) records a value computed from the "
                        f"choices, not a distribution call {value!r}; to sample it write "
                        f"{value!r} @ {name!r}")
    value = jnp.asarray(value)
    bind_observe(DETERMINISTIC, jnp.zeros(value.shape, value.dtype), (value,),
                 addr=prefix + (name,), nest=nesting())
    return value
