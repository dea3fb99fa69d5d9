"""`gv.schedule`: a data argument of `gv.fit` that changes with the step (annealing).

`gv.fit(objective, params, y, gv.schedule(fn), ...)` passes `fn(step)` as that
argument at step `step` (counting from 0, over the whole run, a continued one
included), computed inside the compiled loop: `fn` is a JAX function of an int32
scalar, such as an optax schedule (`optax.linear_schedule(0.0, 1.0, 1000)`). A
scheduled argument is not minibatched; the other data arguments are as usual.

Example:
    >>> import genvi as gv, jax.numpy as jnp
    >>> beta = gv.schedule(lambda step: jnp.minimum(1.0, step / 100))
    >>> float(beta(50))
    0.5
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp


class Schedule:
    """A `gv.fit` data argument given as a function of the step; see `gv.schedule`.

    Example:
        >>> import genvi as gv
        >>> gv.schedule(lambda step: 2.0 * step)(3)
        Array(6., dtype=float32, weak_type=True)
    """

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[[jax.Array], Any]):
        if not callable(fn):
            raise TypeError(f"gv.schedule: expected a function of the step (e.g. "
                            f"optax.linear_schedule(0.0, 1.0, 1000), or lambda step: ...); "
                            f"got {fn!r} (a {type(fn).__name__})")
        self.fn = fn

    def __call__(self, step: Any) -> Any:
        return jax.tree_util.tree_map(jnp.asarray, self.fn(jnp.asarray(step, jnp.int32)))

    def __repr__(self) -> str:
        return f"gv.schedule({getattr(self.fn, '__name__', self.fn)!r})"


def schedule(fn: Callable[[jax.Array], Any]) -> Schedule:
    """Mark a `gv.fit` data argument as `step -> value`: at step t the objective gets
    `fn(t)` there (t counts from 0 over the whole run; a run continued from a
    `FitResult` counts on). `fn` is traced once inside the compiled loop, so write it
    with `jnp` operations; optax schedules work as they are. Scheduled arguments are
    never minibatched, and also work in `eval_data` (evaluated at the evaluation's step).

    KL annealing: an objective `elbo_beta(params, y, beta)` weighting the KL term by
    `beta`, fitted with `beta` rising from 0 to 1 over the first 1000 steps:

    Args:
        fn: a function of the step (a traced integer) written with `jnp` operations.

    Returns:
        a `Schedule`, passed to `gv.fit` in place of a data argument.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> @gv.expectation
        ... def elbo_beta(p, y, beta):
        ...     q = gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM)
        ...     z = gv.sample(q)
        ...     kl = q.log_prob(z) - gv.normal(0.0, 1.0).log_prob(z)
        ...     return gv.normal(z, 1.0).log_prob(y) - beta * kl
        >>> beta = gv.schedule(optax.linear_schedule(0.0, 1.0, 1000))
        >>> result = gv.fit(elbo_beta, {"m": 0.0, "s": 0.0}, 1.0, beta,
        ...                 optimizer=optax.adam(optax.cosine_decay_schedule(0.05, 3000)),
        ...                 steps=3000, key=jax.random.key(0), progress=False)
        >>> round(float(result.params["m"]), 1)   # beta = 1 at the end: the posterior mean
        0.5
    """
    return Schedule(fn)


def split_scheduled(data: Sequence[Any]) -> tuple[tuple, tuple]:
    """`(fixed, scheduled)`: the data arguments that are not `gv.schedule`s, and the
    `(position, Schedule)` pairs of those that are.

    Example:
        >>> import genvi as gv
        >>> from genvi.training.schedule import split_scheduled
        >>> fixed, scheduled = split_scheduled((1.0, gv.schedule(lambda t: t), 2.0))
        >>> fixed, [i for i, _ in scheduled]
        ((1.0, 2.0), [1])
    """
    fixed = tuple(d for d in data if not isinstance(d, Schedule))
    scheduled = tuple((i, d) for i, d in enumerate(data) if isinstance(d, Schedule))
    return fixed, scheduled


def at_step(fixed: Sequence[Any], scheduled: Sequence[tuple[int, Schedule]],
            step: Any) -> tuple:
    """The data arguments at `step`: `fixed` in order, each schedule's value at its
    position.

    Example:
        >>> import genvi as gv
        >>> from genvi.training.schedule import at_step
        >>> args = at_step((1.0, 2.0), [(1, gv.schedule(lambda t: t * 10.0))], 3)
        >>> float(args[1])
        30.0
    """
    args, rest = [], iter(fixed)
    values = dict(scheduled)
    for i in range(len(fixed) + len(scheduled)):
        args.append(values[i](step) if i in values else next(rest))
    return tuple(args)


def check_schedules(scheduled: Sequence[tuple[int, Schedule]], where: str) -> None:
    """Evaluate every schedule at step 0 (abstractly, nothing runs) and raise a
    `TypeError` naming the argument if it cannot be traced or returns no array.

    Example:
        >>> import genvi as gv
        >>> from genvi.training.schedule import check_schedules
        >>> check_schedules([(0, gv.schedule(lambda t: "warm"))], "data")
        Traceback (most recent call last):
        TypeError: gv.fit: data argument 0 is gv.schedule(...), ...
    """
    for i, s in scheduled:
        try:
            jax.eval_shape(s, jnp.zeros((), jnp.int32))
        except Exception as err:  # any failure of the user's function: name it and say why
            raise TypeError(
                f"gv.fit: {where} argument {i} is gv.schedule(...), but its function of the "
                f"step failed on a traced int32 step ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}). Write it "
                "with jnp operations (jnp.minimum, jnp.where; no Python if or float() on the "
                "step), e.g. gv.schedule(optax.linear_schedule(0.0, 1.0, 1000))") from None
